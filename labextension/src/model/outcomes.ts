/**
 * What happened after a person pressed a button (Extend, Checkpoint, Stop) or an admin decided
 * on their extension, in plain words, and when the governor's checkpoint request is due.
 */
import {
  formatCountdown,
  formatTime,
  IViewOptions,
  parseTime,
  shorten,
  transOf
} from '../format';
import { ITrans, nullTrans } from '../trans';
import {
  ICheckpointManifest,
  IExtendResponse,
  IStopResponse,
  IVerdict
} from '../types';
import { checkpointErrors } from './comeback';
import { isWarning } from './verdict';

export type OutcomeKind = 'success' | 'info' | 'warning' | 'error';

export interface IOutcome {
  kind: OutcomeKind;
  message: string;
}

function refusalInWords(message: string, trans: ITrans): string {
  if (!message) {
    return trans.__('Extension refused.');
  }
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

/**
 * The seconds of a `Retry-After` header (the governor's, passed on by the server), or null:
 * none, or an HTTP date (the governor sends seconds).
 */
export function retryAfterSeconds(
  value: string | null | undefined
): number | null {
  const text = (value ?? '').trim();
  return /^\d{1,6}$/.test(text) ? Number(text) : null;
}

/**
 * A 429: the governor asked for a pause (too many requests from this user just now; its
 * `api_budget`). Nothing was done, nothing is wrong: said as information, with the wait: its
 * `Retry-After`, else the seconds its message names (a server from before the header was
 * passed on).
 */
function throttledOutcome(
  message: string,
  trans: ITrans,
  retryAfter: number | null
): IOutcome {
  const wait =
    retryAfter !== null
      ? String(retryAfter)
      : /send again in (\d+) s/.exec(message)?.[1];
  return {
    kind: 'info',
    message: wait
      ? trans.__(
          'The GPU governor had many requests from you just now, so nothing was done. Try again in %1 s.',
          wait
        )
      : trans.__(
          'The GPU governor had many requests from you just now, so nothing was done. Try again in a minute.'
        )
  };
}

/**
 * An answer's message, or "": the server's body as it came (an error page's JSON, a proxy's),
 * where a message that is no string made the words throw and no notification came.
 */
function messageOf(body: { message?: unknown } | null | undefined): string {
  const message = body?.message;
  return typeof message === 'string' ? message.trim() : '';
}

/** The extend answer (200 granted / 202 pending / 409 refused, or an error) in plain words. */
export function extendOutcome(
  httpStatus: number,
  body: IExtendResponse | null,
  options: IViewOptions,
  retryAfter: number | null = null
): IOutcome {
  const trans = transOf(options);
  const status = body?.status;
  const verdict = body?.verdict ?? null;
  const message = messageOf(body);
  if (httpStatus === 200 || status === 'granted') {
    const cull = parseTime(verdict?.cull_at);
    const left = verdict?.extensions_left;
    const until =
      cull === null
        ? trans.__('Extension granted.')
        : trans.__(
            'Extension granted: the GPU stays with you until %1 (in %2).',
            formatTime(cull, options),
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
            formatTime(cull, options)
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
  if (httpStatus === 429) {
    return throttledOutcome(message, trans, retryAfter);
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
  // The first few, briefly: a notification stays until closed, and a hook's error can be
  // pages long (the whole manifest is in the checkpoint's details).
  const errors = checkpointErrors(manifest.errors);
  const shown = errors.slice(0, 3).map(error => shorten(error, 300));
  const more = errors.length - shown.length;
  return {
    kind: manifest.status === 'done' ? 'warning' : 'error',
    message:
      trans.__('Checkpoint incomplete (%1 notebooks saved).', count) +
      (shown.length ? ' ' + shown.join('; ') : '') +
      (more > 0 ? '; ' + trans.__('and %1 more', more) : '') +
      savedText +
      failedSaves
  };
}

export function stopOutcome(
  httpStatus: number,
  body: IStopResponse | null,
  trans: ITrans = nullTrans,
  retryAfter: number | null = null
): IOutcome {
  if (httpStatus >= 200 && httpStatus < 300 && body?.status === 'stopping') {
    return {
      kind: 'success',
      message: trans.__(
        'The server is stopping and its GPU is given back. Thank you!'
      )
    };
  }
  const message = messageOf(body);
  if (httpStatus === 429) {
    return throttledOutcome(message, trans, retryAfter);
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
    message: message
      ? trans.__('Could not stop the server: %1', message)
      : trans.__('Could not stop the server (HTTP %1).', httpStatus)
  };
}

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
  const trans = transOf(options);
  const before = parseTime(previous.cull_at);
  const after = parseTime(next.cull_at);
  if (after !== null && before !== null && after > before) {
    return {
      kind: 'success',
      message: trans.__(
        'An administrator approved your extension: the GPU stays with you until %1.',
        formatTime(after, options)
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
            formatTime(before, options)
          )
  };
}
