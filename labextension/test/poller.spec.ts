/**
 * @jest-environment jsdom
 *
 * What the tab knows about its server: the last report survives a failed poll, and once the
 * Hub answers instead of the server (424), the tab knows it stopped, with what it saw last, and
 * polls no more.
 */
import { StatusPoller } from '../src/poller';
import { IStatusReport } from '../src/types';
import { NOW, report, verdict } from './helpers';

class FakeApi {
  answers: (IStatusReport | Error)[] = [];
  calls = 0;
  async status(): Promise<IStatusReport> {
    this.calls += 1;
    const next = this.answers.shift() ?? new Error('no more answers');
    if (next instanceof Error) {
      throw next;
    }
    return next;
  }
}

function failure(message: string, status: number, gone: boolean): Error {
  return Object.assign(new Error(message), { status, gone });
}

let poller: StatusPoller;
let api: FakeApi;

/** The next change (a refresh resolves once the poll is scheduled, not answered). */
function changed(): Promise<void> {
  return new Promise(resolve => {
    const done = () => {
      poller.changed.disconnect(done);
      resolve();
    };
    poller.changed.connect(done);
  });
}

/** Start polling (the first poll goes out at once) with these answers. */
function start(...answers: (IStatusReport | Error)[]): Promise<void> {
  api.answers = answers;
  poller = new StatusPoller({ api, interval: 600_000, now: () => NOW });
  return changed();
}

function poll(): Promise<void> {
  const next = changed();
  void poller.refresh();
  return next;
}

// jsdom's page is not "visible" (no rendering): the poll would stand by.
Object.defineProperty(document, 'visibilityState', { value: 'visible' });
Object.defineProperty(document, 'hidden', { value: false });

beforeEach(() => {
  api = new FakeApi();
});

afterEach(() => poller.dispose());

it('keeps the last report through a failed poll, and says what failed', async () => {
  const first = report({ verdict: verdict() });
  await start(first, failure('HTTP 502', 502, false));
  expect(poller.report).toBe(first);
  let changes = 0;
  poller.changed.connect(() => (changes += 1));
  await poll();
  expect(poller.report).toBe(first);
  expect(poller.error).toBe('HTTP 502');
  expect(poller.stopped).toBeNull();
  expect(changes).toBe(1);
});

it('shows no error for a 429 (asked to wait), and keeps the last report', async () => {
  const first = report({ verdict: verdict() });
  await start(first, failure('too many requests', 429, false));
  await poll();
  expect(poller.report).toBe(first);
  expect(poller.error).toBeNull();
});

it('knows the server stopped when the Hub answers for it, and stops polling', async () => {
  const last = report({ verdict: verdict({ state: 'checkpointing' }) });
  await start(last, failure('server no longer running', 424, true));
  poller.noteCheckpoint({
    status: 'done',
    cull_reason: 'gpu-idle',
    completed_at: '2026-01-05T11:04:20Z'
  });
  await poll();
  expect(poller.stopped).toEqual({
    at: NOW,
    byOwner: false,
    report: last,
    checkpoint: expect.objectContaining({ cull_reason: 'gpu-idle' })
  });
  const calls = api.calls;
  await poller.refresh();
  expect(api.calls).toBe(calls);
});

it('says the owner stopped it, once', async () => {
  await start(report());
  let changes = 0;
  poller.changed.connect(() => (changes += 1));
  poller.markStopped(true);
  poller.markStopped(false);
  expect(poller.stopped?.byOwner).toBe(true);
  expect(changes).toBe(1);
});
