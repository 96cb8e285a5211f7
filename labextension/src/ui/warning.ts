/**
 * The idle warning as a JupyterLab notification: what will happen and when, a countdown that
 * ticks once a second, and Extend / Checkpoint / Stop server. The warning's deadline and
 * verdict are kept in localStorage so a reload re-raises it at once, exactly once. With the
 * setting `notificationStyle` "panel" a warning opens the GPU panel instead; with "status-bar"
 * only the status bar item says so. A reclaim withdrawn after its warning (the warning simply
 * goes) is said once, in a toast whatever the style: the owner was told of a deadline.
 */
import { Notification } from '@jupyterlab/apputils';
import { IDisposable } from '@lumino/disposable';

import { parseTime } from '../format';
import { isWarning } from '../model/verdict';
import {
  reclaimWithdrawnNotice,
  warningAction,
  warningKey,
  warningView
} from '../model/warning';
import { NotificationStyle } from '../settings';
import { safeLocalStorage } from '../storage';
import { ITrans } from '../trans';
import { IVerdict } from '../types';

export interface IWarningActions {
  extend(): Promise<void>;
  checkpoint(): Promise<void>;
  stop(): Promise<void>;
}

/** Longer than the toast library's deferral of an update (a 0 ms timer, 4 ms once nested). */
const DISMISS_AFTER_UPDATES_MS = 50;

interface IStored {
  key: string;
  verdict: IVerdict;
}

export class WarningNotifier implements IDisposable {
  constructor(options: {
    trans: ITrans;
    actions: IWarningActions;
    /** Opens the GPU panel (the "panel" notification style). */
    openPanel: () => void;
    /** Distinguishes servers that share an origin (JupyterHub: /user/<name>/<server>/). */
    storageKey: string;
    storage?: Storage | null;
    style?: NotificationStyle;
  }) {
    this._trans = options.trans;
    this._actions = options.actions;
    this._openPanel = options.openPanel;
    this._style = options.style ?? 'toast';
    this._storageKey = options.storageKey;
    this._storage =
      options.storage === undefined ? safeLocalStorage() : options.storage;
  }

  /** Re-raise a warning remembered from before a reload, if its deadline is ahead. */
  restore(): void {
    const stored = this._read();
    if (!stored) {
      return;
    }
    const cull = parseTime(stored.verdict.cull_at);
    if (isWarning(stored.verdict) && (cull === null || cull > Date.now())) {
      this.update(stored.verdict);
    } else {
      this._write(null);
    }
  }

  /** The latest verdict (from a poll or an event). */
  update(verdict: IVerdict | null | undefined): void {
    if (this._disposed) {
      return;
    }
    const action = warningAction(this._key, verdict, this._verdict);
    switch (action) {
      case 'raise':
        this._raise(verdict as IVerdict);
        break;
      case 'update':
        // The same warning, its deadline perhaps later: a notification closed stays closed.
        this._verdict = verdict as IVerdict;
        this._key = warningKey(verdict) ?? this._key;
        this._write({ key: this._key as string, verdict: this._verdict });
        this._refresh();
        break;
      case 'dismiss':
        this._clear();
        this._write(null);
        break;
      default:
        break;
    }
    this._sayReclaimWithdrawn(verdict);
  }

  /** Once per withdrawal, for this server's tabs (the last one said is kept with the warning). */
  private _sayReclaimWithdrawn(verdict: IVerdict | null | undefined): void {
    const key = `${this._storageKey}:reclaim-withdrawn`;
    let said: string | null = this._saidWithdrawn;
    try {
      said = this._storage?.getItem(key) ?? said;
    } catch {
      // Storage disabled: this tab still says it once.
    }
    const notice = reclaimWithdrawnNotice(verdict, said, {
      now: Date.now(),
      trans: this._trans
    });
    if (!notice) {
      return;
    }
    this._saidWithdrawn = notice.key;
    try {
      this._storage?.setItem(key, notice.key);
    } catch {
      // As above.
    }
    Notification.info(notice.message, { autoClose: false });
  }

  /** How a new warning is shown; a warning on screen stays as it is. */
  set style(style: NotificationStyle) {
    this._style = style;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** No more warnings (the server is gone): the one on screen goes too. */
  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._clear();
    this._disposed = true;
  }

  private _raise(verdict: IVerdict): void {
    const view = warningView(verdict, { now: Date.now(), trans: this._trans });
    if (!view) {
      this._clear();
      return;
    }
    if (this._style !== 'toast') {
      this._clear();
      this._key = view.key;
      this._verdict = verdict;
      this._write({ key: view.key, verdict });
      if (this._style === 'panel') {
        this._openPanel();
      }
      return;
    }
    // A new deadline while the warning is on screen (an extension, the owner back, a reload
    // that restored the old one) rewrites that notification: one warning, never two.
    const rewritten =
      this._id !== null &&
      !this._userClosed &&
      Notification.update({
        id: this._id,
        message: view.toast,
        type: 'warning',
        autoClose: false,
        actions: this._notificationActions(verdict)
      });
    if (!rewritten) {
      this._clear();
      this._id = Notification.warning(view.toast, {
        autoClose: false,
        actions: this._notificationActions(verdict)
      });
    }
    this._key = view.key;
    this._verdict = verdict;
    this._userClosed = false;
    this._write({ key: view.key, verdict });
    this._startTimer();
  }

  /** Re-render the countdown; stop once the user closed the notification. */
  private _refresh(): void {
    if (!this._id || !this._verdict || this._userClosed) {
      return;
    }
    const view = warningView(this._verdict, {
      now: Date.now(),
      trans: this._trans
    });
    if (!view) {
      return;
    }
    const shown = Notification.update({
      id: this._id,
      message: view.toast,
      type: 'warning',
      autoClose: false,
      actions: this._notificationActions(this._verdict)
    });
    if (!shown) {
      // Closed by the user: the panel still shows the warning; a new deadline raises anew.
      this._userClosed = true;
      this._stopTimer();
    }
  }

  private _notificationActions(verdict: IVerdict): Notification.IAction[] {
    const trans = this._trans;
    const view = warningView(verdict, { now: Date.now(), trans });
    const keepOpen = (run: () => Promise<void>) => (event: MouseEvent) => {
      event.preventDefault();
      void run();
    };
    const actions: Notification.IAction[] = [];
    if (view?.extend.enabled) {
      actions.push({
        label: view.extend.label,
        caption: view.extend.hint,
        displayType: 'accent',
        callback: keepOpen(() => this._actions.extend())
      });
    }
    actions.push({
      label: trans.__('Checkpoint'),
      caption: trans.__(
        'Save open documents and checkpoint every notebook now'
      ),
      callback: keepOpen(() => this._actions.checkpoint())
    });
    actions.push({
      label: trans.__('Stop server'),
      caption: trans.__('Give the GPU back now (asks for confirmation)'),
      displayType: 'warn',
      callback: keepOpen(() => this._actions.stop())
    });
    return actions;
  }

  private _clear(): void {
    this._stopTimer();
    if (this._id) {
      // The toast library applies an update on a later timer (react-toastify's toast.update
      // is a setTimeout) and re-shows a closing toast it updates: a countdown tick just before
      // a dismissal would bring the warning back for good. Dismissing on a timer due after any
      // such update keeps the order.
      const id = this._id;
      window.setTimeout(
        () => Notification.dismiss(id),
        DISMISS_AFTER_UPDATES_MS
      );
    }
    this._id = null;
    this._key = null;
    this._verdict = null;
  }

  private _startTimer(): void {
    this._stopTimer();
    this._timer = window.setInterval(() => this._refresh(), 1000);
  }

  private _stopTimer(): void {
    if (this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    }
  }

  private _read(): IStored | null {
    try {
      const raw = this._storage?.getItem(this._storageKey);
      const parsed = raw ? (JSON.parse(raw) as IStored) : null;
      return parsed && parsed.verdict && parsed.key ? parsed : null;
    } catch {
      return null;
    }
  }

  private _write(value: IStored | null): void {
    try {
      if (value) {
        this._storage?.setItem(this._storageKey, JSON.stringify(value));
      } else {
        this._storage?.removeItem(this._storageKey);
      }
    } catch {
      // Storage full or disabled: the warning still shows, it just won't survive a reload.
    }
  }

  private _trans: ITrans;
  private _actions: IWarningActions;
  private _openPanel: () => void;
  private _style: NotificationStyle;
  private _storageKey: string;
  private _storage: Storage | null;
  private _id: string | null = null;
  private _key: string | null = null;
  private _verdict: IVerdict | null = null;
  private _userClosed = false;
  private _saidWithdrawn: string | null = null;
  private _timer: number | null = null;
  private _disposed = false;
}
