"""Showback: the usage ledger summed per team, user, project or tier and day or week, with idle
costs; CSV and JSON; and the charts of the service's pages, drawn server-side as inline SVG (no
CDN, no JavaScript). Every text that goes into SVG is escaped here."""

from __future__ import annotations

import csv
import heapq
import io
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import date, datetime, timedelta, timezone
from functools import partial
from html import escape
from operator import attrgetter
from typing import NamedTuple

from ..core import browser_json, clock, ledger
from ..core.durations import parse_duration
from ..core.text import in_sentence
from .queue import queue_buckets

COLUMNS = (
    "gpu_hours_allocated",
    "gpu_hours_active",
    "gpu_hours_idle",
    "gpu_hours_idle_held",
    "gpu_hours_idle_free",
    "gpu_hours_unknown",
    "gpu_hours_unobserved",
    "gpu_hours_right_size_freed",
    "utilisation",
    "idle_cost",
    "cost",
    "currency",
    "culls",
    "extensions",
    "queue_starts",
    "queue_hours",
    "queue_expired",
    "right_size_saving",  # last: a column added after the others, as a script reads them
)
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")


class UsageQueryError(ValueError):
    """A bad ``group_by``, ``since`` or ``until``; the message names it."""


def parse_group_by(text: str | None) -> tuple[list[str], str]:
    """``"team,day"`` → (["team"], "day"): dimensions, then at most one period (day, week)."""
    dims, period = [], "all"
    for part in filter(None, (p.strip() for p in (text or "team").split(","))):
        if part in ledger.DIMENSIONS:
            if part not in dims:
                dims.append(part)
        elif part in ("day", "week"):
            if period not in ("all", part):
                raise UsageQueryError(
                    f"'group_by' names at most one of day, week; got {period!r} and {part!r}"
                )
            period = part
        else:
            allowed = ", ".join((*ledger.DIMENSIONS, "day", "week"))
            raise UsageQueryError(f"'group_by' may name {allowed}; got {part!r}")
    return dims, period


PAGE_MAX_DAYS = 366  # the showback page's longest span: a year (its ``days``)


class PageSpan(NamedTuple):
    """What the showback page shows: by ``dim``, per ``period``, the UTC days ``first`` to
    ``last`` inclusive; ``days``: how many back from today it was asked as (None: dates)."""

    dim: str
    period: str
    first: date
    last: date
    days: int | None


_DAY_ONLY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _page_day(text: str, name: str) -> date:
    """A page's ``since`` or ``until``: a UTC day, ``2026-11-01``, as its date fields send."""
    try:
        if _DAY_ONLY.match(text):
            return date.fromisoformat(text)
    except ValueError:
        pass
    raise UsageQueryError(f"'{name}' must be a UTC day as 2026-11-01; got {text!r}")


def parse_page(
    group_by: str | None,
    period: str | None,
    days: str | None,
    since: str | None = None,
    until: str | None = None,
    now: datetime | None = None,
) -> PageSpan:
    """The showback page's ``group_by`` (one of ``ledger.DIMENSIONS``), ``period`` (day or
    week) and its UTC days: ``since`` to ``until`` (dates, inclusive; ``until`` absent: today),
    else the last ``days`` (1 to ``PAGE_MAX_DAYS``) to today; absent or empty: team, day, 14.
    A bad one names itself, as the usage API's do: the page never shows other data than asked
    (finance's closed month read as the 14 days to today)."""
    dim = group_by or "team"
    if dim not in ledger.DIMENSIONS:
        raise UsageQueryError(
            f"'group_by' must be one of {', '.join(ledger.DIMENSIONS)}; got {dim!r}"
        )
    period = period or "day"
    if period not in ("day", "week"):
        raise UsageQueryError(f"'period' must be day or week; got {period!r}")
    today = _day(now or clock.utcnow())
    if since or until:
        if days:
            raise UsageQueryError("give 'days' or 'since' and 'until', not both")
        if not since:
            raise UsageQueryError(f"'since' is needed with 'until' ({until!r}): the first UTC day")
        first = _page_day(since, "since")
        last = _page_day(until, "until") if until else today
        if last < first:
            raise UsageQueryError(f"'until' ({last}) is before 'since' ({first})")
        span = (last - first).days + 1
        if span > PAGE_MAX_DAYS:
            raise UsageQueryError(
                f"'since' to 'until' is {span:,} days; the page shows at most {PAGE_MAX_DAYS} "
                "(take longer spans from api/usage)"
            )
        return PageSpan(dim, period, first, last, None)
    days = days or "14"
    # ASCII digits only: int() also takes "٣", " 7 " and "1_0".
    if not (
        days.isascii() and days.isdigit() and len(days) <= 6 and 1 <= int(days) <= PAGE_MAX_DAYS
    ):
        raise UsageQueryError(
            f"'days' must be a whole number of days from 1 to {PAGE_MAX_DAYS}; got {days!r}"
        )
    n = int(days)
    return PageSpan(dim, period, today - timedelta(days=n - 1), today, n)


def month_spans(today: date) -> dict[str, tuple[date, date]]:
    """The page's one-click spans finance asks for: this month to ``today`` and last month
    whole (UTC days)."""
    first = today.replace(day=1)
    last_month_end = first - timedelta(days=1)
    return {
        "this month": (first, today),
        "last month": (last_month_end.replace(day=1), last_month_end),
    }


def parse_when(text: str | None, name: str, now: datetime | None = None) -> datetime | None:
    """A date (``2025-03-01``), an ISO time, or a duration back from now (``7d``, ``12h``)."""
    if not text:
        return None
    now = now or clock.utcnow()
    try:
        if _DATE.match(text):
            when = clock.parse(text if "T" in text else f"{text}T00:00:00Z")
        else:
            when = now - parse_duration(text, f"'{name}'")
        day = _day(when)
    except ValueError:
        raise UsageQueryError(
            f"'{name}' must be a date (2025-03-01), an ISO time or a duration back from now "
            f"(7d, 12h); got {text!r}"
        ) from None
    except OverflowError:  # its UTC time is out of the calendar
        day = date.max
    # Its UTC day and the day after are what the ledger and the queue's buckets are read by.
    if day >= date.max:
        raise UsageQueryError(
            f"'{name}' must fall from {date.min} to {date.max - timedelta(days=1)} (UTC); "
            f"got {text!r}"
        )
    return when


def _day(when: datetime) -> date:
    return when.astimezone(timezone.utc).date()


def parse_span(
    since: str | None, until: str | None, now: datetime | None = None
) -> tuple[datetime | None, datetime | None]:
    """``since`` and ``until`` (``parse_when``), days inclusive: ``until``'s day not before
    ``since``'s."""
    now = now or clock.utcnow()
    start, end = parse_when(since, "since", now), parse_when(until, "until", now)
    if start and end and _day(end) < _day(start):
        raise UsageQueryError(f"'until' is before 'since' ({until} < {since})")
    return start, end


def usage_rows(
    store,
    options,
    group_by: Sequence[str],
    period: str,
    since: datetime | None,
    until: datetime | None = None,
    **owner: str | None,
) -> Iterator[dict]:
    """Showback rows from the store's ledger (``options``: the governor's Options, for
    prices), streamed: the ledger read a chunk at a time, summed a period at a time (a year of
    a big hub's buckets by user and day is millions of rows, each held as it went: 2.6 KB a
    bucket).

    A renamed tier (``formerly``) is read under its name now, and ``tier=`` any of its names
    reads all of them: the days billed before the rename are that tier's (a month across it
    was two rows by tier, and ``tier=`` its name now left out the days before)."""
    tier = owner.get("tier")
    if isinstance(tier, str):
        owner["tier"] = frozenset(options.tier_names(tier))
    elif tier is not None:
        owner["tier"] = frozenset(n for t in tier for n in options.tier_names(t))
    buckets = heapq.merge(  # both in day order
        store.usage(since, until, **owner),
        queue_buckets(store, since, until, **owner),
        key=attrgetter("day"),
    )
    buckets = map(partial(_named_now, options), buckets)
    for row in ledger.summarize_periods(buckets, group_by, period, options.cost_per_hour):
        row["currency"] = options.currency
        yield row


def _named_now(options, bucket: ledger.Bucket) -> ledger.Bucket:
    """``bucket`` under its tier's name now (itself where the tier was never renamed)."""
    now = options.tier_names(bucket.owner.tier)[0]
    if now == bucket.owner.tier:
        return bucket
    return ledger.Bucket(bucket.day, replace(bucket.owner, tier=now), bucket.values)


def usage(store, options, group_by, period, since, until=None, **owner) -> list[dict]:
    """``usage_rows``, all of them (the pages' few)."""
    return list(usage_rows(store, options, group_by, period, since, until, **owner))


def csv_lines(rows: Iterable[Mapping], group_by: Sequence[str]) -> Iterator[str]:
    """The CSV of showback rows, a line at a time (the header first)."""
    out = io.StringIO()
    # RFC 4180's CRLF: the writer quotes a field holding CR as well as LF. With LF alone a name's
    # bare CR went out unquoted, and a spreadsheet, which ends a row there, read what followed
    # as a new row: its first cell a formula that ``_csv_safe`` never saw.
    writer = csv.writer(out, lineterminator="\r\n")
    header = ["period", *group_by, *COLUMNS]
    writer.writerow(header)
    yield _taken(out)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else _csv_safe(row.get(c)) for c in header])
        yield _taken(out)


def _taken(out: io.StringIO) -> str:
    text = out.getvalue()
    out.seek(0)
    out.truncate()
    return text


def to_csv(rows: Iterable[Mapping], group_by: Sequence[str]) -> str:
    return "".join(csv_lines(rows, group_by))


def json_parts(head: Mapping, rows: Iterable[Mapping]) -> Iterator[str]:
    """``json.dumps({**head, "usage": [*rows]})`` (``head`` not empty), a row at a time."""
    yield browser_json.dumps(head)[:-1] + ', "usage": ['
    for i, row in enumerate(rows):
        yield (", " if i else "") + browser_json.dumps(row)
    yield "]}"


# What starts a spreadsheet formula first in a cell: ASVS 5.0's leading characters, NUL included
# (a project without a grant is any text the user sent).
_FORMULA_LEADS = ("=", "+", "-", "@", "\t", "\r", "\0")


def _csv_safe(value):
    """Owner names come from users: never let one start a spreadsheet formula. OWASP's CSV
    injection guidance: a spreadsheet may drop a cell's leading blanks (spaces, a line break, a
    no-break space) and read `` =1+1`` as ``=1+1``, so the first character after them counts too."""
    if isinstance(value, str) and (
        value[:1] in _FORMULA_LEADS or value.lstrip()[:1] in _FORMULA_LEADS
    ):
        return "'" + value
    return value


# -- charts (inline SVG) -----------------------------------------------------------------------

PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)


def _nice(value: float) -> float:
    """A round axis maximum at or above ``value``."""
    if value <= 0:
        return 1.0
    step = 10 ** (len(str(int(value))) - 1) if value >= 1 else 0.1
    while step * 10 < value:
        step *= 10
    for factor in (1, 2, 2.5, 5, 10):
        if step * factor >= value:
            return step * factor
    return step * 10


def _fmt(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:,.0f}"


def _svg(width: int, height: int, title: str) -> str:
    """A chart's opening tag, drawn at its own size: the page keeps its text readable (12 px
    ticks) and scrolls a chart sideways in a narrow window rather than shrinking it."""
    return (
        f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>'
    )


def stacked_bars(
    series: Mapping[str, Mapping[str, float]],
    periods: Sequence[str],
    *,
    title: str,
    unit: str,
    width: int = 680,
    height: int = 260,
) -> str:
    """Bars per period, stacked by series (e.g. idle GPU-hours by team per day), with a
    legend; ``<title>`` on each piece says what it is (hover)."""
    left, bottom, top, right = 48, 40, 28, 150
    plot_w, plot_h = width - left - right, height - top - bottom
    totals = [sum(s.get(p, 0.0) for s in series.values()) for p in periods]
    top_value = _nice(max(totals, default=0))
    parts = [
        _svg(width, height, title),
        f'<text x="{left}" y="16" class="chart-title">{escape(title)}</text>',
    ]
    for i in range(5):
        value = top_value * i / 4
        y = top + plot_h - plot_h * i / 4
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">'
            f"{_fmt(value)}</text>"
        )
    if not periods:
        parts.append(
            f'<text x="{left + plot_w / 2}" y="{top + plot_h / 2}" text-anchor="middle" '
            f'class="empty">No usage recorded yet</text>'
        )
    slot = plot_w / max(len(periods), 1)
    bar = min(48.0, slot * 0.7)
    colours = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(series)}
    for i, period in enumerate(periods):
        x = left + slot * i + (slot - bar) / 2
        y = top + plot_h
        for name, values in series.items():
            value = values.get(period, 0.0)
            if value <= 0:
                continue
            h = plot_h * value / top_value
            y -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{colours[name]}"><title>{escape(in_sentence(name or "(none)"))}, {escape(period)}: '
                f"{_fmt(value)} {escape(unit)}</title></rect>"
            )
        if len(periods) <= 16 or i % max(1, len(periods) // 8) == 0:
            parts.append(
                f'<text x="{x + bar / 2:.1f}" y="{top + plot_h + 16}" text-anchor="middle" '
                f'class="tick">{escape(period[5:] if len(period) == 10 else period)}</text>'
            )
    parts.append(
        f'<text x="{left}" y="{height - 4}" class="tick">{escape(unit)}</text>' if periods else ""
    )
    for i, name in enumerate(list(series)[:12]):
        y = top + 14 * i
        parts.append(
            f'<rect x="{width - right + 12}" y="{y}" width="10" height="10" '
            f'fill="{colours[name]}"/><text x="{width - right + 28}" y="{y + 9}" class="legend">'
            f"{escape(in_sentence((name or '(none)')[:22]))}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def histogram(
    values: Sequence[float], *, title: str, unit: str, width: int = 680, height: int = 220
) -> str:
    """GPU-hours per utilisation bin (0-10 %, …, 90-100 %)."""
    left, bottom, top, right = 48, 40, 28, 16
    plot_w, plot_h = width - left - right, height - top - bottom
    top_value = _nice(max(values, default=0))
    n = max(len(values), 1)
    slot = plot_w / n
    parts = [
        _svg(width, height, title),
        f'<text x="{left}" y="16" class="chart-title">{escape(title)}</text>',
    ]
    for i in range(5):
        y = top + plot_h - plot_h * i / 4
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">'
            f"{_fmt(top_value * i / 4)}</text>"
        )
    for i, value in enumerate(values):
        low, high = round(100 * i / n), round(100 * (i + 1) / n)
        h = plot_h * value / top_value
        x = left + slot * i + 2
        colour = "#e15759" if high <= 20 else "#edc948" if high <= 50 else "#59a14f"
        parts.append(
            f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{slot - 4:.1f}" '
            f'height="{h:.1f}" fill="{colour}"><title>{low}-{high} % active: {_fmt(value)} '
            f"{escape(unit)}</title></rect>"
            f'<text x="{x + (slot - 4) / 2:.1f}" y="{top + plot_h + 16}" text-anchor="middle" '
            f'class="tick">{low}-{high}%</text>'
        )
    parts.append(f'<text x="{left}" y="{height - 4}" class="tick">{escape(unit)}</text></svg>')
    return "".join(parts)


def hbars(
    values: Mapping[str, float], *, title: str, unit: str, width: int = 600, row: int = 22
) -> str:
    """Horizontal bars, largest first (e.g. idle cost by team)."""
    items = sorted(values.items(), key=lambda kv: -kv[1])[:15]
    height = 36 + row * max(len(items), 1)
    left, right = 130, 110
    plot_w = width - left - right
    top_value = max((v for _, v in items), default=0) or 1.0
    parts = [
        _svg(width, height, title),
        f'<text x="8" y="16" class="chart-title">{escape(title)}</text>',
    ]
    if not items:
        parts.append('<text x="8" y="44" class="empty">No usage recorded yet</text>')
    for i, (name, value) in enumerate(items):
        y = 28 + row * i
        w = plot_w * value / top_value
        parts.append(
            f'<text x="{left - 8}" y="{y + 14}" text-anchor="end" class="legend">'
            f"{escape(in_sentence((name or '(none)')[:18]))}</text>"
            f'<rect x="{left}" y="{y + 2}" width="{max(w, 1):.1f}" height="{row - 6}" '
            f'fill="{PALETTE[i % len(PALETTE)]}"><title>{escape(in_sentence(name or "(none)"))}: '
            f"{_fmt(value)} {escape(unit)}</title></rect>"
            f'<text x="{left + w + 6:.1f}" y="{y + 14}" class="tick">{_fmt(value)} '
            f"{escape(unit)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def series_by(rows: Iterable[Mapping], dim: str, column: str) -> tuple[dict, list[str]]:
    """(series name → period → value, sorted periods) from showback rows."""
    series: dict[str, dict[str, float]] = {}
    periods = set()
    for row in rows:
        periods.add(row["period"])
        values = series.setdefault(row.get(dim) or "", {})
        values[row["period"]] = values.get(row["period"], 0.0) + (row.get(column) or 0.0)
    return series, sorted(periods)


def days_back(days: int, now: datetime | None = None) -> datetime:
    now = (now or clock.utcnow()).astimezone(timezone.utc)
    return datetime.combine(now.date(), datetime.min.time(), timezone.utc) - timedelta(
        days=days - 1
    )
