import { lineStartViews } from '../src/model/linestarts';
import { panelView } from '../src/model/panel';
import { statusView } from '../src/model/status';
import { readStatusReport } from '../src/parse';
import { H100, opts, report, verdict } from './helpers';

/** The report as the server sent it, as JSON text parsed (what api.status reads). */
const wire = (body: unknown): unknown => JSON.parse(JSON.stringify(body));

describe('a status report out of shape', () => {
  const target = report().targets![0];
  it.each<[string, Record<string, unknown>]>([
    ['devices null', { devices: null }],
    ['devices a string', { devices: 'GPU-1111' }],
    ['a null device', { devices: [null, H100] }],
    ['targets an object', { targets: { k1: target } }],
    ['a null target', { targets: [null, target] }],
    [
      'a target’s GPU devices null',
      { targets: [{ ...target, gpu: { ...target.gpu, devices: null } }] }
    ],
    ['a target’s GPU a string', { targets: [{ ...target, gpu: 'GPU-1111' }] }],
    [
      'health reasons a string',
      {
        devices: [
          { ...H100, health: { status: 'unhealthy', reasons: 'XID 79' } }
        ]
      }
    ],
    [
      'started_from_line an object',
      { verdict: verdict({ started_from_line: { url: '/x' } as never }) }
    ]
  ])('still shows the panel and status bar (%s)', (_, extra) => {
    const body = wire({ ...report(), ...extra });
    // Read as it was before: a view threw, and the panel and status bar went blank.
    const read = readStatusReport(body);
    expect(read).not.toBeNull();
    expect(() => panelView(read, opts)).not.toThrow();
    expect(statusView(read, opts).text).toMatch(/^(GPU|No GPU)/);
    expect(panelView(read, opts).lines.length).toBeGreaterThan(0);
    // The started-from-the-line notices read the same verdict on each poll.
    expect(() => lineStartViews(read?.verdict, [], opts)).not.toThrow();
  });

  it('keeps what it can read: the good device, the warning', () => {
    const read = readStatusReport(
      wire({ ...report({ verdict: verdict() }), devices: [null, 'x', H100] })
    );
    expect(read?.devices).toEqual([H100]);
    expect(statusView(read, opts).text).toBe('GPU 20.0 GiB · 0%');
    expect(panelView(read, opts).lines[0].text).toContain(
      'will be stopped in 4m 9s'
    );
  });

  it('reads a verdict it cannot read as unknown, not as no governor', () => {
    const read = readStatusReport(wire({ ...report(), verdict: 'warned' }));
    expect(statusView(read, opts).tooltip).toContain('Governor: unknown');
  });

  it.each([null, 'Service Unavailable', 3, [report()]])(
    'is no report when the body is %p (the poll keeps the last one)',
    body => {
      expect(readStatusReport(body)).toBeNull();
    }
  );
});
