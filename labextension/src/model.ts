/**
 * Pure view logic: from the server extension's status report (docs/api.md) to what the status
 * bar, the GPU panel and the warning show. No DOM, no JupyterLab imports, so it is unit-tested
 * with plain jest. `null` in the report always means *unknown*, never zero.
 */

// -- the report (GET /jupyter-gpu-gov/status) ------------------------------------------------

export type GovState =
  | 'active'
  | 'idle'
  | 'busy'
  | 'warned'
  | 'checkpointing'
  | 'culled'
  | 'exempt'
  | 'unknown';

export interface IDevice {
  uuid: string;
  name: string;
  mig_profile?: string | null;
  parent_uuid?: string | null;
  memory_total_mb?: number | null;
  memory_used_mb?: number | null;
  activity?: number | null;
  shared?: boolean;
}

export interface ITargetGpu {
  devices?: string[];
  memory_mb?: number | null;
  sm?: number | null;
  holds_context?: boolean;
  confidence?: 'exact' | 'inferred' | 'unknown' | string;
  last_active?: string | null;
  idle_since?: string | null;
  active_fraction?: number | null;
  history?: (number | null)[];
}

export interface ITarget {
  kind: 'kernel' | 'terminal' | 'other' | string;
  id: string;
  name?: string | null;
  path?: string | null;
  execution_state?: string | null;
  last_activity?: string | null;
  connections?: number | null;
  gpu?: ITargetGpu | null;
}

/** The governor's diagnosis of why the GPU is underused (docs/api.md, verdict). */
export interface IRootCause {
  label: string;
  hint?: string | null;
  /** Feature -> change in predicted GPU activity at its best-state value (model only). */
  contributions?: Record<string, number> | null;
  source?: 'model' | 'rules' | string | null;
}

export interface IVerdict {
  state: GovState | string;
  reason?: string | null;
  idle_since?: string | null;
  warn_at?: string | null;
  cull_at?: string | null;
  extensions_left?: number | null;
  extension_step_s?: number | null;
  extension_reason?: 'optional' | 'required' | string | null;
  approval_pending?: boolean;
  policy?: string | null;
  cull_action?: 'stop-server' | 'shutdown-kernels' | string | null;
  checkpoint?: 'none' | 'requested' | null;
  dry_run?: boolean;
  root_cause?: IRootCause | null;
  right_size?: IRightSize | null;
}

/** A smaller tier the server's measured use fits (docs/api.md, the verdict). */
export interface IRightSize {
  tier: string;
  label?: string | null;
  reason?: string | null;
}

/** The manifest (docs/api.md; the server writes it as `<checkpoint>/manifest.json`). */
export interface ICheckpointManifest {
  status: 'done' | 'failed' | string;
  id?: string;
  path?: string;
  reason?: string | null;
  cull_reason?: string | null;
  source?: string | null;
  notebooks?: { path: string; checkpoint_id?: string }[];
  errors?: (string | { path?: string; error?: string; message?: string })[];
  requested_at?: string | null;
  completed_at?: string | null;
  bytes?: number | null;
}

export interface IStatusReport {
  schema?: number;
  sampled_at?: string | null;
  backend?: 'nvml' | 'simulated' | 'unavailable' | 'none' | string;
  error?: string | null;
  devices?: IDevice[];
  targets?: ITarget[];
  window?: {
    seconds?: number;
    gpu_active_fraction?: number | null;
    gpu_last_active?: string | null;
    gpu_idle_since?: string | null;
  };
  verdict?: IVerdict | null;
  checkpoint?: {
    requested_at?: string | null;
    status?: string | null;
    manifest?: ICheckpointManifest | null;
  } | null;
}

// -- translation ------------------------------------------------------------------------------

/** End a sentence with a full stop unless it already has one, so joined parts read well. */
function sentence(text: string): string {
  return /[.!?…]$/.test(text.trim()) ? text.trim() : `${text.trim()}.`;
}

/** The subset of JupyterLab's TranslationBundle the model uses (`%1`, `%2` placeholders). */
export interface ITrans {
  __(msgid: string, ...args: unknown[]): string;
  /** Plural forms: `n` picks the form and is also `%1`. */
  _n(msgid: string, msgidPlural: string, n: number, ...args: unknown[]): string;
}

function substitute(msgid: string, args: unknown[]): string {
  return msgid.replace(/%(\d+)/g, (match, n) => {
    const i = Number(n) - 1;
    return i < args.length ? String(args[i]) : match;
  });
}

/** Identity translation with JupyterLab's `%N` substitution (tests, and before ITranslator). */
export const nullTrans: ITrans = {
  __: (msgid: string, ...args: unknown[]) => substitute(msgid, args),
  _n: (msgid: string, plural: string, n: number, ...args: unknown[]) =>
    substitute(n === 1 ? msgid : plural, [n, ...args])
};

/** Options every formatter takes: time is passed in, never read inside the model. */
export interface IViewOptions {
  now: number;
  trans?: ITrans;
  /** Formats a wall-clock time ("14:05"); defaults to the browser locale, HH:MM. */
  clock?: (date: Date) => string;
}

function tr(options: IViewOptions): ITrans {
  return options.trans ?? nullTrans;
}

export function defaultClock(date: Date): string {
  return date.toLocaleTimeString(undefined, {
    hour: '2-digit',
    minute: '2-digit'
  });
}

function clockOf(options: IViewOptions): (date: Date) => string {
  return options.clock ?? defaultClock;
}

// -- formatting ------------------------------------------------------------------------------

function pad2(n: number): string {
  return n < 10 ? `0${n}` : `${n}`;
}

/**
 * A countdown for humans: "2d 03h", "1h 05m", "4m 09s", "42s", "0s". Rounds up, so "0s"
 * shows only once the deadline has passed; negative, NaN and infinite inputs give "0s".
 */
export function formatCountdown(msLeft: number): string {
  if (!Number.isFinite(msLeft) || msLeft <= 0) {
    return '0s';
  }
  const total = Math.ceil(msLeft / 1000);
  const days = Math.floor(total / 86400);
  const hours = Math.floor((total % 86400) / 3600);
  const minutes = Math.floor((total % 3600) / 60);
  const seconds = total % 60;
  if (days > 0) {
    return `${days}d ${pad2(hours)}h`;
  }
  if (hours > 0) {
    return `${hours}h ${pad2(minutes)}m`;
  }
  if (minutes > 0) {
    return `${minutes}m ${pad2(seconds)}s`;
  }
  return `${seconds}s`;
}

/** A duration in seconds in words for an extension step: 3600 → "1h", 5400 → "1h 30m". */
export function formatDuration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) {
    return '?';
  }
  const s = Math.max(0, Math.round(seconds));
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  const rest = s % 60;
  const parts: string[] = [];
  if (d) {
    parts.push(`${d}d`);
  }
  if (h) {
    parts.push(`${h}h`);
  }
  if (m) {
    parts.push(`${m}m`);
  }
  if (rest || parts.length === 0) {
    parts.push(`${rest}s`);
  }
  return parts.join(' ');
}

/** MiB → "512 MiB" or "20.0 GiB"; unknown → "?". */
export function formatMemory(mb: number | null | undefined): string {
  if (mb === null || mb === undefined || !Number.isFinite(mb)) {
    return '?';
  }
  if (mb >= 1024) {
    return `${(mb / 1024).toFixed(1)} GiB`;
  }
  return `${Math.round(mb)} MiB`;
}

/** 0..1 → "37%"; unknown → "?". */
export function formatActivity(value: number | null | undefined): string {
  if (value === null || value === undefined || !Number.isFinite(value)) {
    return '?';
  }
  return `${Math.round(Math.min(1, Math.max(0, value)) * 100)}%`;
}

export function parseTime(value: string | null | undefined): number | null {
  if (!value) {
    return null;
  }
  const t = Date.parse(value);
  return Number.isNaN(t) ? null : t;
}

// -- status bar -------------------------------------------------------------------------------

/** The five colours of the status bar item. */
export type ViewState = 'active' | 'idle' | 'warned' | 'exempt' | 'unknown';

const GOV_STATES: GovState[] = [
  'active',
  'idle',
  'warned',
  'checkpointing',
  'culled',
  'exempt',
  'unknown'
];

/** The governor's state, or (no governor) one derived from the local window. */
export function governorState(report: IStatusReport | null): GovState {
  if (!report) {
    return 'unknown';
  }
  const verdict = report.verdict;
  if (verdict && GOV_STATES.includes(verdict.state as GovState)) {
    return verdict.state as GovState;
  }
  if (verdict) {
    return 'unknown';
  }
  if (report.backend === 'unavailable' || report.backend === 'none') {
    return 'unknown';
  }
  if (report.window?.gpu_idle_since) {
    return 'idle';
  }
  const fraction = report.window?.gpu_active_fraction;
  if (fraction === null || fraction === undefined) {
    return 'unknown';
  }
  return fraction > 0 ? 'active' : 'idle';
}

export function viewState(report: IStatusReport | null): ViewState {
  const state = governorState(report);
  switch (state) {
    case 'warned':
    case 'checkpointing':
    case 'culled':
      return 'warned';
    case 'active':
    case 'idle':
    case 'exempt':
      return state;
    default:
      return 'unknown';
  }
}

function sum(values: (number | null | undefined)[]): number | null {
  const known = values.filter(
    (v): v is number => typeof v === 'number' && Number.isFinite(v)
  );
  return known.length ? known.reduce((a, b) => a + b, 0) : null;
}

function max(values: (number | null | undefined)[]): number | null {
  const known = values.filter(
    (v): v is number => typeof v === 'number' && Number.isFinite(v)
  );
  return known.length ? Math.max(...known) : null;
}

/** GPU memory this server holds: its targets' memory, else the devices' use. */
export function serverMemoryMb(report: IStatusReport): number | null {
  const targets = (report.targets ?? []).filter(t => t.gpu);
  const fromTargets = sum(targets.map(t => t.gpu?.memory_mb));
  if (fromTargets !== null) {
    return fromTargets;
  }
  return sum((report.devices ?? []).map(d => d.memory_used_mb));
}

/** GPU activity now: the busiest device, else the busiest target (MIG has no device value). */
export function serverActivity(report: IStatusReport): number | null {
  const fromDevices = max((report.devices ?? []).map(d => d.activity));
  if (fromDevices !== null) {
    return fromDevices;
  }
  return max((report.targets ?? []).map(t => t.gpu?.sm));
}

export function stateLabel(state: GovState | string, trans: ITrans): string {
  switch (state) {
    case 'active':
      return trans.__('active');
    case 'idle':
      return trans.__('idle');
    case 'busy':
      return trans.__('running a cell, GPU idle');
    case 'warned':
      return trans.__('warned');
    case 'checkpointing':
      return trans.__('checkpointing');
    case 'culled':
      return trans.__('stopping');
    case 'exempt':
      return trans.__('exempt');
    default:
      return trans.__('unknown');
  }
}

/** A root-cause label (DESIGN §8) in words; an unknown label is shown as it is. */
export function causeLabel(label: string, trans: ITrans = nullTrans): string {
  switch (label) {
    case 'zombie':
      return trans.__('an idle kernel holding GPU memory');
    case 'data_io':
      return trans.__('data loading');
    case 'cpu_serial':
      return trans.__('a CPU-bound loop');
    case 'memory_bandwidth':
      return trans.__('memory-bound kernels');
    case 'small_work':
      return trans.__('too little work per step');
    case 'fragmentation':
      return trans.__('GPUs fragmented across servers');
    default:
      return label.replace(/_/g, ' ');
  }
}

export interface IRootCauseView {
  /** The label in words, e.g. "data loading". */
  label: string;
  /** What to do about it ("" when the governor gave no hint). */
  hint: string;
  /** One line for the warning, tooltip and panel: "Likely cause: …. Hint: …". */
  line: string;
}

/**
 * The verdict's root cause in words, or `null` when the governor names none (no diagnosis,
 * a healthy server, or unknown GPU data: unknown is never blamed).
 */
export function rootCauseView(
  verdict: IVerdict | null | undefined,
  trans: ITrans = nullTrans
): IRootCauseView | null {
  const cause = verdict?.root_cause;
  if (
    !cause ||
    typeof cause.label !== 'string' ||
    !cause.label ||
    cause.label === 'healthy' ||
    cause.label === 'unknown'
  ) {
    return null;
  }
  const label = causeLabel(cause.label, trans);
  const hint = typeof cause.hint === 'string' ? cause.hint.trim() : '';
  const line = hint
    ? trans.__('Likely cause: %1. Hint: %2', label, hint)
    : trans.__('Likely cause: %1', label);
  return { label, hint, line };
}

/** The verdict's right-sizing hint in one line, or `null` when it has none. */
export function rightSizeLine(
  verdict: IVerdict | null | undefined,
  trans: ITrans = nullTrans
): string | null {
  const fit = verdict?.right_size;
  if (!fit || typeof fit.tier !== 'string' || !fit.tier) {
    return null;
  }
  const label = fit.label || fit.tier;
  return fit.reason
    ? trans.__('A smaller GPU would do: %1 (%2).', label, fit.reason)
    : trans.__('A smaller GPU would do: %1.', label);
}

/** The status bar text: "GPU 20.0 GiB · 0%". */
export function statusText(
  report: IStatusReport | null,
  trans: ITrans = nullTrans
): string {
  if (!report) {
    return trans.__('GPU …');
  }
  if (report.backend === 'unavailable') {
    return trans.__('GPU unavailable');
  }
  if (report.backend === 'none' || (report.devices ?? []).length === 0) {
    return trans.__('No GPU');
  }
  return trans.__(
    'GPU %1 · %2',
    formatMemory(serverMemoryMb(report)),
    formatActivity(serverActivity(report))
  );
}

/** One tooltip line per device: a whole GPU or a MIG slice. */
export function deviceLine(device: IDevice, trans: ITrans = nullTrans): string {
  const memory = `${formatMemory(device.memory_used_mb)} / ${formatMemory(device.memory_total_mb)}`;
  const activity =
    device.activity === null || device.activity === undefined
      ? trans.__('activity unknown')
      : trans.__('%1 active', formatActivity(device.activity));
  const shared = device.shared ? trans.__(', shared') : '';
  if (device.mig_profile) {
    // NVML names a MIG instance "<card> MIG 1g.18gb"; say the card once.
    const card = device.name.replace(/\s+MIG\s+\S+$/, '');
    return trans.__(
      'MIG %1 slice of %2: %3, %4%5',
      device.mig_profile,
      card,
      memory,
      activity,
      shared
    );
  }
  return trans.__(
    '%1 (whole GPU): %2, %3%4',
    device.name,
    memory,
    activity,
    shared
  );
}

export function tooltip(
  report: IStatusReport | null,
  options: IViewOptions
): string {
  const trans = tr(options);
  if (!report) {
    return trans.__('GPU status not loaded yet');
  }
  const lines: string[] = [];
  if (report.backend === 'unavailable') {
    lines.push(
      trans.__(
        'GPU data unavailable: %1',
        report.error ?? trans.__('unknown error')
      )
    );
  } else if (report.backend === 'none' || (report.devices ?? []).length === 0) {
    lines.push(trans.__('This server has no GPU.'));
  }
  for (const device of report.devices ?? []) {
    lines.push(deviceLine(device, trans));
  }
  const verdict = report.verdict;
  if (verdict) {
    lines.push(trans.__('Governor: %1', stateLabel(verdict.state, trans)));
    if (verdict.reason) {
      lines.push(verdict.reason);
    }
    const cause = rootCauseView(verdict, trans);
    if (cause) {
      lines.push(cause.line);
    }
    const cull = parseTime(verdict.cull_at);
    if (
      cull !== null &&
      (verdict.state === 'warned' || verdict.state === 'checkpointing')
    ) {
      lines.push(
        trans.__(
          'Deadline %1 (in %2)',
          clockOf(options)(new Date(cull)),
          formatCountdown(cull - options.now)
        )
      );
    }
  } else {
    lines.push(trans.__('Governor: not connected'));
  }
  return lines.join('\n');
}

export interface IStatusView {
  text: string;
  state: ViewState;
  className: string;
  tooltip: string;
}

export function statusView(
  report: IStatusReport | null,
  options: IViewOptions
): IStatusView {
  const state = viewState(report);
  return {
    text: statusText(report, tr(options)),
    state,
    className: `jp-GpuGov-state-${state}`,
    tooltip: tooltip(report, options)
  };
}

// -- panel rows -------------------------------------------------------------------------------

export type TargetState = 'active' | 'idle' | 'unknown';

export interface IPanelRow {
  key: string;
  kind: string;
  id: string;
  title: string;
  /** The notebook or console of a kernel; opening the row opens it. */
  path: string | null;
  devices: string;
  memory: string;
  activity: string;
  history: (number | null)[];
  confidence: string;
  state: TargetState;
  idleFor: string | null;
}

/** Whether a target holds a GPU (memory, a context or a device). */
export function holdsGpu(target: ITarget): boolean {
  const gpu = target.gpu;
  if (!gpu) {
    return false;
  }
  return (
    !!gpu.holds_context ||
    (gpu.memory_mb ?? 0) > 0 ||
    (gpu.devices ?? []).length > 0
  );
}

export function targetState(target: ITarget): TargetState {
  const gpu = target.gpu;
  if (
    !gpu ||
    gpu.sm === null ||
    gpu.sm === undefined ||
    gpu.confidence === 'unknown'
  ) {
    return 'unknown';
  }
  return gpu.idle_since ? 'idle' : 'active';
}

function shortDevice(uuid: string, devices: IDevice[]): string {
  const device = devices.find(d => d.uuid === uuid);
  if (!device) {
    return uuid.slice(0, 12);
  }
  return device.mig_profile ? `${device.mig_profile} (MIG)` : device.name;
}

export function targetTitle(
  target: ITarget,
  trans: ITrans = nullTrans
): string {
  const name = target.name || target.id;
  switch (target.kind) {
    case 'kernel':
      return target.path
        ? trans.__('Kernel %1 · %2', name, target.path)
        : trans.__('Kernel %1', name);
    case 'terminal':
      return trans.__('Terminal %1', name);
    default:
      return trans.__('Other processes of this server');
  }
}

export function panelRows(
  report: IStatusReport | null,
  options: IViewOptions
): IPanelRow[] {
  if (!report) {
    return [];
  }
  const trans = tr(options);
  const devices = report.devices ?? [];
  return (report.targets ?? []).filter(holdsGpu).map(target => {
    const gpu = target.gpu as ITargetGpu;
    const idleSince = parseTime(gpu.idle_since);
    return {
      key: `${target.kind}:${target.id}`,
      kind: target.kind,
      id: target.id,
      title: targetTitle(target, trans),
      path: target.kind === 'kernel' && target.path ? target.path : null,
      devices: (gpu.devices ?? [])
        .map(uuid => shortDevice(uuid, devices))
        .join(', '),
      memory: formatMemory(gpu.memory_mb),
      activity: formatActivity(gpu.sm),
      history: gpu.history ?? [],
      confidence: gpu.confidence ?? 'unknown',
      state: targetState(target),
      idleFor:
        idleSince === null ? null : formatCountdown(options.now - idleSince)
    };
  });
}

/**
 * Sparkline geometry: one SVG polyline `points` string per run of known values (unknown
 * samples break the line rather than drawing a false zero).
 */
export function sparklineSegments(
  history: (number | null)[],
  width: number,
  height: number
): string[] {
  const n = history.length;
  if (n === 0) {
    return [];
  }
  const step = n > 1 ? width / (n - 1) : 0;
  const segments: string[] = [];
  let current: string[] = [];
  history.forEach((value, i) => {
    if (value === null || value === undefined || !Number.isFinite(value)) {
      if (current.length) {
        segments.push(current.join(' '));
      }
      current = [];
      return;
    }
    const v = Math.min(1, Math.max(0, value));
    const x = n > 1 ? i * step : width / 2;
    const y = height - v * height;
    current.push(`${+x.toFixed(1)},${+y.toFixed(1)}`);
  });
  if (current.length) {
    segments.push(current.join(' '));
  }
  return segments;
}

// -- warning ----------------------------------------------------------------------------------

/** Whether the verdict calls for a warning to the user. */
export function isWarning(verdict: IVerdict | null | undefined): boolean {
  return (
    !!verdict &&
    (verdict.state === 'warned' || verdict.state === 'checkpointing')
  );
}

/** Identifies one warning (one deadline): a new cull_at is a new warning. */
export function warningKey(
  verdict: IVerdict | null | undefined
): string | null {
  if (!isWarning(verdict)) {
    return null;
  }
  return verdict?.cull_at ?? verdict?.warn_at ?? 'no-deadline';
}

export type WarningAction = 'raise' | 'update' | 'dismiss' | 'none';

/**
 * What to do with the notification given the key of the one shown (or null) and the new
 * verdict. A changed deadline (extension granted, new idle stretch) replaces the warning.
 */
export function warningAction(
  shownKey: string | null,
  verdict: IVerdict | null | undefined
): WarningAction {
  const key = warningKey(verdict);
  if (key === null) {
    return shownKey === null ? 'none' : 'dismiss';
  }
  if (shownKey === null) {
    return 'raise';
  }
  return shownKey === key ? 'update' : 'raise';
}

function whatHappens(verdict: IVerdict, trans: ITrans): string {
  return verdict.cull_action === 'shutdown-kernels'
    ? trans.__('its GPU kernels will be shut down')
    : trans.__('this server will be stopped');
}

export interface IWarningView {
  key: string;
  /** Short text for the notification (JupyterLab truncates at 140 characters). */
  toast: string;
  /** Longer text for the panel. */
  detail: string;
  countdown: string;
  deadline: string | null;
  extend: IExtendView;
}

export interface IExtendView {
  /** Whether the Extend button is offered. */
  enabled: boolean;
  label: string;
  /** Why it is disabled, or what pressing it does, in plain words. */
  hint: string;
  reason: ReasonMode;
}

export type ReasonMode = 'optional' | 'required';

export function reasonMode(verdict: IVerdict | null | undefined): ReasonMode {
  return verdict?.extension_reason === 'required' ? 'required' : 'optional';
}

export function extendView(
  verdict: IVerdict | null | undefined,
  trans: ITrans = nullTrans
): IExtendView {
  const reason = reasonMode(verdict);
  const step = formatDuration(verdict?.extension_step_s);
  const label = trans.__('Extend %1', step);
  if (
    !verdict ||
    !['idle', 'warned', 'checkpointing'].includes(verdict.state)
  ) {
    return {
      enabled: false,
      label,
      hint: trans.__('Nothing to extend: the GPU is not idle.'),
      reason
    };
  }
  if (verdict.approval_pending) {
    return {
      enabled: false,
      label,
      hint: trans.__(
        'Your extension request is waiting for an administrator. The current deadline applies until they approve it.'
      ),
      reason
    };
  }
  const left = verdict.extensions_left;
  if (left === 0) {
    return {
      enabled: true,
      label: trans.__('Ask for %1 more', step),
      hint: trans.__(
        'You have used all your extensions: an administrator must approve this one.'
      ),
      reason
    };
  }
  const hint =
    left === null || left === undefined
      ? trans.__('Keep the GPU %1 longer.', step)
      : trans._n(
          'Keep the GPU %2 longer (%1 extension left).',
          'Keep the GPU %2 longer (%1 extensions left).',
          left,
          step
        );
  return { enabled: true, label, hint, reason };
}

export function warningView(
  verdict: IVerdict | null | undefined,
  options: IViewOptions
): IWarningView | null {
  const key = warningKey(verdict);
  if (key === null || !verdict) {
    return null;
  }
  const trans = tr(options);
  const cull = parseTime(verdict.cull_at);
  const countdown = cull === null ? '' : formatCountdown(cull - options.now);
  const deadline = cull === null ? null : clockOf(options)(new Date(cull));
  const what = whatHappens(verdict, trans);
  let toast: string;
  if (verdict.state === 'checkpointing') {
    toast = trans.__(
      'GPU idle: saving a checkpoint, then %1 in %2.',
      what,
      countdown
    );
  } else if (cull === null) {
    toast = trans.__('GPU idle: %1 soon unless you extend.', what);
  } else if (cull <= options.now) {
    toast = trans.__('GPU idle: %1 now.', what);
  } else {
    toast = trans.__(
      'GPU idle: %1 in %2 (at %3) unless you extend.',
      what,
      countdown,
      deadline
    );
  }
  if (verdict.approval_pending) {
    toast += ' ' + trans.__('Extension awaits admin approval.');
  }
  if (verdict.dry_run) {
    toast += ' ' + trans.__('(Dry run: nothing will happen.)');
  }
  const detail: string[] = [toast];
  if (verdict.reason) {
    detail.push(verdict.reason);
  }
  const cause = rootCauseView(verdict, trans);
  if (cause) {
    detail.push(cause.line);
  }
  const extend = extendView(verdict, trans);
  detail.push(extend.hint);
  return {
    key,
    toast: toast.length > 140 ? toast.slice(0, 139) + '…' : toast,
    detail: detail.map(sentence).join(' '),
    countdown,
    deadline,
    extend
  };
}

// -- reason prompt ----------------------------------------------------------------------------

export interface IReasonCheck {
  ok: boolean;
  reason: string;
  error: string | null;
}

/**
 * The reason the user typed, against the policy: `null` means they cancelled the prompt
 * (never an extension), blank is fine unless the policy requires a reason.
 */
export function checkReason(
  mode: ReasonMode,
  input: string | null | undefined,
  trans: ITrans = nullTrans
): IReasonCheck {
  if (input === null || input === undefined) {
    return { ok: false, reason: '', error: null };
  }
  const reason = input.trim();
  if (mode === 'required' && !reason) {
    return {
      ok: false,
      reason,
      error: trans.__(
        'This policy needs a reason to extend. Say briefly why you need the GPU.'
      )
    };
  }
  return { ok: true, reason, error: null };
}

// -- outcomes ---------------------------------------------------------------------------------

export type OutcomeKind = 'success' | 'info' | 'warning' | 'error';

export interface IOutcome {
  kind: OutcomeKind;
  message: string;
}

export interface IExtendResponse {
  status?: string;
  message?: string;
  verdict?: IVerdict | null;
}

function refusalInWords(message: string, trans: ITrans): string {
  const lower = message.toLowerCase();
  if (lower.includes('reason is required')) {
    return trans.__(
      'Extension refused: this policy needs a reason. Try again and say why.'
    );
  }
  if (lower.includes('nothing to extend')) {
    return trans.__(
      'Nothing to extend: the governor sees the GPU in use again, so there is no deadline.'
    );
  }
  if (lower.includes('does not report to a governor')) {
    return trans.__(
      'This server is not governed (no GPU governor is configured), so there is nothing to extend.'
    );
  }
  return trans.__('Extension refused: %1', message);
}

/** The extend answer (200 granted / 202 pending / 409 refused, or an error) in plain words. */
export function extendOutcome(
  httpStatus: number,
  body: IExtendResponse | null,
  options: IViewOptions
): IOutcome {
  const trans = tr(options);
  const status = body?.status;
  const verdict = body?.verdict ?? null;
  const message = body?.message ?? '';
  if (httpStatus === 200 || status === 'granted') {
    const cull = parseTime(verdict?.cull_at);
    const left = verdict?.extensions_left;
    const until =
      cull === null
        ? trans.__('Extension granted.')
        : trans.__(
            'Extension granted: the GPU stays with you until %1 (in %2).',
            clockOf(options)(new Date(cull)),
            formatCountdown(cull - options.now)
          );
    const rest =
      left === null || left === undefined
        ? ''
        : left === 0
          ? ' ' +
            trans.__('That was your last one; more needs an administrator.')
          : ' ' + trans._n('%1 extension left.', '%1 extensions left.', left);
    return { kind: 'success', message: until + rest };
  }
  if (httpStatus === 202 || status === 'pending') {
    const cull = parseTime(verdict?.cull_at);
    const deadline =
      cull === null
        ? ''
        : ' ' +
          trans.__(
            'Until then the current deadline (%1) still applies.',
            clockOf(options)(new Date(cull))
          );
    return {
      kind: 'info',
      message:
        trans.__(
          'You have used all your extensions, so an administrator must approve this one.'
        ) + deadline
    };
  }
  if (httpStatus === 409 || status === 'refused') {
    return { kind: 'warning', message: refusalInWords(message, trans) };
  }
  if (httpStatus === 502 || httpStatus === 503 || httpStatus === 504) {
    return {
      kind: 'error',
      message: trans.__(
        'The GPU governor did not answer. Try again in a minute.'
      )
    };
  }
  if (httpStatus === 0) {
    return {
      kind: 'error',
      message: trans.__(
        'Could not reach this server. Check your connection and try again.'
      )
    };
  }
  return {
    kind: 'error',
    message: message
      ? trans.__('Could not extend: %1', message)
      : trans.__('Could not extend (HTTP %1).', httpStatus)
  };
}

/** The checkpoint result, including the documents saved first. */
export function checkpointOutcome(
  manifest: ICheckpointManifest | null,
  saved: { saved: number; failed: string[] },
  error: string | null,
  trans: ITrans = nullTrans
): IOutcome {
  const savedText = saved.saved
    ? ' ' +
      trans._n(
        '%1 unsaved document was saved first.',
        '%1 unsaved documents were saved first.',
        saved.saved
      )
    : '';
  const failedSaves = saved.failed.length
    ? ' ' + trans.__('Could not save: %1.', saved.failed.join(', '))
    : '';
  if (error !== null || !manifest) {
    return {
      kind: 'error',
      message:
        trans.__('Checkpoint failed: %1', error ?? trans.__('no answer')) +
        failedSaves
    };
  }
  const count = (manifest.notebooks ?? []).length;
  if (manifest.status === 'done' && !saved.failed.length) {
    return {
      kind: 'success',
      message:
        trans._n(
          'Checkpoint saved for %1 notebook.',
          'Checkpoint saved for %1 notebooks.',
          count
        ) + savedText
    };
  }
  const errors = checkpointErrors(manifest.errors);
  return {
    kind: manifest.status === 'done' ? 'warning' : 'error',
    message:
      trans.__('Checkpoint incomplete (%1 notebooks saved).', count) +
      (errors.length ? ' ' + errors.join('; ') : '') +
      savedText +
      failedSaves
  };
}

export function stopOutcome(
  httpStatus: number,
  body: { status?: string; message?: string } | null,
  trans: ITrans = nullTrans
): IOutcome {
  if (httpStatus >= 200 && httpStatus < 300 && body?.status === 'stopping') {
    return {
      kind: 'success',
      message: trans.__(
        'The server is stopping and its GPU is given back. Thank you!'
      )
    };
  }
  if (httpStatus === 409) {
    return {
      kind: 'warning',
      message: trans.__(
        'This server is not governed, so it cannot be stopped from here. Use File → Hub Control Panel.'
      )
    };
  }
  return {
    kind: 'error',
    message: body?.message
      ? trans.__('Could not stop the server: %1', body.message)
      : trans.__('Could not stop the server (HTTP %1).', httpStatus)
  };
}

// -- checkpoint request tracking ---------------------------------------------------------------

/**
 * Whether the frontend should save and checkpoint now: the governor asks (`checkpoint ==
 * 'requested'`) and this request (identified by its deadline) was not handled yet.
 */
export function checkpointDue(
  verdict: IVerdict | null | undefined,
  handledKey: string | null
): string | null {
  if (!verdict || verdict.checkpoint !== 'requested') {
    return null;
  }
  const key = `${verdict.cull_at ?? ''}|${verdict.idle_since ?? ''}`;
  return key === handledKey ? null : key;
}

// -- admin decisions on a pending extension -----------------------------------------------------

/**
 * An admin decided on the pending extension between two verdicts: approved when the deadline
 * moved later (or the warning ended), denied when it stayed. `null` when nothing was pending.
 */
export function approvalOutcome(
  previous: IVerdict | null | undefined,
  next: IVerdict | null | undefined,
  options: IViewOptions
): IOutcome | null {
  if (!previous?.approval_pending || !next || next.approval_pending) {
    return null;
  }
  const trans = tr(options);
  const before = parseTime(previous.cull_at);
  const after = parseTime(next.cull_at);
  if (after !== null && before !== null && after > before) {
    return {
      kind: 'success',
      message: trans.__(
        'An administrator approved your extension: the GPU stays with you until %1.',
        clockOf(options)(new Date(after))
      )
    };
  }
  if (!isWarning(next) && next.state !== 'idle') {
    return null; // the GPU is in use again or the server is going: nothing to explain
  }
  return {
    kind: 'warning',
    message:
      before === null
        ? trans.__('An administrator did not approve your extension.')
        : trans.__(
            'An administrator did not approve your extension: the deadline stays at %1. Save your work or checkpoint now.',
            clockOf(options)(new Date(before))
          )
  };
}

// -- coming back after a cull ---------------------------------------------------------------------

/** One checkpoint as GET /jupyter-gpu-gov/checkpoints lists it (newest first). */
export interface ICheckpointSummary {
  id: string;
  reason?: string | null;
  /** Why the governor stopped the server: gpu-idle, max-age, reclaim, admin, inactive. */
  cull_reason?: string | null;
  source?: 'user' | 'frontend' | 'governor' | string | null;
  status?: 'done' | 'failed' | string | null;
  completed_at?: string | null;
  notebooks?: (string | { path: string })[] | null;
  bytes?: number | null;
  /** How many problems the checkpoint had. */
  errors?: number | null;
  /** The one line that brings the saved objects back in a notebook. */
  restore?: string | null;
}

/** What the restore line is when the server does not say. */
export const DEFAULT_RESTORE =
  'from jupyter_gpu_gov import checkpoint; checkpoint.restore()';

/** A checkpoint older than this is not announced any more (the user has moved on). */
export const COMING_BACK_MAX_AGE_MS = 7 * 24 * 3600 * 1000;

/** The most "Open …" buttons the notification offers; the rest are "and N more". */
export const COMING_BACK_MAX_NOTEBOOKS = 3;

/**
 * Whether the governor asked for this checkpoint: its source, or (when an open JupyterLab saved
 * its documents first and took the checkpoint for it, source "frontend") the cull reason the
 * governor passed on. A checkpoint the user asked for has no cull reason.
 */
export function governorCheckpoint(summary: ICheckpointSummary): boolean {
  return summary.source === 'governor' || !!summary.cull_reason;
}

/**
 * The checkpoint to announce when JupyterLab starts, or null: the newest checkpoint, if the
 * governor took it before stopping the previous server (it completed before this server
 * started), it is not too old, and the user did not dismiss it already. Without the server's
 * start time nothing is announced: a checkpoint of this very server is no "coming back".
 */
export function comingBackCheckpoint(
  checkpoints: ICheckpointSummary[] | null | undefined,
  options: {
    /** This server's start (GET /api/status `started`), ms since the epoch. */
    started: number | null;
    now: number;
    dismissed?: readonly string[];
    maxAgeMs?: number;
  }
): ICheckpointSummary | null {
  const list = (checkpoints ?? []).filter(c => c && typeof c.id === 'string');
  if (!list.length || options.started === null) {
    return null;
  }
  // Ids are UTC times (`20261129T134927Z`, then `-2`, `-3`): sorting them sorts by time.
  const newest = list.reduce((a, b) => (b.id > a.id ? b : a));
  const completed = parseTime(newest.completed_at);
  if (
    !governorCheckpoint(newest) ||
    completed === null ||
    completed > options.started ||
    options.now - completed > (options.maxAgeMs ?? COMING_BACK_MAX_AGE_MS) ||
    (options.dismissed ?? []).includes(newest.id)
  ) {
    return null;
  }
  return newest;
}

/** Why the server was stopped, as the end of "Stopped at 14:02 because …". */
export function cullReasonPhrase(
  cullReason: string | null | undefined,
  trans: ITrans = nullTrans
): string | null {
  switch (cullReason) {
    case 'gpu-idle':
      return trans.__('the GPU was idle');
    case 'max-age':
      return trans.__('it reached its maximum age');
    case 'reclaim':
      return trans.__('its borrowed GPU was needed back');
    case 'admin':
      return trans.__('an admin stopped it');
    case 'busy-limit':
      return trans.__('a cell ran for hours with its GPU idle');
    case 'inactive':
      return trans.__('it was inactive');
    default:
      return null;
  }
}

export interface INotebookLink {
  /** The button: "Open train.ipynb". */
  label: string;
  /** The full path, for the tooltip and to open it. */
  path: string;
}

export interface IComingBackView {
  id: string;
  kind: 'info' | 'warning';
  /** "Stopped at 14:02 because the GPU was idle; checkpoint saved." */
  message: string;
  /** At most COMING_BACK_MAX_NOTEBOOKS. */
  notebooks: INotebookLink[];
  /** Saved notebooks beyond those, and the words for them ("and 2 more"); null when none. */
  more: number;
  moreLabel: string | null;
  restore: string;
  problems: number;
  /** Offer "Details" (the manifest): the checkpoint had problems. */
  details: boolean;
}

/** Paths of the saved notebooks, whatever shape the server lists them in. */
export function notebookPaths(
  notebooks: ICheckpointSummary['notebooks'] | ICheckpointManifest['notebooks']
): string[] {
  return (notebooks ?? [])
    .map(n => (typeof n === 'string' ? n : n?.path))
    .filter((p): p is string => typeof p === 'string' && p.length > 0);
}

function baseName(path: string): string {
  const name = path.split('/').filter(Boolean).pop() ?? path;
  return name.length > 32 ? name.slice(0, 31) + '…' : name;
}

/** "Jan 5" in the browser's locale: only to tell another day from today. */
export function defaultDay(date: Date): string {
  return date.toLocaleDateString(undefined, { month: 'short', day: 'numeric' });
}

/** The notification that greets the user after the governor stopped their server. */
export function comingBackView(
  summary: ICheckpointSummary,
  options: IViewOptions & {
    /** Formats a calendar day ("Jan 5"); a stop on another day than today names it. */
    day?: (date: Date) => string;
  }
): IComingBackView {
  const trans = tr(options);
  const completed = parseTime(summary.completed_at);
  let when = '';
  if (completed !== null) {
    const time = clockOf(options)(new Date(completed));
    const day = options.day ?? defaultDay;
    const then = day(new Date(completed));
    when =
      then === day(new Date(options.now))
        ? trans.__('at %1', time)
        : trans.__('on %1 at %2', then, time);
  }
  const problems = Math.max(0, Math.round(summary.errors ?? 0));
  const saved =
    problems > 0
      ? trans._n(
          'checkpoint saved with %1 problem.',
          'checkpoint saved with %1 problems.',
          problems
        )
      : summary.status === 'failed'
        ? trans.__('the checkpoint is incomplete.')
        : trans.__('checkpoint saved.');
  const because = cullReasonPhrase(summary.cull_reason, trans);
  const raw = (summary.reason ?? '').trim();
  let message: string;
  if (because) {
    message = trans.__('Stopped %1 because %2; %3', when, because, saved);
  } else if (raw) {
    const shortened = raw.length > 80 ? raw.slice(0, 79) + '…' : raw;
    message = trans.__('Stopped %1 (%2); %3', when, shortened, saved);
  } else {
    message = trans.__('Stopped %1; %2', when, saved);
  }
  message = message.replace(/\s{2,}/g, ' ').replace(' ;', ';');
  const paths = notebookPaths(summary.notebooks);
  const shown = paths.slice(0, COMING_BACK_MAX_NOTEBOOKS);
  const more = paths.length - shown.length;
  return {
    id: summary.id,
    kind: problems > 0 || summary.status === 'failed' ? 'warning' : 'info',
    message,
    notebooks: shown.map(path => ({
      label: trans.__('Open %1', baseName(path)),
      path
    })),
    more,
    moreLabel: more > 0 ? trans._n('and %1 more', 'and %1 more', more) : null,
    restore: (summary.restore ?? '').trim() || DEFAULT_RESTORE,
    problems,
    details: problems > 0 || summary.status === 'failed'
  };
}

/** The checkpoint ids the user dismissed, from localStorage (anything unreadable: none). */
export function dismissedIds(raw: string | null | undefined): string[] {
  if (!raw) {
    return [];
  }
  try {
    const parsed = JSON.parse(raw);
    return Array.isArray(parsed)
      ? parsed.filter((id): id is string => typeof id === 'string')
      : [];
  } catch {
    return [];
  }
}

/** The dismissed ids with one more, keeping the newest `keep`. */
export function rememberDismissed(
  ids: readonly string[],
  id: string,
  keep = 50
): string[] {
  const next = ids.filter(other => other !== id);
  next.push(id);
  return next.slice(-keep);
}

/** One readable line per problem of a checkpoint (strings, or `{path, error}` objects). */
export function checkpointErrors(
  errors: ICheckpointManifest['errors'] | null | undefined
): string[] {
  return (errors ?? [])
    .map(e =>
      typeof e === 'string'
        ? e
        : [e?.path, e?.error ?? e?.message].filter(Boolean).join(': ')
    )
    .filter(Boolean);
}

export interface IManifestDetails {
  title: string;
  /** The problems, one line each (first in the dialog). */
  problems: string[];
  /** Every saved notebook. */
  notebooks: string[];
  /** Where the checkpoint is on disk, when the manifest says. */
  path: string | null;
  /** The whole manifest, pretty-printed, read-only. */
  json: string;
}

export function manifestDetails(
  id: string,
  manifest: ICheckpointManifest | null,
  trans: ITrans = nullTrans
): IManifestDetails {
  return {
    title: trans.__('Checkpoint %1', id),
    problems: checkpointErrors(manifest?.errors),
    notebooks: notebookPaths(manifest?.notebooks),
    path: typeof manifest?.path === 'string' ? manifest.path : null,
    json: manifest ? JSON.stringify(manifest, null, 2) : ''
  };
}
