/**
 * What the panel and the stopped tab look like, as React components of their view-models
 * (src/model/). Pure: no JupyterLab imports, so jest renders them in jsdom; the widgets in
 * widgets.tsx put them on screen and re-render them when the status changes.
 */
import * as React from 'react';

import {
  IPanelRow,
  IPanelView,
  PanelAction,
  sparklineSegments
} from '../model/panel';
import { IStoppedView } from '../model/stopped';
import { ITrans } from '../trans';

const SPARK_WIDTH = 48;
const SPARK_HEIGHT = 14;

export function Sparkline(props: { history: (number | null)[] }): JSX.Element {
  return (
    <svg
      className="jp-GpuGov-sparkline"
      width={SPARK_WIDTH}
      height={SPARK_HEIGHT}
      viewBox={`0 0 ${SPARK_WIDTH} ${SPARK_HEIGHT}`}
      aria-hidden="true"
    >
      {sparklineSegments(props.history, SPARK_WIDTH, SPARK_HEIGHT).map(
        (points, i) => (
          <polyline key={i} points={points} />
        )
      )}
    </svg>
  );
}

function Holder(props: {
  row: IPanelRow;
  trans: ITrans;
  onOpen: (path: string) => void;
}): JSX.Element {
  const { row, trans, onOpen } = props;
  const path = row.path;
  return (
    <li
      className={`jp-GpuGov-holder jp-GpuGov-target-${row.state}`}
      data-key={row.key}
    >
      <span className="jp-GpuGov-holder-title">
        {path ? (
          <button
            type="button"
            className="jp-GpuGov-link"
            title={trans.__('Open %1', path)}
            onClick={() => onOpen(path)}
          >
            {row.title}
          </button>
        ) : (
          row.title
        )}
      </span>
      <span className="jp-GpuGov-holder-memory">{row.memory}</span>
      <span className="jp-GpuGov-holder-device">{row.devices}</span>
      <span className="jp-GpuGov-holder-activity">
        <Sparkline history={row.history} />
        {row.activity}
      </span>
      <span
        className="jp-GpuGov-holder-state"
        title={trans.__('Attribution: %1', row.confidence)}
      >
        {row.idleFor ?? row.stateLabel}
        {row.confidence !== 'exact' && row.confidence !== 'unknown'
          ? ` · ${trans.__('%1 attribution', row.confidence)}`
          : ''}
      </span>
    </li>
  );
}

const BUTTON_STYLE = {
  accept: 'jp-mod-accept',
  warn: 'jp-mod-warn',
  plain: 'jp-mod-reject'
};

export interface IPanelViewProps {
  view: IPanelView;
  trans: ITrans;
  onAction: (action: PanelAction) => void;
  onOpen: (path: string) => void;
}

/** The GPU panel: three lines at most, the buttons, who holds the GPU, the details folded. */
export function PanelView(props: IPanelViewProps): JSX.Element {
  const { view, trans, onAction, onOpen } = props;
  return (
    <div className="jp-GpuGov-panel-body">
      <div className="jp-GpuGov-panel-header">
        <h2 className="jp-GpuGov-panel-title">{trans.__('GPU')}</h2>
        <span className={`jp-GpuGov-chip jp-GpuGov-tone-${view.tone}`}>
          {view.summary}
        </span>
      </div>
      <div className="jp-GpuGov-lines">
        {view.lines.map((line, i) => (
          <p key={i} className={`jp-GpuGov-line jp-GpuGov-line-${line.tone}`}>
            {line.text}
          </p>
        ))}
      </div>
      {view.buttons.length > 0 && (
        <div className="jp-GpuGov-actions">
          {view.buttons.map(button => (
            <button
              key={button.action}
              type="button"
              className={`jp-Button jp-mod-styled jp-GpuGov-button ${BUTTON_STYLE[button.style]}`}
              data-action={button.action}
              title={button.hint}
              disabled={!button.enabled}
              onClick={() => onAction(button.action)}
            >
              {button.label}
            </button>
          ))}
        </div>
      )}
      {view.rows.length > 0 && (
        <section className="jp-GpuGov-holders">
          <h3>{trans.__('Holding a GPU')}</h3>
          <ul>
            {view.rows.map(row => (
              <Holder key={row.key} row={row} trans={trans} onOpen={onOpen} />
            ))}
          </ul>
        </section>
      )}
      {(view.facts.length > 0 || view.devices.length > 0) && (
        <details className="jp-GpuGov-details">
          <summary>{trans.__('Details')}</summary>
          <dl className="jp-GpuGov-facts">
            {view.facts.map(fact => (
              <React.Fragment key={fact.label}>
                <dt>{fact.label}</dt>
                <dd>{fact.value}</dd>
              </React.Fragment>
            ))}
          </dl>
          {view.devices.length > 0 && (
            <ul className="jp-GpuGov-devices">
              {view.devices.map(line => (
                <li key={line}>{line}</li>
              ))}
            </ul>
          )}
        </details>
      )}
    </div>
  );
}

export interface IStoppedViewProps {
  view: IStoppedView;
  /** Where the Hub starts this server again. */
  hubUrl: string;
  /** Move focus to the button when shown (the overlay). */
  autoFocus?: boolean;
}

/** The one state of a tab whose server stopped: when, why, and the way back to the Hub. */
export function StoppedView(props: IStoppedViewProps): JSX.Element {
  const { view, hubUrl, autoFocus } = props;
  const link = React.useRef<HTMLAnchorElement>(null);
  React.useEffect(() => {
    if (autoFocus) {
      link.current?.focus(); // React's autoFocus does not cover links
    }
  }, [autoFocus]);
  return (
    <div className="jp-GpuGov-stopped">
      <h2 className="jp-GpuGov-stopped-title">{view.title}</h2>
      <p className="jp-GpuGov-stopped-message">{view.message}</p>
      <p className="jp-GpuGov-stopped-next">{view.next}</p>
      <a className="jp-GpuGov-hub" href={hubUrl} ref={link}>
        {view.action}
      </a>
    </div>
  );
}
