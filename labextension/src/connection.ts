/**
 * When a request to the server fails, JupyterLab asks its IConnectionLost. On a Hub that asks
 * "Server unavailable or unreachable… Restart?": a second dialog over this tab's own state
 * once the governor has stopped the server. This one looks first: a server the Hub says is
 * gone is the stopped tab's to show; one that answers was a blip; otherwise JupyterLab's own
 * "Server Connection Error" (it keeps trying to reconnect).
 */
import { ConnectionLost, IConnectionLost } from '@jupyterlab/application';

import { StatusPoller } from './poller';

export class ConnectionWatch {
  /** The tab's poller, once the main plugin has made it. */
  poller: StatusPoller | null = null;

  readonly lost: IConnectionLost = async (manager, error, translator) => {
    const poller = this.poller;
    if (poller && !poller.stopped) {
      await poller.check();
    }
    if (poller && (poller.stopped || !poller.error)) {
      return; // the stopped tab says it, or the server answers again
    }
    if (!this._showing) {
      this._showing = true;
      try {
        await ConnectionLost(manager, error, translator);
      } finally {
        this._showing = false;
      }
    }
  };

  private _showing = false;
}
