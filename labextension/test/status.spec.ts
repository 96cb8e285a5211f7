import { nullTrans } from '../src/trans';
import {
  deviceLine,
  statusText,
  statusView,
  tooltip
} from '../src/model/status';
import {
  causeLabel,
  healthAlert,
  rightSizeLine,
  rootCauseView,
  viewState
} from '../src/model/verdict';
import { H100, MIG, opts, report, verdict } from './helpers';

describe('status bar item', () => {
  it('shows memory and activity', () => {
    expect(statusText(report())).toBe('GPU 20.0 GiB · 0%');
  });

  it.each([
    ['active', 'active'],
    ['idle', 'idle'],
    ['busy', 'idle'],
    ['warned', 'warned'],
    ['checkpointing', 'warned'],
    ['culled', 'warned'],
    ['exempt', 'exempt'],
    ['gpu-failed', 'warned'],
    ['unknown', 'unknown'],
    ['something-new', 'unknown']
  ])('governor state %p → colour %p', (state, view) => {
    const r = report({ verdict: verdict({ state }) });
    expect(viewState(r)).toBe(view);
    expect(statusView(r, opts).className).toBe(`jp-GpuGov-state-${view}`);
  });

  it('without a governor, derives the state from the window; unknown is never idle', () => {
    expect(viewState(report({ verdict: null }))).toBe('idle');
    const window = (gpu_active_fraction: number | null) =>
      report({ verdict: null, window: { seconds: 60, gpu_active_fraction } });
    expect(viewState(window(0.3))).toBe('active');
    expect(viewState(window(null))).toBe('unknown');
    expect(viewState(report({ verdict: null, backend: 'unavailable' }))).toBe(
      'unknown'
    );
    expect(viewState(null)).toBe('unknown');
    // Idle once the whole server is idle, even after activity earlier in the window.
    expect(
      viewState(
        report({
          verdict: null,
          window: {
            seconds: 60,
            gpu_active_fraction: 0.3,
            gpu_idle_since: '2026-01-05T10:59:00Z'
          }
        })
      )
    ).toBe('idle');
  });

  it('says when there is no GPU or the backend failed', () => {
    expect(
      statusText(report({ backend: 'none', devices: [], targets: [] }))
    ).toBe('No GPU');
    const lost = report({ backend: 'unavailable', error: 'GPU is lost' });
    expect(statusText(lost)).toBe('GPU unavailable');
    expect(tooltip(lost, opts)).toContain('GPU is lost');
    expect(statusText(null)).toBe('GPU …');
  });

  it('uses the busiest target when a MIG slice has no device activity', () => {
    const r = report({
      devices: [MIG],
      targets: [
        {
          kind: 'kernel',
          id: 'k',
          gpu: { devices: ['MIG-2222'], memory_mb: 4096, sm: 0.5 }
        }
      ]
    });
    expect(statusText(r)).toBe('GPU 4.0 GiB · 50%');
  });

  it('lists the devices, then the governor with its reason in the person’s clock', () => {
    expect(deviceLine(H100)).toBe(
      'NVIDIA H100 80GB HBM3 (whole GPU): 20.0 GiB / 79.6 GiB, 0% active'
    );
    expect(deviceLine(MIG)).toBe(
      'MIG 1g.18gb slice of NVIDIA H200: 4.0 GiB / 17.8 GiB, activity unknown'
    );
    const text = tooltip(
      report({ devices: [H100, MIG], verdict: verdict() }),
      opts
    );
    expect(text.split('\n')).toEqual([
      'NVIDIA H100 80GB HBM3 (whole GPU): 20.0 GiB / 79.6 GiB, 0% active',
      'MIG 1g.18gb slice of NVIDIA H200: 4.0 GiB / 17.8 GiB, activity unknown',
      'Governor: warned',
      'GPU idle since 09:14; server stopped at 11:04 unless extended',
      'Deadline 11:04 (in 4m 9s)'
    ]);
    expect(tooltip(report({ verdict: null }), opts)).toContain(
      'Governor: not connected'
    );
  });

  it('says the server stopped, and why the last update failed', () => {
    expect(statusView(report(), { ...opts, stopped: true })).toMatchObject({
      text: 'GPU: server stopped',
      state: 'stopped'
    });
    expect(
      statusView(report(), { ...opts, error: 'HTTP 502' }).tooltip
    ).toContain('Last update failed: HTTP 502');
  });

  it('reads "reclaim lifted" while the governor says a reclaim was withdrawn, never over a warning', () => {
    const lifted = { reclaim_withdrawn: '2026-01-05T10:55:00Z' };
    const active = {
      state: 'active',
      reason: null,
      idle_since: null,
      warn_at: null,
      cull_at: null
    };
    const view = statusView(
      report({ verdict: verdict({ ...active, ...lifted }) }),
      opts
    );
    expect(view.text).toBe('GPU 20.0 GiB · 0% · reclaim lifted');
    expect(view.className).toBe('jp-GpuGov-state-active');
    expect(view.tooltip).toContain(
      'Your borrowed GPU is no longer asked back (since 10:55)'
    );
    // Its time over, the governor sends none: the item reads as before.
    const after = statusView(report({ verdict: verdict(active) }), opts);
    expect(after.text).toBe('GPU 20.0 GiB · 0%');
    expect(after.tooltip).not.toContain('no longer asked back');
    // A warning that stands again (a new reclaim) is what the item says.
    const warned = statusView(report({ verdict: verdict(lifted) }), opts);
    expect(warned.text).toBe('GPU 20.0 GiB · 0%');
    expect(warned.className).toBe('jp-GpuGov-state-warned');
    expect(warned.tooltip).not.toContain('no longer asked back');
    expect(
      statusView(report({ verdict: verdict({ ...active, ...lifted }) }), {
        ...opts,
        stopped: true
      }).text
    ).toBe('GPU: server stopped');
  });

  it('translates through the bundle', () => {
    const upper = {
      __: (s: string, ...a: unknown[]) => nullTrans.__(s.toUpperCase(), ...a),
      _n: nullTrans._n
    };
    expect(statusText(report(), upper)).toBe('GPU 20.0 GiB · 0%');
    expect(statusText(null, upper)).toBe('GPU …');
  });
});

describe('root cause', () => {
  const ZOMBIE_HINT =
    'This kernel holds GPU memory but has done no GPU work and nobody has used it for a while: save what you need and shut it down (or restart the kernel) to give the GPU back.';

  it('names the cause in words with the hint on one line', () => {
    const view = rootCauseView(
      verdict({
        root_cause: {
          label: 'data_io',
          hint: 'Data loading: try more DataLoader workers.',
          contributions: { read_mb_s: 0.4 },
          source: 'model'
        }
      })
    );
    expect(view).toEqual({
      label: 'data loading',
      hint: 'Data loading: try more DataLoader workers.',
      line: 'Likely cause: data loading. Hint: Data loading: try more DataLoader workers.'
    });
    expect(
      rootCauseView(
        verdict({ root_cause: { label: 'cpu_serial', hint: null } })
      )?.line
    ).toBe('Likely cause: a CPU-bound loop');
  });

  it('says nothing without a cause, for healthy and for unknown', () => {
    expect(rootCauseView(null)).toBeNull();
    expect(rootCauseView(verdict())).toBeNull();
    for (const label of ['healthy', 'unknown', '']) {
      expect(
        rootCauseView(verdict({ root_cause: { label, hint: 'x' } }))
      ).toBeNull();
    }
  });

  it('shows every label in words, and a new one as it is', () => {
    expect(causeLabel('zombie')).toBe('an idle kernel holding GPU memory');
    expect(causeLabel('memory_bandwidth')).toBe('memory-bound kernels');
    expect(causeLabel('small_work')).toBe('too little work per step');
    expect(causeLabel('fragmentation')).toBe('GPUs fragmented across servers');
    expect(causeLabel('thermal_throttle')).toBe('thermal throttle');
  });

  it('is in the tooltip, after the reason', () => {
    const v = verdict({
      root_cause: { label: 'zombie', hint: ZOMBIE_HINT, source: 'rules' }
    });
    const lines = tooltip(report({ verdict: v }), opts).split('\n');
    const reason = lines.findIndex(l => l.startsWith('GPU idle since'));
    expect(lines[reason + 1]).toBe(
      `Likely cause: an idle kernel holding GPU memory. Hint: ${ZOMBIE_HINT}`
    );
  });
});

describe('right size and health', () => {
  it('says which smaller tier the work would fit, when the governor knows one', () => {
    expect(
      rightSizeLine(
        verdict({
          right_size: {
            tier: 'h100-1g',
            label: 'Small H100 slice (MIG 1g.10gb)',
            reason: 'it peaked at 3.2 GiB and 12 % of the SMs over 2 h'
          }
        })
      )
    ).toBe(
      'This work would fit Small H100 slice (MIG 1g.10gb): it peaked at 3.2 GiB and 12 % of the SMs over 2 h'
    );
    expect(rightSizeLine(verdict({ right_size: null }))).toBeNull();
    expect(rightSizeLine(verdict())).toBeNull();
    expect(
      rightSizeLine(
        verdict({ right_size: { tier: 'h100-1g', label: '', reason: '' } })
      )
    ).toBe('This work would fit h100-1g.');
  });

  it('names unhealthy devices and why; ok and unknown say nothing', () => {
    const sick = {
      ...H100,
      health: { status: 'unhealthy', reasons: ['XID 79: GPU fell off the bus'] }
    };
    expect(healthAlert(report({ devices: [sick] }), {})?.line).toBe(
      'GPU NVIDIA H100 80GB HBM3 is unhealthy: XID 79: GPU fell off the bus. Save your work and restart the server.'
    );
    expect(deviceLine(sick)).toContain('UNHEALTHY');
    for (const status of ['ok', 'unknown']) {
      expect(
        healthAlert(
          report({ devices: [{ ...H100, health: { status, reasons: [] } }] }),
          {}
        )
      ).toBeNull();
    }
    expect(healthAlert(report(), {})).toBeNull();
  });
});

describe('a device whose product name NVML could not read', () => {
  it('names a whole GPU whose product name NVML could not read by its UUID, never "null"', () => {
    // IDevice.name is `string | null` on the wire.
    const line = deviceLine({ ...H100, name: null });
    expect(line).toBe('GPU-1111 (whole GPU): 20.0 GiB / 79.6 GiB, 0% active');
    expect(deviceLine({ ...MIG, name: null })).toBe(
      'MIG 1g.18gb slice: 4.0 GiB / 17.8 GiB, activity unknown'
    );
  });
});
