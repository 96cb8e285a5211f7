/**
 * The status bar item: "GPU 20.0 GiB · 0%", coloured by the governor's state, with a tooltip
 * that lists the devices and what the governor decided.
 */
import {
  formatActivity,
  formatCountdown,
  formatMemory,
  formatTime,
  IViewOptions,
  parseTime,
  transOf
} from '../format';
import { ITrans, nullTrans } from '../trans';
import { IDevice, IStatusReport } from '../types';
import {
  healthAlert,
  isWarning,
  reasonText,
  rootCauseView,
  stateLabel,
  ViewState,
  viewState
} from './verdict';
import { reclaimWithdrawnLine } from './warning';

function known(values: (number | null | undefined)[]): number[] {
  return values.filter(
    (v): v is number => typeof v === 'number' && Number.isFinite(v)
  );
}

/** GPU memory this server holds: its targets' memory, else the devices' use. */
export function serverMemoryMb(report: IStatusReport): number | null {
  const fromTargets = known((report.targets ?? []).map(t => t.gpu?.memory_mb));
  if (fromTargets.length) {
    return fromTargets.reduce((a, b) => a + b, 0);
  }
  const fromDevices = known((report.devices ?? []).map(d => d.memory_used_mb));
  return fromDevices.length ? fromDevices.reduce((a, b) => a + b, 0) : null;
}

/** GPU activity now: the busiest device, else the busiest target (MIG has no device value). */
export function serverActivity(report: IStatusReport): number | null {
  const fromDevices = known((report.devices ?? []).map(d => d.activity));
  if (fromDevices.length) {
    return Math.max(...fromDevices);
  }
  const fromTargets = known((report.targets ?? []).map(t => t.gpu?.sm));
  return fromTargets.length ? Math.max(...fromTargets) : null;
}

/** "GPU 20.0 GiB · 0%", "No GPU", "GPU unavailable". */
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

/** One line per device: a whole GPU or a MIG slice. */
export function deviceLine(device: IDevice, trans: ITrans = nullTrans): string {
  const memory = `${formatMemory(device.memory_used_mb)} / ${formatMemory(device.memory_total_mb)}`;
  const activity =
    device.activity === null || device.activity === undefined
      ? trans.__('activity unknown')
      : trans.__('%1 active', formatActivity(device.activity));
  const shared = device.shared ? trans.__(', shared') : '';
  const sick =
    device.health?.status === 'unhealthy' ? trans.__(', UNHEALTHY') : '';
  if (device.mig_profile) {
    // NVML names a MIG instance "<card> MIG 1g.18gb"; say the card once.
    const card = (device.name ?? '').replace(/\s+MIG\s+\S+$/, '');
    if (!card) {
      return trans.__(
        'MIG %1 slice: %2, %3%4%5',
        device.mig_profile,
        memory,
        activity,
        shared,
        sick
      );
    }
    return trans.__(
      'MIG %1 slice of %2: %3, %4%5%6',
      device.mig_profile,
      card,
      memory,
      activity,
      shared,
      sick
    );
  }
  // A product name NVML could not read is null on the wire: the device by its UUID.
  return trans.__(
    '%1 (whole GPU): %2, %3%4%5',
    device.name || device.uuid || trans.__('GPU'),
    memory,
    activity,
    shared,
    sick
  );
}

/**
 * When a reclaim of this server's borrowed GPU was withdrawn, while the governor says so (the
 * verdict's `reclaim_withdrawn`: 15 minutes) and no warning stands: the item the warning
 * coloured says why it no longer does. `null` otherwise.
 */
export function reclaimLifted(report: IStatusReport | null): number | null {
  const verdict = report?.verdict;
  return isWarning(verdict) ? null : parseTime(verdict?.reclaim_withdrawn);
}

export function tooltip(
  report: IStatusReport | null,
  options: IViewOptions
): string {
  const trans = transOf(options);
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
  const health = healthAlert(report, options);
  if (health) {
    lines.push(health.line);
  }
  const verdict = report.verdict;
  if (!verdict) {
    lines.push(trans.__('Governor: not connected'));
    return lines.join('\n');
  }
  lines.push(
    trans.__('Governor: %1', stateLabel(verdict.state ?? 'unknown', trans))
  );
  const reason = reasonText(verdict, options);
  if (reason) {
    lines.push(reason);
  }
  const lifted = reclaimLifted(report);
  if (lifted !== null) {
    lines.push(reclaimWithdrawnLine(lifted, options));
  }
  const cause = rootCauseView(verdict, trans);
  if (cause) {
    lines.push(cause.line);
  }
  const cull = parseTime(verdict.cull_at);
  if (cull !== null && isWarning(verdict)) {
    lines.push(
      trans.__(
        'Deadline %1 (in %2)',
        formatTime(cull, options),
        formatCountdown(cull - options.now)
      )
    );
  }
  return lines.join('\n');
}

export interface IStatusView {
  text: string;
  state: ViewState | 'stopped';
  className: string;
  tooltip: string;
}

export function statusView(
  report: IStatusReport | null,
  options: IViewOptions & { stopped?: boolean; error?: string | null }
): IStatusView {
  const trans = transOf(options);
  if (options.stopped) {
    return {
      text: trans.__('GPU: server stopped'),
      state: 'stopped',
      className: 'jp-GpuGov-state-stopped',
      tooltip: trans.__('This server is not running; its GPU is given back.')
    };
  }
  const state = viewState(report);
  let tip = tooltip(report, options);
  if (options.error) {
    tip += '\n' + trans.__('Last update failed: %1', options.error);
  }
  const text = statusText(report, trans);
  return {
    text:
      reclaimLifted(report) === null
        ? text
        : trans.__('%1 · reclaim lifted', text),
    state,
    className: `jp-GpuGov-state-${state}`,
    tooltip: tip
  };
}
