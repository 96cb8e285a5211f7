/**
 * The wire types: what the server extension sends (docs/api.md). This module is the only place
 * that defines them (they are to be generated from the report's JSON Schema), so it holds no
 * logic. `null` in a report always means *unknown*, never zero.
 */

/** The governor's states (docs/api.md, the verdict). */
export type GovState =
  | 'active'
  | 'idle'
  | 'busy'
  | 'warned'
  | 'checkpointing'
  | 'culled'
  | 'exempt'
  | 'unknown'
  | 'gpu-failed';

/** A device's health, when the server extension or DCGM knows it. */
export interface IDeviceHealth {
  status: 'ok' | 'unhealthy' | 'unknown' | string;
  /** One line each, e.g. "XID 79: GPU fell off the bus". */
  reasons?: string[] | null;
}

export interface IDevice {
  uuid: string;
  name: string;
  mig_profile?: string | null;
  parent_uuid?: string | null;
  memory_total_mb?: number | null;
  memory_used_mb?: number | null;
  activity?: number | null;
  shared?: boolean;
  health?: IDeviceHealth | null;
}

export interface ITargetGpu {
  devices?: string[];
  memory_mb?: number | null;
  sm?: number | null;
  holds_context?: boolean;
  confidence?: 'exact' | 'inferred' | 'unknown' | string;
  last_active?: string | null;
  idle_since?: string | null;
  active_fraction?: number | null;
  history?: (number | null)[];
}

export interface ITarget {
  kind: 'kernel' | 'terminal' | 'other' | string;
  id: string;
  name?: string | null;
  path?: string | null;
  execution_state?: string | null;
  last_activity?: string | null;
  connections?: number | null;
  gpu?: ITargetGpu | null;
}

/** The governor's diagnosis of why the GPU is underused. */
export interface IRootCause {
  label: string;
  hint?: string | null;
  /** Feature -> change in predicted GPU activity at its best-state value (model only). */
  contributions?: Record<string, number> | null;
  source?: 'model' | 'rules' | string | null;
}

/** A smaller tier the work would fit. */
export interface IRightSize {
  tier: string;
  label: string;
  reason: string;
}

export interface IVerdict {
  state: GovState | string;
  reason?: string | null;
  idle_since?: string | null;
  warn_at?: string | null;
  cull_at?: string | null;
  extensions_left?: number | null;
  extension_step_s?: number | null;
  extension_reason?: 'optional' | 'required' | string | null;
  approval_pending?: boolean;
  policy?: string | null;
  cull_action?: 'stop-server' | 'shutdown-kernels' | string | null;
  checkpoint?: 'none' | 'requested' | null;
  dry_run?: boolean;
  root_cause?: IRootCause | null;
  right_size?: IRightSize | null;
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

/** GET /jupyter-gpu-gov/status. */
export interface IStatusReport {
  schema?: number;
  sampled_at?: string | null;
  backend?: 'nvml' | 'simulated' | 'unavailable' | 'none' | string;
  error?: string | null;
  devices?: IDevice[];
  targets?: ITarget[];
  window?: {
    seconds?: number;
    gpu_active_fraction?: number | null;
    gpu_last_active?: string | null;
    gpu_idle_since?: string | null;
  };
  verdict?: IVerdict | null;
  checkpoint?: {
    requested_at?: string | null;
    status?: string | null;
    manifest?: ICheckpointManifest | null;
  } | null;
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
