/**
 * What this tab knows about its server: the latest status report, the last error, the newest
 * checkpoint it saw and, once the Hub answers instead of the server, that the server stopped
 * (then polling ends: nothing here can act any more). A Poll with backoff (slower when the tab
 * is hidden), refreshed whenever the server extension emits one of our events.
 */
import type { Event } from '@jupyterlab/services';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';
import { IDisposable } from '@lumino/disposable';

import type { GpuGovApi } from './api';
import { ICheckpointManifest, IStatusReport } from './types';
import { IStopFacts } from './model/stopped';

export const VERDICT_SCHEMA =
  'https://events.jupyter-gpu-gov.org/server/verdict';
export const GPU_STATE_SCHEMA =
  'https://events.jupyter-gpu-gov.org/server/gpu-state';

/** Polls back off on errors up to this. */
const MAX_INTERVAL_MS = 60 * 1000;

export interface IPollerOptions {
  api: Pick<GpuGovApi, 'status'>;
  /** JupyterLab's event manager (`app.serviceManager.events`), when available. */
  events?: Event.IManager | null;
  /** Milliseconds between polls (default 5 s). */
  interval?: number;
  /** The clock (tests). */
  now?: () => number;
}

export class StatusPoller implements IDisposable {
  constructor(options: IPollerOptions) {
    this._api = options.api;
    this._now = options.now ?? Date.now;
    this._poll = new Poll({
      auto: true,
      factory: () => this._fetch(),
      frequency: this._frequency(options.interval ?? 5000),
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

  /** The last poll's error in words, null after a good one. */
  get error(): string | null {
    return this._error;
  }

  /** Set once the server is gone: what the tab knew then. */
  get stopped(): IStopFacts | null {
    return this._stopped;
  }

  /** Emits after each poll (good or not), a stop, or a new checkpoint. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get isDisposed(): boolean {
    return this._poll.isDisposed;
  }

  /** Milliseconds between two polls (the settings' poll interval). */
  set interval(ms: number) {
    if (!this.isDisposed) {
      this._poll.frequency = this._frequency(ms);
    }
  }

  /** Poll now (after an action, or an event). */
  refresh(): Promise<void> {
    return this._stopped || this.isDisposed
      ? Promise.resolve()
      : this._poll.refresh();
  }

  /** Read the status now, outside the poll's schedule (a request failed elsewhere). */
  async check(): Promise<void> {
    if (!this._stopped && !this.isDisposed) {
      await this._fetch().catch(() => undefined);
    }
  }

  /** A checkpoint this tab took (its manifest), so the stop can say it was saved. */
  noteCheckpoint(manifest: ICheckpointManifest | null): void {
    if (manifest) {
      this._checkpoint = manifest;
      this._changed.emit();
    }
  }

  /** The server is gone (or going, stopped from this tab): stop polling and say so once. */
  markStopped(byOwner: boolean): void {
    if (this._stopped) {
      return;
    }
    this._stopped = {
      at: this._now(),
      byOwner,
      report: this._report,
      checkpoint: this._newestCheckpoint()
    };
    this._events?.stream.disconnect(this._onEvent, this);
    this._poll.dispose();
    this._changed.emit();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._events?.stream.disconnect(this._onEvent, this);
    this._poll.dispose();
    Signal.clearData(this);
  }

  private _frequency(ms: number) {
    const interval = Math.max(1000, ms);
    return {
      interval,
      backoff: true,
      max: Math.max(interval, MAX_INTERVAL_MS)
    };
  }

  private _newestCheckpoint(): ICheckpointManifest | null {
    const reported = this._report?.checkpoint?.manifest ?? null;
    const own = this._checkpoint;
    if (!reported || !own) {
      return own ?? reported;
    }
    return (own.completed_at ?? '') >= (reported.completed_at ?? '')
      ? own
      : reported;
  }

  private _onEvent(_: Event.IManager, emission: Event.Emission): void {
    const schema = emission.schema_id;
    if (schema === VERDICT_SCHEMA || schema === GPU_STATE_SCHEMA) {
      void this.refresh();
    }
  }

  private async _fetch(): Promise<void> {
    try {
      this._report = await this._api.status();
      this._error = null;
      this._changed.emit();
    } catch (error) {
      const gone = (error as { gone?: boolean }).gone === true;
      if (gone) {
        this.markStopped(false);
        return;
      }
      // A 429 (asked to wait: too many requests) is no error to show; the poll backs off.
      if ((error as { status?: number }).status !== 429) {
        this._error = error instanceof Error ? error.message : String(error);
      }
      // Keep the last report so a blip does not hide a warning; tell listeners anyway.
      this._changed.emit();
      throw error;
    }
  }

  private _api: Pick<GpuGovApi, 'status'>;
  private _now: () => number;
  private _poll: Poll;
  private _events: Event.IManager | null = null;
  private _report: IStatusReport | null = null;
  private _error: string | null = null;
  private _checkpoint: ICheckpointManifest | null = null;
  private _stopped: IStopFacts | null = null;
  private _changed = new Signal<this, void>(this);
}
