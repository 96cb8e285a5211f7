/**
 * How numbers, times and durations read, everywhere the extension shows one. One format each:
 * a time is the person's clock time ("14:02", with the day when it is not today: "Jan 5,
 * 14:02"); a duration keeps its seconds below an hour ("1m 30s", "2h 5m"), as
 * jupyter_gpu_gov/core/durations.py's format_duration does. UTC appears only in the API.
 */
import { ITrans, nullTrans } from './trans';

/**
 * A name a user chose (a server's, a kernel's path) as its own bidi isolate (U+2068 … U+2069,
 * what HTML's <bdi> is in plain text, which a notification is): a bidi control in it
 * (U+202E) reorders the name alone, never the sentence around it. Only where it holds
 * anything but ASCII, as the governor's core/text.py in_sentence: an ASCII name reorders
 * nothing, and copied from the notice it is the name alone.
 */
export function isolate(name: string): string {
  for (let i = 0; i < name.length; i++) {
    if (name.charCodeAt(i) > 0x7f) {
      return `\u2068${name}\u2069`;
    }
  }
  return name;
}

/** What every view takes: time is passed in, never read inside a view. */
export interface IViewOptions {
  now: number;
  trans?: ITrans;
  /** A clock time ("14:05"); default: the browser's locale, hours and minutes. */
  clock?: (date: Date) => string;
  /** A calendar day ("Jan 5"); default: the browser's locale. */
  day?: (date: Date) => string;
}

export function transOf(options: { trans?: ITrans }): ITrans {
  return options.trans ?? nullTrans;
}

export function defaultClock(date: Date): string {
  return date.toLocaleTimeString(undefined, {
    hour: 'numeric',
    minute: '2-digit'
  });
}

export function defaultDay(date: Date): string {
  return date.toLocaleDateString(undefined, { month: 'short', day: 'numeric' });
}

/** A time as people read it: "14:02" today, "Jan 5, 14:02" on another day. */
export function formatTime(
  when: number | Date,
  options: Pick<IViewOptions, 'now' | 'clock' | 'day'>
): string {
  const date = new Date(when);
  const clock = (options.clock ?? defaultClock)(date);
  const day = options.day ?? defaultDay;
  const today = day(new Date(options.now));
  const then = day(date);
  return then === today ? clock : `${then}, ${clock}`;
}

// "2026-01-05 09:14 UTC", "2026-01-05T09:14:00 UTC" or "09:14 UTC" (a time of about now).
const UTC_IN_TEXT =
  /\b(?:(\d{4})-(\d{2})-(\d{2})[ T])?(\d{2}):(\d{2})(?::(\d{2}))? UTC\b/g;

/**
 * The same text with each UTC time the governor wrote into it ("GPU idle since 2026-01-05
 * 09:14 UTC") in the person's clock. A time without a date is taken as the one nearest now.
 */
export function localizeTimes(
  text: string,
  options: Pick<IViewOptions, 'now' | 'clock' | 'day'>
): string {
  return text.replace(UTC_IN_TEXT, (match, y, mo, d, h, mi, s) => {
    let at: number;
    if (y) {
      at = Date.UTC(+y, +mo - 1, +d, +h, +mi, +(s ?? 0));
    } else {
      const now = new Date(options.now);
      const base = Date.UTC(
        now.getUTCFullYear(),
        now.getUTCMonth(),
        now.getUTCDate(),
        +h,
        +mi,
        +(s ?? 0)
      );
      const day = 86400000;
      at = [base - day, base, base + day].reduce((a, b) =>
        Math.abs(b - options.now) < Math.abs(a - options.now) ? b : a
      );
    }
    return Number.isFinite(at) ? formatTime(at, options) : match;
  });
}

/**
 * Seconds in words: "45s", "1m 30s", "59m 59s", "1h", "2h 5m", "1d 3h". Below an hour the
 * seconds stay; above it, minutes are enough. Unknown → "?".
 */
export function formatDuration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) {
    return '?';
  }
  const s = Math.max(0, Math.floor(seconds));
  if (s < 3600) {
    const m = Math.floor(s / 60);
    const rest = s % 60;
    return m ? (rest ? `${m}m ${rest}s` : `${m}m`) : `${rest}s`;
  }
  const parts: string[] = [];
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  if (d) {
    parts.push(`${d}d`);
  }
  if (h) {
    parts.push(`${h}h`);
  }
  if (m) {
    parts.push(`${m}m`);
  }
  return parts.join(' ');
}

/** Time left until a deadline, rounded up, so "0s" shows only once it has passed. */
export function formatCountdown(msLeft: number): string {
  if (!Number.isFinite(msLeft) || msLeft <= 0) {
    return '0s';
  }
  return formatDuration(Math.ceil(msLeft / 1000));
}

/** Time since a moment (an idle stretch): "4m 12s". */
export function formatSince(ms: number, now: number): string {
  return formatDuration(Math.max(0, (now - ms) / 1000));
}

/** MiB → "512 MiB" or "20.0 GiB"; unknown → "?". */
export function formatMemory(mb: number | null | undefined): string {
  if (mb === null || mb === undefined || !Number.isFinite(mb)) {
    return '?';
  }
  if (mb >= 1024) {
    return `${(mb / 1024).toFixed(1)} GiB`;
  }
  return `${Math.round(mb)} MiB`;
}

/** 0..1 → "37%"; unknown → "?". */
export function formatActivity(value: number | null | undefined): string {
  if (value === null || value === undefined || !Number.isFinite(value)) {
    return '?';
  }
  return `${Math.round(Math.min(1, Math.max(0, value)) * 100)}%`;
}

/**
 * An ISO time from the wire, in ms; anything unreadable is null (unknown). Only a string: a
 * number (an edited manifest's epoch seconds) would be read by Date.parse as a year.
 */
export function parseTime(value: string | null | undefined): number | null {
  if (typeof value !== 'string' || !value) {
    return null;
  }
  const t = Date.parse(value);
  return Number.isNaN(t) ? null : t;
}

/** Cut a text to `max` characters with an ellipsis. */
export function shorten(text: string, max: number): string {
  return text.length > max ? text.slice(0, max - 1) + '…' : text;
}
