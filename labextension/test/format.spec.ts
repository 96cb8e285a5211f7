import {
  formatActivity,
  formatCountdown,
  formatDuration,
  formatMemory,
  formatTime,
  localizeTimes
} from '../src/format';
import { clock, day, NOW } from './helpers';

const at = { now: NOW, clock, day };

describe('formatDuration (as core/durations.py format_duration)', () => {
  it.each([
    [0, '0s'],
    [45, '45s'],
    [60, '1m'],
    [90, '1m 30s'],
    [3599, '59m 59s'],
    [3600, '1h'],
    [3661, '1h 1m'],
    [5400, '1h 30m'],
    [90061, '1d 1h 1m'],
    [-5, '0s'],
    [12.7, '12s']
  ])('%p s → %p', (seconds, text) => {
    expect(formatDuration(seconds)).toBe(text);
  });

  it('says "?" for unknown, never 0', () => {
    expect(formatDuration(null)).toBe('?');
    expect(formatDuration(undefined)).toBe('?');
    expect(formatDuration(NaN)).toBe('?');
  });
});

describe('formatCountdown', () => {
  it.each([
    [3_900_000, '1h 5m'],
    [249_000, '4m 9s'],
    [248_200, '4m 9s'],
    [42_000, '42s'],
    [60_000, '1m'],
    [90_000, '1m 30s'],
    [1, '1s'],
    [0, '0s'],
    [-5_000, '0s'],
    [NaN, '0s'],
    [Infinity, '0s']
  ])('%p ms → %p (rounded up: 0s only once due)', (ms, text) => {
    expect(formatCountdown(ms)).toBe(text);
  });
});

describe('times', () => {
  it('shows the clock today and the day with it on another day', () => {
    expect(formatTime(Date.parse('2026-01-05T14:02:00Z'), at)).toBe('14:02');
    expect(formatTime(Date.parse('2026-01-04T23:59:00Z'), at)).toBe(
      '2026-01-04, 23:59'
    );
  });

  it('reads the governor’s UTC times in the person’s clock', () => {
    const here = {
      now: NOW,
      clock: (d: Date) =>
        `${(d.getUTCHours() + 1) % 24}:${String(d.getUTCMinutes()).padStart(2, '0')}`,
      day
    };
    expect(
      localizeTimes(
        'GPU idle since 2026-01-05 09:14 UTC; server stopped at 11:04 UTC unless extended',
        here
      )
    ).toBe('GPU idle since 10:14; server stopped at 12:04 unless extended');
    expect(
      localizeTimes('exempt until 2026-01-07 18:00 UTC (maintenance)', at)
    ).toBe('exempt until 2026-01-07, 18:00 (maintenance)');
    // A time without a day is the one nearest now: 23:50 UTC just after midnight is yesterday.
    expect(
      localizeTimes('since 23:50 UTC', {
        ...at,
        now: Date.parse('2026-01-05T00:10:00Z')
      })
    ).toBe('since 2026-01-04, 23:50');
    expect(localizeTimes('no time here: 12:00 noon', at)).toBe(
      'no time here: 12:00 noon'
    );
  });
});

describe('memory and activity', () => {
  it('unknown is "?", never 0', () => {
    expect(formatMemory(20480)).toBe('20.0 GiB');
    expect(formatMemory(512)).toBe('512 MiB');
    expect(formatMemory(null)).toBe('?');
    expect(formatActivity(0)).toBe('0%');
    expect(formatActivity(0.374)).toBe('37%');
    expect(formatActivity(null)).toBe('?');
  });
});
