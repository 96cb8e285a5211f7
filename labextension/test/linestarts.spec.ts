/**
 * Another of the owner's servers started from the line while this tab is open: the verdict
 * names it, and the tab says so once, with a link to it (model/linestarts.ts, ui/linestarts.ts;
 * JupyterLab's Notification is replaced by a recorder).
 */
import { lineStartViews, safeHubPath } from '../src/model/linestarts';
import { LineStartNotifier } from '../src/ui/linestarts';
import { nullTrans } from '../src/trans';
import { ILineStart } from '../src/types';
import { NOW, memoryStorage, opts, verdict } from './helpers';

const shown: { message: string; options: any }[] = [];
jest.mock('@jupyterlab/apputils', () => ({
  Notification: {
    info: (message: string, options: unknown) => {
      shown.push({ message, options });
      return 'id';
    }
  }
}));

/** ben's default server started from the line at 10:58; he has until 11:13 to open it. */
function started(extra: Partial<ILineStart> = {}): ILineStart {
  return {
    name: '',
    url: '/user/ben/',
    tier: 'h100',
    started: '2026-01-05T10:58:00Z',
    claim_by: '2026-01-05T11:13:00Z',
    ...extra
  };
}

describe('lineStartViews', () => {
  it('names the server, the tier and the time to open it by, with its link', () => {
    const views = lineStartViews(
      verdict({ started_from_line: [started()] }),
      [],
      opts
    );
    expect(views).toEqual([
      {
        key: '/user/ben/@2026-01-05T10:58:00Z',
        message:
          'Your default server waited in line for h100 and has started. Open it by 11:13 (in 13m), or its GPU is given back.',
        url: '/user/ben/',
        open: 'Open default server'
      }
    ]);
    const named = lineStartViews(
      verdict({
        started_from_line: [started({ name: 'gpu', url: '/user/ben/gpu/' })]
      }),
      [],
      opts
    );
    expect(named[0].message).toMatch(/^Your server “gpu” waited in line/);
    expect(named[0].open).toBe('Open “gpu”'); // an ASCII name alone: copied, it is the name
    expect(named[0].message.length).toBeLessThanOrEqual(140); // JupyterLab's toast
  });

  it('isolates the server name: a bidi override in it cannot reorder the sentence', () => {
    // U+202E (RIGHT-TO-LEFT OVERRIDE), which JupyterHub 4.1-5.x take in a server's name:
    // left open, it showed the rest of the sentence reversed ("...nevig si UPG sti").
    const name = 'gpu\u202e';
    const [view] = lineStartViews(
      verdict({
        started_from_line: [started({ name, url: '/user/ben/gpu%E2%80%AE/' })]
      }),
      [],
      opts
    );
    // The name, override and all, is one isolate (FSI ... PDI): the PDI ends the override.
    expect(view.message).toContain(`“\u2068${name}\u2069” waited in line`);
    expect(view.open).toBe(`Open “\u2068${name}\u2069”`);
    const after = view.message.slice(view.message.indexOf('\u2069'));
    expect(after).not.toMatch(/[\u202a-\u202e\u2066-\u2068]/);
  });

  it('says each start once, and nothing once it is given back', () => {
    const v = verdict({ started_from_line: [started()] });
    expect(
      lineStartViews(v, ['/user/ben/@2026-01-05T10:58:00Z'], opts)
    ).toEqual([]);
    // The same server started again later is a new start.
    const again = started({ started: '2026-01-05T10:59:30Z' });
    expect(
      lineStartViews(
        verdict({ started_from_line: [again] }),
        ['/user/ben/@2026-01-05T10:58:00Z'],
        opts
      )
    ).toHaveLength(1);
    const late = { ...opts, now: Date.parse('2026-01-05T11:13:00Z') };
    expect(lineStartViews(v, [], late)).toEqual([]);
  });

  it('links only to a path of this origin, and reads an older verdict as none', () => {
    for (const url of [
      'https://evil.example/',
      '//evil.example/user/ben/',
      'javascript:alert(1)',
      '/\\evil.example',
      // A browser drops tabs and newlines from a URL: each of these is //evil.example.
      '/\t/evil.example/',
      '/\n/evil.example/',
      '/\r/evil.example/',
      ''
    ]) {
      expect(safeHubPath(url)).toBeNull();
      expect(
        lineStartViews(
          verdict({ started_from_line: [started({ url })] }),
          [],
          opts
        )
      ).toEqual([]);
    }
    expect(new URL('/\t/evil.example/', 'https://hub.example/').origin).toBe(
      'https://evil.example'
    );
    expect(lineStartViews(verdict(), [], opts)).toEqual([]);
    expect(lineStartViews(null, [], opts)).toEqual([]);
    expect(
      lineStartViews(
        verdict({ started_from_line: [started({ claim_by: 'soon' })] }),
        [],
        opts
      )
    ).toEqual([]);
  });
});

describe('LineStartNotifier', () => {
  beforeEach(() => {
    shown.length = 0;
    jest.useFakeTimers({ now: NOW });
  });
  afterEach(() => jest.useRealTimers());

  it('notifies once across polls and tabs, and its button opens the server', () => {
    const storage = memoryStorage();
    const opened: string[] = [];
    const options = {
      trans: nullTrans,
      storageKey: 'jupyter-gpu-gov:line-starts:ben',
      storage,
      open: (url: string) => opened.push(url)
    };
    const tab = new LineStartNotifier(options);
    const v = verdict({ started_from_line: [started()] });
    tab.update(verdict());
    expect(shown).toHaveLength(0);
    tab.update(v);
    tab.update(v); // the next poll
    new LineStartNotifier(options).update(v); // another tab of ben's
    expect(shown).toHaveLength(1);
    expect(shown[0].message).toContain('Your default server waited in line');
    expect(shown[0].options.autoClose).toBe(false);
    const [button] = shown[0].options.actions;
    expect(button.label).toBe('Open default server');
    button.callback();
    expect(opened).toEqual(['/user/ben/']);
  });
});
