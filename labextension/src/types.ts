/**
 * The wire types: what the server extension sends (docs/api.md). The report and the verdict are
 * generated from their JSON Schema into wire.ts (scripts/wire-types.js); this module adds the
 * open objects they carry and the other endpoints' answers, and holds no logic. `null` in a
 * report always means *unknown*, never zero.
 */
import type { IReport, IVerdict } from './wire';

export type {
  GovState,
  ICheckpointState,
  IDevice,
  ILineStart,
  IReport,
  ITarget,
  ITargetCpu,
  ITargetGpu,
  IVerdict,
  IWindow
} from './wire';

/** A device's health, when the server extension or DCGM knows it. */
export interface IDeviceHealth {
  status: 'ok' | 'unhealthy' | 'unknown' | string;
  /** One line each, e.g. "XID 79: GPU fell off the bus". */
  reasons?: string[] | null;
}

/** The governor's diagnosis of why the GPU is underused. */
export interface IRootCause {
  label: string;
  hint?: string | null;
  /** Feature -> change in predicted GPU activity at its best-state value (model only). */
  contributions?: Record<string, number> | null;
  source?: 'model' | 'rules' | string | null;
}

/** What the governor asks of the server in its verdict (it never calls the server). */
export interface IVerdictRequests {
  checkpoint?: {
    requested_at: string;
    reason?: string | null;
    cull_reason?: CullReason | string | null;
  };
  interrupt_kernels?: {
    requested_at: string;
    kernels: string[];
    reason?: string | null;
  };
  shutdown_kernels?: {
    requested_at: string;
    kernels: string[];
    reason?: string | null;
  };
}

/** A smaller tier the work would fit. */
export interface IRightSize {
  tier: string;
  label: string;
  reason: string;
}

/** Why the governor stopped a server (a checkpoint's `cull_reason`). */
export type CullReason =
  | 'gpu-idle'
  | 'max-age'
  | 'reclaim'
  | 'admin'
  | 'busy-limit'
  | 'inactive'
  | 'unclaimed';

/** A checkpoint's manifest (`<checkpoint>/manifest.json`). */
export interface ICheckpointManifest {
  status: 'done' | 'failed' | string;
  id?: string;
  path?: string;
  reason?: string | null;
  cull_reason?: CullReason | string | null;
  source?: string | null;
  notebooks?: { path: string; checkpoint_id?: string }[];
  errors?: (string | { path?: string; error?: string; message?: string })[];
  requested_at?: string | null;
  completed_at?: string | null;
  bytes?: number | null;
}

/** GET /jupyter-gpu-gov/status: the report, with the verdict the server last got. */
export interface IStatusReport extends IReport {
  verdict?: IVerdict | null;
}

/** One checkpoint as GET /jupyter-gpu-gov/checkpoints lists it (newest first). */
export interface ICheckpointSummary {
  id: string;
  reason?: string | null;
  cull_reason?: CullReason | string | null;
  source?: 'user' | 'frontend' | 'governor' | string | null;
  status?: 'done' | 'failed' | string | null;
  completed_at?: string | null;
  notebooks?: (string | { path: string })[] | null;
  bytes?: number | null;
  /** How many problems the checkpoint had. */
  errors?: number | null;
  /** The one line that brings the saved objects back in a notebook. */
  restore?: string | null;
}

/** POST /jupyter-gpu-gov/extend. */
export interface IExtendResponse {
  status?: string;
  message?: string;
  verdict?: IVerdict | null;
}

/** POST /jupyter-gpu-gov/stop. */
export interface IStopResponse {
  status?: string;
  message?: string;
  verdict?: IVerdict | null;
}
