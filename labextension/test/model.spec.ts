import {
  approvalOutcome,
  causeLabel,
  checkpointDue,
  checkpointOutcome,
  checkReason,
  deviceLine,
  extendOutcome,
  extendView,
  formatActivity,
  formatCountdown,
  formatDuration,
  formatMemory,
  IStatusReport,
  IVerdict,
  nullTrans,
  panelRows,
  rightSizeLine,
  rootCauseView,
  sparklineSegments,
  statusText,
  statusView,
  stopOutcome,
  tooltip,
  viewState,
  warningAction,
  warningKey,
  warningView
} from '../src/model';

const NOW = Date.parse('2026-01-05T11:00:00Z');
const clock = (d: Date) => d.toISOString().slice(11, 16);
const opts = { now: NOW, clock };

const H100 = {
  uuid: 'GPU-1111',
  name: 'NVIDIA H100 80GB HBM3',
  mig_profile: null,
  memory_total_mb: 81559,
  memory_used_mb: 20480,
  activity: 0.0,
  shared: false
};

const MIG = {
  uuid: 'MIG-2222',
  name: 'NVIDIA H200',
  mig_profile: '1g.18gb',
  parent_uuid: 'GPU-9999',
  memory_total_mb: 18176,
  memory_used_mb: 4096,
  activity: null
};

function verdict(extra: Partial<IVerdict> = {}): IVerdict {
  return {
    state: 'warned',
    reason:
      'GPU idle since 09:14 UTC; server stopped at 11:14 UTC unless extended',
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

function report(extra: Partial<IStatusReport> = {}): IStatusReport {
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
      { kind: 'kernel', id: 'k2', name: 'python3', gpu: null },
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

describe('formatCountdown', () => {
  it.each([
    [3_900_000, '1h 05m'],
    [249_000, '4m 09s'],
    [248_200, '4m 09s'],
    [42_000, '42s'],
    [60_000, '1m 00s'],
    [3_600_000, '1h 00m'],
    [90_061_000, '1d 01h'],
    [1, '1s'],
    [0, '0s'],
    [-5_000, '0s'],
    [NaN, '0s'],
    [Infinity, '0s']
  ])('%p ms → %p', (ms, text) => {
    expect(formatCountdown(ms)).toBe(text);
  });
});

describe('formatters', () => {
  it('formats durations, memory and activity; unknown is "?", never 0', () => {
    expect(formatDuration(3600)).toBe('1h');
    expect(formatDuration(5400)).toBe('1h 30m');
    expect(formatDuration(900)).toBe('15m');
    expect(formatDuration(0)).toBe('0s');
    expect(formatDuration(null)).toBe('?');
    expect(formatMemory(20480)).toBe('20.0 GiB');
    expect(formatMemory(512)).toBe('512 MiB');
    expect(formatMemory(null)).toBe('?');
    expect(formatActivity(0)).toBe('0%');
    expect(formatActivity(0.374)).toBe('37%');
    expect(formatActivity(null)).toBe('?');
  });
});

describe('status bar view', () => {
  it('shows memory and activity', () => {
    expect(statusText(report())).toBe('GPU 20.0 GiB · 0%');
  });

  it.each([
    ['active', 'active'],
    ['idle', 'idle'],
    ['warned', 'warned'],
    ['checkpointing', 'warned'],
    ['culled', 'warned'],
    ['exempt', 'exempt'],
    ['unknown', 'unknown'],
    ['something-new', 'unknown']
  ])('governor state %p → class %p', (state, view) => {
    const r = report({ verdict: verdict({ state }) });
    expect(viewState(r)).toBe(view);
    expect(statusView(r, opts).className).toBe(`jp-GpuGov-state-${view}`);
  });

  it('without a governor, derives the state from the window; unknown is never idle', () => {
    expect(viewState(report({ verdict: null }))).toBe('idle');
    expect(
      viewState(
        report({
          verdict: null,
          window: { seconds: 60, gpu_active_fraction: 0.3 }
        })
      )
    ).toBe('active');
    expect(
      viewState(
        report({
          verdict: null,
          window: { seconds: 60, gpu_active_fraction: null }
        })
      )
    ).toBe('unknown');
    expect(viewState(report({ verdict: null, backend: 'unavailable' }))).toBe(
      'unknown'
    );
    expect(viewState(null)).toBe('unknown');
  });

  it('says when there is no GPU or the backend failed', () => {
    expect(
      statusText(report({ backend: 'none', devices: [], targets: [] }))
    ).toBe('No GPU');
    expect(
      statusText(report({ backend: 'unavailable', error: 'GPU is lost' }))
    ).toBe('GPU unavailable');
    expect(
      tooltip(report({ backend: 'unavailable', error: 'GPU is lost' }), opts)
    ).toContain('GPU is lost');
    expect(statusText(null)).toBe('GPU …');
  });

  it('uses the busiest target when a MIG slice has no device activity', () => {
    const r = report({
      devices: [MIG],
      targets: [
        {
          kind: 'kernel',
          id: 'k',
          gpu: {
            devices: ['MIG-2222'],
            memory_mb: 4096,
            sm: 0.5,
            holds_context: true
          }
        }
      ]
    });
    expect(statusText(r)).toBe('GPU 4.0 GiB · 50%');
  });

  it('lists whole GPUs and MIG slices in the tooltip', () => {
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
      'GPU idle since 09:14 UTC; server stopped at 11:14 UTC unless extended',
      'Deadline 11:04 (in 4m 09s)'
    ]);
    expect(tooltip(report({ verdict: null }), opts)).toContain(
      'Governor: not connected'
    );
  });

  it('translates through the bundle', () => {
    const upper = {
      __: (s: string, ...a: unknown[]) => nullTrans.__(s.toUpperCase(), ...a),
      _n: nullTrans._n
    };
    expect(statusText(report(), upper)).toBe(
      'GPU 20.0 GIB · 0%'.replace('GIB', 'GiB')
    );
  });
});

describe('panel rows', () => {
  it('lists only targets holding a GPU, with state, confidence and a notebook path', () => {
    const rows = panelRows(report(), opts);
    expect(rows.map(r => r.key)).toEqual(['kernel:k1', 'terminal:1']);
    expect(rows[0]).toMatchObject({
      title: 'Kernel python3 · train.ipynb',
      path: 'train.ipynb',
      devices: 'NVIDIA H100 80GB HBM3',
      memory: '20.0 GiB',
      activity: '0%',
      state: 'idle',
      confidence: 'exact',
      idleFor: '10m 00s'
    });
    expect(rows[1]).toMatchObject({
      title: 'Terminal 1',
      path: null,
      memory: '?',
      activity: '?',
      state: 'unknown',
      confidence: 'inferred',
      idleFor: null
    });
  });

  it('names MIG slices and other processes', () => {
    const rows = panelRows(
      report({
        devices: [MIG],
        targets: [
          {
            kind: 'other',
            id: 'server',
            gpu: {
              devices: ['MIG-2222'],
              memory_mb: 10,
              sm: 0.2,
              holds_context: true
            }
          }
        ]
      }),
      opts
    );
    expect(rows[0]).toMatchObject({
      title: 'Other processes of this server',
      devices: '1g.18gb (MIG)',
      state: 'active'
    });
  });

  it('breaks the sparkline at unknown samples', () => {
    expect(sparklineSegments([0.5, 0.2, null, 0, 0], 40, 10)).toEqual([
      '0,5 10,8',
      '30,10 40,10'
    ]);
    expect(sparklineSegments([], 40, 10)).toEqual([]);
    expect(sparklineSegments([1], 40, 10)).toEqual(['20,0']);
  });
});

describe('warning', () => {
  it('says what will happen and when, with a countdown', () => {
    const view = warningView(verdict(), opts);
    expect(view).not.toBeNull();
    expect(view?.toast).toBe(
      'GPU idle: this server will be stopped in 4m 09s (at 11:04) unless you extend.'
    );
    expect(view?.countdown).toBe('4m 09s');
    expect(view?.key).toBe('2026-01-05T11:04:09Z');
    expect(view?.extend).toMatchObject({
      enabled: true,
      label: 'Extend 1h',
      reason: 'optional'
    });
    expect(view?.detail).toContain('2 extensions left');
    expect(view?.detail).toContain('unless extended. Keep the GPU'); // whole sentences
  });

  it('names the cull action, the past deadline, dry run and the root cause', () => {
    const v = verdict({
      cull_action: 'shutdown-kernels',
      dry_run: true,
      root_cause: { label: 'zombie', hint: 'memory held, no GPU work' }
    });
    const view = warningView(v, opts);
    expect(view?.toast).toContain(
      'its GPU kernels will be shut down in 4m 09s'
    );
    expect(view?.toast).toContain('Dry run');
    expect(view?.detail).toContain('Hint: memory held, no GPU work');
    expect(
      warningView(verdict(), { ...opts, now: NOW + 3_600_000 })?.toast
    ).toBe('GPU idle: this server will be stopped now.');
    expect(
      warningView(verdict({ state: 'checkpointing' }), opts)?.toast
    ).toContain('saving a checkpoint');
  });

  it('keeps the toast within JupyterLab’s 140 characters', () => {
    const view = warningView(
      verdict({
        approval_pending: true,
        dry_run: true,
        cull_action: 'shutdown-kernels'
      }),
      opts
    );
    expect(view?.toast.length).toBeLessThanOrEqual(140);
  });

  it('only warns for warned and checkpointing', () => {
    for (const state of ['active', 'idle', 'exempt', 'culled', 'unknown']) {
      expect(warningView(verdict({ state }), opts)).toBeNull();
      expect(warningKey(verdict({ state }))).toBeNull();
    }
    expect(warningView(null, opts)).toBeNull();
  });

  it('raises once per deadline, updates, and dismisses when the verdict clears', () => {
    const v = verdict();
    expect(warningAction(null, v)).toBe('raise');
    expect(warningAction(warningKey(v), v)).toBe('update');
    expect(
      warningAction(warningKey(v), verdict({ cull_at: '2026-01-05T12:04:09Z' }))
    ).toBe('raise');
    expect(warningAction(warningKey(v), verdict({ state: 'active' }))).toBe(
      'dismiss'
    );
    expect(warningAction(null, verdict({ state: 'active' }))).toBe('none');
    expect(warningAction(warningKey(v), null)).toBe('dismiss');
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

  it('shows every label of DESIGN §8 in words, and a new one as it is', () => {
    expect(causeLabel('zombie')).toBe('an idle kernel holding GPU memory');
    expect(causeLabel('memory_bandwidth')).toBe('memory-bound kernels');
    expect(causeLabel('small_work')).toBe('too little work per step');
    expect(causeLabel('fragmentation')).toBe('GPUs fragmented across servers');
    expect(causeLabel('thermal_throttle')).toBe('thermal throttle');
  });

  it('is in the idle warning and in the tooltip, after the reason', () => {
    const v = verdict({
      root_cause: { label: 'zombie', hint: ZOMBIE_HINT, source: 'rules' }
    });
    const detail = warningView(v, opts)?.detail ?? '';
    expect(detail).toContain(
      'Likely cause: an idle kernel holding GPU memory. Hint: This kernel holds GPU memory'
    );
    expect(detail.indexOf('Likely cause')).toBeGreaterThan(
      detail.indexOf('GPU idle since 09:14')
    );
    const text = tooltip(report({ verdict: v }), opts);
    const lines = text.split('\n');
    const reason = lines.findIndex(l => l.startsWith('GPU idle since'));
    expect(lines[reason + 1]).toBe(
      `Likely cause: an idle kernel holding GPU memory. Hint: ${ZOMBIE_HINT}`
    );
    expect(tooltip(report({ verdict: verdict() }), opts)).not.toContain(
      'Likely cause'
    );
  });
});

describe('extend button', () => {
  it('explains pending approval and the last extensions', () => {
    expect(extendView(verdict({ approval_pending: true }))).toMatchObject({
      enabled: false,
      hint: expect.stringContaining('waiting for an administrator')
    });
    expect(extendView(verdict({ extensions_left: 0 }))).toMatchObject({
      enabled: true,
      label: 'Ask for 1h more',
      hint: expect.stringContaining('administrator must approve')
    });
    expect(extendView(verdict({ state: 'active' })).enabled).toBe(false);
    expect(extendView(verdict({ extension_reason: 'required' })).reason).toBe(
      'required'
    );
  });
});

describe('reason prompt', () => {
  it('requires a reason only when the policy says so', () => {
    expect(checkReason('optional', '')).toEqual({
      ok: true,
      reason: '',
      error: null
    });
    expect(checkReason('optional', '  data  ')).toEqual({
      ok: true,
      reason: 'data',
      error: null
    });
    const missing = checkReason('required', '   ');
    expect(missing.ok).toBe(false);
    expect(missing.error).toContain('needs a reason');
    expect(checkReason('required', 'waiting for data').ok).toBe(true);
  });

  it('treats a cancelled prompt as no request, without an error', () => {
    expect(checkReason('required', null)).toEqual({
      ok: false,
      reason: '',
      error: null
    });
    expect(checkReason('optional', undefined).ok).toBe(false);
  });
});

describe('outcomes in plain words', () => {
  it('granted', () => {
    const out = extendOutcome(
      200,
      {
        status: 'granted',
        message: 'extended by 1h; 1 left',
        verdict: verdict({
          state: 'idle',
          cull_at: '2026-01-05T12:04:09Z',
          extensions_left: 1
        })
      },
      opts
    );
    expect(out).toEqual({
      kind: 'success',
      message:
        'Extension granted: the GPU stays with you until 12:04 (in 1h 04m). 1 extension left.'
    });
    const last = extendOutcome(
      200,
      { status: 'granted', verdict: verdict({ extensions_left: 0 }) },
      opts
    );
    expect(last.message).toContain('That was your last one');
  });

  it('pending', () => {
    const out = extendOutcome(
      202,
      {
        status: 'pending',
        message: 'all 2 extensions used',
        verdict: verdict({ approval_pending: true })
      },
      opts
    );
    expect(out.kind).toBe('info');
    expect(out.message).toBe(
      'You have used all your extensions, so an administrator must approve this one. Until then the current deadline (11:04) still applies.'
    );
  });

  it('refused, with the reason in plain words', () => {
    expect(
      extendOutcome(
        409,
        { status: 'refused', message: 'a reason is required to extend' },
        opts
      )
    ).toEqual({
      kind: 'warning',
      message:
        'Extension refused: this policy needs a reason. Try again and say why.'
    });
    expect(
      extendOutcome(
        409,
        {
          status: 'refused',
          message: 'nothing to extend: the server is active'
        },
        opts
      ).message
    ).toContain('GPU in use again');
    expect(
      extendOutcome(
        409,
        {
          message:
            'this server does not report to a governor (GpuGovApp.governor_url)'
        },
        opts
      ).message
    ).toContain('not governed');
    expect(
      extendOutcome(409, { status: 'refused', message: 'policy says no' }, opts)
        .message
    ).toBe('Extension refused: policy says no');
  });

  it('errors', () => {
    expect(
      extendOutcome(502, { message: 'the governor did not answer' }, opts)
    ).toMatchObject({
      kind: 'error',
      message: 'The GPU governor did not answer. Try again in a minute.'
    });
    expect(extendOutcome(0, null, opts).message).toContain('Could not reach');
    expect(extendOutcome(500, null, opts).message).toBe(
      'Could not extend (HTTP 500).'
    );
  });

  it('checkpoint success and failure', () => {
    expect(
      checkpointOutcome(
        {
          status: 'done',
          notebooks: [{ path: 'a.ipynb' }, { path: 'b.ipynb' }]
        },
        { saved: 1, failed: [] },
        null
      )
    ).toEqual({
      kind: 'success',
      message:
        'Checkpoint saved for 2 notebooks. 1 unsaved document was saved first.'
    });
    const failed = checkpointOutcome(
      {
        status: 'failed',
        notebooks: [],
        errors: [{ path: 'a.ipynb', error: 'disk full' }]
      },
      { saved: 0, failed: ['b.ipynb'] },
      null
    );
    expect(failed.kind).toBe('error');
    expect(failed.message).toContain('a.ipynb: disk full');
    expect(failed.message).toContain('Could not save: b.ipynb.');
    expect(
      checkpointOutcome(null, { saved: 0, failed: [] }, 'HTTP 500').message
    ).toBe('Checkpoint failed: HTTP 500');
  });

  it('stop', () => {
    expect(stopOutcome(200, { status: 'stopping' }).kind).toBe('success');
    expect(stopOutcome(409, { message: 'no governor' }).kind).toBe('warning');
    expect(
      stopOutcome(502, { message: 'the governor did not answer' }).message
    ).toContain('the governor did not answer');
  });
});

describe('checkpoint requests', () => {
  it('fires once per request', () => {
    const v = verdict({ checkpoint: 'requested' });
    const key = checkpointDue(v, null);
    expect(key).not.toBeNull();
    expect(checkpointDue(v, key)).toBeNull();
    expect(checkpointDue(verdict({ checkpoint: 'none' }), null)).toBeNull();
    expect(checkpointDue(null, null)).toBeNull();
  });
});

describe('no governor', () => {
  it('is idle once the whole server is idle, even after activity earlier in the window', () => {
    const r = report({
      verdict: null,
      window: {
        seconds: 60,
        gpu_active_fraction: 0.3,
        gpu_idle_since: '2026-01-05T10:59:00Z'
      }
    });
    expect(viewState(r)).toBe('idle');
  });
});

describe('admin decision on a pending extension', () => {
  const pending = verdict({ approval_pending: true, extensions_left: 0 });
  it('explains an approval with the new deadline', () => {
    const next = verdict({
      approval_pending: false,
      cull_at: '2026-01-05T12:04:09Z'
    });
    expect(approvalOutcome(pending, next, opts)).toEqual({
      kind: 'success',
      message:
        'An administrator approved your extension: the GPU stays with you until 12:04.'
    });
  });
  it('explains a denial in plain words', () => {
    const next = verdict({ approval_pending: false });
    expect(approvalOutcome(pending, next, opts)).toEqual({
      kind: 'warning',
      message:
        'An administrator did not approve your extension: the deadline stays at 11:04. Save your work or checkpoint now.'
    });
  });
  it('says nothing when nothing was pending or it is still pending', () => {
    expect(approvalOutcome(verdict(), verdict(), opts)).toBeNull();
    expect(approvalOutcome(pending, pending, opts)).toBeNull();
    expect(
      approvalOutcome(
        pending,
        verdict({ state: 'active', approval_pending: false }),
        opts
      )
    ).toBeNull();
  });
});

describe('right-sizing', () => {
  it('names the smaller tier and why, or says nothing', () => {
    const fit = {
      tier: 'h100-1g',
      label: 'Small H100 slice (MIG 1g.10gb)',
      reason: 'at most 6.3 GB of GPU memory and 5% of the GPU over 2h'
    };
    expect(rightSizeLine(verdict({ right_size: fit }))).toBe(
      'A smaller GPU would do: Small H100 slice (MIG 1g.10gb) (at most 6.3 GB of GPU memory and 5% of the GPU over 2h).'
    );
    expect(rightSizeLine(verdict({ right_size: { tier: 'h100-1g' } }))).toBe(
      'A smaller GPU would do: h100-1g.'
    );
    expect(rightSizeLine(verdict())).toBeNull();
    expect(rightSizeLine(verdict({ right_size: null }))).toBeNull();
  });
});
