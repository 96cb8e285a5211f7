import {
  PANEL_LINES,
  panelRows,
  panelView,
  sparklineSegments
} from '../src/model/panel';
import { GovState } from '../src/types';
import { H100, MIG, NOW, opts, report, verdict } from './helpers';

const lines = (r: ReturnType<typeof report> | null, error?: string) =>
  panelView(r, { ...opts, error }).lines.map(l => l.text);

describe('the panel’s first lines', () => {
  it('say in one sentence when the server will be stopped, and why', () => {
    const v = verdict({
      root_cause: { label: 'zombie', hint: 'Shut the kernel down.' }
    });
    const view = panelView(report({ verdict: v }), opts);
    expect(view.lines.map(l => l.text)).toEqual([
      'GPU idle: this server will be stopped in 4m 9s (at 11:04) unless you extend.',
      'Likely cause: an idle kernel holding GPU memory.'
    ]);
    expect(view.facts).toContainEqual({
      label: 'What to do',
      value: 'Shut the kernel down.'
    });
  });

  it('never repeat the governor’s reason under a warning that says it already', () => {
    const text = lines(report({ verdict: verdict() })).join(' ');
    expect(text).not.toContain('unless extended');
    expect(text).not.toContain('UTC');
  });

  it('show a reason naming someone with a bidi override as its own isolate', () => {
    // "culled by user:…" names the admin as the Hub does: U+202E in it reversed the rest of
    // the line around the reason, not only the name.
    const v = verdict({
      state: 'culled',
      reason: 'culled by \u2068user:mallory\u202e\u2069: GPU idle',
      warn_at: null,
      cull_at: null
    });
    const [, reason] = lines(report({ verdict: v }));
    expect(reason).toBe(
      '\u2068culled by \u2068user:mallory\u202e\u2069: GPU idle\u2069'
    );
    const why = panelView(report({ verdict: v }), opts).facts.find(
      f => f.label === 'Why'
    );
    expect(why?.value).toBe(reason);
    // Every isolate opened is closed: nothing after the reason is reordered.
    const opened = [...reason].filter(c => c === '\u2068').length;
    expect([...reason].filter(c => c === '\u2069').length).toBe(opened);
  });

  it.each<[GovState | string, string]>([
    ['active', 'GPU in use.'],
    ['idle', 'GPU idle for 1h 46m.'],
    ['busy', 'A cell is running, but the GPU is idle.'],
    ['culled', 'The GPU governor is stopping this server.'],
    ['exempt', 'This server is exempt from idle culling.'],
    [
      'gpu-failed',
      'This server’s GPU failed: save your work. It is not culled as idle.'
    ],
    ['unknown', 'GPU activity unknown: nothing is decided on unknown data.'],
    ['a-new-state', 'GPU activity unknown: nothing is decided on unknown data.']
  ])('read sensibly in state %p', (state, first) => {
    const v = verdict({
      state,
      reason: `reason of ${state} since 2026-01-05 09:14 UTC`,
      warn_at: null,
      cull_at: null
    });
    const text = lines(report({ verdict: v }));
    expect(text[0]).toBe(first);
    if (state !== 'active') {
      // Any other state shows its reason once, with times in the person's clock.
      expect(text[1]).toBe(`reason of ${state} since 09:14`);
    }
  });

  it('say when the warning comes while the GPU is idle', () => {
    const v = verdict({ state: 'idle', warn_at: '2026-01-05T11:30:00Z' });
    expect(lines(report({ verdict: v }))[0]).toBe(
      'GPU idle for 1h 46m. A warning follows at 11:30 unless it is used.'
    );
  });

  it('put an unhealthy device first, and are never more than three', () => {
    const sick = {
      ...H100,
      health: { status: 'unhealthy', reasons: ['XID 79: GPU fell off the bus'] }
    };
    const v = verdict({
      state: 'busy',
      reason: 'a cell is running',
      right_size: { tier: 'mig-1g', label: 'MIG 1g', reason: 'peak 2 GiB' }
    });
    const view = panelView(report({ devices: [sick], verdict: v }), {
      ...opts,
      error: 'HTTP 502'
    });
    expect(view.lines).toHaveLength(PANEL_LINES);
    expect(view.lines[0]).toEqual({
      text: 'GPU NVIDIA H100 80GB HBM3 is unhealthy: XID 79: GPU fell off the bus. Save your work and restart the server.',
      tone: 'alert'
    });
    // What did not fit is in the details.
    expect(view.facts).toContainEqual({
      label: 'Right size',
      value: 'This work would fit MIG 1g: peak 2 GiB'
    });
    expect(view.devices[0]).toContain('XID 79');
  });

  it('show the right size when the governor suggests one', () => {
    const v = verdict({
      state: 'active',
      right_size: {
        tier: 'h100-1g',
        label: 'Small H100 slice',
        reason: 'it never used more than 3 GiB'
      }
    });
    expect(lines(report({ verdict: v }))).toEqual([
      'GPU in use.',
      'This work would fit Small H100 slice: it never used more than 3 GiB'
    ]);
  });

  it('say a withdrawn reclaim lifted the deadline, but never under a warning', () => {
    const lifted = { reclaim_withdrawn: '2026-01-05T10:55:00Z' };
    const v = verdict({
      state: 'active',
      reason: null,
      idle_since: null,
      warn_at: null,
      cull_at: null,
      ...lifted
    });
    expect(lines(report({ verdict: v }))).toEqual([
      'GPU in use.',
      'Your borrowed GPU is no longer asked back (since 10:55): the team that asked for it no longer needs it. The deadline you were warned of is lifted and this server keeps its GPU.'
    ]);
    expect(lines(report({ verdict: verdict(lifted) })).join(' ')).not.toMatch(
      /no longer asked back/
    );
  });

  it('say so without a GPU, a governor or a report', () => {
    expect(lines(report({ backend: 'none', devices: [] }))[0]).toBe(
      'This server has no GPU.'
    );
    expect(lines(report({ verdict: null }))).toEqual([
      'GPU idle.',
      'No GPU governor: nothing is culled.'
    ]);
    expect(lines(null)).toEqual(['Loading GPU status…']);
    expect(lines(null, 'HTTP 502')).toEqual([
      'GPU status unavailable: HTTP 502'
    ]);
  });
});

describe('the panel’s buttons', () => {
  const buttons = (state: string, extra = {}) =>
    panelView(report({ verdict: verdict({ state, ...extra }) }), opts).buttons;

  it('offer Extend only while a deadline runs, and say why it cannot act', () => {
    expect(buttons('warned').map(b => [b.action, b.enabled])).toEqual([
      ['extend', true],
      ['checkpoint', true],
      ['stop', true]
    ]);
    expect(buttons('active').map(b => b.action)).toEqual([
      'checkpoint',
      'stop'
    ]);
    const pending = buttons('warned', { approval_pending: true })[0];
    expect(pending.enabled).toBe(false);
    expect(pending.hint).toContain('waiting for an administrator');
  });

  it('offer no Stop without a governor, and nothing before the first report', () => {
    expect(
      panelView(report({ verdict: null }), opts).buttons.map(b => b.action)
    ).toEqual(['checkpoint']);
    expect(panelView(null, opts).buttons).toEqual([]);
  });
});

describe('the panel’s details', () => {
  it('fold away the facts, with times in the person’s clock', () => {
    const facts = panelView(report({ verdict: verdict() }), opts).facts;
    expect(facts).toEqual(
      expect.arrayContaining([
        { label: 'Governor', value: 'warned' },
        { label: 'Policy', value: 'default' },
        {
          label: 'Why',
          value: 'GPU idle since 09:14; server stopped at 11:04 unless extended'
        },
        { label: 'GPU idle since', value: '09:14 (1h 46m ago)' },
        { label: 'Deadline', value: '11:04 (in 4m 9s)' },
        { label: 'Extensions', value: '2 left, 1h each' }
      ])
    );
  });

  it('tick each second while something counts', () => {
    expect(panelView(report({ verdict: verdict() }), opts).ticking).toBe(true);
    expect(
      panelView(
        report({
          verdict: verdict({ state: 'active', idle_since: null }),
          window: { seconds: 60, gpu_active_fraction: 1 }
        }),
        opts
      ).ticking
    ).toBe(false);
  });
});

describe('who holds the GPU', () => {
  it('lists only targets holding a GPU, with state, confidence and a notebook path', () => {
    const rows = panelRows(report(), opts);
    expect(rows.map(r => r.key)).toEqual(['kernel:k1', 'terminal:1']);
    expect(rows[0]).toMatchObject({
      title: 'train.ipynb',
      path: 'train.ipynb',
      devices: 'NVIDIA H100 80GB HBM3',
      memory: '20.0 GiB',
      activity: '0%',
      state: 'idle',
      confidence: 'exact',
      idleFor: 'idle 10m'
    });
    expect(rows[1]).toMatchObject({
      title: 'Terminal 1',
      path: null,
      memory: '?',
      activity: '?',
      state: 'unknown',
      stateLabel: 'unknown',
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
            gpu: { devices: ['MIG-2222'], memory_mb: 10, sm: 0.2 }
          }
        ]
      }),
      { ...opts, now: NOW }
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
