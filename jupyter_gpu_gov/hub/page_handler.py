"""How the service's pages are rendered (``hub/pages.py`` has the pages themselves): the
Jinja2 templates (autoescaped; no CDN), times shown in the reader's clock, the page handler
(Hub login for browsers, errors as pages), and the pages' static files.

Times are written as ``<time datetime="…Z">2026-01-05 09:14 UTC</time>``; ``static/pages.js``
shows them in the reader's clock, like JupyterLab does. Only the API and CSV stay in UTC.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from tornado import web

from ..core import clock
from ..core.durations import format_duration
from ..core.text import in_sentence
from .api_handler import ApiHandler, error_message, retry_after
from .hub_auth import HubOAuthenticated
from .prepared_auth import is_governor_admin
from .readers import reads_showback
from .views import match_text

env = Environment(
    loader=PackageLoader("jupyter_gpu_gov.hub", "templates"),
    autoescape=select_autoescape(["html"], default=True),
)
env.filters["dur"] = lambda s: "—" if s is None else format_duration(int(s))

STATIC = Path(__file__).parent / "static"
# What the governor writes into reasons: "2026-01-05 09:14 UTC", or "09:14 UTC" (about now).
_UTC_IN_TEXT = re.compile(r"\b(?:(\d{4}-\d{2}-\d{2})[ T])?(\d{2}):(\d{2})(?::(\d{2}))? UTC\b")


def time_tag(when: datetime | None) -> Markup:
    """A moment for people: the page's script shows it in their clock; UTC without it."""
    if when is None:
        return Markup("")
    when = when.astimezone(timezone.utc)
    return Markup('<time datetime="{}">{} UTC</time>').format(
        when.strftime("%Y-%m-%dT%H:%M:%SZ"), when.strftime("%Y-%m-%d %H:%M")
    )


def times_in_text(text: str | None, now: datetime | None = None) -> Markup:
    """``text`` escaped, each UTC time in it a :func:`time_tag` (a time without a day is the
    one nearest ``now``)."""
    now = (now or clock.utcnow()).astimezone(timezone.utc)
    out, last = [], 0
    for match in _UTC_IN_TEXT.finditer(text or ""):
        day, hour, minute, second = match.groups()
        try:
            if day:
                at = datetime.fromisoformat(f"{day}T{hour}:{minute}:{second or '00'}+00:00")
            else:
                base = now.replace(hour=int(hour), minute=int(minute), second=0, microsecond=0)
                at = min((base + timedelta(days=d) for d in (-1, 0, 1)), key=lambda t: abs(t - now))
        except ValueError:  # 25:99 UTC: left as written
            continue
        out += [Markup.escape(text[last : match.start()]), time_tag(at)]
        last = match.end()
    out.append(Markup.escape((text or "")[last:]))
    return Markup("").join(out)


def bdi(name: object) -> Markup:
    """A name a user chose (a user's, a server's, a team's, a project's) escaped and isolated
    as ``<bdi>``: a bidi control in it (U+202E) reorders it alone, never the text around it (a
    row once read as another user's)."""
    return Markup("<bdi>{}</bdi>").format(name)


def isolate(text: object) -> str:
    """Text from outside where markup cannot go (a tooltip, an ``<option>``, the ``<title>``):
    ``core.text.in_sentence``, U+2068 ... U+2069 as ``bdi`` is in markup, but only where the
    text could reorder what is around it (anything but ASCII): text a reader copies from
    there (a user's name, into ``?user=``, read as sent) is the name itself for every
    ordinary name. Escaped as any text."""
    return "" if text is None or text == "" else in_sentence(str(text))


env.filters["time"] = time_tag
env.filters["bdi"] = bdi
env.filters["isolate"] = isolate
env.filters["times"] = times_in_text
env.filters["match"] = match_text


class PageHandler(ApiHandler):
    """HTML pages: a browser that is not logged in is sent to the Hub's login (GET); errors
    are pages, not JSON."""

    def sends_to_login(self) -> bool:
        return self.request.method in ("GET", "HEAD")

    def get_login_url(self):
        if self.sends_to_login():
            return HubOAuthenticated.get_login_url(self)  # the Hub's OAuth, with its state
        raise web.HTTPError(403, "log in again: this form has expired (XSRF)")

    @property
    def prefix(self) -> str:
        return self.settings["gpu_gov_prefix"]

    def render_page(self, template: str, status: int = 200, **context) -> None:
        self.finish(self._page(template, status, context)())

    async def render_page_in_worker(self, template: str, status: int = 200, **context) -> None:
        """``render_page``, rendered in a worker thread: a page of a year of a big hub's usage
        is seconds of work (its tables and charts), which held every report on the event loop."""
        await self.finish_from_worker(self._page(template, status, context))

    def _page(self, template: str, status: int, context: dict) -> Callable[[], str]:
        """The page's headers set, and its rendering, to call."""
        self.set_status(status)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Content-Security-Policy", "default-src 'self'")  # no inline code
        self.set_header("X-Content-Type-Options", "nosniff")
        user = self.current_user or {}
        return partial(
            env.get_template(template).render,
            prefix=self.prefix,
            me=user.get("name", ""),
            is_admin=bool(user) and self.is_admin,
            # A team lead's or finance's navigation has Showback (``hub/readers.py``).
            reads_showback=bool(user) and reads_showback(user),
            xsrf=Markup(self.xsrf_form_html()),
            dry_run=self.governor.options.dry_run,
            currency=self.governor.options.currency,
            **context,
        )

    def write_error(self, status_code: int, **kwargs):
        message = error_message(self._reason, kwargs)
        user = getattr(self, "_hub_auth_user_cache", None) or {}
        self.set_status(status_code)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Content-Security-Policy", "default-src 'self'")
        retry_after(self, kwargs)
        self.finish(
            env.get_template("error.html").render(
                prefix=self.prefix,
                status=status_code,
                message=message,
                me=user.get("name", ""),
                is_admin=is_governor_admin(user),
                # A lead refused the dashboard (the Hub's Services menu leads there) still
                # finds Showback in the navigation.
                reads_showback=bool(user) and reads_showback(user),
                dry_run=self.governor.options.dry_run,
            )
        )

    def require_admin(self) -> None:
        if not self.is_admin:
            theirs = (
                "your teams' usage is on “Showback”, your own on “My GPU usage”"
                if reads_showback(self.current_user)
                else "your own usage is on “My GPU usage”"
            )
            raise web.HTTPError(
                403,
                "the GPU dashboard is for Hub admins and governor admins "
                f"(scope custom:gpu-gov:admin); {theirs}",
            )


def ago(when: datetime | None, now: datetime) -> str:
    if when is None:
        return ""
    return format_duration(max(0, int((now - when).total_seconds())))


def until(when: datetime | None, now: datetime) -> str:
    if when is None:
        return ""
    seconds = int((when - now).total_seconds())
    return f"in {format_duration(seconds)}" if seconds > 0 else "due"


class StaticHandler(web.StaticFileHandler):
    """The pages' stylesheet and script (no CDN): public, like any page's assets."""

    def set_extra_headers(self, path):
        self.set_header("X-Content-Type-Options", "nosniff")
