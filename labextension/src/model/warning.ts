/**
 * The idle warning: when to raise, update or dismiss the notification, what it says, and the
 * Extend button (with the reason the policy may require).
 */
import {
  formatCountdown,
  formatDuration,
  formatTime,
  IViewOptions,
  parseTime,
  shorten,
  transOf
} from '../format';
import { ITrans, nullTrans } from '../trans';
import { IVerdict } from '../types';
import { isHardDeadline, isWarning } from './verdict';

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
 * What to do with the notification given the key of the one shown (or null), its verdict, and
 * the new verdict. A changed deadline (extension granted, new idle stretch) replaces the
 * warning; one only moved later on the same warning is updated in place.
 */
export function warningAction(
  shownKey: string | null,
  verdict: IVerdict | null | undefined,
  shown?: IVerdict | null
): WarningAction {
  const key = warningKey(verdict);
  if (key === null) {
    return shownKey === null ? 'none' : 'dismiss';
  }
  if (shownKey === null) {
    return 'raise';
  }
  return shownKey === key || movedLater(shown, verdict) ? 'update' : 'raise';
}

/**
 * Whether `next` is the warning `shown` with only its deadline moved later, as the owner's own
 * work does (a cell they run after the warning: its full notice counts from then): the same
 * idle stretch and kind of deadline, no extension. Still one warning, not a new one.
 */
function movedLater(
  shown: IVerdict | null | undefined,
  next: IVerdict | null | undefined
): boolean {
  const before = parseTime(shown?.cull_at);
  const after = parseTime(next?.cull_at);
  return (
    !!shown &&
    !!next &&
    before !== null &&
    after !== null &&
    after > before &&
    shown.idle_since === next.idle_since &&
    shown.extensions_left === next.extensions_left &&
    shown.approval_pending === next.approval_pending &&
    !!shown.hard_deadline === !!next.hard_deadline &&
    (shown.at_deadline ?? null) === (next.at_deadline ?? null)
  );
}

/**
 * What comes at the deadline, as the start of "… in 4m 12s": a running cell's limit that
 * interrupts it and keeps the server (`at_deadline`), else what a cull does to this server.
 */
export function whatHappens(verdict: IVerdict, trans: ITrans): string {
  if (verdict.at_deadline === 'interrupt') {
    return trans.__('the running cell will be interrupted and checkpointed');
  }
  return verdict.cull_action === 'shutdown-kernels'
    ? trans.__('its GPU kernels will be shut down')
    : trans.__('this server will be stopped');
}

export type ReasonMode = 'optional' | 'required';

export function reasonMode(verdict: IVerdict | null | undefined): ReasonMode {
  return verdict?.extension_reason === 'required' ? 'required' : 'optional';
}

export interface IExtendView {
  /** Whether the Extend button can act. */
  enabled: boolean;
  label: string;
  /** Why it is disabled, or what pressing it does, in plain words. */
  hint: string;
  reason: ReasonMode;
}

/** Whether there is a deadline to extend (the GPU is idle on the governor's clock). */
export function hasDeadline(verdict: IVerdict | null | undefined): boolean {
  return (
    !!verdict &&
    ['idle', 'warned', 'checkpointing'].includes(verdict.state ?? 'unknown')
  );
}

export function extendView(
  verdict: IVerdict | null | undefined,
  trans: ITrans = nullTrans
): IExtendView {
  const reason = reasonMode(verdict);
  const step = formatDuration(verdict?.extension_step_s);
  const label = trans.__('Extend %1', step);
  if (isHardDeadline(verdict)) {
    return {
      enabled: false,
      label,
      hint: trans.__(
        'A hard deadline (see the GPU panel for why): extending does not move it.'
      ),
      reason
    };
  }
  if (!hasDeadline(verdict)) {
    return {
      enabled: false,
      label,
      hint: trans.__('Nothing to extend: the GPU is not idle.'),
      reason
    };
  }
  if (verdict?.approval_pending) {
    return {
      enabled: false,
      label,
      hint: trans.__(
        'Your extension request is waiting for an administrator. The current deadline applies until they approve it.'
      ),
      reason
    };
  }
  const left = verdict?.extensions_left;
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

/**
 * Whether the deadline was set by a policy brought in during this idle stretch (or, for a
 * maximum age or a reclaim, since it was asked), an admin's apply or the config file changed:
 * the verdict's `policy_change` says so (its reason says it in words), and the toast must too,
 * or a deadline sooner than the owner was told reads as a mistake. The code, not the words:
 * those change with the wording and how the policy came in.
 */
export function policyChanged(verdict: IVerdict | null | undefined): boolean {
  return Boolean(verdict?.policy_change);
}

export interface IWarningView {
  key: string;
  /** The notification's text (JupyterLab cuts it at 140 characters). */
  toast: string;
  countdown: string;
  deadline: string | null;
  extend: IExtendView;
}

export function warningView(
  verdict: IVerdict | null | undefined,
  options: IViewOptions
): IWarningView | null {
  const key = warningKey(verdict);
  if (key === null || !verdict) {
    return null;
  }
  const trans = transOf(options);
  const cull = parseTime(verdict.cull_at);
  const countdown = cull === null ? '' : formatCountdown(cull - options.now);
  const deadline = cull === null ? null : formatTime(cull, options);
  const what = whatHappens(verdict, trans);
  let toast: string;
  if (
    isHardDeadline(verdict) &&
    !['warned', 'checkpointing'].includes(verdict.state ?? '')
  ) {
    // Running work too: the owner must save it before the deadline.
    // A deadline announced with a time this tab cannot read is soon, not past.
    toast =
      cull === null
        ? trans.__(
            'Hard deadline: %1 soon, whatever the GPU does. Save your work.',
            what
          )
        : cull <= options.now
          ? trans.__('Hard deadline: %1 now. Save your work.', what)
          : trans.__(
              'Hard deadline: %1 in %2 (at %3), whatever the GPU does. Save your work.',
              what,
              countdown,
              deadline
            );
  } else if (
    verdict.state === 'checkpointing' &&
    verdict.at_deadline === 'interrupt'
  ) {
    // The interrupt came as announced; nothing is stopped after the save.
    toast = trans.__(
      'GPU idle: the running cell was interrupted; saving a checkpoint. The server and kernel stay.'
    );
  } else if (verdict.state === 'checkpointing') {
    // Due already (a running cell interrupted as announced): the stop follows the save.
    toast =
      cull === null || cull <= options.now
        ? trans.__('GPU idle: saving a checkpoint, then %1.', what)
        : trans.__(
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
  if (policyChanged(verdict)) {
    toast += ' ' + trans.__('The GPU policy changed.');
  }
  if (verdict.approval_pending) {
    toast += ' ' + trans.__('Extension awaits admin approval.');
  }
  if (verdict.dry_run) {
    toast += ' ' + trans.__('(Dry run: nothing will happen.)');
  }
  return {
    key,
    toast: shorten(toast, 140),
    countdown,
    deadline,
    extend: extendView(verdict, trans)
  };
}

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

/**
 * A reclaim of this server's borrowed GPU that the governor withdrew (the team that asked for
 * it no longer needs it): the warning simply goes, so the owner who was told "given back at
 * …" is told it is not, once. `null`: none on this verdict, the one already said
 * (`announced`: the `reclaim_withdrawn` last said), or a warning stands (it says what is due).
 */
export function reclaimWithdrawnNotice(
  verdict: IVerdict | null | undefined,
  announced: string | null,
  options: IViewOptions
): { key: string; message: string } | null {
  const key = verdict?.reclaim_withdrawn ?? null;
  const at = parseTime(key);
  if (key === null || at === null || key === announced || isWarning(verdict)) {
    return null;
  }
  return { key, message: reclaimWithdrawnLine(at, options) };
}

/** The withdrawn reclaim in words (the toast's, the panel's line). */
export function reclaimWithdrawnLine(
  at: number,
  options: IViewOptions
): string {
  return transOf(options).__(
    'Your borrowed GPU is no longer asked back (since %1): the team that asked for it no longer needs it. The deadline you were warned of is lifted and this server keeps its GPU.',
    formatTime(at, options)
  );
}
