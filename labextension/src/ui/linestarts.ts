/**
 * Says once, in this tab, that another server of the owner started from the line for a GPU,
 * with a link to it (what is said: model/linestarts.ts). Announced starts are kept in
 * localStorage, so a reload or a second tab does not say it again.
 */
import { Notification } from '@jupyterlab/apputils';

import { dismissedIds, rememberDismissed } from '../model/comeback';
import { lineStartViews } from '../model/linestarts';
import { ITrans } from '../trans';
import { IVerdict } from '../types';
import { readStored, safeLocalStorage, writeStored } from '../storage';

export interface ILineStartNotifierOptions {
  trans: ITrans;
  /** Where the announced starts are kept (one list for the user's tabs). */
  storageKey: string;
  storage?: Storage | null;
  /** Opens the started server (default: a new browser tab). */
  open?: (url: string) => void;
}

export class LineStartNotifier {
  constructor(options: ILineStartNotifierOptions) {
    this._options = options;
    this._storage =
      options.storage === undefined ? safeLocalStorage() : options.storage;
  }

  update(verdict: IVerdict | null): void {
    const { trans, storageKey } = this._options;
    let announced = dismissedIds(readStored(this._storage, storageKey));
    const views = lineStartViews(verdict, announced, {
      now: Date.now(),
      trans
    });
    for (const view of views) {
      Notification.info(view.message, {
        autoClose: false,
        actions: [
          {
            label: view.open,
            caption: view.url,
            displayType: 'accent',
            callback: () => this._open(view.url)
          }
        ]
      });
      announced = rememberDismissed(announced, view.key);
    }
    if (views.length) {
      writeStored(this._storage, storageKey, announced);
    }
  }

  private _open(url: string): void {
    if (this._options.open) {
      this._options.open(url);
    } else {
      window.open(url, '_blank', 'noopener');
    }
  }

  private _options: ILineStartNotifierOptions;
  private _storage: Storage | null;
}
