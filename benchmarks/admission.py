"""Spawn-time cost of the profile layer with many running servers.

Builds a real JupyterHub database (SQLite, in memory) holding ``--servers`` started servers on
GPU tiers, then times what a spawn pays: the count of started servers (``GpuProfilesMixin.
gpu_held``, kept between spawns: ``profiles/grant_count.py``) after one server's grant changed
(``count_ms``: a spawn recorded since the last use) and with nothing changed (``form_count_ms``),
the full recount from the database that the kept count does every ``recount_every`` seconds or
on suspicion (``recount_ms``: what every spawn paid before it was kept), one admission
(``quota.admit``), and the spawn form's lines (``quota.tier_use``: one admission per tier the
team may use).

    python -m benchmarks.admission [--servers 10000] [--teams 20] [--repeat 20] [--workstation]

``--workstation``: each server also holds a card of the workstation allocator
(``profiles/local.py``; its UUID in the state), and ``held_ms`` times what a workstation spawn
and form view pay beside the count to know which cards are taken (``LocalGpuMixin._held``).

Prints medians in milliseconds. Every spawn and every form view pays the count once.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from datetime import datetime
from types import SimpleNamespace

from jupyterhub import orm
from traitlets.config import Config

from jupyter_gpu_gov.core.grant import DEVICES_STATE, GRANT_STATE
from jupyter_gpu_gov.profiles.config import GpuProfiles
from jupyter_gpu_gov.profiles.estimate import DEFAULT_TIERS
from jupyter_gpu_gov.profiles.grant_count import kept_count
from jupyter_gpu_gov.profiles.local import LocalGpuMixin
from jupyter_gpu_gov.profiles.quota import Request, admit, tier_use
from jupyter_gpu_gov.profiles.spawner import BORROWED, TEAM, TIER, GpuProfilesMixin


def _median_ms(work, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 2)


def team_names(teams: int) -> list[str]:
    return [f"team{i}" for i in range(teams)]


def profiles_for(names: list[str]) -> GpuProfiles:
    """The default tiers, each team guaranteed 64 servers of each."""
    config = Config()
    config.GpuProfiles.tiers = list(DEFAULT_TIERS)
    config.GpuProfiles.quotas = {
        team: {"guaranteed": {t["name"]: 64 * t.get("count", 1) for t in DEFAULT_TIERS}}
        for team in names
    }
    return GpuProfiles(config=config)


def add_started_servers(
    db, servers: int, names: list[str], tiers: list[str], workstation: bool = False
) -> random.Random:
    """``servers`` started servers, one a user, on tiers and teams drawn from seed 0; the
    generator, to draw on from where the servers left it."""
    rng = random.Random(0)
    for i in range(servers):
        user = orm.User(name=f"user{i}")
        db.add(user)
        tier = rng.choice(tiers)
        spawner = orm.Spawner(name="", user=user, started=datetime(2026, 1, 1))
        # The grant as the profile layer records it: in the spawner's state, which the
        # count reads (user_options are the user's words, never read as a grant).
        spawner.state = {GRANT_STATE: {TIER: tier, TEAM: rng.choice(names), BORROWED: "false"}}
        if workstation:
            spawner.state[DEVICES_STATE] = [f"GPU-{i:08x}-0000-0000-0000-000000000000"]
        db.add(spawner)
    db.commit()
    return rng


def run(servers: int, teams: int, repeat: int, workstation: bool = False) -> dict:
    names = team_names(teams)
    profiles = profiles_for(names)
    tiers = profiles.tier_map

    db = orm.new_session_factory("sqlite://")()
    rng = add_started_servers(db, servers, names, list(tiers), workstation)
    db.expunge_all()  # the hub's session holds its live servers, not 2 x N objects just made
    gc.collect()

    class Spawner(LocalGpuMixin if workstation else GpuProfilesMixin):
        """What the count needs of a spawner: the settings, the database, its own row."""

        gpu_profiles = profiles
        user = SimpleNamespace(db=db)
        orm_spawner = None
        log = None

    spawner = Spawner()
    usage = spawner.gpu_held()
    rows = [row_id for (row_id,) in db.query(orm.Spawner.id)]

    def spawn_recorded():  # one server's grant changes, as admission records it
        row = db.get(orm.Spawner, rng.choice(rows))
        state = dict(row.state)
        grant = dict(state[GRANT_STATE])
        grant[BORROWED] = "true" if grant[BORROWED] == "false" else "false"
        row.state = {**state, GRANT_STATE: grant}
        db.commit()

    def after_a_spawn():
        spawn_recorded()
        start = time.perf_counter()
        spawner.gpu_held()
        return time.perf_counter() - start

    def _median_of(sample) -> float:
        return round(statistics.median(sample() for _ in range(repeat)) * 1000, 2)

    capacity = {name: None for name in tiers}
    request = Request("new/", "new", names[0], "h100")
    kept = kept_count(db)
    usage = spawner.gpu_held()
    held = {"held_ms": _median_ms(spawner._held, repeat)} if workstation else {}
    return {
        "servers": len(usage),
        **held,
        "count_ms": _median_of(after_a_spawn),
        "form_count_ms": _median_ms(spawner.gpu_held, repeat),
        "recount_ms": _median_ms(lambda: kept.recount(db, profiles, "benchmark"), repeat),
        # Both from the count as gpu_held gives it (its own cost is above).
        "admit_ms": _median_ms(
            lambda: admit(request, usage, capacity, profiles.quota_map, tiers), repeat
        ),
        "form_lines_ms": _median_ms(
            lambda: tier_use("new", names[0], usage, capacity, profiles.quota_map, tiers), repeat
        ),
        "tiers": len(tiers),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=10_000)
    parser.add_argument("--teams", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--workstation", action="store_true")
    args = parser.parse_args(argv)
    figures = run(args.servers, args.teams, args.repeat, args.workstation)
    print("admission:", " ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
