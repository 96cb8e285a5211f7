/**
 * The status bar item: GPU icon, this server's GPU memory and activity, coloured by the
 * governor's state; the tooltip lists the devices. Click (or Enter/Space) opens the panel.
 */
import { Widget } from '@lumino/widgets';

import { gpuIcon } from './icons';
import { IStatusReport, ITrans, statusView, ViewState } from './model';
import { StatusPoller } from './poller';

const STATES: ViewState[] = ['active', 'idle', 'warned', 'exempt', 'unknown'];

export class GpuStatusItem extends Widget {
  constructor(options: {
    poller: StatusPoller;
    trans: ITrans;
    onOpen: () => void;
  }) {
    super();
    this._poller = options.poller;
    this._trans = options.trans;
    this._onOpen = options.onOpen;
    this.addClass('jp-GpuGov-status');
    const node = this.node;
    node.tabIndex = 0;
    node.setAttribute('role', 'button');
    const icon = document.createElement('span');
    icon.className = 'jp-GpuGov-status-icon';
    gpuIcon.element({
      container: icon,
      elementPosition: 'center',
      height: '16px'
    });
    this._text = document.createElement('span');
    this._text.className = 'jp-GpuGov-status-text';
    node.append(icon, this._text);
    node.addEventListener('click', () => this._onOpen());
    node.addEventListener('keydown', (event: KeyboardEvent) => {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        this._onOpen();
      }
    });
    this._poller.changed.connect(this._render, this);
    this._render(this._poller, this._poller.report);
  }

  dispose(): void {
    this._poller.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(_: StatusPoller, report: IStatusReport | null): void {
    const view = statusView(report, { now: Date.now(), trans: this._trans });
    this._text.textContent = view.text;
    let tooltip = view.tooltip;
    if (this._poller.error) {
      tooltip +=
        '\n' + this._trans.__('Last update failed: %1', this._poller.error);
    }
    this.node.title = tooltip;
    this.node.setAttribute(
      'aria-label',
      this._trans.__('GPU status: %1. Open the GPU panel.', view.text)
    );
    for (const state of STATES) {
      this.node.classList.toggle(
        `jp-GpuGov-state-${state}`,
        state === view.state
      );
    }
  }

  private _poller: StatusPoller;
  private _trans: ITrans;
  private _onOpen: () => void;
  private _text: HTMLSpanElement;
}
