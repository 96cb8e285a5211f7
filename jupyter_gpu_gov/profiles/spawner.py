"""The spawner side of the profile layer, shared by the KubeSpawner and local-process glue.

Mix ``GpuProfilesMixin`` in front of a spawner class. It gives the spawner

- a spawn form listing the tiers the user's teams may use, with what each team has left and
  whether a server would borrow (``options_form`` / ``options_from_form``);
- admission at ``start()``: the count of the hub's started servers (kept between spawns and
  brought up to date with the database first: ``grant_count.py``), ``quota.admit``, and the
  grant (``gpu-gov/tier``, ``team``, ``project``, ``borrowed``, ``max-age``) recorded in the
  spawner's *state*, which only the Hub writes and where the governor, the pod labels and
  the next admission's count read it (``core.grant``), with a copy in ``user_options`` for the
  Hub's pages. Of
  what a user sends in ``user_options`` only their choices are kept (``core.grant.
  USER_CHOICES``): a ``gpu-gov/exempt`` sent through the REST API is dropped. The count, the
  decision and the record happen without an ``await`` in between, so concurrent spawns in the
  hub's event loop cannot overshoot a quota;
- refusals as an HTTP 403 whose ``jupyterhub_message`` the spawn page shows;
- the spawn queue (``profiles/queue.py``): a refused request may wait in line
  (``gpu_enqueue``), recorded in the spawner's state; admission measures every request against
  the requests ranked ahead of it, and a waiting server leaves the line when it starts.

Subclasses say how many devices a tier has (``gpu_capacity``), read what they count from before
the steps that count (``gpu_refresh``, awaited; a slow source waits there, bounded, never in
the steps themselves), say when it cannot be counted (``gpu_unknown``: admission then hands
out no GPU, naming why) and may pin devices (``gpu_assign``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from functools import partial
from typing import Any

from jupyterhub import orm
from sqlalchemy import Text, type_coerce
from tornado import web

from ..core import clock
from ..core.durations import parse_duration
from ..core.grant import GRANT_STATE, oversized, user_may_choose
from ..core.queue import (
    CANCELLED,
    FOR_A_GPU,
    QUEUE_STATE,
    QueuedRequest,
    Waiting,
    from_state,
    whole_ms,
)
from ..core.teams import group_teams, user_teams
from ..core.text import escaped, in_sentence, listed
from ..core.vocabulary import (
    BORROWED_LABEL,
    CLAIM_WITHIN_LABEL,
    EXPECTED_DURATION_LABEL,
    MAX_AGE_LABEL,
    PROJECT_LABEL,
    QUEUED_AT_LABEL,
    RECLAIM_BY_LABEL,
    RECLAIM_FOR_LABEL,
    RECLAIM_LABEL,
    TASK_TYPE_LABEL,
    TEAM_LABEL,
    TIER_LABEL,
    WEIGHT_LABEL,
    server_key,
)
from ..hub_process import cut_where_stored
from . import form
from .config import GpuProfiles
from .grant_count import NOT_CACHED, kept_count
from .queue import (
    FORECAST,
    QUEUEABLE,
    REFUSED,
    admit_in_line,
    line,
    offer,
    offer_words,
    starts_when,
)
from .quota import Admission, Grant, Held, Request, admit, tier_use
from .tiers import Tier

NO_GPU = "no-gpu"  # the form's CPU-only choice
# The grant's labels (core.vocabulary), by their short names here.
TIER, TEAM, PROJECT, BORROWED, MAX_AGE, WEIGHT, RECLAIM, RECLAIM_FOR = GRANT_KEYS = (
    TIER_LABEL,
    TEAM_LABEL,
    PROJECT_LABEL,
    BORROWED_LABEL,
    MAX_AGE_LABEL,
    WEIGHT_LABEL,
    RECLAIM_LABEL,
    RECLAIM_FOR_LABEL,
)
GRANT_KEYS += (
    RECLAIM_BY_LABEL,
    TASK_TYPE_LABEL,
    EXPECTED_DURATION_LABEL,
    QUEUED_AT_LABEL,
    CLAIM_WITHIN_LABEL,
)
# On the hub's user object: the spawner whose form just refused, so that the spawn page, which
# renders the default server's form with the refusal, shows that server's (get_options_form).
_REFUSED_FORM = "_gpu_gov_refused_form"
# The queue is offered while the governor (which starts waiting servers) was heard this recently.
GOVERNOR_HEARD_WITHIN = timedelta(minutes=10)


def waiting_requests(db) -> list[QueuedRequest]:
    """Every request waiting in line in the hub, from the spawners' state in its database (one
    query; only the rows holding a request are read)."""
    rows = (
        db.query(orm.Spawner.state, orm.Spawner.name, orm.User.name)
        .join(orm.User, orm.Spawner.user_id == orm.User.id)
        .filter(type_coerce(orm.Spawner.state, Text).like(f'%"{QUEUE_STATE}"%'))
        .execution_options(**NOT_CACHED)
    )
    waiting = []
    for state, name, user in rows:
        request = from_state(state)
        if request is not None:  # the row says whose it is, whatever the record says
            waiting.append(replace(request, user=user, name=name or ""))
    return waiting


def _asked_for_the_line(db):
    """The running servers a reclaim for a spawn in line was asked of (one query; only the
    rows holding one are read)."""
    return (
        db.query(orm.Spawner)
        .filter(
            orm.Spawner.started.isnot(None),
            type_coerce(orm.Spawner.state, Text).like(f'%"{RECLAIM_BY_LABEL}"%'),
        )
        .execution_options(**NOT_CACHED)
    )


def reclaim_askers(db) -> set[str]:
    """The waiting servers the standing reclaims were asked for (``gpu-gov/reclaim-by``)."""
    found = set()
    for row in _asked_for_the_line(db):
        by = ((row.state or {}).get(GRANT_STATE) or {}).get(RECLAIM_BY_LABEL)
        if isinstance(by, str):
            found.add(by)
    return found


def withdraw_reclaims(db, users, needed: set[str]) -> list[dict[str, str]]:
    """Lift the reclaims asked for a spawn in line (``gpu-gov/reclaim-by``) that no spawn in
    line needs now (``needed``: the servers the waiting requests would ask back, and those
    still waiting): the asker cancelled, expired or started elsewhere, and the borrower keeps
    its GPU. Returns what was lifted (the governor audits it and tells the owner). A reclaim
    asked for a refused spawn stands: that spawn was told to retry in a few minutes."""
    lifted = []
    for row in _asked_for_the_line(db):
        state = dict(row.state or {})
        grant = dict(state.get(GRANT_STATE) or {})
        by = grant.get(RECLAIM_BY_LABEL)
        key = server_key(row.user.name, row.name or "")
        if by is None or by in needed or key in needed:
            continue
        request = {k: grant.pop(k, None) for k in (RECLAIM, RECLAIM_FOR, RECLAIM_BY_LABEL)}
        row.state = {**state, GRANT_STATE: grant}
        row.user_options = {k: v for k, v in (row.user_options or {}).items() if k not in request}
        spawner = users[row.user].spawners.get(row.name) if users is not None else None
        if spawner is not None:  # the Hub API (which the governor reads) shows the live one
            spawner._gpu_granted = grant
            spawner.user_options = dict(row.user_options)
        lifted.append(
            {
                "server": key,
                "team": str(request[RECLAIM_FOR] or ""),
                "asked_at": str(request[RECLAIM] or ""),
                "by": str(by),
            }
        )
    if lifted:
        db.commit()
    return lifted


def _say_gone(log, said: set[str], gone: Mapping[str, int]) -> None:
    """Once per tier name and process: running servers hold a tier no longer configured
    (removed, or renamed without saying so: the team's guarantee then does not see them)."""
    for name, servers in gone.items():
        if name in said or len(said) >= 1000:
            continue
        said.add(name)
        log.warning(
            "gpu-gov: %d running server(s) hold tier %s, which is no longer configured: "
            "their devices count on no tier's quota. If it was renamed, give the new tier "
            "'formerly': [%s]",
            servers,
            repr(name[:60]),
            repr(name[:60]),
        )


class GpuRefused(web.HTTPError):
    """A spawn the profile layer refuses; JupyterHub shows ``jupyterhub_message`` to the user."""

    def __init__(self, message: str) -> None:
        # The Hub logs the error's own message: it may quote a user's choice or team name.
        super().__init__(403, "gpu-gov: %s", escaped(message))
        self.jupyterhub_message = message


def unstartable(user: str, name: str) -> str | None:
    """Why no spawner can start this server, in the words the user reads (None: it can be).
    A name holding NUL (JupyterHub 4.1-5.x took one for a server, a Hub on SQLite keeps one for
    a user, and JupyterHub 6 starts what it kept) goes into the server's environment
    (``JUPYTERHUB_USER``, ``JUPYTERHUB_SERVER_NAME``), which no process can be given: a local
    process failed at once, but a pod held its GPU, admitted and counted, until the start
    timed out ("did not start in 120 seconds"). Refused before admission, so nothing is held."""
    for whose, named in (("user", user), ("server", name)):
        if "\0" in named:
            return (
                f"This {whose}'s name, “{escaped(named)[:80]}”, holds a NUL character, which no "
                "server's environment can carry: it can never start. "
                + (
                    "Start a server under another name (and delete this one)."
                    if whose == "server"
                    else "Ask your hub admin to rename this user."
                )
            )
    return None


def _applied_at_admission(spawner, user_options) -> None:
    """The profile layer's ``apply_user_options``: nothing before ``start()``'s admission."""


class GpuProfilesMixin:
    """Tiers, team quotas and admission for a JupyterHub spawner (mix in first)."""

    _gpu_granted: dict[str, str] | None = None  # the grant, in the spawner's state ({}: no GPU)
    # Admission refuses user_options too large to keep (after what cannot be granted):
    # add_governor's pre_spawn_hook (hub/hubconfig.py) leaves them to it.
    bounds_user_options = True
    _gpu_queued: QueuedRequest | None = None  # waiting in line, kept in the spawner's state
    # The pod of each started server holding a tier (KubeSpawner's state: pod_name) -> the tier,
    # from the last count: the cluster count knows the hub's pods by name, not by their labels.
    _gpu_pods: Mapping[str, str] = {}

    @property
    def gpu_profiles(self) -> GpuProfiles:
        return GpuProfiles.instance(config=self.config)

    def _apply_user_options_default(self):
        # Without one, JupyterHub (5.3+) logs "Received unhandled user_options" at every GPU
        # spawn, as if the choices were ignored: admission applies them, in start(). An
        # admin's own apply_user_options still replaces this. (traitlets' named default: a
        # mixin's @default is not registered, only the final class's own.)
        return _applied_at_admission

    # -- hooks for the glue ------------------------------------------------------------------

    async def gpu_refresh(self) -> None:
        """Read what ``gpu_capacity`` counts from, before the form, admission and the line
        (which then await nothing); a bounded wait. Default: nothing to read."""

    def gpu_unknown(self) -> str | None:
        """Why the devices cannot be counted now (no GPU is then admitted; the form and the
        refusal say this), or None."""
        return None

    def gpu_capacity(self, usage: list[Grant]) -> dict[str, int | None]:
        """Devices per tier (in use or free). Default: ``GpuProfiles.capacity``."""
        return dict(self.gpu_profiles.capacity)

    def gpu_cards_held(self, usage: Held, servers: set[str] | None = None) -> dict[str, str] | None:
        """Server -> the product of the cards it holds, for ``servers`` (default: the borrowed
        servers of capability classes in ``usage``, ``quota.admit``'s ``cards_held``; the
        spawners that know it say it: a pod's node, a workstation's devices); None: not
        known."""
        return None

    def _gpu_cards_for_estimates(self, usage: Held) -> dict[str, str] | None:
        """``gpu_cards_held`` for the line's estimates: the capability classes' servers whose
        release the governor forecast (one on an H100 frees it for an H100 request); nothing
        read when there are none."""
        releases = FORECAST.releases
        classes = {t.name for t in self.gpu_profiles.tier_map.values() if t.card is None}
        if not classes or not releases:
            return None
        servers = {
            g.server
            for g in usage.grants
            if g.tier in classes and (r := releases.get(g.server)) is not None and r.at
        }
        return self.gpu_cards_held(usage, servers) if servers else None

    def gpu_cards(self) -> dict[str, int | None]:
        """Devices per tier the machine or cluster has, whichever tier holds them (the form's
        "of M"; a tier without an entry reads its ``gpu_capacity``). Default: none."""
        return {}

    def gpu_assign(self, tier: Tier) -> None:
        """Pin devices for an admitted server; raise ``GpuRefused`` when none is free."""

    # -- the form ----------------------------------------------------------------------------

    async def get_options_form(self) -> str:
        # JupyterHub's spawn page answers a refused form with ``user.spawner``'s form (the
        # default server's), whatever server was asked: that server's own is the true one.
        refused, at = getattr(self.user, _REFUSED_FORM, None) or (None, 0.0)
        if refused is not None:
            setattr(self.user, _REFUSED_FORM, None)  # once: the very next form, that request's
            if refused is not self and time.monotonic() - at < 10:
                return await refused.get_options_form()
        conf = self.gpu_profiles
        teams = await self.gpu_teams()
        await self.gpu_refresh()
        usage = self.gpu_held()
        capacity = self.gpu_capacity(usage)
        cards = self.gpu_cards()
        name = self._gpu_server_key()
        now = clock.utcnow()
        queued = self.gpu_waiting()
        mine = self._gpu_queued if self._gpu_queued and self._gpu_queued.live(now) else None
        decide = partial(admit_in_line, queued=queued, now=now, queued_at=mine and mine.queued_at)
        unknown = self.gpu_unknown()
        if unknown is not None:

            def decide(*_, **__) -> Admission:  # every tier says why, as admission would
                return Admission(False, unknown)

        lines = {
            team: tier_use(
                self.user.name,
                team,
                usage,
                capacity,
                conf.quota_map,
                conf.tier_map,
                server=name,
                decide=decide,
                cards=cards,
            )
            for team in teams
        }
        offers = {}
        if self.gpu_queue_offered(now):
            held_cards = self._gpu_cards_for_estimates(usage)
            for team, uses in lines.items():
                for use in uses:
                    request = Request(name, self.user.name, team, use.tier)
                    place = offer(
                        request,
                        use.admission,
                        usage,
                        capacity,
                        conf.quota_map,
                        conf.tier_map,
                        queued,
                        FORECAST.releases,
                        now,
                        cards_held=held_cards,
                    )
                    if place is not None and self._gpu_never(conf.tier_map[use.tier], team) is None:
                        offers[team, use.tier] = offer_words(place, conf.tier_map)
        previous = (self.orm_spawner.user_options or {}) if self.orm_spawner else {}
        base = self.hub.base_url if self.hub else "/hub/"
        return form.render(
            tiers=conf.tier_map,
            teams=teams,
            lines=lines,
            offers=offers,
            waiting=mine and getattr(conf.tier_map.get(mine.tier), "display_name", mine.tier),
            queue_url=base + "gpu-gov/queue/join/" + form.server_path(self.user.name, self.name),
            queue_page=base + "gpu-gov/queue",
            projects=sorted({p for t in teams for p in conf.projects.get(t, [])}),
            previous=previous,
            allow_no_gpu=conf.allow_no_gpu,
            require_project=conf.require_project,
            no_gpu=NO_GPU,
            estimate_url=base + "gpu-gov/estimate" if self.hub else "",
        )

    async def run_options_from_form(self, formdata: Mapping[str, list[str]]) -> dict[str, Any]:
        try:
            try:
                options = form.parse(formdata)
            except form.FormError as error:
                raise GpuRefused(str(error)) from None
            # A quick answer on the form itself; start() decides again and records, atomically.
            teams = await self.gpu_teams()
            await self.gpu_refresh()
            self._gpu_decide(options, teams)
        except Exception:
            setattr(self.user, _REFUSED_FORM, (self, time.monotonic()))  # shown with it: ours
            raise
        return options

    # -- admission ---------------------------------------------------------------------------

    async def start(self):
        if refused := unstartable(self.user.name, self.name or ""):
            raise GpuRefused(refused)
        teams = await self.gpu_teams()
        await self.gpu_refresh()
        waiting = self._gpu_queued
        # From here to super().start(), no await: count, decide and record as one step.
        self._gpu_admit(teams)
        try:
            return await super().start()
        except Exception as error:
            self._gpu_back_in_line(waiting)
            failed = self.gpu_start_failed(error)
            if failed is error:
                raise
            raise failed from error

    def gpu_start_failed(self, error: Exception) -> Exception:
        """The error the user reads when the spawner could not start the admitted server
        (JupyterHub then stops it, and its grant goes). Default: the spawner's own."""
        return error

    def _gpu_back_in_line(self, waiting: QueuedRequest | None) -> None:
        """A start from the line whose server could not be started (its pod never created,
        never running) keeps its place: the line starts it again when its turn comes, until
        the request expires. JupyterHub's stop after the failed start keeps it (``clear_state``)."""
        if waiting is None or self._gpu_queued is not None or not waiting.live(clock.utcnow()):
            return
        self._gpu_queued = waiting
        self.log.warning(
            "gpu-gov: %s failed to start; it keeps its place in line", escaped(self._log_name)
        )
        self._gpu_save(None)

    async def gpu_teams(self) -> list[str]:
        conf = self.gpu_profiles
        groups = [{"name": g.name, "properties": g.properties or {}} for g in self.user.groups]
        auth_state = await self.user.get_auth_state() if conf.auth_state_teams_key else None
        teams = user_teams(
            self.user.name,
            [g["name"] for g in groups],
            group_teams(groups),
            auth_state,
            conf.auth_state_teams_key,
            conf.team_map,
        )
        return teams or ([conf.default_team] if conf.default_team else [])

    def gpu_usage(self) -> list[Grant]:
        """Every started server of the hub that holds a tier (this one excluded), as a list.

        Each grant is read from the spawner's state, where admission recorded it: JupyterHub
        saves a spawn's ``user_options`` as the user sent them, and marks the server started,
        before ``start()`` admits it, so until then they are the user's words (forged grant keys
        there once used up a team's quota, and a tier that was a list failed every admission).
        The count is kept between spawns (``profiles/grant_count.py``)."""
        return list(self.gpu_held())

    def gpu_held(self) -> Held:
        """``gpu_usage`` as the index admission reads (``quota.Held``), brought up to date with
        the database now: read it at once (the next count changes it), awaiting nothing."""
        conf = self.gpu_profiles
        kept = kept_count(self.user.db)
        kept.sync(self.user.db, conf, conf.recount_every, self.log)
        own = self.orm_spawner.id if self.orm_spawner is not None else None
        gone = kept.gone_of(own) if kept.gone else {}
        if gone:
            _say_gone(self.log, conf.said_gone, gone)
        self._gpu_pods = kept.pods_of(own) if kept.pods else {}
        return kept.usage(own)

    def _gpu_server_key(self) -> str:
        return server_key(self.user.name, self.name or "")

    def _gpu_check(self, options: Mapping[str, Any], teams: list[str]) -> tuple[Tier, str] | None:
        """The tier and team ``options`` ask for (None: no GPU), every choice checked; raises
        ``GpuRefused`` naming what cannot be granted whatever the count."""
        conf = self.gpu_profiles
        profile = options.get("profile")
        # Absent, empty or the form's choice: no GPU. (0, false or [] through the REST API are
        # no choice of the form's: named as the tier they are not, below.)
        if profile is None or (isinstance(profile, str) and profile in ("", NO_GPU)):
            if conf.allow_no_gpu:
                return None
            raise GpuRefused("Choose a GPU tier: this hub offers no server without a GPU.")
        # Any JSON through the REST API: a list or an object is no tier's name.
        tier = conf.tier_map.get(profile) if isinstance(profile, str) else None
        if tier is None:
            offered = listed(conf.tier_map) or "none"
            raise GpuRefused(f"There is no GPU tier {profile!r:.60}. Choose one of: {offered}.")
        if not teams:
            raise GpuRefused(
                "You are in no team with GPU access. Ask your hub admin to add you to a team "
                "(a Hub group with the gpu-gov/team property)."
            )
        team = options.get("team") or (teams[0] if len(teams) == 1 else None)
        if team not in teams:
            raise GpuRefused(
                f"You are not in team {in_sentence(f'{team!r:.60}')}; choose one of: {listed(teams)}."
                if team
                else f"Choose the team this server is for: {listed(teams)}."
            )
        try:  # the form checks these too, but a REST API spawn does not go through the form
            if options.get("project") is not None:
                form.check_project(options["project"])
            elif conf.require_project:
                raise GpuRefused("Name the project this GPU server is for.")
            form.check_task_type(options.get("task_type"), tier)
            form.check_expected_duration(
                options.get("expected_duration"), tier, conf.expected_duration_bound
            )
        except form.FormError as error:
            raise GpuRefused(str(error)) from None
        return tier, team

    def _gpu_admission(self, tier: Tier, team: str) -> Admission:
        """Admission from the count brought up to date now, behind the requests waiting in line ahead of this one
        (this server's own place, if it waits, is kept)."""
        unknown = self.gpu_unknown()
        if unknown is not None:  # unknown is never free; waiting in line would not say why
            return Admission(False, unknown)
        conf = self.gpu_profiles
        usage = self.gpu_held()
        now = clock.utcnow()
        mine = self._gpu_queued if self._gpu_queued and self._gpu_queued.live(now) else None
        return admit_in_line(
            Request(self._gpu_server_key(), self.user.name, team, tier.name),
            usage,
            self.gpu_capacity(usage),
            conf.quota_map,
            conf.tier_map,
            queued=self.gpu_waiting(),
            now=now,
            queued_at=mine and mine.queued_at,
            cards_held=self.gpu_cards_held(usage),
        )

    def _gpu_decide(
        self, options: Mapping[str, Any], teams: list[str], oversized: str | None = None
    ) -> tuple[Tier, str, Admission] | None:
        """The tier, team and admission for ``options`` (None: no GPU); raises ``GpuRefused``.
        ``oversized``: why a choice is too large to keep (``core.grant.oversized``), refused once
        each choice is read (a choice that cannot be granted says so first)."""
        checked = self._gpu_check(options, teams)
        if oversized:
            raise GpuRefused(oversized)
        if checked is None:
            return None
        tier, team = checked
        admission = self._gpu_admission(tier, team)
        if not admission.allowed:
            self.log.info(
                "gpu-gov: refused %s: %s", escaped(self._log_name), escaped(admission.reason)
            )
            now = clock.utcnow()
            waits = self._gpu_queued is not None and self._gpu_queued.live(now)
            if admission.limit in FOR_A_GPU and not waits:  # one in line is counted there
                conf = self.gpu_profiles
                key = self._gpu_server_key()
                cut = REFUSED.refused(key, now, tier.name, self.user.name, conf.queue_per_user)
                if cut is not None:  # the user's names are theirs: a bounded count, said
                    self.log.info(
                        "gpu-gov: %s's refused spawns count for at most %d servers "
                        "(GpuProfiles.queue_per_user): %s is no longer counted in the "
                        "cluster's refused demand",
                        escaped(self.user.name),
                        conf.queue_per_user,
                        escaped(cut),
                    )
            else:  # it now waits for a quota, or in line
                REFUSED.forget(self._gpu_server_key())
            if admission.reclaim:  # not for a spawn in line: for a retry, it stands
                self._gpu_request_reclaim(admission.reclaim, team)
            message = admission.reason
            if (
                admission.limit in QUEUEABLE
                and self.gpu_queue_offered(clock.utcnow())
                and self._gpu_never(tier, team) is None
            ):
                message += (
                    " Or wait in line for it (the spawn form's “Wait in line”): the server "
                    f"starts by itself {starts_when(admission.limit)}."
                )
            raise GpuRefused(message)
        return tier, team, admission

    def _gpu_admit(self, teams: list[str]) -> None:
        sent = dict(self.user_options or {})
        # The user's choices only; what an earlier spawn was granted is decided anew.
        choices = {k: v for k, v in sent.items() if user_may_choose(k)}
        ignored = sorted(str(k) for k in sent.keys() - choices.keys() - set(GRANT_KEYS))
        options, too_large = oversized(choices)  # never kept: refused in _gpu_decide
        # Or cut already, where the Hub saved them before its hooks and this start ran.
        too_large = too_large or cut_where_stored(self.orm_spawner)
        if ignored:  # named in one bounded line: the keys are the user's
            self.log.warning(
                "gpu-gov: %s: ignored user_options a user may not set: %s",
                escaped(self._log_name),
                ", ".join(repr(k[:40])[1:-1] for k in ignored[:10])  # a newline as \n
                + (f" and {len(ignored) - 10} more" if len(ignored) > 10 else ""),
            )
        self._gpu_granted = None
        try:
            decided = self._gpu_decide(choices, teams, too_large)
            # Admitted: a server waiting in line leaves it (whatever it now starts with).
            waited, self._gpu_queued = self._gpu_queued, None
            REFUSED.forget(self._gpu_server_key())
            if decided is None:
                self._gpu_granted = {}  # recorded: no GPU (``core.grant.no_gpu``)
            else:
                tier, team, admission = decided
                self.gpu_assign(tier)
                self._gpu_granted = self._gpu_grant(tier, team, options, admission)
                if waited is not None and waited.live(clock.utcnow()):
                    self._gpu_granted[QUEUED_AT_LABEL] = clock.isoformat(waited.queued_at)
                    claim = parse_duration(self.gpu_profiles.queue_claim_within)
                    self._gpu_granted[CLAIM_WITHIN_LABEL] = str(int(claim.total_seconds()))
                options.update(self._gpu_granted)  # a copy, for the Hub's pages and the count
                self.log.info(
                    "gpu-gov: admitted %s on %s: %s",
                    escaped(self._log_name),
                    escaped(tier.name),
                    escaped(admission.reason),
                )
        finally:
            # Granted or not, the record now says exactly what this spawn holds: a refused
            # spawn must not go on counting the grant of an earlier one.
            self.user_options = options
            if self.orm_spawner is not None:
                self.orm_spawner.user_options = options
                self.orm_spawner.state = self.get_state()
                self.user.db.commit()

    def _gpu_request_reclaim(self, grants, team: str, by: str | None = None) -> None:
        """Ask for borrowed GPUs back: label their servers (``gpu-gov/reclaim``) where the
        governor reads ownership; it warns them and gives the GPUs back after its
        ``reclaim_grace``. The first request stands; asking again changes nothing. ``by``:
        the server waiting in line it is asked for (``withdraw_reclaims`` lifts it once that
        left the line and no waiting spawn needs the card)."""
        wanted = {g.server for g in grants}
        users = self.user.settings.get("users")
        db = self.user.db
        asked = clock.isoformat(clock.utcnow())
        for row in db.query(orm.Spawner).filter(orm.Spawner.started.isnot(None)):
            if server_key(row.user.name, row.name or "") not in wanted:
                continue
            state = dict(row.state or {})
            grant = dict(state.get(GRANT_STATE) or {})
            if RECLAIM in grant:
                continue
            request = {RECLAIM: asked, RECLAIM_FOR: team}
            if by is not None:
                request[RECLAIM_BY_LABEL] = by
            grant.update(request)
            row.state = {**state, GRANT_STATE: grant}
            row.user_options = {**(row.user_options or {}), **request}
            # The Hub API (which the governor reads) shows the live spawner's state.
            spawner = users[row.user].spawners.get(row.name) if users is not None else None
            if spawner is not None:
                spawner._gpu_granted = grant
                spawner.user_options = dict(row.user_options)
            self.log.info(
                "gpu-gov: asked %s/%s to give its borrowed GPU back to team %s",
                escaped(row.user.name),
                escaped(row.name or ""),
                escaped(team),
            )
        db.commit()

    def _gpu_grant(
        self, tier: Tier, team: str, options: Mapping[str, Any], admission: Admission
    ) -> dict:
        grant = {TIER: tier.name, TEAM: team, BORROWED: "true" if admission.borrowed else "false"}
        grant[WEIGHT] = f"{tier.weight:g}"  # GPU-equivalents: what the usage ledger bills
        if options.get("project"):
            grant[PROJECT] = options["project"]
        if tier.max_age:
            grant[MAX_AGE] = str(int(tier.max_age.total_seconds()))
        # Checked against the tier by _gpu_check: the tier's default, or the owner's pick.
        grant[TASK_TYPE_LABEL] = options.get("task_type") or tier.task_types[0]
        expected = form.check_expected_duration(
            options.get("expected_duration"), tier, self.gpu_profiles.expected_duration_bound
        )
        if expected:
            grant[EXPECTED_DURATION_LABEL] = str(int(expected.total_seconds()))
        return grant

    # -- the spawn queue -------------------------------------------------------------------

    def gpu_queue_offered(self, now) -> bool:
        """Whether waiting in line is offered: enabled, and the governor (which starts waiting
        servers) was heard from lately."""
        return self.gpu_profiles.queue and FORECAST.heard_since(now - GOVERNOR_HEARD_WITHIN)

    @property
    def gpu_queued(self) -> QueuedRequest | None:
        """This server's place in line (None: it does not wait)."""
        return self._gpu_queued

    def gpu_waiting(self) -> list[QueuedRequest]:
        """Every request waiting in line in this hub."""
        return waiting_requests(self.user.db)

    def gpu_line(self, queued: list[QueuedRequest], now, sooner_for=None) -> list[Waiting]:
        """The line now, as admission sees it (the hub's count, any waiting server's spawner);
        what would start sooner only for the requests ``sooner_for`` names (default all)."""
        conf = self.gpu_profiles
        usage = self.gpu_held()
        capacity = self.gpu_capacity(usage)
        return line(
            queued,
            usage,
            capacity,
            conf.quota_map,
            conf.tier_map,
            FORECAST.releases,
            now,
            sooner_for=sooner_for,
            cards_held=self._gpu_cards_for_estimates(usage),
        )

    async def gpu_enqueue(self, options: Mapping[str, Any]) -> Admission:
        """Put this server in line for what ``options`` ask (the spawn form's choices), when
        admission refuses it now for a reason waiting can end; returns the admission (allowed:
        nothing recorded, start it instead). Raises ``GpuRefused`` when it cannot wait."""
        conf = self.gpu_profiles
        teams = await self.gpu_teams()
        await self.gpu_refresh()
        # From here on no await: check, decide and record as one step.
        if self.active:  # a start began while the cards were read (another tab, the governor)
            raise GpuRefused(
                "This server is running or starting already: it does not wait in line."
            )
        now = whole_ms(clock.utcnow())
        if not self.gpu_queue_offered(now):
            raise GpuRefused(
                "Waiting in line is not available now (the GPU governor, which starts waiting "
                "servers, has not been heard from): try again later."
            )
        choices = {k: v for k, v in options.items() if user_may_choose(k) and isinstance(v, str)}
        checked = self._gpu_check(choices, teams)
        if checked is None:
            raise GpuRefused("A server without a GPU does not wait in line: start it.")
        tier, team = checked
        choices.setdefault("task_type", tier.task_types[0])  # metered with its wait
        admission = self._gpu_admission(tier, team)
        if admission.allowed:
            return admission
        if admission.limit not in QUEUEABLE:
            raise GpuRefused(admission.reason)
        never = self._gpu_never(tier, team)
        if never is not None:  # it would wait until it expires, and start nothing
            raise GpuRefused(f"{never} It cannot wait in line.")
        # The team decided now goes with the choices: the start must not decide another (the
        # user may have joined a second team meanwhile, and then must name one).
        choices["team"] = team
        mine = self._gpu_server_key()
        others = [
            q
            for q in self.gpu_waiting()
            if q.user == self.user.name and q.server != mine and q.live(now)
        ]
        if len(others) >= conf.queue_per_user:
            raise GpuRefused(
                f"You already wait in line with {len(others)} server(s) (at most "
                f"{conf.queue_per_user}): cancel one first, or wait for it to start."
            )
        if admission.reclaim:  # a team within its guarantee: borrowed GPUs are asked back
            self._gpu_request_reclaim(admission.reclaim, team, by=mine)
        kept = self._gpu_queued
        same = kept is not None and kept.live(now) and (kept.tier, kept.team) == (tier.name, team)
        self._gpu_queued = QueuedRequest(
            user=self.user.name,
            name=self.name or "",
            team=team,
            tier=tier.name,
            options=choices,
            # Asking again for the same keeps one's place; anything else joins at the end.
            queued_at=kept.queued_at if same else now,
            expires_at=now + conf.queue_expiry,
        )
        self.log.info(
            "gpu-gov: %s waits in line for %s (team %s): %s",
            escaped(self._log_name),
            escaped(tier.name),
            escaped(team),
            escaped(admission.reason),
        )
        REFUSED.forget(mine)  # counted in line from now on
        self.user_options = choices
        self._gpu_save(choices)
        return admission

    def _gpu_never(self, tier: Tier, team: str) -> str | None:
        """Why a server of ``tier`` for ``team`` can never start as the hub is configured —
        refused with every GPU free: beyond the team's quota or the user's cap, or the
        configured capacity (``GpuProfiles.capacity``; a count from the cluster can grow) —
        or None. Such a request must not wait in line."""
        conf = self.gpu_profiles
        request = Request(self._gpu_server_key(), self.user.name, team, tier.name)
        alone = admit(request, [], conf.capacity, conf.quota_map, conf.tier_map)
        if alone.allowed:
            return None
        return (
            f"{in_sentence(tier.display_name)} can never start for team {in_sentence(team)} as this "
            "hub is configured, "
            f"even with every GPU free: {alone.reason}"
        )

    async def gpu_unstartable(self) -> str | None:
        """Why this server's place in line can no longer start (the user left the team, an
        admin removed the tier or lowered the quota, ...: the start's own checks), or None.
        The line gives such a request back rather than let it stand ahead of others."""
        request = self._gpu_queued
        if request is None:
            return None
        teams = await self.gpu_teams()
        try:
            checked = self._gpu_check(request.options, teams)
        except GpuRefused as refusal:
            return refusal.jupyterhub_message
        if checked is None:
            return "It asks for no GPU."
        return self._gpu_never(*checked)

    def gpu_cancel(self, outcome: str = CANCELLED) -> bool:
        """Take this server out of the line (``outcome``: cancelled, expired); False when it
        was not waiting."""
        if self._gpu_queued is None:
            return False
        self._gpu_queued = None
        self.log.info("gpu-gov: %s left the line (%s)", escaped(self._log_name), outcome)
        self._gpu_save(None)
        return True

    def _gpu_save(self, user_options: Mapping[str, Any] | None) -> None:
        if self.orm_spawner is not None:
            if user_options is not None:
                self.orm_spawner.user_options = dict(user_options)
            self.orm_spawner.state = self.get_state()
            self.user.db.commit()

    @property
    def gpu_grant(self) -> dict[str, str]:
        """The ``gpu-gov/*`` entries of this server's admission (empty without a GPU)."""
        return dict(self._gpu_granted or {})

    def get_state(self):
        state = super().get_state()
        if self._gpu_granted is not None:  # an empty grant: admitted with no GPU
            state[GRANT_STATE] = dict(self._gpu_granted)
        if self._gpu_queued is not None:
            state[QUEUE_STATE] = self._gpu_queued.to_json()
        return state

    def load_state(self, state):
        super().load_state(state)
        grant = state.get(GRANT_STATE)
        self._gpu_granted = dict(grant) if isinstance(grant, Mapping) else None
        self._gpu_queued = from_state(state)

    def clear_state(self):
        # A place in line is not the state of a server run: JupyterHub clears state before a
        # start (whose admission must see the place) and after a stop or a refused start
        # (which must not lose it). Admission, a cancel or a new request change it.
        super().clear_state()
        self._gpu_granted = None
