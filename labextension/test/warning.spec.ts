import {
  checkReason,
  extendView,
  warningAction,
  warningKey,
  warningView
} from '../src/model/warning';
import { NOW, opts, verdict } from './helpers';

describe('warning', () => {
  it('says what will happen and when, with a countdown', () => {
    const view = warningView(verdict(), opts);
    expect(view).toMatchObject({
      toast:
        'GPU idle: this server will be stopped in 4m 9s (at 11:04) unless you extend.',
      countdown: '4m 9s',
      deadline: '11:04',
      key: '2026-01-05T11:04:09Z',
      extend: { enabled: true, label: 'Extend 1h', reason: 'optional' }
    });
  });

  it('names the cull action, the past deadline, dry run and checkpointing', () => {
    const v = verdict({ cull_action: 'shutdown-kernels', dry_run: true });
    const view = warningView(v, opts);
    expect(view?.toast).toContain('its GPU kernels will be shut down in 4m 9s');
    expect(view?.toast).toContain('Dry run');
    expect(
      warningView(verdict(), { ...opts, now: NOW + 3_600_000 })?.toast
    ).toBe('GPU idle: this server will be stopped now.');
    expect(warningView(verdict({ state: 'checkpointing' }), opts)?.toast).toBe(
      'GPU idle: saving a checkpoint, then this server will be stopped in 4m 9s.'
    );
    // A cell interrupted as its warning said: the stop is due once the checkpoint is saved.
    for (const cull_at of [null, '2026-01-05T10:30:00Z']) {
      expect(
        warningView(verdict({ state: 'checkpointing', cull_at }), opts)?.toast
      ).toBe(
        'GPU idle: saving a checkpoint, then this server will be stopped.'
      );
    }
  });

  it('says the deadline comes from a policy changed during the idle stretch', () => {
    // The governor's reason: "… unless extended (set by a policy applied at …)", and its code.
    const reason =
      'GPU idle since 2026-01-05 09:00 UTC; server stopped at 2026-01-05 11:04 UTC unless ' +
      'extended (set by a policy applied at 2026-01-05 10:34 UTC)';
    expect(
      warningView(verdict({ reason, policy_change: 'applied' }), opts)?.toast
    ).toBe(
      'GPU idle: this server will be stopped in 4m 9s (at 11:04) unless you extend. The GPU policy changed.'
    );
    // The config file's policy changed at a restart: other words, the same code's toast.
    const config = verdict({
      reason:
        'GPU idle since 2026-01-05 09:00 UTC; server stopped at 2026-01-05 11:04 UTC unless ' +
        'extended (set by the policy changed in the config file, in force at 2026-01-05 10:34 UTC)',
      policy_change: 'config-changed'
    });
    expect(warningView(config, opts)?.toast).toContain(
      'The GPU policy changed.'
    );
    // A maximum age a policy applied brought in: the same.
    const hard = verdict({
      hard_deadline: true,
      state: 'active',
      reason:
        'GPU active; past the maximum age of 8h for this profile (a policy applied at 2026-01-05 10:34 UTC): it will be stopped at 11:04 UTC',
      policy_change: 'applied'
    });
    expect(warningView(hard, opts)?.toast).toContain('The GPU policy changed.');
    // The code decides, not the reason's words (a governor whose wording differs, or a reason
    // quoting them): none, no such toast.
    expect(warningView(verdict({ reason }), opts)?.toast).not.toContain(
      'policy'
    );
    expect(warningView(verdict(), opts)?.toast).not.toContain('policy');
  });

  it('says a running cell’s limit interrupts and checkpoints it, not that the server stops', () => {
    // on_busy_limit: interrupt, after_interrupt: warn (the default): the server and kernel stay.
    const interrupt = verdict({ at_deadline: 'interrupt' });
    const view = warningView(interrupt, opts);
    expect(view?.toast).toBe(
      'GPU idle: the running cell will be interrupted and checkpointed in 4m 9s (at 11:04) unless you extend.'
    );
    expect(view?.toast).not.toContain('stopped');
    expect(view?.extend.enabled).toBe(true);
    expect(
      warningView(
        verdict({ at_deadline: 'interrupt', state: 'checkpointing' }),
        opts
      )?.toast
    ).toBe(
      'GPU idle: the running cell was interrupted; saving a checkpoint. The server and kernel stay.'
    );
    // after_interrupt: cull (no at_deadline): the stop follows the interrupt, as today.
    expect(warningView(verdict({ at_deadline: null }), opts)?.toast).toBe(
      'GPU idle: this server will be stopped in 4m 9s (at 11:04) unless you extend.'
    );
    expect(
      warningView(verdict({ at_deadline: null, state: 'checkpointing' }), opts)
        ?.toast
    ).toBe(
      'GPU idle: saving a checkpoint, then this server will be stopped in 4m 9s.'
    );
  });

  it('warns a busy or active server of a hard deadline, which Extend cannot move', () => {
    for (const state of ['busy', 'active', 'idle', 'unknown', 'gpu-failed']) {
      const v = verdict({ state, hard_deadline: true });
      const view = warningView(v, opts);
      expect(view?.toast).toBe(
        'Hard deadline: this server will be stopped in 4m 9s (at 11:04), whatever the GPU does. Save your work.'
      );
      expect(view?.extend.enabled).toBe(false);
      expect(view?.extend.hint).toContain('extending does not move it');
      expect(warningAction(null, v)).toBe('raise');
    }
    // Announced, but the server is already going, or exempt: nothing to warn of.
    for (const state of ['culled', 'exempt']) {
      expect(
        warningView(verdict({ state, hard_deadline: true }), opts)
      ).toBeNull();
    }
    // Warned of an idle cull as well: the idle warning's words.
    expect(
      warningView(verdict({ hard_deadline: true }), opts)?.toast
    ).toContain('GPU idle');
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
    for (const state of [
      'active',
      'idle',
      'busy',
      'exempt',
      'culled',
      'unknown'
    ]) {
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

  it('updates, not raises again, a warning whose deadline the owner’s own work moved later', () => {
    // Warned, the owner runs a short CPU cell: the warning stands, its notice now counting
    // from the cell (a later deadline). Still one warning: a closed notification stays closed.
    const v = verdict();
    const later = verdict({ cull_at: '2026-01-05T11:20:00Z' });
    expect(warningAction(warningKey(v), later, v)).toBe('update');
    // An extension, a new idle stretch, a hard deadline or an earlier deadline is a new one.
    for (const next of [
      verdict({ cull_at: '2026-01-05T11:20:00Z', extensions_left: 0 }),
      verdict({
        cull_at: '2026-01-05T11:20:00Z',
        idle_since: '2026-01-05T10:40:00Z'
      }),
      verdict({ cull_at: '2026-01-05T11:20:00Z', hard_deadline: true }),
      verdict({ cull_at: '2026-01-05T11:00:00Z' })
    ]) {
      expect(warningAction(warningKey(v), next, v)).toBe('raise');
    }
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
    expect(extendView(verdict({ extensions_left: 2 })).hint).toBe(
      'Keep the GPU 1h longer (2 extensions left).'
    );
    expect(extendView(verdict({ extension_step_s: 90 })).label).toBe(
      'Extend 1m 30s'
    );
    for (const state of ['active', 'busy', 'exempt', 'culled']) {
      expect(extendView(verdict({ state })).enabled).toBe(false);
    }
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

describe('a hard deadline at a time this tab cannot read', () => {
  it('says a hard deadline whose time this tab cannot read is soon, not now', () => {
    for (const cull_at of [
      'tomorrow',
      'in 5 minutes',
      '2026-99-99T00:00:00Z'
    ]) {
      const view = warningView(
        verdict({ state: 'active', hard_deadline: true, cull_at }),
        opts
      );
      expect(view?.toast).toBe(
        'Hard deadline: this server will be stopped soon, whatever the GPU does. Save your work.'
      );
    }
    // A past deadline is still now.
    expect(
      warningView(
        verdict({
          state: 'active',
          hard_deadline: true,
          cull_at: '2026-01-05T10:00:00Z'
        }),
        opts
      )?.toast
    ).toBe('Hard deadline: this server will be stopped now. Save your work.');
  });
});
