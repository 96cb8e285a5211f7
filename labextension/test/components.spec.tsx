/**
 * @jest-environment jsdom
 *
 * The panel and the stopped tab as React renders them in a browser DOM: what a person sees,
 * what the buttons do, and that an update patches the page in place (focus and an open
 * "Details" survive the countdown's tick).
 */
import * as React from 'react';
import { act } from 'react';
import { createRoot, Root } from 'react-dom/client';

import { panelView, PanelAction } from '../src/model/panel';
import { stoppedView } from '../src/model/stopped';
import { nullTrans } from '../src/trans';
import { PanelView, StoppedView } from '../src/ui/components';
import { NOW, opts, report, verdict } from './helpers';

(
  globalThis as { IS_REACT_ACT_ENVIRONMENT?: boolean }
).IS_REACT_ACT_ENVIRONMENT = true;

let host: HTMLDivElement;
let root: Root;

beforeEach(() => {
  host = document.createElement('div');
  document.body.append(host);
  root = createRoot(host);
});

afterEach(() => {
  act(() => root.unmount());
  host.remove();
});

function renderPanel(
  now: number,
  extra: Parameters<typeof report>[0] = {},
  handlers: {
    onAction?: (a: PanelAction) => void;
    onOpen?: (p: string) => void;
  } = {}
): void {
  const view = panelView(report({ verdict: verdict(), ...extra }), {
    ...opts,
    now
  });
  act(() =>
    root.render(
      <PanelView
        view={view}
        trans={nullTrans}
        onAction={handlers.onAction ?? (() => undefined)}
        onOpen={handlers.onOpen ?? (() => undefined)}
      />
    )
  );
}

const text = (selector: string) =>
  Array.from(host.querySelectorAll(selector)).map(n => n.textContent);

describe('the GPU panel', () => {
  it('reads top-down: at most three lines, then the buttons, the holders, the details folded', () => {
    renderPanel(NOW);
    const body = host.querySelector('.jp-GpuGov-panel-body') as HTMLElement;
    const order = Array.from(body.children).map(c => c.className);
    expect(order).toEqual([
      'jp-GpuGov-panel-header',
      'jp-GpuGov-lines',
      'jp-GpuGov-actions',
      'jp-GpuGov-holders',
      'jp-GpuGov-details'
    ]);
    expect(host.querySelectorAll('.jp-GpuGov-line').length).toBeLessThanOrEqual(
      3
    );
    expect(text('.jp-GpuGov-line')[0]).toBe(
      'GPU idle: this server will be stopped in 4m 9s (at 11:04) unless you extend.'
    );
    expect(text('.jp-GpuGov-actions button')).toEqual([
      'Extend 1h',
      'Checkpoint',
      'Stop server'
    ]);
    const details = host.querySelector('details') as HTMLDetailsElement;
    expect(details.open).toBe(false);
    expect(details.textContent).toContain('Deadline11:04 (in 4m 9s)');
  });

  it('does what its buttons and notebook links say', () => {
    const actions: PanelAction[] = [];
    const opened: string[] = [];
    renderPanel(
      NOW,
      {},
      { onAction: a => actions.push(a), onOpen: p => opened.push(p) }
    );
    for (const button of Array.from(
      host.querySelectorAll<HTMLButtonElement>('.jp-GpuGov-actions button')
    )) {
      act(() => button.click());
    }
    expect(actions).toEqual(['extend', 'checkpoint', 'stop']);
    act(() =>
      host.querySelector<HTMLButtonElement>('.jp-GpuGov-holder button')?.click()
    );
    expect(opened).toEqual(['train.ipynb']);
  });

  it('disables Extend while an administrator decides, and says why', () => {
    const actions: PanelAction[] = [];
    renderPanel(
      NOW,
      { verdict: verdict({ approval_pending: true }) },
      { onAction: a => actions.push(a) }
    );
    const extend = host.querySelector<HTMLButtonElement>(
      '[data-action="extend"]'
    ) as HTMLButtonElement;
    expect(extend.disabled).toBe(true);
    expect(extend.title).toContain('waiting for an administrator');
    act(() => extend.click());
    expect(actions).toEqual([]);
  });

  it('ticks in place: the same nodes, focus and an open Details survive an update', () => {
    renderPanel(NOW);
    const checkpoint = host.querySelector<HTMLButtonElement>(
      '[data-action="checkpoint"]'
    ) as HTMLButtonElement;
    const line = host.querySelector('.jp-GpuGov-line');
    const details = host.querySelector('details') as HTMLDetailsElement;
    details.open = true;
    checkpoint.focus();
    renderPanel(NOW + 1000);
    expect(text('.jp-GpuGov-line')[0]).toContain('in 4m 8s');
    expect(host.querySelector('[data-action="checkpoint"]')).toBe(checkpoint);
    expect(host.querySelector('.jp-GpuGov-line')).toBe(line);
    expect(document.activeElement).toBe(checkpoint);
    expect((host.querySelector('details') as HTMLDetailsElement).open).toBe(
      true
    );
  });

  it('drops Extend once the GPU is in use again', () => {
    renderPanel(NOW);
    renderPanel(NOW + 1000, {
      verdict: verdict({ state: 'active', cull_at: null, idle_since: null })
    });
    expect(host.querySelector('[data-action="extend"]')).toBeNull();
    expect(text('.jp-GpuGov-line')[0]).toBe('GPU in use.');
  });
});

describe('the tab after a stop', () => {
  it('shows one state with one way back to the Hub', () => {
    const view = stoppedView(
      {
        at: NOW + 300_000,
        byOwner: false,
        report: report({ verdict: verdict({ state: 'checkpointing' }) }),
        checkpoint: {
          status: 'done',
          cull_reason: 'gpu-idle',
          source: 'frontend',
          completed_at: '2026-01-05T11:04:20Z'
        }
      },
      { ...opts, now: NOW + 300_000 }
    );
    act(() =>
      root.render(
        <StoppedView view={view} hubUrl="/hub/spawn/lena" autoFocus />
      )
    );
    expect(text('.jp-GpuGov-stopped-message')).toEqual([
      'This server was stopped at 11:04 because its GPU was idle; checkpoint saved.'
    ]);
    expect(host.querySelectorAll('button')).toHaveLength(0);
    const links = host.querySelectorAll<HTMLAnchorElement>('a');
    expect(links).toHaveLength(1);
    expect(links[0].textContent).toBe('Start it again on the Hub');
    expect(links[0].getAttribute('href')).toBe('/hub/spawn/lena');
    expect(document.activeElement).toBe(links[0]);
  });
});
