import { stoppedView } from '../src/model/stopped';
import { ICheckpointManifest } from '../src/types';
import { NOW, opts, report, verdict } from './helpers';

const manifest = (extra: Partial<ICheckpointManifest> = {}) =>
  ({
    status: 'done',
    id: '20260105T110420Z',
    cull_reason: 'gpu-idle',
    source: 'frontend',
    completed_at: '2026-01-05T11:04:20Z',
    notebooks: [{ path: 'train.ipynb' }],
    errors: [],
    ...extra
  }) as ICheckpointManifest;

const AFTER = NOW + 5 * 60 * 1000; // the tab learns of the stop at 11:05

describe('the tab after its server stopped', () => {
  it('says when and why the governor stopped it, and that the checkpoint was saved', () => {
    const view = stoppedView(
      {
        at: AFTER,
        byOwner: false,
        report: report({ verdict: verdict({ state: 'checkpointing' }) }),
        checkpoint: manifest()
      },
      { ...opts, now: AFTER }
    );
    expect(view).toEqual({
      title: 'Server stopped',
      message:
        'This server was stopped at 11:04 because its GPU was idle; checkpoint saved.',
      next: 'Start it again to keep working: JupyterLab then shows what the checkpoint saved and how to restore it.',
      action: 'Start it again on the Hub'
    });
  });

  it('names each reason the governor gives, and a checkpoint with problems', () => {
    const view = (extra: Partial<ICheckpointManifest>) =>
      stoppedView(
        {
          at: AFTER,
          byOwner: false,
          report: report({ verdict: verdict() }),
          checkpoint: manifest(extra)
        },
        { ...opts, now: AFTER }
      ).message;
    expect(view({ cull_reason: 'max-age' })).toContain(
      'because it reached its maximum age; checkpoint saved.'
    );
    expect(view({ cull_reason: 'reclaim' })).toContain(
      'because its borrowed GPU was needed back'
    );
    expect(view({ cull_reason: 'busy-limit' })).toContain(
      'because a cell ran for hours with its GPU idle'
    );
    expect(view({ cull_reason: 'unclaimed' })).toContain(
      'because it started from the line for a GPU and was not opened in time; checkpoint saved.'
    );
    expect(
      view({ status: 'failed', errors: ['hook x failed', 'disk full'] })
    ).toContain('; checkpoint saved with 2 problems.');
  });

  it('falls back on the last verdict, and leaves out a checkpoint it did not see', () => {
    const view = stoppedView(
      { at: AFTER, byOwner: false, report: report({ verdict: verdict() }) },
      { ...opts, now: AFTER }
    );
    expect(view.message).toBe(
      'This server was stopped at 11:04 because its GPU was idle.'
    );
    expect(view.next).toBe('Start it again to keep working.');
    // An old checkpoint (the owner's, yesterday) is not this stop's.
    const old = stoppedView(
      {
        at: AFTER,
        byOwner: false,
        report: report({ verdict: verdict({ state: 'active' }) }),
        checkpoint: manifest({
          completed_at: '2026-01-04T09:00:00Z',
          cull_reason: null,
          source: 'user'
        })
      },
      { ...opts, now: AFTER }
    );
    expect(old.message).toBe('This server was stopped at 11:05.');
  });

  it('says the owner stopped it from here', () => {
    const view = stoppedView(
      { at: AFTER, byOwner: true, report: report() },
      { ...opts, now: AFTER }
    );
    expect(view.message).toBe('You stopped this server at 11:05.');
  });

  it('names the day when the stop was not today', () => {
    const view = stoppedView(
      { at: AFTER, byOwner: false, report: null },
      { ...opts, now: AFTER + 24 * 3600 * 1000 }
    );
    expect(view.message).toBe('This server was stopped on 2026-01-05, 11:05.');
  });
});
