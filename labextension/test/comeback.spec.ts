/**
 * Coming back after a cull: which checkpoint JupyterLab announces when it starts, and what the
 * notification says. Times are formatted in UTC by the test's own clock and day, so the
 * results do not depend on the machine's time zone.
 */
import {
  checkpointErrors,
  COMING_BACK_MAX_AGE_MS,
  comingBackCheckpoint,
  comingBackView,
  cullReasonPhrase,
  DEFAULT_RESTORE,
  dismissedIds,
  manifestDetails,
  notebookPaths,
  rememberDismissed
} from '../src/model/comeback';
import { ITrans, nullTrans } from '../src/trans';
import { ICheckpointSummary } from '../src/types';

const T = (iso: string) => Date.parse(iso);
const clock = (d: Date) => d.toISOString().slice(11, 16);
const day = (d: Date) => d.toISOString().slice(0, 10);

/** The previous server was stopped at 14:02 UTC; this one started at 14:30. */
const STARTED = T('2026-01-05T14:30:00Z');
const NOW = T('2026-01-05T14:31:00Z');

function summary(extra: Partial<ICheckpointSummary> = {}): ICheckpointSummary {
  return {
    id: '20260105T140200Z',
    reason: 'GPU idle for 2h 1m; saving a checkpoint before the cull',
    cull_reason: 'gpu-idle',
    source: 'governor',
    status: 'done',
    completed_at: '2026-01-05T14:02:10.000Z',
    notebooks: ['train.ipynb'],
    bytes: 1234,
    errors: 0,
    restore: 'from jupyter_gpu_gov import checkpoint; checkpoint.restore()',
    ...extra
  };
}

describe('comingBackCheckpoint', () => {
  const base = { started: STARTED, now: NOW, dismissed: [] as string[] };

  it.each<[string, ICheckpointSummary[], Partial<typeof base>, string | null]>([
    [
      'the governor checkpointed, then stopped the server',
      [summary()],
      {},
      '20260105T140200Z'
    ],
    ['no checkpoints', [], {}, null],
    [
      'the user checkpointed last',
      [summary({ source: 'user', cull_reason: null })],
      {},
      null
    ],
    [
      'the user clicked Checkpoint in JupyterLab last',
      [summary({ source: 'frontend', cull_reason: null })],
      {},
      null
    ],
    [
      'JupyterLab saved first and checkpointed for the governor',
      [summary({ source: 'frontend', cull_reason: 'gpu-idle' })],
      {},
      '20260105T140200Z'
    ],
    [
      'no source, no cull reason',
      [summary({ source: null, cull_reason: null })],
      {},
      null
    ],
    [
      'taken while this server ran (e.g. a postponed cull)',
      [summary({ completed_at: '2026-01-05T14:40:00Z' })],
      {},
      null
    ],
    [
      'unfinished (no completion time)',
      [summary({ completed_at: null })],
      {},
      null
    ],
    [
      'server start unknown',
      [summary()],
      { started: null as unknown as number },
      null
    ],
    [
      'dismissed before',
      [summary()],
      { dismissed: ['20260105T140200Z'] },
      null
    ],
    [
      'too old',
      [summary()],
      { now: T('2026-01-05T14:02:10Z') + COMING_BACK_MAX_AGE_MS + 1 },
      null
    ],
    [
      'only the newest counts: a user checkpoint after the governor one',
      [
        summary({ id: '20260105T141000Z', source: 'user', cull_reason: null }),
        summary()
      ],
      {},
      null
    ],
    [
      'the newest by id, whatever the order of the list',
      [
        summary({
          id: '20260105T120000Z',
          completed_at: '2026-01-05T12:00:05Z'
        }),
        summary({ id: '20260105T140200Z-2' }),
        summary()
      ],
      {},
      '20260105T140200Z-2'
    ]
  ])('%s', (_what, list, options, expected) => {
    const found = comingBackCheckpoint(list, { ...base, ...options });
    expect(found?.id ?? null).toBe(expected);
  });

  it('tolerates a missing or malformed list', () => {
    expect(comingBackCheckpoint(null, base)).toBeNull();
    expect(
      comingBackCheckpoint([{} as ICheckpointSummary, summary()], base)?.id
    ).toBe('20260105T140200Z');
  });
});

describe('comingBackView', () => {
  const opts = { now: NOW, clock, day };

  it.each<[string, Partial<ICheckpointSummary>, string]>([
    [
      'gpu-idle',
      {},
      'Stopped at 14:02 because its GPU was idle; checkpoint saved.'
    ],
    [
      'max-age',
      { cull_reason: 'max-age' },
      'Stopped at 14:02 because it reached its maximum age; checkpoint saved.'
    ],
    [
      'reclaim',
      { cull_reason: 'reclaim' },
      'Stopped at 14:02 because its borrowed GPU was needed back; checkpoint saved.'
    ],
    [
      'admin',
      { cull_reason: 'admin' },
      'Stopped at 14:02 because an administrator stopped it; checkpoint saved.'
    ],
    [
      'inactive',
      { cull_reason: 'inactive' },
      'Stopped at 14:02 because it was inactive; checkpoint saved.'
    ],
    [
      'no cull reason: the manifest reason',
      { cull_reason: null, reason: 'maintenance window' },
      'Stopped at 14:02 (maintenance window); checkpoint saved.'
    ],
    [
      'an unknown cull reason: the manifest reason',
      { cull_reason: 'solar-flare', reason: 'maintenance window' },
      'Stopped at 14:02 (maintenance window); checkpoint saved.'
    ],
    [
      'no reason at all',
      { cull_reason: null, reason: null },
      'Stopped at 14:02; checkpoint saved.'
    ],
    [
      'one problem',
      { status: 'failed', errors: 1 },
      'Stopped at 14:02 because its GPU was idle; checkpoint saved with 1 problem.'
    ],
    [
      'problems',
      { status: 'failed', errors: 3 },
      'Stopped at 14:02 because its GPU was idle; checkpoint saved with 3 problems.'
    ],
    [
      'failed without a count',
      { status: 'failed', errors: null },
      'Stopped at 14:02 because its GPU was idle; the checkpoint is incomplete.'
    ],
    [
      'another day',
      { completed_at: '2026-01-04T22:15:00Z' },
      'Stopped on 2026-01-04, 22:15 because its GPU was idle; checkpoint saved.'
    ]
  ])('%s', (_what, extra, message) => {
    expect(comingBackView(summary(extra), opts).message).toBe(message);
  });

  it('offers problems as a warning with Details, a clean one as info without', () => {
    const clean = comingBackView(summary(), opts);
    expect([clean.kind, clean.details, clean.problems]).toEqual([
      'info',
      false,
      0
    ]);
    const bad = comingBackView(summary({ status: 'failed', errors: 2 }), opts);
    expect([bad.kind, bad.details, bad.problems]).toEqual(['warning', true, 2]);
  });

  it.each<[string[], string[], string | null]>([
    [[], [], null],
    [['train.ipynb'], ['Open train.ipynb'], null],
    [
      ['a/b/one.ipynb', 'two.ipynb', 'three.ipynb'],
      ['Open one.ipynb', 'Open two.ipynb', 'Open three.ipynb'],
      null
    ],
    [
      ['1.ipynb', '2.ipynb', '3.ipynb', '4.ipynb', '5.ipynb'],
      ['Open 1.ipynb', 'Open 2.ipynb', 'Open 3.ipynb'],
      'and 2 more'
    ],
    [
      ['1.ipynb', '2.ipynb', '3.ipynb', '4.ipynb'],
      ['Open 1.ipynb', 'Open 2.ipynb', 'Open 3.ipynb'],
      'and 1 more'
    ]
  ])('notebooks %j → %j, %p', (paths, labels, more) => {
    const view = comingBackView(summary({ notebooks: paths }), opts);
    expect(view.notebooks.map(n => n.label)).toEqual(labels);
    expect(view.notebooks.map(n => n.path)).toEqual(paths.slice(0, 3));
    expect(view.moreLabel).toBe(more);
    expect(view.more).toBe(Math.max(0, paths.length - 3));
  });

  it('shortens a long notebook name on its button, keeps the path', () => {
    const path = `projects/${'x'.repeat(40)}.ipynb`;
    const [link] = comingBackView(
      summary({ notebooks: [path] }),
      opts
    ).notebooks;
    expect(link.path).toBe(path);
    expect(link.label.length).toBeLessThan(45);
    expect(link.label.endsWith('…')).toBe(true);
  });

  it('restores with the server line, else the documented one', () => {
    expect(comingBackView(summary({ restore: 'x = 1' }), opts).restore).toBe(
      'x = 1'
    );
    expect(comingBackView(summary({ restore: null }), opts).restore).toBe(
      DEFAULT_RESTORE
    );
  });

  it('goes through the translator', () => {
    const calls: string[] = [];
    const upper: ITrans = {
      __: (msgid, ...args) => {
        calls.push(msgid);
        return nullTrans.__(msgid, ...args).toUpperCase();
      },
      _n: (msgid, plural, n, ...args) => {
        calls.push(msgid);
        return nullTrans._n(msgid, plural, n, ...args).toUpperCase();
      }
    };
    const view = comingBackView(
      summary({ errors: 2, notebooks: ['a', 'b', 'c', 'd'] }),
      {
        ...opts,
        trans: upper
      }
    );
    expect(view.message).toBe(
      'STOPPED AT 14:02 BECAUSE ITS GPU WAS IDLE; CHECKPOINT SAVED WITH 2 PROBLEMS.'
    );
    expect(view.moreLabel).toBe('AND 1 MORE');
    expect(calls).toContain('its GPU was idle');
    expect(cullReasonPhrase('admin', upper)).toBe(
      'AN ADMINISTRATOR STOPPED IT'
    );
  });
});

describe('dismissed checkpoints', () => {
  it.each<[string | null, string[]]>([
    [null, []],
    ['', []],
    ['not json', []],
    ['{"a": 1}', []],
    ['["a", 2, "b"]', ['a', 'b']]
  ])('%p reads as %j', (raw, ids) => {
    expect(dismissedIds(raw)).toEqual(ids);
  });

  it('remembers each id once, the newest last, a bounded number', () => {
    expect(rememberDismissed(['a', 'b'], 'a')).toEqual(['b', 'a']);
    expect(rememberDismissed(['a', 'b', 'c'], 'd', 3)).toEqual(['b', 'c', 'd']);
  });
});

describe('manifest details', () => {
  it('lists problems, notebooks and the whole manifest', () => {
    const manifest = {
      id: '20260105T140200Z',
      path: '/home/alice/.jupyter-gpu-gov/checkpoints/20260105T140200Z',
      status: 'failed',
      notebooks: [{ path: 'train.ipynb', checkpoint_id: 'checkpoint' }],
      errors: [
        "kernel python3 (train.ipynb): hook 'torch' failed: OSError: [Errno 28] No space left on device",
        { path: 'old.ipynb', error: 'permission denied' }
      ]
    };
    const details = manifestDetails('20260105T140200Z', manifest);
    expect(details.title).toBe('Checkpoint 20260105T140200Z');
    expect(details.problems).toEqual([
      "kernel python3 (train.ipynb): hook 'torch' failed: OSError: [Errno 28] No space left on device",
      'old.ipynb: permission denied'
    ]);
    expect(details.notebooks).toEqual(['train.ipynb']);
    expect(details.path).toBe(manifest.path);
    expect(JSON.parse(details.json)).toEqual(manifest);
  });

  it('copes with nothing', () => {
    expect(manifestDetails('x', null)).toEqual({
      title: 'Checkpoint x',
      problems: [],
      notebooks: [],
      path: null,
      json: ''
    });
    expect(checkpointErrors(undefined)).toEqual([]);
    expect(
      notebookPaths([{ path: 'a.ipynb' }, 'b.ipynb', { path: '' }])
    ).toEqual(['a.ipynb', 'b.ipynb']);
  });
});

describe('a checkpoint whose manifest in the user’s folder is out of shape', () => {
  // The server lists a manifest's reason, status and times as the file holds them (an edit,
  // a disk that filled): the notification and its Details dialog must still read.
  const opts = { now: NOW, clock, day };

  it('is announced, its words none, when its reason, errors or restore are no strings', () => {
    const odd = summary({
      cull_reason: null,
      reason: 5 as never,
      errors: 'many' as never,
      restore: { code: 'x' } as never
    });
    // Before, `.trim` of a number threw: no coming-back notification at all.
    const view = comingBackView(odd, opts);
    expect(view.message).toBe('Stopped at 14:02; checkpoint saved.');
    expect(view.restore).toBe(DEFAULT_RESTORE);
    expect(view.problems).toBe(0);
  });

  it('reads a time that is no string as unknown, not as a year', () => {
    // Date.parse(2026) reads the number's text: "Stopped on 2026-01-01, 00:00".
    const odd = summary({ completed_at: 2026 as never });
    expect(comingBackView(odd, opts).message).toBe(
      'Stopped because its GPU was idle; checkpoint saved.'
    );
    expect(
      comingBackCheckpoint([odd], { started: STARTED, now: NOW })
    ).toBeNull();
  });

  it('opens the Details dialog when its errors or notebooks are no lists', () => {
    const details = manifestDetails('20260105T140200Z', {
      errors: 'disk full',
      notebooks: { 'train.ipynb': true }
    } as never);
    expect(details.problems).toEqual([]);
    expect(details.notebooks).toEqual([]);
    expect(details.json).toContain('disk full');
  });
});
