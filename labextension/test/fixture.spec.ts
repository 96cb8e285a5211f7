/**
 * The view logic against a real report: GET /jupyter-gpu-gov/status from the server extension
 * (simulated backend: one whole H100 and four MIG slices; a notebook kernel holding 20 GiB,
 * briefly at 40 % SM), captured into fixtures/status-simulated.json. No governor: verdict null.
 */
import { panelRows, panelView } from '../src/model/panel';
import { statusView } from '../src/model/status';
import { warningView } from '../src/model/warning';
import { IStatusReport } from '../src/types';

import fixture from './fixtures/status-simulated.json';

const report = fixture as IStatusReport;

const now = Date.parse(report.sampled_at as string);
const clock = (d: Date) => d.toISOString().slice(11, 16);

describe('a real status report', () => {
  it('renders the status bar item', () => {
    const view = statusView(report, { now, clock });
    expect(view.text).toBe('GPU 20.0 GiB · 0%');
    expect(view.state).toBe('idle');
    const lines = view.tooltip.split('\n');
    expect(lines[0]).toBe(
      'NVIDIA H100 80GB HBM3 (whole GPU): 20.0 GiB / 79.6 GiB, 0% active'
    );
    expect(lines[1]).toBe(
      'MIG 3g.40gb slice of NVIDIA H100 80GB HBM3: 0 MiB / 39.0 GiB, activity unknown'
    );
    expect(lines).toContain('Governor: not connected');
  });

  it('lists the notebook kernel with its path and sparkline history', () => {
    const rows = panelRows(report, { now, clock });
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({
      kind: 'kernel',
      title: 'train.ipynb',
      path: 'train.ipynb',
      devices: 'NVIDIA H100 80GB HBM3',
      memory: '20.0 GiB',
      confidence: 'exact',
      state: 'idle'
    });
    expect(rows[0].history.length).toBeGreaterThan(0);
  });

  it('raises no warning without a governor, and the panel says so', () => {
    expect(warningView(report.verdict, { now })).toBeNull();
    const view = panelView(report, { now, clock });
    expect(view.lines.map(l => l.text)).toContain(
      'No GPU governor: nothing is culled.'
    );
    expect(view.buttons.map(b => b.action)).toEqual(['checkpoint']);
  });
});
