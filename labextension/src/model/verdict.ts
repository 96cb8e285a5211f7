/**
 * The governor's verdict and the devices' health in words: the state, its label, the likely
 * cause, the smaller tier the work would fit. Shared by the status bar, panel and warning.
 */
import { isolate, IViewOptions, localizeTimes, transOf } from '../format';
import { ITrans, nullTrans } from '../trans';
import { GovState, IDevice, IStatusReport, IVerdict } from '../types';

const GOV_STATES: readonly string[] = [
  'active',
  'idle',
  'busy',
  'warned',
  'checkpointing',
  'culled',
  'exempt',
  'unknown',
  'gpu-failed'
];

/** The governor's state, or (no governor) one derived from the local window. */
export function governorState(report: IStatusReport | null): GovState {
  if (!report) {
    return 'unknown';
  }
  const verdict = report.verdict;
  if (verdict) {
    return GOV_STATES.includes(verdict.state ?? '')
      ? (verdict.state as GovState)
      : 'unknown';
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

/** The five colours of the status bar item. */
export type ViewState = 'active' | 'idle' | 'warned' | 'exempt' | 'unknown';

export function viewState(report: IStatusReport | null): ViewState {
  const state = governorState(report);
  switch (state) {
    case 'warned':
    case 'checkpointing':
    case 'culled':
    case 'gpu-failed':
      return 'warned';
    case 'busy':
      return 'idle';
    case 'active':
    case 'idle':
    case 'exempt':
      return state;
    default:
      return 'unknown';
  }
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
    case 'gpu-failed':
      return trans.__('GPU failed');
    default:
      return trans.__('unknown');
  }
}

/** Whether the verdict calls for a warning to the user: an idle cull, or a hard deadline
 * announced, whatever the GPU does (a busy or active server's maximum age, a reclaim). */
export function isWarning(verdict: IVerdict | null | undefined): boolean {
  return (
    !!verdict &&
    (verdict.state === 'warned' ||
      verdict.state === 'checkpointing' ||
      isHardDeadline(verdict))
  );
}

/** A hard deadline announced to the owner, still ahead of the server. */
export function isHardDeadline(verdict: IVerdict | null | undefined): boolean {
  return (
    !!verdict?.hard_deadline &&
    !!verdict.cull_at &&
    !['culled', 'exempt'].includes(verdict.state ?? 'unknown')
  );
}

/**
 * The verdict's reason with its UTC times in the person's clock ("" when none), as its own
 * bidi isolate: a reason names people and teams ("culled by user:…"), and a bidi control in
 * one (U+202E) must not reorder the sentence the reason is shown in.
 */
export function reasonText(
  verdict: IVerdict | null | undefined,
  options: IViewOptions
): string {
  const reason =
    typeof verdict?.reason === 'string' ? verdict.reason.trim() : '';
  return reason ? isolate(localizeTimes(reason, options)) : '';
}

/** A root-cause label in words (docs/api.md lists them); an unknown label as it is. */
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
  /** One line: "Likely cause: …. Hint: …". */
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

/** "This work would fit H100 MIG 1g.10gb: …", or null when the governor suggests nothing. */
export function rightSizeLine(
  verdict: IVerdict | null | undefined,
  trans: ITrans = nullTrans
): string | null {
  const fit = verdict?.right_size;
  if (!fit || typeof fit !== 'object') {
    return null;
  }
  const label =
    (typeof fit.label === 'string' && fit.label.trim()) ||
    (typeof fit.tier === 'string' && fit.tier.trim()) ||
    '';
  if (!label) {
    return null;
  }
  const reason = typeof fit.reason === 'string' ? fit.reason.trim() : '';
  return reason
    ? trans.__('This work would fit %1: %2', label, reason)
    : trans.__('This work would fit %1.', label);
}

/** A device by the name people know it: its MIG profile, or its product name. */
export function deviceName(device: IDevice): string {
  return device.mig_profile
    ? `${device.mig_profile} (MIG)`
    : (device.name ?? device.uuid ?? '');
}

export interface IHealthAlert {
  /** "H100 80GB is unhealthy: XID 79: GPU fell off the bus". */
  line: string;
  devices: string[];
}

/** The devices reported unhealthy, in one line; null when none is. */
export function healthAlert(
  report: IStatusReport | null,
  options: { trans?: ITrans }
): IHealthAlert | null {
  const trans = transOf(options);
  const sick = (report?.devices ?? []).filter(
    d => d.health?.status === 'unhealthy'
  );
  if (!sick.length) {
    return null;
  }
  const names = sick.map(deviceName);
  const reasons: string[] = [];
  for (const device of sick) {
    for (const reason of device.health?.reasons ?? []) {
      // (Each its own isolate: a server's own report writes them.)
      if (
        typeof reason === 'string' &&
        reason.trim() &&
        !reasons.includes(isolate(reason.trim()))
      ) {
        reasons.push(isolate(reason.trim()));
      }
    }
  }
  const who =
    sick.length === 1
      ? trans.__('GPU %1 is unhealthy', names[0])
      : trans.__('GPUs %1 are unhealthy', names.join(', '));
  const line = reasons.length
    ? trans.__(
        '%1: %2. Save your work and restart the server.',
        who,
        reasons.join('; ')
      )
    : trans.__('%1. Save your work and restart the server.', who);
  return { line, devices: names };
}
