/**
 * @jest-environment jsdom
 *
 * The idle warning's toast goes when the server stops, even right after a countdown tick
 * (ui/warning.ts). JupyterLab's Notification is replaced by a model of its toasts that behaves
 * as react-toastify does in a real browser: an update is applied on a later timer, and an
 * update applied to a toast already dismissed shows it again, for good (seen in chromium with
 * JupyterLab's own commands: update then dismiss in one task left the toast on screen).
 */
import { WarningNotifier } from '../src/ui/warning';
import { nullTrans } from '../src/trans';
import { verdict } from './helpers';

const onScreen = new Set<string>();
let nextId = 0;
jest.mock('@jupyterlab/apputils', () => ({
  Notification: {
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

function notifier(): WarningNotifier {
  return new WarningNotifier({
    trans: nullTrans,
    actions: {
      extend: async () => undefined,
      checkpoint: async () => undefined,
      stop: async () => undefined
    },
    openPanel: () => undefined,
    storageKey: 'test',
    storage: null
  });
}

describe('WarningNotifier', () => {
  beforeEach(() => {
    jest.useFakeTimers();
    // The warning's deadline is an hour ahead of the fake clock.
    jest.setSystemTime(Date.parse('2026-01-05T11:00:00Z'));
    onScreen.clear();
    known.clear();
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
});
