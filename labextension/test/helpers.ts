/**
 * Reports and verdicts for the tests. Times are read with the tests' own UTC clock and day,
 * so the results do not depend on the machine's time zone or locale.
 */
import { IDevice, IStatusReport, IVerdict } from '../src/types';

export const NOW = Date.parse('2026-01-05T11:00:00Z');
export const clock = (d: Date): string => d.toISOString().slice(11, 16);
export const day = (d: Date): string => d.toISOString().slice(0, 10);
export const opts = { now: NOW, clock, day };

export const H100: IDevice = {
  uuid: 'GPU-1111',
  name: 'NVIDIA H100 80GB HBM3',
  mig_profile: null,
  memory_total_mb: 81559,
  memory_used_mb: 20480,
  activity: 0.0,
  shared: false
};

export const MIG: IDevice = {
  uuid: 'MIG-2222',
  name: 'NVIDIA H200',
  mig_profile: '1g.18gb',
  parent_uuid: 'GPU-9999',
  memory_total_mb: 18176,
  memory_used_mb: 4096,
  activity: null
};

export function verdict(extra: Partial<IVerdict> = {}): IVerdict {
  return {
    state: 'warned',
    reason:
      'GPU idle since 2026-01-05 09:14 UTC; server stopped at 11:04 UTC unless extended',
    idle_since: '2026-01-05T09:14:00Z',
    warn_at: '2026-01-05T10:44:00Z',
    cull_at: '2026-01-05T11:04:09Z',
    extensions_left: 2,
    extension_step_s: 3600,
    extension_reason: 'optional',
    approval_pending: false,
    policy: 'default',
    cull_action: 'stop-server',
    checkpoint: 'none',
    dry_run: false,
    root_cause: null,
    ...extra
  };
}

export function report(extra: Partial<IStatusReport> = {}): IStatusReport {
  return {
    schema: 1,
    backend: 'nvml',
    devices: [H100],
    targets: [
      {
        kind: 'kernel',
        id: 'k1',
        name: 'python3',
        path: 'train.ipynb',
        gpu: {
          devices: ['GPU-1111'],
          memory_mb: 20480,
          sm: 0,
          holds_context: true,
          confidence: 'exact',
          idle_since: '2026-01-05T10:50:00Z',
          history: [0.5, 0.2, null, 0, 0]
        }
      },
      { kind: 'kernel', id: 'k2', name: 'python3' },
      {
        kind: 'terminal',
        id: '1',
        name: '1',
        gpu: {
          devices: ['GPU-1111'],
          memory_mb: null,
          sm: null,
          holds_context: true,
          confidence: 'inferred'
        }
      }
    ],
    window: { seconds: 60, gpu_active_fraction: 0 },
    verdict: verdict({ state: 'idle' }),
    ...extra
  };
}

/** A `localStorage` of the tests' own: what a notice remembers across reloads, per test. */
export function memoryStorage(): Storage {
  const items = new Map<string, string>();
  return {
    getItem: (k: string) => items.get(k) ?? null,
    setItem: (k: string, v: string) => void items.set(k, v),
    removeItem: (k: string) => void items.delete(k),
    clear: () => items.clear(),
    key: () => null,
    get length() {
      return items.size;
    }
  };
}
