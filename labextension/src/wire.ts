/**
 * Generated from https://events.jupyter-gpu-gov.org/wire/v1 (jupyter_gpu_gov/events/wire.v1.schema.json) by
 * scripts/wire-types.js: do not edit. The report and the verdict, as docs/api.md lists them.
 */

import type {
  ICheckpointManifest,
  IDeviceHealth,
  IRightSize,
  IRootCause,
  IVerdictRequests
} from './types';
/** One of the values the schema lists. */
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

/** The server's last checkpoint. */
export interface ICheckpointState {
  /** when the checkpoint was asked for */
  requested_at?: string | null;
  /** `null`, `running`, `done` or `failed` */
  status?: string | null;
  /** its manifest ([what a checkpoint does](#what-a-checkpoint-does)) */
  manifest?: ICheckpointManifest | null;
}

/** A leaf device: a whole GPU or a MIG instance. */
export interface IDevice {
  /** NVML UUID (`GPU-…` or `MIG-…`) */
  uuid?: string;
  /** product name */
  name?: string | null;
  /** e.g. `1g.18gb` for a MIG instance; `null` for a whole GPU */
  mig_profile?: string | null;
  /** the physical GPU of a MIG instance; `null` for a whole GPU */
  parent_uuid?: string | null;
  /** MiB */
  memory_total_mb?: number | null;
  /** MiB */
  memory_used_mb?: number | null;
  /**
   * 0..1 over the driver's last sample period; `null` where there is no utilisation API (MIG
   * without GPM)
   */
  activity?: number | null;
  /** memory controller activity 0..1 */
  memory_activity?: number | null;
  /**
   * other people's processes use this card (workstation: processes of another Unix user; the
   * server's own user's outside the server are its `other` target), or it is time-sliced
   */
  shared?: boolean;
  /**
   * the GPU's health (a MIG instance: its GPU's), [GPU health](#gpu-health): `{"status":
   * "ok"|"unhealthy"|"unknown", "reasons": [...], "action": "reset"|"drain"|null, "warnings":
   * [...]}`; `null` from a server that does not check
   */
  health?: IDeviceHealth | null;
}

/** Another server of the same owner that the spawn queue started on their behalf. */
export interface ILineStart {
  /** the server name (`""` for the default server) */
  name?: string;
  /** its path on the Hub, as the Hub names it (`/user/alice/gpu/`) */
  url?: string;
  /** the GPU tier it waited for */
  tier?: string | null;
  /** when it started */
  started?: string;
  /** when it is given back unless someone opens it (`queue_claim_within` after its start) */
  claim_by?: string;
}

/** What a server knows of its GPUs, kernels and terminals. */
export interface IReport {
  /** report format version, `1` */
  schema?: 1;
  /** when the GPUs were sampled (RFC 3339, UTC) */
  sampled_at?: string;
  /**
   * `nvml`, `simulated`, `unavailable` (the backend failed: see `error`) or `none` (no GPU
   * backend: `GpuGovApp.backend` is `none`, or `auto` found no driver, as in a CPU-only pod; a
   * CPU-only server where a backend runs, `CUDA_VISIBLE_DEVICES` empty, names that backend with
   * no `devices`)
   */
  backend?: 'nvml' | 'simulated' | 'unavailable' | 'none' | string;
  /** why the backend is unavailable, naming the device when known; else `null` */
  error?: string | null;
  /** who this server is */
  server?: IServer;
  /**
   * the leaf devices this server may use (a whole GPU or a MIG instance; restricted by
   * `CUDA_VISIBLE_DEVICES`)
   */
  devices?: IDevice[];
  /**
   * every kernel and terminal of the server, plus `{"kind": "other", "id": "server"}` when the
   * server's other processes hold a GPU
   */
  targets?: ITarget[];
  /** the rolling window, for the whole server */
  window?: IWindow;
  /** the last checkpoint */
  checkpoint?: ICheckpointState | null;
}

/** Who the server is. */
export interface IServer {
  /** the Hub user */
  user?: string;
  /** the server name (`""` for the default server) */
  name?: string;
  /** when this server started */
  started?: string | null;
  /**
   * last activity of people and clients (API calls, kernel messages, terminals), **excluding**
   * GPU work, so the governor can tell an open tab from GPU work
   */
  last_activity?: string | null;
  /** the Kubernetes pod, `null` outside Kubernetes */
  pod?: string | null;
  /** the Kubernetes namespace, `null` outside Kubernetes */
  namespace?: string | null;
  /**
   * the GPUs it sees are its own allocation (a Kubernetes GPU request, the workstation
   * allocator's devices), not a machine's shared cards
   */
  gpu_allocated?: boolean;
}

/** A kernel, a terminal, or the server's other processes. */
export interface ITarget {
  /** `kernel`, `terminal` or `other` (the server's other processes) */
  kind?: 'kernel' | 'terminal' | 'other' | string;
  /** a kernel's id (a UUID), a terminal's name, or `server` */
  id?: string;
  /** the kernel's name */
  name?: string | null;
  /** the notebook or console a kernel belongs to, when there is a session */
  path?: string | null;
  /** as Jupyter Server reports it for the kernel */
  execution_state?: string | null;
  /** when the running cell began (`busy` only) */
  busy_since?: string | null;
  /** as Jupyter Server reports it (terminals: their last activity) */
  last_activity?: string | null;
  /** clients connected (browser tabs; terminals: their clients) */
  connections?: number | null;
  /** what it holds of the GPUs */
  gpu?: ITargetGpu;
  /**
   * what the target's process tree did over the rolling window (the same `window.seconds` as
   * the GPU's, shorter just after a start), from `/proc/<pid>/stat` and `/proc/<pid>/io` deltas
   * between samples; `null` on the first sample. Optional: a governor accepts reports without
   * it
   */
  cpu?: ITargetCpu | null;
}

/** What a target's process tree did over the rolling window. */
export interface ITargetCpu {
  /**
   * CPU cores busy on average (user + system time / wall time): `1.0` is one core saturated,
   * e.g. a Python loop
   */
  cores?: number | null;
  /**
   * share 0..1 of the window the tree's processes spent blocked on block I/O
   * (`delayacct_blkio_ticks`, field 42 of `stat`; the main thread of each process; summed over
   * processes and capped at 1). `null` when the kernel does not account I/O delay
   * (`/proc/sys/kernel/task_delayacct` is `0`, the default since Linux 5.14; `sysctl
   * kernel.task_delayacct=1` turns it on)
   */
  iowait?: number | null;
  /**
   * reads from storage (`read_bytes` of `/proc/<pid>/io`: page-cache misses, not cached
   * re-reads), in MB/s (10^6 bytes); `null` when `io` is unreadable for any process of the
   * tree, and for `other`
   */
  read_mb_s?: number | null;
  /** the span these figures cover */
  seconds?: number | null;
  /**
   * share 0..1 of a core the tree's busiest thread used, tick by tick, averaged over the window
   * (`/proc/<pid>/task/<tid>/schedstat` where the kernel keeps it, else `stat`; at most 512
   * threads a process): a serial loop saturates one thread (1.0) where workers sharing a load
   * each read less; `null` when a task list is unreadable
   */
  top_thread?: number | null;
}

/** What a target holds of the GPUs. */
export interface ITargetGpu {
  /** UUIDs of the devices this target holds */
  devices?: string[];
  /** GPU memory it holds, MiB */
  memory_mb?: number | null;
  /** SM activity 0..1 (of its busiest device) at this sample */
  sm?: number | null;
  /** it has a CUDA context on a GPU (holds the card even if idle) */
  holds_context?: boolean;
  /**
   * how sure the attribution is: `exact` (local PIDs, per-process data), `inferred` (derived
   * from device totals or open device files), `unknown` (no split possible)
   */
  confidence?: 'exact' | 'inferred' | 'unknown' | string;
  /** last sample at or above `active_threshold` */
  last_active?: string | null;
  /** start of the current idle stretch (`null` unless idle) */
  idle_since?: string | null;
  /** share of known samples in the window that were active */
  active_fraction?: number | null;
  /** the GPU process IDs as the backend reported them (host PIDs in a container) */
  pids?: number[];
  /** the window's `sm` values, oldest first (sparklines) */
  history?: (number | null)[];
}

/** What the governor answers a report with. */
export interface IVerdict {
  /**
   * `active`, `idle`, `busy` (a cell runs while the GPU idles, past `busy_grace`: `reason`
   * names the cause and what to do), `warned`, `checkpointing`, `culled`, `exempt`, `unknown`
   * or `gpu-failed` (the server's GPU failed: [GPU health](#gpu-health))
   */
  state?: GovState | string;
  /** the idle clock (`null` when none) */
  idle_since?: string | null;
  /** when the warning goes out (`null` when none) */
  warn_at?: string | null;
  /** when the cull is due (`null` when none) */
  cull_at?: string | null;
  /**
   * why, in words: e.g. `GPU idle since 2026-01-05 09:14 UTC; server stopped at 2026-01-05
   * 11:14 UTC unless extended`
   */
  reason?: string | null;
  /**
   * a hard deadline — the maximum age, a borrowed GPU given back, an admin's cull — has been
   * announced to the owner: the cull at `cull_at` comes whatever the GPU does and Extend does
   * not move it (`reason` says why)
   */
  hard_deadline?: boolean;
  /** how many more times Extend gives time */
  extensions_left?: number;
  /** seconds each Extend gives */
  extension_step_s?: number;
  /** whether Extend needs a reason (`optional` or `required`) */
  extension_reason?: 'optional' | 'required' | string;
  /** an extension waits for an admin */
  approval_pending?: boolean;
  /** the policy that applies */
  policy?: string | null;
  /** what a cull does (`stop-server` or `shutdown-kernels`) */
  cull_action?: 'stop-server' | 'shutdown-kernels' | null | string;
  /**
   * what comes at `cull_at` when it is not a cull: `interrupt` (a running cell's limit,
   * `on_busy_limit: interrupt` with `after_interrupt: warn`: the cell is interrupted and a
   * checkpoint saved, the server and kernel stay; while `checkpointing`, that interrupt has
   * happened and no stop follows); `null` when `cull_at` is a cull (`cull_action`)
   */
  at_deadline?: 'interrupt' | null | string;
  /**
   * set while `reason` says a policy brought in as this server ran set its deadline or warning
   * (sooner than it was told before, perhaps): how it came in, `applied` (an admin applied
   * policies, or reverted to the config file's) or `config-changed` (the config file's policy
   * changed since the service last ran); `null` otherwise. JupyterLab's toast says the policy
   * changed on it, whatever the reason's words
   */
  policy_change?: 'applied' | 'config-changed' | null | string;
  /**
   * when a reclaim this server was warned of was withdrawn (the team that asked its borrowed
   * GPU back no longer needs it: its deadline is lifted, the server keeps the GPU), for
   * `RECLAIM_WITHDRAWN_NOTICE` (15 min) after, a restart of the governor within them included,
   * a standby's answer included (it reads the holder's audit rows back each pass), a new
   * session of the server (stopped and started since: its Hub `started` is not the one the
   * reclaim was lifted on, whatever the two clocks say) not; `null` otherwise. JupyterLab tells
   * the owner once and its status bar reads "reclaim lifted" meanwhile
   */
  reclaim_withdrawn?: string | null;
  /** `requested` while the governor waits for a checkpoint, else `none` */
  checkpoint?: 'requested' | 'none' | string;
  /** the governor records decisions but acts on none */
  dry_run?: boolean;
  /**
   * why the GPU is underused ([root causes](#root-causes)): `{"label", "hint", "contributions",
   * "source"}` (and the diagnosis's `cause`, `confidence`, `candidates`), or `null` when the
   * server is healthy, its GPU data is unknown, it holds no GPU, or its last report is older
   * than `report_stale_after`
   */
  root_cause?: IRootCause | null;
  /**
   * a smaller tier this session's measured use fits: `{"tier", "label", "reason"}` (e.g.
   * `{"tier": "h100-1g", "label": "Small H100 slice", "reason": "it used at most 4.3 GB of GPU
   * memory and 5% of the GPU over 1h 10m; Small H100 slice has 10 GB and counts 14% of H100 80
   * GB's GPU-equivalents"}`), or `null` (no catalogue, too little evidence, or nothing smaller
   * fits)
   */
  right_size?: IRightSize | null;
  /**
   * what the governor asks of the server (it never calls it): `{"checkpoint": {"requested_at",
   * "reason", "cull_reason"}}`, `{"interrupt_kernels": {"requested_at", "kernels": [ids],
   * "reason"}}` and/or `{"shutdown_kernels": {"requested_at", "kernels": [ids], "reason"}}`;
   * `{}` when nothing (always in a dry run). The server does each once per `requested_at`
   */
  requests?: IVerdictRequests;
  /**
   * the owner's *other* servers that the spawn queue started on their behalf and nobody has
   * opened yet, until one is opened or given back (`[]` when none): JupyterLab on this server
   * tells the owner, with a link. From the Hub's records, carried on the verdict this server
   * polls anyway: no server is given a credential to see another. The owner's alone: the server
   * extension's `status` and the verdict its `extend` and `stop` answer give anyone else (a
   * guest of a shared server, an admin in its JupyterLab) `[]`
   */
  started_from_line?: ILineStart[];
}

/** The rolling window, for the whole server. */
export interface IWindow {
  /** length of the rolling window (`GpuGovApp.window_seconds`) */
  seconds?: number;
  /**
   * share of the window's known samples in which any GPU-holding target was active; `null` when
   * nothing is known
   */
  gpu_active_fraction?: number | null;
  /** the last active sample, for the whole server */
  gpu_last_active?: string | null;
  /**
   * start of the server's idle stretch, no earlier than it took a GPU (a context, or the GPUs
   * allocated to it); the governor reads it as no earlier than it received this server
   * process's first report holding a GPU, nor than the Hub's `started`
   */
  gpu_idle_since?: string | null;
}
