/**
 * When a request to the server fails, JupyterLab asks its IConnectionLost. On a Hub that asks
 * "Server unavailable or unreachable… Restart?": a second dialog over this tab's own state
 * once the governor has stopped the server. This one looks first: a server the Hub says is
 * gone is the stopped tab's to show; one that answers was a blip; otherwise JupyterLab's own
 * "Server Connection Error" (it keeps trying to reconnect).
 */
import { ConnectionLost, IConnectionLost } from '@jupyterlab/application';

import { StatusPoller } from './poller';

const CHECKS = 3;
const CHECK_INTERVAL_MS = 1000;

export class ConnectionWatch {
  /** The tab's poller, once the main plugin has made it. */
  poller: StatusPoller | null = null;

  readonly lost: IConnectionLost = async (manager, error, translator) => {
    const poller = this.poller;
    // While the Hub stops a server, the proxy may answer 503 for a moment before the Hub
    // says 424: ask a few times before calling it a lost connection.
    for (let tries = 0; poller && tries < CHECKS; tries++) {
      if (!poller.stopped) {
        await poller.check();
      }
      if (poller.stopped || !poller.error) {
        return; // the stopped tab says it, or the server answers again
      }
      await new Promise(resolve => setTimeout(resolve, CHECK_INTERVAL_MS));
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
