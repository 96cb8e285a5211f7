"""Spawn-time cost of the profile layer with many running servers.

Builds a real JupyterHub database (SQLite, in memory) holding ``--servers`` started servers on
GPU tiers, then times what a spawn pays: the fresh count of started servers from the database
(``GpuProfilesMixin.gpu_usage``), one admission (``quota.admit``), and the spawn form's lines
(``quota.tier_use``: one admission per tier the team may use).

    python -m benchmarks.admission [--servers 10000] [--teams 20] [--repeat 20]

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

from jupyter_gpu_gov.core.grant import GRANT_STATE
from jupyter_gpu_gov.profiles.config import GpuProfiles
from jupyter_gpu_gov.profiles.estimate import DEFAULT_TIERS
from jupyter_gpu_gov.profiles.quota import Request, admit, tier_use
from jupyter_gpu_gov.profiles.spawner import BORROWED, TEAM, TIER, GpuProfilesMixin


def _median_ms(work, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 2)


def run(servers: int, teams: int, repeat: int) -> dict:
    names = [f"team{i}" for i in range(teams)]
    config = Config()
    config.GpuProfiles.tiers = list(DEFAULT_TIERS)
    config.GpuProfiles.quotas = {
        team: {"guaranteed": {t["name"]: 64 * t.get("count", 1) for t in DEFAULT_TIERS}}
        for team in names
    }
    profiles = GpuProfiles(config=config)
    tiers = profiles.tier_map

    db = orm.new_session_factory("sqlite://")()
    rng = random.Random(0)
    for i in range(servers):
        user = orm.User(name=f"user{i}")
        db.add(user)
        tier = rng.choice(list(tiers))
        spawner = orm.Spawner(name="", user=user, started=datetime(2026, 1, 1))
        # The grant as the profile layer records it: in the spawner's state, which the
        # count reads (user_options are the user's words, never read as a grant).
        spawner.state = {GRANT_STATE: {TIER: tier, TEAM: rng.choice(names), BORROWED: "false"}}
        db.add(spawner)
    db.commit()
    db.expunge_all()  # the hub's session holds its live servers, not 2 x N objects just made
    gc.collect()

    # gpu_usage needs only these of a spawner: the settings, the database, its own row.
    spawner = SimpleNamespace(gpu_profiles=profiles, user=SimpleNamespace(db=db), orm_spawner=None)
    usage = GpuProfilesMixin.gpu_usage(spawner)
    capacity = {name: None for name in tiers}
    request = Request("new/", "new", names[0], "h100")
    return {
        "servers": len(usage),
        "count_ms": _median_ms(lambda: GpuProfilesMixin.gpu_usage(spawner), repeat),
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
    args = parser.parse_args(argv)
    figures = run(args.servers, args.teams, args.repeat)
    print("admission:", " ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
