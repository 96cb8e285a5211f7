/**
 * The GPU panel: at most three lines that say where this server stands, the buttons that can
 * act now, the kernels and terminals holding a GPU, and the details folded away.
 */
import {
  formatActivity,
  formatCountdown,
  formatDuration,
  formatMemory,
  formatSince,
  formatTime,
  IViewOptions,
  parseTime,
  transOf
} from '../format';
import { ITrans, nullTrans } from '../trans';
import { IDevice, IStatusReport, ITarget, ITargetGpu } from '../types';
import {
  deviceLine,
  serverActivity,
  serverMemoryMb,
  statusText
} from './status';
import {
  deviceName,
  governorState,
  healthAlert,
  isWarning,
  reasonText,
  rightSizeLine,
  rootCauseView,
  stateLabel,
  viewState,
  ViewState
} from './verdict';
import {
  extendView,
  hasDeadline,
  reclaimWithdrawnLine,
  warningView
} from './warning';

/** The panel says this much before its buttons. */
export const PANEL_LINES = 3;

export type LineTone = 'state' | 'alert' | 'note';

export interface IPanelLine {
  text: string;
  tone: LineTone;
}

export type PanelAction = 'extend' | 'checkpoint' | 'stop';

export interface IPanelButton {
  action: PanelAction;
  label: string;
  /** What pressing it does, or why it cannot act now. */
  hint: string;
  enabled: boolean;
  style: 'accept' | 'warn' | 'plain';
}

export interface IPanelFact {
  label: string;
  value: string;
}

export type TargetState = 'active' | 'idle' | 'unknown';

export interface IPanelRow {
  key: string;
  kind: string;
  title: string;
  /** The notebook or console of a kernel; opening the row opens it. */
  path: string | null;
  devices: string;
  memory: string;
  activity: string;
  history: (number | null)[];
  confidence: string;
  state: TargetState;
  stateLabel: string;
  /** "idle 4m 12s", or null while active or unknown. */
  idleFor: string | null;
}

export interface IPanelView {
  /** The header's short status: "GPU 20.0 GiB · 0%". */
  summary: string;
  tone: ViewState;
  /** At most PANEL_LINES, most important first. */
  lines: IPanelLine[];
  buttons: IPanelButton[];
  rows: IPanelRow[];
  /** Folded away: the governor's facts and each device. */
  facts: IPanelFact[];
  devices: string[];
  /** Something counts down: render again each second. */
  ticking: boolean;
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

export function targetTitle(
  target: ITarget,
  trans: ITrans = nullTrans
): string {
  const name = target.name || target.id;
  switch (target.kind) {
    case 'kernel':
      return target.path || trans.__('Kernel %1', name);
    case 'terminal':
      return trans.__('Terminal %1', name);
    default:
      return trans.__('Other processes of this server');
  }
}

function shortDevice(uuid: string, devices: IDevice[]): string {
  const device = devices.find(d => d.uuid === uuid);
  return device ? deviceName(device) : uuid.slice(0, 12);
}

export function panelRows(
  report: IStatusReport | null,
  options: IViewOptions
): IPanelRow[] {
  if (!report) {
    return [];
  }
  const trans = transOf(options);
  const devices = report.devices ?? [];
  return (report.targets ?? []).filter(holdsGpu).map(target => {
    const gpu = target.gpu as ITargetGpu;
    const idleSince = parseTime(gpu.idle_since);
    const state = targetState(target);
    return {
      key: `${target.kind}:${target.id}`,
      kind: target.kind ?? 'other',
      title: targetTitle(target, trans),
      path: target.kind === 'kernel' && target.path ? target.path : null,
      devices: (gpu.devices ?? [])
        .map(uuid => shortDevice(uuid, devices))
        .join(', '),
      memory: formatMemory(gpu.memory_mb),
      activity: formatActivity(gpu.sm),
      history: gpu.history ?? [],
      confidence: gpu.confidence ?? 'unknown',
      state,
      stateLabel: stateLabel(state, trans),
      idleFor:
        idleSince === null || state !== 'idle'
          ? null
          : trans.__('idle %1', formatSince(idleSince, options.now))
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

/** The first line: where this server stands, in one sentence. */
function stateSentence(report: IStatusReport, options: IViewOptions): string {
  const trans = transOf(options);
  const { now } = options;
  if (report.backend === 'unavailable') {
    return trans.__(
      'GPU data unavailable: %1',
      report.error ?? trans.__('unknown error')
    );
  }
  if (report.backend === 'none' || !(report.devices ?? []).length) {
    return trans.__('This server has no GPU.');
  }
  const verdict = report.verdict;
  const state = governorState(report);
  const idleSince = parseTime(
    verdict?.idle_since ?? report.window?.gpu_idle_since
  );
  const idleFor =
    idleSince === null
      ? trans.__('GPU idle.')
      : trans.__('GPU idle for %1.', formatSince(idleSince, now));
  if (isWarning(verdict)) {
    return warningView(verdict, options)?.toast ?? idleFor;
  }
  switch (state) {
    case 'active':
      return trans.__('GPU in use.');
    case 'idle': {
      const warnAt = parseTime(verdict?.warn_at);
      return warnAt !== null && warnAt > now
        ? trans.__(
            '%1 A warning follows at %2 unless it is used.',
            idleFor,
            formatTime(warnAt, options)
          )
        : idleFor;
    }
    case 'busy':
      return trans.__('A cell is running, but the GPU is idle.');
    case 'culled':
      return trans.__('The GPU governor is stopping this server.');
    case 'exempt':
      return trans.__('This server is exempt from idle culling.');
    case 'gpu-failed':
      return trans.__(
        'This server’s GPU failed: save your work. It is not culled as idle.'
      );
    default:
      return verdict
        ? trans.__('GPU activity unknown: nothing is decided on unknown data.')
        : trans.__('GPU activity unknown.');
  }
}

function panelLines(
  report: IStatusReport | null,
  error: string | null,
  options: IViewOptions
): IPanelLine[] {
  const trans = transOf(options);
  if (!report) {
    return [
      error
        ? {
            text: trans.__('GPU status unavailable: %1', error),
            tone: 'alert'
          }
        : { text: trans.__('Loading GPU status…'), tone: 'note' }
    ];
  }
  const verdict = report.verdict;
  const lines: IPanelLine[] = [];
  const health = healthAlert(report, options);
  if (health) {
    lines.push({ text: health.line, tone: 'alert' });
  }
  lines.push({
    text: stateSentence(report, options),
    tone:
      isWarning(verdict) || verdict?.state === 'gpu-failed' ? 'alert' : 'state'
  });
  if (error) {
    lines.push({
      text: trans.__('Showing the last status: %1', error),
      tone: 'alert'
    });
  }
  const lifted = parseTime(verdict?.reclaim_withdrawn);
  if (lifted !== null && !isWarning(verdict)) {
    lines.push({ text: reclaimWithdrawnLine(lifted, options), tone: 'note' });
  }
  const cause = rootCauseView(verdict, trans);
  if (cause) {
    // The hint (what to do) is in the details: a line stays a line.
    lines.push({
      text: trans.__('Likely cause: %1.', cause.label),
      tone: 'note'
    });
  } else if (
    verdict &&
    !['active', 'warned', 'checkpointing'].includes(verdict.state ?? 'unknown')
  ) {
    const reason = reasonText(verdict, options);
    if (reason) {
      lines.push({ text: reason, tone: 'note' });
    }
  }
  const fit = rightSizeLine(verdict, trans);
  if (fit) {
    lines.push({ text: fit, tone: 'note' });
  }
  if (!verdict && report.devices?.length) {
    lines.push({
      text: trans.__('No GPU governor: nothing is culled.'),
      tone: 'note'
    });
  }
  return lines.slice(0, PANEL_LINES);
}

function panelButtons(
  report: IStatusReport | null,
  trans: ITrans
): IPanelButton[] {
  if (!report) {
    return [];
  }
  const verdict = report.verdict;
  const buttons: IPanelButton[] = [];
  if (hasDeadline(verdict)) {
    const extend = extendView(verdict, trans);
    buttons.push({
      action: 'extend',
      label: extend.label,
      hint: extend.hint,
      enabled: extend.enabled,
      style: 'accept'
    });
  }
  buttons.push({
    action: 'checkpoint',
    label: trans.__('Checkpoint'),
    hint: trans.__('Save open documents and checkpoint every notebook now'),
    enabled: true,
    style: 'plain'
  });
  if (verdict) {
    buttons.push({
      action: 'stop',
      label: trans.__('Stop server'),
      hint: trans.__('Give the GPU back now (asks for confirmation)'),
      enabled: true,
      style: 'warn'
    });
  }
  return buttons;
}

function panelFacts(
  report: IStatusReport | null,
  options: IViewOptions
): IPanelFact[] {
  if (!report) {
    return [];
  }
  const trans = transOf(options);
  const { now } = options;
  const verdict = report.verdict;
  const facts: IPanelFact[] = [];
  const fact = (label: string, value: string | null | undefined) => {
    if (value) {
      facts.push({ label, value });
    }
  };
  const state = governorState(report);
  fact(
    trans.__('Governor'),
    verdict
      ? stateLabel(state, trans) +
          (verdict.dry_run ? ' ' + trans.__('(dry run)') : '')
      : trans.__('not connected (%1)', stateLabel(state, trans))
  );
  fact(trans.__('Policy'), verdict?.policy);
  fact(trans.__('Why'), reasonText(verdict, options));
  const idle = parseTime(verdict?.idle_since ?? report.window?.gpu_idle_since);
  if (idle !== null) {
    fact(
      trans.__('GPU idle since'),
      trans.__('%1 (%2 ago)', formatTime(idle, options), formatSince(idle, now))
    );
  }
  const warnAt = parseTime(verdict?.warn_at);
  if (warnAt !== null && warnAt > now) {
    fact(
      trans.__('Warning at'),
      trans.__(
        '%1 (in %2)',
        formatTime(warnAt, options),
        formatCountdown(warnAt - now)
      )
    );
  }
  const cull = parseTime(verdict?.cull_at);
  if (cull !== null) {
    fact(
      trans.__('Deadline'),
      trans.__(
        '%1 (in %2)',
        formatTime(cull, options),
        formatCountdown(cull - now)
      )
    );
  }
  const left = verdict?.extensions_left;
  if (verdict && typeof left === 'number') {
    fact(
      trans.__('Extensions'),
      verdict.approval_pending
        ? trans.__('one waits for an administrator')
        : trans._n(
            '%1 left, %2 each',
            '%1 left, %2 each',
            left,
            formatDuration(verdict.extension_step_s)
          )
    );
  }
  const cause = rootCauseView(verdict, trans);
  if (cause) {
    fact(trans.__('Likely cause'), cause.label);
    fact(trans.__('What to do'), cause.hint);
  }
  fact(trans.__('Right size'), rightSizeLine(verdict, trans));
  return facts;
}

export function panelView(
  report: IStatusReport | null,
  options: IViewOptions & { error?: string | null }
): IPanelView {
  const trans = transOf(options);
  const error = options.error ?? null;
  const verdict = report?.verdict;
  const devices = (report?.devices ?? []).map(device => {
    const reasons = (device.health?.reasons ?? []).filter(
      r => typeof r === 'string'
    );
    const line = deviceLine(device, trans);
    return reasons.length ? `${line} (${reasons.join('; ')})` : line;
  });
  const known = !!report?.devices?.length && report.backend !== 'unavailable';
  return {
    // The panel's title says GPU already: "20.0 GiB · 0%".
    summary:
      report && known
        ? `${formatMemory(serverMemoryMb(report))} · ${formatActivity(serverActivity(report))}`
        : statusText(report, trans),
    tone: viewState(report),
    lines: panelLines(report, error, options),
    buttons: panelButtons(report, trans),
    rows: panelRows(report, options),
    facts: panelFacts(report, options),
    devices,
    ticking:
      !!report &&
      (hasDeadline(verdict) ||
        !!verdict?.idle_since ||
        !!report.window?.gpu_idle_since)
  };
}
