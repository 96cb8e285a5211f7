/**
 * The GPU panel (sidebar): every kernel, terminal and other process group holding a GPU, with
 * device, memory, an activity sparkline, confidence and state; the governor's state, idle-since
 * and deadline; the warning with its buttons for users who closed the notification.
 */
import { Widget } from '@lumino/widgets';

import { gpuIcon } from './icons';
import {
  formatCountdown,
  governorState,
  IPanelRow,
  IStatusReport,
  ITrans,
  panelRows,
  parseTime,
  rightSizeLine,
  rootCauseView,
  sparklineSegments,
  stateLabel,
  statusText,
  warningView
} from './model';
import { StatusPoller } from './poller';
import { IWarningActions } from './warning';

const SVG_NS = 'http://www.w3.org/2000/svg';

export class GpuPanel extends Widget {
  constructor(options: {
    poller: StatusPoller;
    trans: ITrans;
    actions: IWarningActions;
    openPath: (path: string) => void;
  }) {
    super();
    this._poller = options.poller;
    this._trans = options.trans;
    this._actions = options.actions;
    this._openPath = options.openPath;
    this.id = 'jupyter-gpu-gov-panel';
    this.addClass('jp-GpuGov-panel');
    this.title.icon = gpuIcon;
    this.title.caption = this._trans.__('GPU');
    this.node.setAttribute(
      'aria-label',
      this._trans.__('GPU usage and idle warnings')
    );
    this._poller.changed.connect(this._render, this);
    this._render();
    this._timer = window.setInterval(() => this._tick(), 1000);
  }

  dispose(): void {
    window.clearInterval(this._timer);
    this._poller.changed.disconnect(this._render, this);
    super.dispose();
  }

  /** Re-render each second while visible and a deadline is counting down. */
  private _tick(): void {
    const state = this._poller.report?.verdict?.state;
    if (this.isVisible && (state === 'warned' || state === 'checkpointing')) {
      this._render();
    }
  }

  private _render(): void {
    const report = this._poller.report;
    const trans = this._trans;
    const now = Date.now();
    const node = this.node;
    // Keep keyboard focus on a button across re-renders.
    const focused = (document.activeElement as HTMLElement | null)?.dataset
      ?.gpugovFocus;
    node.textContent = '';

    const header = el('div', 'jp-GpuGov-panel-header');
    header.append(el('h2', 'jp-GpuGov-panel-title', trans.__('GPU')));
    header.append(
      el('div', 'jp-GpuGov-panel-summary', statusText(report, trans))
    );
    node.append(header);

    if (this._poller.error) {
      node.append(
        el(
          'div',
          'jp-GpuGov-error',
          trans.__('Last update failed: %1', this._poller.error)
        )
      );
    }
    if (!report) {
      node.append(el('p', 'jp-GpuGov-empty', trans.__('Loading GPU status…')));
      return;
    }
    this._renderWarning(report, now);
    this._renderGovernor(report, now);
    this._renderRows(panelRows(report, { now, trans }));

    if (focused) {
      const target = node.querySelector(`[data-gpugov-focus="${focused}"]`);
      (target as HTMLElement | null)?.focus();
    }
  }

  private _renderWarning(report: IStatusReport, now: number): void {
    const trans = this._trans;
    const view = warningView(report.verdict, { now, trans });
    if (!view) {
      return;
    }
    const box = el('section', 'jp-GpuGov-warning');
    box.setAttribute('role', 'alert');
    box.append(el('p', 'jp-GpuGov-warning-text', view.detail));
    if (view.countdown) {
      box.append(el('p', 'jp-GpuGov-countdown', view.countdown));
    }
    const buttons = el('div', 'jp-GpuGov-actions');
    const extend = button(view.extend.label, 'extend', 'jp-mod-accept', () =>
      this._actions.extend()
    );
    extend.title = view.extend.hint;
    extend.disabled = !view.extend.enabled;
    buttons.append(
      extend,
      button(trans.__('Checkpoint now'), 'checkpoint', '', () =>
        this._actions.checkpoint()
      ),
      button(trans.__('Stop server now'), 'stop', 'jp-mod-warn', () =>
        this._actions.stop()
      )
    );
    box.append(buttons);
    this.node.append(box);
  }

  private _renderGovernor(report: IStatusReport, now: number): void {
    const trans = this._trans;
    const verdict = report.verdict;
    const section = el('section', 'jp-GpuGov-governor');
    const state = governorState(report);
    const list = el('dl', 'jp-GpuGov-facts');
    const fact = (name: string, value: string) => {
      list.append(el('dt', '', name), el('dd', '', value));
    };
    fact(
      trans.__('Governor'),
      verdict
        ? stateLabel(state, trans)
        : trans.__('not connected (%1)', stateLabel(state, trans))
    );
    if (verdict?.policy) {
      fact(trans.__('Policy'), verdict.policy);
    }
    const idle = parseTime(
      verdict?.idle_since ?? report.window?.gpu_idle_since
    );
    if (idle !== null) {
      fact(
        trans.__('GPU idle since'),
        trans.__(
          '%1 (%2 ago)',
          new Date(idle).toLocaleTimeString(),
          formatCountdown(now - idle)
        )
      );
    }
    const cull = parseTime(verdict?.cull_at);
    if (cull !== null) {
      fact(
        trans.__('Deadline'),
        trans.__(
          '%1 (in %2)',
          new Date(cull).toLocaleTimeString(),
          formatCountdown(cull - now)
        )
      );
    }
    if (verdict?.reason) {
      fact(trans.__('Why'), verdict.reason);
    }
    section.append(list);
    const cause = rootCauseView(verdict, trans);
    if (cause) {
      const hint = el('p', 'jp-GpuGov-hint');
      hint.append(
        el('strong', '', trans.__('Likely cause: %1.', cause.label)),
        document.createTextNode(cause.hint ? ` ${cause.hint}` : '')
      );
      section.append(hint);
    }
    const rightSize = rightSizeLine(verdict, trans);
    if (rightSize) {
      section.append(el('p', 'jp-GpuGov-right-size', rightSize));
    }
    this.node.append(section);
  }

  private _renderRows(rows: IPanelRow[]): void {
    const trans = this._trans;
    if (!rows.length) {
      this.node.append(
        el(
          'p',
          'jp-GpuGov-empty',
          trans.__('No kernel or terminal holds a GPU.')
        )
      );
      return;
    }
    const table = el('table', 'jp-GpuGov-table');
    const head = el('tr');
    for (const name of [
      trans.__('Holder'),
      trans.__('Device'),
      trans.__('Memory'),
      trans.__('Activity'),
      trans.__('State')
    ]) {
      head.append(el('th', '', name));
    }
    table.append(el('thead'), el('tbody'));
    table.tHead?.append(head);
    for (const row of rows) {
      const tr = el('tr', `jp-GpuGov-row jp-GpuGov-target-${row.state}`);
      const holder = el('td');
      if (row.path) {
        const path = row.path;
        const open = button(
          row.title,
          `open:${row.key}`,
          'jp-GpuGov-link',
          async () => this._openPath(path)
        );
        open.title = trans.__('Open %1', path);
        holder.append(open);
      } else {
        holder.append(document.createTextNode(row.title));
      }
      const activity = el('td');
      activity.append(sparkline(row.history), el('span', '', row.activity));
      const state = el('td', '', stateLabel(row.state, trans));
      state.title = trans.__('Attribution confidence: %1', row.confidence);
      if (row.idleFor) {
        state.append(
          el('div', 'jp-GpuGov-muted', trans.__('idle %1', row.idleFor))
        );
      }
      if (row.confidence !== 'exact') {
        state.append(
          el(
            'div',
            'jp-GpuGov-muted',
            trans.__('%1 attribution', row.confidence)
          )
        );
      }
      tr.append(el('td', '', row.devices), el('td', '', row.memory));
      tr.prepend(holder);
      tr.append(activity, state);
      table.tBodies[0].append(tr);
    }
    this.node.append(table);
  }

  private _poller: StatusPoller;
  private _trans: ITrans;
  private _actions: IWarningActions;
  private _openPath: (path: string) => void;
  private _timer: number;
}

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className = '',
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** A real <button>: focusable, Enter and Space work without extra handlers. */
function button(
  label: string,
  focusKey: string,
  modifier: string,
  run: () => Promise<void>
): HTMLButtonElement {
  const node = el(
    'button',
    `jp-Button jp-mod-styled jp-GpuGov-button ${modifier}`.trim(),
    label
  );
  node.type = 'button';
  node.dataset.gpugovFocus = focusKey;
  node.addEventListener('click', () => {
    void run();
  });
  return node;
}

function sparkline(history: (number | null)[]): SVGSVGElement {
  const width = 60;
  const height = 16;
  const svg = document.createElementNS(SVG_NS, 'svg');
  svg.setAttribute('class', 'jp-GpuGov-sparkline');
  svg.setAttribute('width', String(width));
  svg.setAttribute('height', String(height));
  svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
  svg.setAttribute('aria-hidden', 'true');
  for (const points of sparklineSegments(history, width, height)) {
    const line = document.createElementNS(SVG_NS, 'polyline');
    line.setAttribute('points', points);
    svg.append(line);
  }
  return svg;
}
