/**
 * Coming back after a cull: which checkpoint to announce when JupyterLab starts, and what the
 * notification and its Details dialog say. Also the phrases the tab after a stop shares.
 */
import {
  defaultDay,
  formatTime,
  isolate,
  IViewOptions,
  parseTime,
  shorten,
  transOf
} from '../format';
import { ITrans, nullTrans } from '../trans';
import { ICheckpointManifest, ICheckpointSummary } from '../types';

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
export function governorCheckpoint(summary: {
  source?: string | null;
  cull_reason?: string | null;
}): boolean {
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

/** Why the server was stopped, as the end of "… stopped at 14:02 because …". */
export function cullReasonPhrase(
  cullReason: string | null | undefined,
  trans: ITrans = nullTrans
): string | null {
  switch (cullReason) {
    case 'gpu-idle':
      return trans.__('its GPU was idle');
    case 'max-age':
      return trans.__('it reached its maximum age');
    case 'reclaim':
      return trans.__('its borrowed GPU was needed back');
    case 'admin':
      return trans.__('an administrator stopped it');
    case 'busy-limit':
      return trans.__('a cell ran for hours with its GPU idle');
    case 'inactive':
      return trans.__('it was inactive');
    case 'unclaimed':
      return trans.__(
        'it started from the line for a GPU and was not opened in time'
      );
    default:
      return null;
  }
}

/** "at 14:02" today, "on Jan 5, 14:02" another day. */
export function atTime(ms: number, options: IViewOptions): string {
  const trans = transOf(options);
  const day = options.day ?? defaultDay;
  const sameDay = day(new Date(ms)) === day(new Date(options.now));
  return sameDay
    ? trans.__('at %1', formatTime(ms, options))
    : trans.__('on %1', formatTime(ms, options));
}

/** "checkpoint saved", "checkpoint saved with 2 problems", "the checkpoint is incomplete". */
export function checkpointPhrase(
  status: string | null | undefined,
  problems: number,
  trans: ITrans = nullTrans
): string {
  if (problems > 0) {
    return trans._n(
      'checkpoint saved with %1 problem',
      'checkpoint saved with %1 problems',
      problems
    );
  }
  return status === 'failed'
    ? trans.__('the checkpoint is incomplete')
    : trans.__('checkpoint saved');
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
  /** "Stopped at 14:02 because its GPU was idle; checkpoint saved." */
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
  return (Array.isArray(notebooks) ? notebooks : [])
    .map(n => (typeof n === 'string' ? n : n?.path))
    .filter((p): p is string => typeof p === 'string' && p.length > 0);
}

function baseName(path: string): string {
  return shorten(path.split('/').filter(Boolean).pop() ?? path, 32);
}

/** The notification that greets the user after the governor stopped their server. */
export function comingBackView(
  summary: ICheckpointSummary,
  options: IViewOptions
): IComingBackView {
  const trans = transOf(options);
  const completed = parseTime(summary.completed_at);
  const when = completed === null ? '' : atTime(completed, options);
  // The summary's words come from a manifest in the user's folder, as it was written (an
  // edit, a disk that filled): anything but a string is none.
  const problems =
    typeof summary.errors === 'number' && Number.isFinite(summary.errors)
      ? Math.max(0, Math.round(summary.errors))
      : 0;
  const saved = checkpointPhrase(summary.status, problems, trans);
  const because = cullReasonPhrase(summary.cull_reason, trans);
  const raw = typeof summary.reason === 'string' ? summary.reason.trim() : '';
  let message: string;
  if (because) {
    message = trans.__('Stopped %1 because %2; %3.', when, because, saved);
  } else if (raw) {
    message = trans.__(
      'Stopped %1 (%2); %3.',
      when,
      isolate(shorten(raw, 80)),
      saved
    );
  } else {
    message = trans.__('Stopped %1; %2.', when, saved);
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
    restore:
      (typeof summary.restore === 'string' && summary.restore.trim()) ||
      DEFAULT_RESTORE,
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
  return (Array.isArray(errors) ? errors : [])
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
