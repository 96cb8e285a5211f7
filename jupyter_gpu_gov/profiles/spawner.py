"""The spawner side of the profile layer, shared by the KubeSpawner and local-process glue.

Mix ``GpuProfilesMixin`` in front of a spawner class. It gives the spawner

- a spawn form listing the tiers the user's teams may use, with what each team has left and
  whether a server would borrow (``options_form`` / ``options_from_form``);
- admission at ``start()``: a fresh count of the hub's started servers, ``quota.admit``, and the
  grant (``gpu-gov/tier``, ``team``, ``project``, ``borrowed``, ``max-age``) recorded in the
  spawner's *state*, which only the Hub writes and where the governor and the pod labels read
  it (``core.grant``), with a copy in ``user_options`` for the Hub's pages and quota counts. Of
  what a user sends in ``user_options`` only their choices are kept (``core.grant.
  USER_CHOICES``): a ``gpu-gov/exempt`` sent through the REST API is dropped. The count, the
  decision and the record happen without an ``await`` in between, so concurrent spawns in the
  hub's event loop cannot overshoot a quota;
- refusals as an HTTP 403 whose ``jupyterhub_message`` the spawn page shows.

Subclasses say how many devices a tier has (``gpu_capacity``) and may pin devices
(``gpu_assign``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jupyterhub import orm
from tornado import web

from ..core import clock
from ..core.grant import GRANT_STATE, user_may_choose
from ..core.teams import group_teams, user_teams
from ..core.vocabulary import (
    BORROWED_LABEL,
    MAX_AGE_LABEL,
    PROJECT_LABEL,
    RECLAIM_FOR_LABEL,
    RECLAIM_LABEL,
    TEAM_LABEL,
    TIER_LABEL,
    WEIGHT_LABEL,
    server_key,
)
from . import form
from .config import GpuProfiles
from .quota import Admission, Grant, Request, admit, tier_use
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


class GpuRefused(web.HTTPError):
    """A spawn the profile layer refuses; JupyterHub shows ``jupyterhub_message`` to the user."""

    def __init__(self, message: str) -> None:
        super().__init__(403, "gpu-gov: %s", message)
        self.jupyterhub_message = message


class GpuProfilesMixin:
    """Tiers, team quotas and admission for a JupyterHub spawner (mix in first)."""

    _gpu_granted: dict[str, str] | None = None  # the grant, kept in the spawner's state

    @property
    def gpu_profiles(self) -> GpuProfiles:
        return GpuProfiles.instance(config=self.config)

    # -- hooks for the glue ------------------------------------------------------------------

    def gpu_capacity(self, usage: list[Grant]) -> dict[str, int | None]:
        """Devices per tier (in use or free). Default: ``GpuProfiles.capacity``."""
        return dict(self.gpu_profiles.capacity)

    def gpu_assign(self, tier: Tier) -> None:
        """Pin devices for an admitted server; raise ``GpuRefused`` when none is free."""

    # -- the form ----------------------------------------------------------------------------

    async def get_options_form(self) -> str:
        conf = self.gpu_profiles
        teams = await self.gpu_teams()
        usage = self.gpu_usage()
        capacity = self.gpu_capacity(usage)
        name = self._gpu_server_key()
        lines = {
            team: tier_use(
                self.user.name, team, usage, capacity, conf.quota_map, conf.tier_map, server=name
            )
            for team in teams
        }
        previous = (self.orm_spawner.user_options or {}) if self.orm_spawner else {}
        return form.render(
            tiers=conf.tier_map,
            teams=teams,
            lines=lines,
            projects=sorted({p for t in teams for p in conf.projects.get(t, [])}),
            previous=previous,
            allow_no_gpu=conf.allow_no_gpu,
            require_project=conf.require_project,
            no_gpu=NO_GPU,
            estimate_url=self.hub.base_url + "gpu-gov/estimate" if self.hub else "",
        )

    async def run_options_from_form(self, formdata: Mapping[str, list[str]]) -> dict[str, Any]:
        try:
            options = form.parse(formdata)
        except form.FormError as error:
            raise GpuRefused(str(error)) from None
        # A quick answer on the form itself; start() decides again and records, atomically.
        self._gpu_decide(options, await self.gpu_teams())
        return options

    # -- admission ---------------------------------------------------------------------------

    async def start(self):
        teams = await self.gpu_teams()
        # From here to super().start(), no await: count, decide and record as one step.
        self._gpu_admit(teams)
        return await super().start()

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
        """Every started server of the hub that holds a tier (this one excluded)."""
        conf = self.gpu_profiles
        tiers, quotas = conf.tier_map, conf.quota_map
        grants = []
        for row_id, name, user, options, started in (
            self.user.db.query(
                orm.Spawner.id,
                orm.Spawner.name,
                orm.User.name,
                orm.Spawner.user_options,
                orm.Spawner.started,
            )
            .join(orm.User, orm.Spawner.user_id == orm.User.id)
            .filter(orm.Spawner.started.isnot(None))
        ):  # columns in one query: loading each row's user would be a query per server
            if self.orm_spawner is not None and row_id == self.orm_spawner.id:
                continue
            options = options or {}
            tier, team = tiers.get(options.get(TIER)), options.get(TEAM)
            if tier is None:
                continue
            grants.append(
                Grant(
                    server=server_key(user, name or ""),
                    user=user,
                    team=team or "",
                    tier=tier.name,
                    devices=tier.count,
                    weight=tier.weight,
                    borrowed=options.get(BORROWED) == "true",
                    priority=quotas[team].priority if team in quotas else 0,
                    started=started,
                )
            )
        return grants

    def _gpu_server_key(self) -> str:
        return server_key(self.user.name, self.name or "")

    def _gpu_decide(
        self, options: Mapping[str, Any], teams: list[str]
    ) -> tuple[Tier, str, Admission] | None:
        """The tier, team and admission for ``options`` (None: no GPU); raises ``GpuRefused``."""
        conf = self.gpu_profiles
        profile = options.get("profile")
        if not profile or profile == NO_GPU:
            if conf.allow_no_gpu:
                return None
            raise GpuRefused("Choose a GPU tier: this hub offers no server without a GPU.")
        tier = conf.tier_map.get(profile)
        if tier is None:
            offered = ", ".join(conf.tier_map) or "none"
            raise GpuRefused(f"There is no GPU tier {profile!r}. Choose one of: {offered}.")
        if not teams:
            raise GpuRefused(
                "You are in no team with GPU access. Ask your hub admin to add you to a team "
                "(a Hub group with the gpu-gov/team property)."
            )
        team = options.get("team") or (teams[0] if len(teams) == 1 else None)
        if team not in teams:
            raise GpuRefused(
                f"You are not in team {team!r}; choose one of: {', '.join(teams)}."
                if team
                else f"Choose the team this server is for: {', '.join(teams)}."
            )
        if options.get("project") is not None:
            try:  # the form checks it too, but a REST API spawn does not go through the form
                form.check_project(options["project"])
            except form.FormError as error:
                raise GpuRefused(str(error)) from None
        elif conf.require_project:
            raise GpuRefused("Name the project this GPU server is for.")
        usage = self.gpu_usage()
        admission = admit(
            Request(self._gpu_server_key(), self.user.name, team, tier.name),
            usage,
            self.gpu_capacity(usage),
            conf.quota_map,
            conf.tier_map,
        )
        if not admission.allowed:
            self.log.info("gpu-gov: refused %s: %s", self._log_name, admission.reason)
            if admission.reclaim:
                self._gpu_request_reclaim(admission.reclaim, team)
            raise GpuRefused(admission.reason)
        return tier, team, admission

    def _gpu_admit(self, teams: list[str]) -> None:
        sent = dict(self.user_options or {})
        # The user's choices only; what an earlier spawn was granted is decided anew.
        options = {k: v for k, v in sent.items() if user_may_choose(k)}
        ignored = sorted(str(k) for k in sent.keys() - options.keys() - set(GRANT_KEYS))
        if ignored:
            self.log.warning(
                "gpu-gov: %s: ignored user_options a user may not set: %s",
                self._log_name,
                ", ".join(ignored),
            )
        self._gpu_granted = None
        try:
            decided = self._gpu_decide(options, teams)
            if decided is not None:
                tier, team, admission = decided
                self.gpu_assign(tier)
                self._gpu_granted = self._gpu_grant(tier, team, options.get("project"), admission)
                options.update(self._gpu_granted)  # a copy, for the Hub's pages and the count
                self.log.info(
                    "gpu-gov: admitted %s on %s: %s", self._log_name, tier.name, admission.reason
                )
        finally:
            # Granted or not, the record now says exactly what this spawn holds: a refused
            # spawn must not go on counting the grant of an earlier one.
            self.user_options = options
            if self.orm_spawner is not None:
                self.orm_spawner.user_options = options
                self.orm_spawner.state = self.get_state()
                self.user.db.commit()

    def _gpu_request_reclaim(self, grants, team: str) -> None:
        """Ask for borrowed GPUs back: label their servers (``gpu-gov/reclaim``) where the
        governor reads ownership; it warns them and gives the GPUs back after its
        ``reclaim_grace``. The first request stands; asking again changes nothing."""
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
                row.user.name,
                row.name,
                team,
            )
        db.commit()

    @staticmethod
    def _gpu_grant(tier: Tier, team: str, project: str | None, admission: Admission) -> dict:
        grant = {TIER: tier.name, TEAM: team, BORROWED: "true" if admission.borrowed else "false"}
        grant[WEIGHT] = f"{tier.weight:g}"  # GPU-equivalents: what the usage ledger bills
        if project:
            grant[PROJECT] = project
        if tier.max_age:
            grant[MAX_AGE] = str(int(tier.max_age.total_seconds()))
        return grant

    @property
    def gpu_grant(self) -> dict[str, str]:
        """The ``gpu-gov/*`` entries of this server's admission (empty without a GPU)."""
        return dict(self._gpu_granted or {})

    def get_state(self):
        state = super().get_state()
        if self._gpu_granted:
            state[GRANT_STATE] = dict(self._gpu_granted)
        return state

    def load_state(self, state):
        super().load_state(state)
        grant = state.get(GRANT_STATE)
        self._gpu_granted = dict(grant) if isinstance(grant, Mapping) else None

    def clear_state(self):
        super().clear_state()
        self._gpu_granted = None
