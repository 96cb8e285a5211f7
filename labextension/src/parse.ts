/**
 * The status report as read from the wire, before any view sees it: the views trust its shape
 * (a list is a list of objects), so a report that breaks it (a list that is null or a string,
 * a null in a list: a server extension older or newer than this one, or a bug) has those
 * parts dropped here, as unknown, rather than throwing in the view and leaving the panel and
 * status bar blank. Values inside are left to the formatters, which already read anything
 * unreadable as unknown.
 */
import { IStatusReport } from './types';

type Obj = Record<string, unknown>;

function isObject(value: unknown): value is Obj {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** The objects of a list; `undefined` (absent: unknown) when it is no list. */
function objects(value: unknown): Obj[] | undefined {
  return Array.isArray(value) ? value.filter(isObject) : undefined;
}

/** The strings of a list; `undefined` when it is no list. */
function strings(value: unknown): string[] | undefined {
  return Array.isArray(value)
    ? value.filter((v): v is string => typeof v === 'string')
    : undefined;
}

/** `obj` with `key` set to `value`, or without it when `value` is undefined. */
function put(obj: Obj, key: string, value: unknown): Obj {
  const out = { ...obj };
  if (value === undefined) {
    delete out[key];
  } else {
    out[key] = value;
  }
  return out;
}

function readDevice(device: Obj): Obj {
  const health = device.health;
  if (health === undefined || health === null) {
    return device;
  }
  return put(
    device,
    'health',
    isObject(health)
      ? put(health, 'reasons', strings(health.reasons))
      : undefined
  );
}

function readTarget(target: Obj): Obj {
  const gpu = target.gpu;
  if (gpu === undefined || gpu === null) {
    return target;
  }
  if (!isObject(gpu)) {
    return put(target, 'gpu', undefined);
  }
  let read = put(gpu, 'devices', strings(gpu.devices));
  if (gpu.history !== undefined && gpu.history !== null) {
    read = put(
      read,
      'history',
      Array.isArray(gpu.history) ? gpu.history : undefined
    );
  }
  return put(target, 'gpu', read);
}

function readVerdict(verdict: unknown): unknown {
  if (verdict === undefined || verdict === null) {
    return verdict;
  }
  if (!isObject(verdict)) {
    return {}; // a governor answered, with nothing readable: its state is unknown
  }
  const starts = verdict.started_from_line;
  return starts === undefined || starts === null
    ? verdict
    : put(verdict, 'started_from_line', objects(starts));
}

/**
 * A status answer's body as a report, or `null` when it is none (not a JSON object: an HTML
 * error page, a list, a string), which the poll treats as a failed request.
 */
export function readStatusReport(body: unknown): IStatusReport | null {
  if (!isObject(body)) {
    return null;
  }
  let report: Obj = put(
    body,
    'devices',
    objects(body.devices)?.map(readDevice)
  );
  report = put(report, 'targets', objects(body.targets)?.map(readTarget));
  report = put(report, 'verdict', readVerdict(body.verdict));
  for (const part of ['window', 'checkpoint', 'server']) {
    if (
      report[part] !== undefined &&
      report[part] !== null &&
      !isObject(report[part])
    ) {
      report = put(report, part, undefined);
    }
  }
  return report as IStatusReport;
}
