/**
 * The only way the frontend talks to the world: its own server extension under
 * `/jupyter-gpu-gov/`, through JupyterLab's ServerConnection (XSRF and token handled there).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { parseTime } from './format';
import { retryAfterSeconds } from './model/outcomes';
import { readStatusReport } from './parse';
import {
  ICheckpointManifest,
  ICheckpointSummary,
  IExtendResponse,
  IStatusReport,
  IStopResponse
} from './types';

export const API_NAMESPACE = 'jupyter-gpu-gov';

export interface IApiResponse<T> {
  /** HTTP status; 0 when the server could not be reached. */
  status: number;
  body: T | null;
  /** The server's error message, when there is one. */
  message: string | null;
  /**
   * The Hub answered instead of this server: it is not running (424 "Failed Dependency",
   * or a redirect to the Hub's pages while it stops).
   */
  gone: boolean;
  /** A 429's `Retry-After` in seconds (the governor's, passed on by the server), or null. */
  retryAfter?: number | null;
}

/** A status request that failed; `gone` when the server is not running any more. */
export class StatusError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly gone: boolean
  ) {
    super(message);
    this.name = 'StatusError';
  }
}

export class GpuGovApi {
  constructor(settings: ServerConnection.ISettings) {
    this._settings = settings;
  }

  get settings(): ServerConnection.ISettings {
    return this._settings;
  }

  /** GET status; throws a StatusError on failure so the poll backs off. */
  async status(refresh = false): Promise<IStatusReport> {
    const response = await this.request<unknown>(
      refresh ? 'status?refresh=1' : 'status',
      { method: 'GET' }
    );
    const report = readStatusReport(response.body);
    if (response.status !== 200 || !report || response.gone) {
      throw new StatusError(
        response.message ?? `HTTP ${response.status}`,
        response.status,
        response.gone
      );
    }
    return report;
  }

  extend(reason: string): Promise<IApiResponse<IExtendResponse>> {
    return this.post<IExtendResponse>('extend', { reason });
  }

  /** After the frontend saved its dirty documents: the server checkpoints (and answers a
   * pending request of the governor with the same manifest). */
  checkpoint(reason: string): Promise<IApiResponse<ICheckpointManifest>> {
    return this.post<ICheckpointManifest>('checkpoint', {
      reason,
      source: 'frontend'
    });
  }

  /** Saved checkpoints, newest first (GET /jupyter-gpu-gov/checkpoints). */
  checkpoints(): Promise<IApiResponse<{ checkpoints: ICheckpointSummary[] }>> {
    return this.request('checkpoints', { method: 'GET' });
  }

  /** One checkpoint's manifest; 404 when the id is unknown. */
  checkpointManifest(id: string): Promise<IApiResponse<ICheckpointManifest>> {
    return this.request(`checkpoints/${encodeURIComponent(id)}`, {
      method: 'GET'
    });
  }

  /** When this Jupyter server started (jupyter-server's GET /api/status), or null. */
  async serverStarted(): Promise<number | null> {
    const url = URLExt.join(this._settings.baseUrl, 'api', 'status');
    try {
      const response = await ServerConnection.makeRequest(
        url,
        { method: 'GET' },
        this._settings
      );
      if (!response.ok) {
        return null;
      }
      const body = await response.json();
      return parseTime(typeof body?.started === 'string' ? body.started : null);
    } catch {
      return null;
    }
  }

  stop(reason: string): Promise<IApiResponse<IStopResponse>> {
    return this.post('stop', { reason });
  }

  private post<T>(endpoint: string, body: unknown): Promise<IApiResponse<T>> {
    return this.request<T>(endpoint, {
      method: 'POST',
      body: JSON.stringify(body)
    });
  }

  /** A request that never throws on HTTP errors: 202 and 409 carry meaning here. */
  async request<T>(
    endpoint: string,
    init: RequestInit
  ): Promise<IApiResponse<T>> {
    const url = URLExt.join(this._settings.baseUrl, API_NAMESPACE, endpoint);
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(url, init, this._settings);
    } catch (error) {
      return {
        status: 0,
        body: null,
        message: String(error),
        gone: false,
        retryAfter: null
      };
    }
    // Sent to the Hub's pages: the proxy no longer routes to this server.
    const gone =
      response.status === 424 ||
      (response.redirected &&
        !!response.url &&
        !response.url.startsWith(this._settings.baseUrl));
    let body: any = null;
    const text = await response.text();
    if (text) {
      try {
        body = JSON.parse(text);
      } catch {
        body = null;
      }
    }
    const message =
      body && typeof body.message === 'string' && body.message
        ? (body.message as string)
        : response.ok
          ? null
          : response.statusText || null;
    return {
      status: response.status,
      body: body as T | null,
      message,
      gone,
      retryAfter: retryAfterSeconds(response.headers.get('Retry-After'))
    };
  }

  private _settings: ServerConnection.ISettings;
}
