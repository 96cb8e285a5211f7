import {
  approvalOutcome,
  checkpointDue,
  checkpointOutcome,
  extendOutcome,
  retryAfterSeconds,
  stopOutcome
} from '../src/model/outcomes';
import { opts, verdict } from './helpers';

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
        'Extension granted: the GPU stays with you until 12:04 (in 1h 4m). 1 extension left.'
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

  it('a 429 (the governor asks for a pause) is no error: it says to wait, and how long', () => {
    const busy = "too many requests from 'alice': send again in 7 s";
    for (const out of [
      extendOutcome(429, { message: busy }, opts),
      stopOutcome(429, { message: busy })
    ]) {
      expect(out).toEqual({
        kind: 'info',
        message:
          'The GPU governor had many requests from you just now, so nothing was done. Try again in 7 s.'
      });
    }
    expect(extendOutcome(429, null, opts)).toMatchObject({
      kind: 'info',
      message: expect.stringContaining('Try again in a minute.')
    });
  });

  it("a 429's wait is its Retry-After header's, passed on by the server, not the message's words", () => {
    const worded = {
      message: "too many requests from 'alice': send again in 7 s"
    };
    for (const out of [
      extendOutcome(429, worded, opts, 12),
      stopOutcome(429, worded, undefined, 12),
      extendOutcome(429, { message: 'Too Many Requests' }, opts, 12)
    ]) {
      expect(out).toEqual({
        kind: 'info',
        message:
          'The GPU governor had many requests from you just now, so nothing was done. Try again in 12 s.'
      });
    }
    expect(retryAfterSeconds(' 12 ')).toBe(12);
    for (const value of [
      null,
      '',
      'Wed, 21 Oct 2015 07:28:00 GMT',
      '-1',
      '1e3',
      '9999999'
    ]) {
      expect(retryAfterSeconds(value)).toBeNull();
    }
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

  it('a checkpoint with many or long errors says the first few, briefly', () => {
    // A hook that raised with a message of pages (a tensor in the text), in a loop of
    // kernels: the notification, which stays until closed, held all of it.
    const errors = Array.from(
      { length: 40 },
      (_, i) =>
        `hook 'config' failed (kernel ${i}): ValueError: ${'x'.repeat(300000)}`
    );
    const out = checkpointOutcome(
      { status: 'failed', notebooks: [], errors },
      { saved: 0, failed: [] },
      null
    );
    expect(out.kind).toBe('error');
    expect(out.message.length).toBeLessThan(1500);
    expect(out.message).toContain(
      "hook 'config' failed (kernel 0): ValueError: xxx"
    );
    expect(out.message).toContain("hook 'config' failed (kernel 2)");
    expect(out.message).not.toContain('(kernel 3)');
    expect(out.message).toContain('and 37 more');
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

describe('an answer whose message is no string, or none', () => {
  // The body as the server (or a proxy in front of it) sent it.
  it.each<[string, unknown]>([
    ['an object', { detail: 'no' }],
    ['a number', 409],
    ['a list', ['no']]
  ])('says the extend was refused when its message is %s', (_, message) => {
    const outcome = extendOutcome(
      409,
      { status: 'refused', message } as never,
      opts
    );
    expect(outcome).toEqual({ kind: 'warning', message: 'Extension refused.' });
  });

  it('says a refusal without a message in one sentence, not "refused: "', () => {
    expect(extendOutcome(409, { status: 'refused' }, opts).message).toBe(
      'Extension refused.'
    );
  });

  it('says the stop failed, not "[object Object]"', () => {
    expect(
      stopOutcome(500, { message: { detail: 'x' } } as never).message
    ).toBe('Could not stop the server (HTTP 500).');
  });
});
