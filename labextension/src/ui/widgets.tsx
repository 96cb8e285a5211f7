/**
 * The widgets on screen: the GPU panel (right sidebar), the status bar item and, once the
 * server is gone, the overlay that says so. Each is a ReactWidget: a change of status asks for
 * an update and React patches the DOM in place (focus and open <details> stay as they are).
 */
import { ReactWidget } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';
import * as React from 'react';

import { gpuIcon } from '../icons';
import { PanelAction, panelView } from '../model/panel';
import { statusView } from '../model/status';
import { stoppedView } from '../model/stopped';
import { StatusPoller } from '../poller';
import { ITrans } from '../trans';
import { PanelView, StoppedView } from './components';

export const PANEL_ID = 'jupyter-gpu-gov-panel';

export class GpuPanel extends ReactWidget {
  constructor(options: {
    poller: StatusPoller;
    trans: ITrans;
    hubUrl: string;
    onAction: (action: PanelAction) => void;
    openPath: (path: string) => void;
  }) {
    super();
    this._options = options;
    this.id = PANEL_ID;
    this.addClass('jp-GpuGov-panel');
    this.title.icon = gpuIcon;
    this.title.caption = options.trans.__('GPU');
    this.node.setAttribute(
      'aria-label',
      options.trans.__('GPU usage and idle warnings')
    );
    options.poller.changed.connect(this._changed, this);
  }

  dispose(): void {
    this._stopTicking();
    this._options.poller.changed.disconnect(this._changed, this);
    super.dispose();
  }

  protected render(): JSX.Element {
    const { poller, trans, hubUrl, onAction, openPath } = this._options;
    const now = Date.now();
    if (poller.stopped) {
      this._ticking = false;
      return (
        <StoppedView
          view={stoppedView(poller.stopped, { now, trans })}
          hubUrl={hubUrl}
        />
      );
    }
    const view = panelView(poller.report, { now, trans, error: poller.error });
    this._ticking = view.ticking;
    return (
      <PanelView
        view={view}
        trans={trans}
        onAction={onAction}
        onOpen={openPath}
      />
    );
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.update();
    // A countdown on screen moves each second; hidden, nothing does.
    this._timer = window.setInterval(() => {
      if (this._ticking) {
        this.update();
      }
    }, 1000);
  }

  protected onBeforeHide(msg: Message): void {
    this._stopTicking();
    super.onBeforeHide(msg);
  }

  private _changed(): void {
    if (this.isVisible) {
      this.update();
    }
  }

  private _stopTicking(): void {
    if (this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    }
  }

  private _options: ConstructorParameters<typeof GpuPanel>[0];
  private _ticking = false;
  private _timer: number | null = null;
}

/** The status bar item: GPU icon, memory and activity; click (or Enter/Space) opens the panel. */
export class GpuStatusItem extends ReactWidget {
  constructor(options: {
    poller: StatusPoller;
    trans: ITrans;
    onOpen: () => void;
  }) {
    super();
    this._options = options;
    this.addClass('jp-GpuGov-status');
    this.node.tabIndex = 0;
    this.node.setAttribute('role', 'button');
    this.node.addEventListener('click', () => options.onOpen());
    this.node.addEventListener('keydown', (event: KeyboardEvent) => {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        options.onOpen();
      }
    });
    options.poller.changed.connect(this.update, this);
  }

  /** The setting "show the status item" changed. */
  get activeStateChanged(): ISignal<this, void> {
    return this._activeStateChanged;
  }

  get shown(): boolean {
    return this._shown;
  }

  set shown(value: boolean) {
    if (value !== this._shown) {
      this._shown = value;
      this._activeStateChanged.emit();
    }
  }

  dispose(): void {
    this._options.poller.changed.disconnect(this.update, this);
    super.dispose();
  }

  protected render(): JSX.Element {
    const { poller, trans } = this._options;
    const view = statusView(poller.report, {
      now: Date.now(),
      trans,
      stopped: !!poller.stopped,
      error: poller.error
    });
    this.node.title = view.tooltip;
    this.node.setAttribute(
      'aria-label',
      trans.__('GPU status: %1. Open the GPU panel.', view.text)
    );
    this.node.dataset.state = view.state;
    for (const name of Array.from(this.node.classList)) {
      if (name.startsWith('jp-GpuGov-state-')) {
        this.node.classList.remove(name);
      }
    }
    this.node.classList.add(view.className);
    return (
      <>
        <gpuIcon.react
          tag="span"
          className="jp-GpuGov-status-icon"
          height="16px"
        />
        <span className="jp-GpuGov-status-text">{view.text}</span>
      </>
    );
  }

  private _options: ConstructorParameters<typeof GpuStatusItem>[0];
  private _shown = true;
  private _activeStateChanged = new Signal<this, void>(this);
}

/**
 * Covers the whole page once the server is gone: the open tab can no longer save, run or
 * extend anything, so it shows one state and the way back to the Hub. What it covers is made
 * inert: no click or key reaches a control that can no longer act.
 */
export class StoppedOverlay extends ReactWidget {
  constructor(options: {
    poller: StatusPoller;
    trans: ITrans;
    hubUrl: string;
    /** The page beneath (JupyterLab's shell). */
    covers: HTMLElement;
  }) {
    super();
    this._options = options;
    this.id = 'jupyter-gpu-gov-stopped';
    this.addClass('jp-GpuGov-overlay');
    this.node.setAttribute('role', 'alertdialog');
    this.node.setAttribute('aria-modal', 'true');
  }

  /** Attach to the page (once). */
  show(): void {
    this._options.covers.setAttribute('inert', '');
    if (!this.isAttached) {
      Widget.attach(this, document.body);
    }
    this.update();
  }

  protected render(): JSX.Element | null {
    const { poller, trans, hubUrl } = this._options;
    if (!poller.stopped) {
      return null;
    }
    const view = stoppedView(poller.stopped, { now: Date.now(), trans });
    this.node.setAttribute('aria-label', view.message);
    return (
      <div className="jp-GpuGov-overlay-card">
        <StoppedView view={view} hubUrl={hubUrl} autoFocus />
      </div>
    );
  }

  private _options: ConstructorParameters<typeof StoppedOverlay>[0];
}
