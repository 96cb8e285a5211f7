/**
 * @jest-environment jsdom
 *
 * The idle warning's toast goes when the server stops, even right after a countdown tick
 * (ui/warning.ts). JupyterLab's Notification is replaced by a model of its toasts that behaves
 * as react-toastify does in a real browser: an update is applied on a later timer, and an
 * update applied to a toast already dismissed shows it again, for good (seen in chromium with
 * JupyterLab's own commands: update then dismiss in one task left the toast on screen).
 * A reclaim withdrawn after its warning is said once, a reload or a second tab included.
 */
import { WarningNotifier } from '../src/ui/warning';
import { nullTrans } from '../src/trans';
import { memoryStorage, verdict } from './helpers';

const onScreen = new Set<string>();
const said: string[] = [];
let nextId = 0;
jest.mock('@jupyterlab/apputils', () => ({
  Notification: {
    info: (message: string) => {
      said.push(message);
      return `info-${++nextId}`;
    },
    warning: () => {
      const id = `toast-${++nextId}`;
      known.add(id);
      onScreen.add(id);
      return id;
    },
    update: ({ id }: { id: string }) => {
      if (!known.has(id)) {
        return false;
      }
      setTimeout(() => onScreen.add(id), 0); // react-toastify: re-shown if closing
      return true;
    },
    dismiss: (id: string) => {
      known.delete(id);
      onScreen.delete(id);
    }
  }
}));
const known = new Set<string>();

function notifier(storage: Storage | null = null): WarningNotifier {
  return new WarningNotifier({
    trans: nullTrans,
    actions: {
      extend: async () => undefined,
      checkpoint: async () => undefined,
      stop: async () => undefined
    },
    openPanel: () => undefined,
    storageKey: 'test',
    storage
  });
}

describe('WarningNotifier', () => {
  beforeEach(() => {
    jest.useFakeTimers();
    // The warning's deadline is an hour ahead of the fake clock.
    jest.setSystemTime(Date.parse('2026-01-05T11:00:00Z'));
    onScreen.clear();
    known.clear();
    said.length = 0;
  });
  afterEach(() => jest.useRealTimers());

  it('leaves no toast once the server stops right after a countdown tick', () => {
    const warnings = notifier();
    warnings.update(verdict({ cull_at: '2026-01-05T12:00:00Z' }));
    expect(onScreen.size).toBe(1);
    jest.advanceTimersByTime(1000); // the countdown's tick: an update, applied later
    warnings.dispose(); // the owner stopped the server: the tab disposes its warnings
    jest.advanceTimersByTime(5000);
    expect(onScreen.size).toBe(0);
  });

  it('leaves no toast when the warning is withdrawn while a new deadline is shown', () => {
    const warnings = notifier();
    warnings.update(verdict({ cull_at: '2026-01-05T12:00:00Z' }));
    // Extended: the same warning with a later deadline rewrites the toast, then is withdrawn.
    warnings.update(verdict({ cull_at: '2026-01-05T13:00:00Z' }));
    warnings.update(null);
    jest.advanceTimersByTime(5000);
    expect(onScreen.size).toBe(0);
  });

  it('says once that a reclaim it warned of is withdrawn', () => {
    const noDeadline = {
      state: 'active',
      reason: null,
      idle_since: null,
      warn_at: null,
      cull_at: null
    } as const;
    const storage = memoryStorage();
    const warnings = notifier(storage);
    const reclaim =
      'team vision, within its guarantee, needs this borrowed GPU back: it will be given back at 11:15 UTC';
    warnings.update(
      verdict({ cull_at: '2026-01-05T11:15:00Z', reason: reclaim })
    );
    expect(onScreen.size).toBe(1);
    expect(said).toEqual([]);
    // The team that asked cancelled: the deadline leaves the verdict, the withdrawal rides on.
    const lifted = verdict({
      ...noDeadline,
      reclaim_withdrawn: '2026-01-05T11:05:00Z'
    });
    warnings.update(lifted);
    jest.advanceTimersByTime(5000);
    expect(onScreen.size).toBe(0); // the warning went...
    expect(said.length).toBe(1); // ...and the owner is told why, once
    expect(said[0]).toMatch(
      /^Your borrowed GPU is no longer asked back \(since .*11:05.*\): the team that asked for it no longer needs it\. The deadline you were warned of is lifted and this server keeps its GPU\.$/
    );
    warnings.update(lifted); // the next poll
    notifier(storage).update(lifted); // a reload, or another tab on this server
    expect(said.length).toBe(1);
    // A later withdrawal is a new one; none is said over a warning that stands.
    warnings.update(
      verdict({
        cull_at: '2026-01-05T12:00:00Z',
        reclaim_withdrawn: '2026-01-05T11:40:00Z'
      })
    );
    expect(said.length).toBe(1);
    warnings.update(
      verdict({ ...noDeadline, reclaim_withdrawn: '2026-01-05T11:40:00Z' })
    );
    expect(said.length).toBe(2);
  });
});
