"""The periodic recount of the started servers' grants: how long it holds the Hub's event loop.

    python -m benchmarks.recount_stall [--servers 10000] [--repeat 5]

A real JupyterHub database (SQLite in a file, as a hub keeps it) holding ``--servers`` started
servers with grants, and the hub's kept count (``profiles/grant_count.py``) built. Then, on an
asyncio loop whose ticker notes every gap between its 1 ms ticks, the recount falls due
(``recount_every`` passed) and the count is used every 20 ms, as spawns and form views would,
until the recount is done (in the use itself; or read in its thread and compared at a later
use). Prints, medians over ``--repeat``: the longest the loop was held (``stall_ms``: the
longest gap between ticks, whatever held it: a use, the recount's thread holding the GIL, the
machine), the longest use (``longest_use_ms``), the time until the recount was done
(``done_ms``), and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from types import SimpleNamespace

from jupyterhub import orm

from jupyter_gpu_gov.profiles.estimate import DEFAULT_TIERS
from jupyter_gpu_gov.profiles.grant_count import kept_count
from jupyter_gpu_gov.profiles.spawner import GpuProfilesMixin

from .admission import add_started_servers, profiles_for, team_names
from .loop_hold import ticked


def build(path: str, servers: int, teams: int) -> None:
    db = orm.new_session_factory(f"sqlite:///{path}")()
    add_started_servers(db, servers, team_names(teams), [t["name"] for t in DEFAULT_TIERS])
    db.close()


async def one(db, profiles) -> tuple[float, float, float]:
    class Spawner(GpuProfilesMixin):
        gpu_profiles = profiles
        user = SimpleNamespace(db=db)
        orm_spawner = None
        log = None

    spawner = Spawner()
    spawner.gpu_held()  # built (the first use)
    kept = kept_count(db)
    uses = []

    async def recount():
        kept.checked = -1e9  # recount_every has passed
        began = kept.checked
        while True:
            use = time.perf_counter()
            spawner.gpu_held()
            uses.append(time.perf_counter() - use)
            if kept.checked != began and getattr(kept, "checking", None) is None:
                return
            await asyncio.sleep(0.02)

    took, stall = await ticked(recount)
    return stall, took, max(uses)


def run(servers: int, teams: int, repeat: int) -> dict:
    profiles = profiles_for(team_names(teams))
    stalls, dones, uses = [], [], []
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "jupyterhub.sqlite")
        build(path, servers, teams)
        for _ in range(repeat):
            db = orm.new_session_factory(f"sqlite:///{path}")()
            stall, done, use = asyncio.run(one(db, profiles))
            stalls.append(stall)
            uses.append(use)
            dones.append(done)
            db.close()
    return {
        "servers": servers,
        "stall_ms": round(statistics.median(stalls) * 1000, 1),
        "stalls_ms": [round(s * 1000, 1) for s in stalls],
        "longest_use_ms": round(statistics.median(uses) * 1000, 1),
        "done_ms": round(statistics.median(dones) * 1000, 1),
        "load": round(os.getloadavg()[0], 1),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=10_000)
    parser.add_argument("--teams", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    figures = run(args.servers, args.teams, args.repeat)
    print("recount stall:", " ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
