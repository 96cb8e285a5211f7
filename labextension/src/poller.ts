/**
 * Keeps the latest status report: a Poll with backoff (slower when the tab is hidden), and a
 * refresh whenever the server extension emits one of our events.
 */
import { Event } from '@jupyterlab/services';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';
import { IDisposable } from '@lumino/disposable';

import { GpuGovApi } from './api';
import { IStatusReport } from './model';

export const VERDICT_SCHEMA =
  'https://events.jupyter-gpu-gov.org/server/verdict';
export const GPU_STATE_SCHEMA =
  'https://events.jupyter-gpu-gov.org/server/gpu-state';

export interface IPollerOptions {
  api: GpuGovApi;
  /** JupyterLab's event manager (`app.serviceManager.events`), when available. */
  events?: Event.IManager | null;
  /** Milliseconds between polls (default 5 s; backs off on errors up to 60 s). */
  interval?: number;
}

export class StatusPoller implements IDisposable {
  constructor(options: IPollerOptions) {
    this._api = options.api;
    const interval = options.interval ?? 5000;
    this._poll = new Poll({
      auto: true,
      factory: () => this._fetch(),
      frequency: { interval, backoff: true, max: 60 * 1000 },
      name: 'jupyter-gpu-gov:status',
      standby: 'when-hidden'
    });
    const events = options.events;
    if (events) {
      events.stream.connect(this._onEvent, this);
      this._events = events;
    }
  }

  get report(): IStatusReport | null {
    return this._report;
  }

  /** Emits each new report (and null after an error). */
  get changed(): ISignal<this, IStatusReport | null> {
    return this._changed;
  }

  get error(): string | null {
    return this._error;
  }

  get isDisposed(): boolean {
    return this._poll.isDisposed;
  }

  /** Poll now (after an action, or an event). */
  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._events?.stream.disconnect(this._onEvent, this);
    this._poll.dispose();
    Signal.clearData(this);
  }

  private _onEvent(_: Event.IManager, emission: Event.Emission): void {
    const schema = emission.schema_id;
    if (schema === VERDICT_SCHEMA || schema === GPU_STATE_SCHEMA) {
      void this._poll.refresh();
    }
  }

  private async _fetch(): Promise<void> {
    try {
      this._report = await this._api.status();
      this._error = null;
      this._changed.emit(this._report);
    } catch (error) {
      this._error = String(error);
      // Keep the last report so a blip does not hide a warning; tell listeners anyway.
      this._changed.emit(this._report);
      throw error;
    }
  }

  private _api: GpuGovApi;
  private _poll: Poll;
  private _events: Event.IManager | null = null;
  private _report: IStatusReport | null = null;
  private _error: string | null = null;
  private _changed = new Signal<this, IStatusReport | null>(this);
}
