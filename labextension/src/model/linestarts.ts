/**
 * A server of the owner that waited in line for a GPU and started while this tab is open on
 * another of their servers: the verdict this server polls names it (`started_from_line`, from
 * the governor's own records: this server gets no credential to see the others), and the tab
 * says so once, with a link to it.
 */
import {
  formatCountdown,
  isolate,
  formatTime,
  IViewOptions,
  parseTime,
  transOf
} from '../format';
import { ILineStart, IVerdict } from '../types';

export interface ILineStartView {
  /** Announced once per server start (kept with the announced ones). */
  key: string;
  message: string;
  /** The server's path on the Hub: always relative to this origin. */
  url: string;
  /** The link's label. */
  open: string;
}

/**
 * Only a path on this origin: never another site, nor a `javascript:` link. No control
 * character either: a browser drops tabs and newlines, so `/\t/evil.example` is `//evil.example`.
 */
export function safeHubPath(url: string | null | undefined): string | null {
  return typeof url === 'string' &&
    url.startsWith('/') &&
    !url.startsWith('//') &&
    !url.includes('\\') &&
    !Array.from(url).some(c => c < ' ' || c === '\u007f')
    ? url
    : null;
}

/** The started servers on this verdict that the tab has not announced yet, in words. */
export function lineStartViews(
  verdict: IVerdict | null | undefined,
  announced: readonly string[],
  options: IViewOptions
): ILineStartView[] {
  const views: ILineStartView[] = [];
  for (const start of verdict?.started_from_line ?? []) {
    const url = safeHubPath(start?.url);
    const claimBy = parseTime(start?.claim_by);
    if (!url || !start.started || claimBy === null) {
      continue;
    }
    const key = `${url}@${start.started}`;
    if (announced.includes(key) || claimBy <= options.now) {
      continue;
    }
    views.push({
      key,
      message: message(start, claimBy, options),
      url,
      open: openLabel(start, options)
    });
  }
  return views;
}

function serverName(start: ILineStart, options: IViewOptions): string {
  const trans = transOf(options);
  return start.name
    ? trans.__('Your server “%1”', isolate(start.name))
    : trans.__('Your default server');
}

function message(
  start: ILineStart,
  claimBy: number,
  options: IViewOptions
): string {
  const trans = transOf(options);
  const tier = start.tier ? trans.__(' for %1', start.tier) : '';
  return trans.__(
    '%1 waited in line%2 and has started. Open it by %3 (in %4), or its GPU is given back.',
    serverName(start, options),
    tier,
    formatTime(claimBy, options),
    formatCountdown(claimBy - options.now)
  );
}

function openLabel(start: ILineStart, options: IViewOptions): string {
  const trans = transOf(options);
  return start.name
    ? trans.__('Open “%1”', isolate(start.name))
    : trans.__('Open default server');
}
