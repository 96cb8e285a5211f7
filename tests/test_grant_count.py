"""The count admission reads, kept between spawns (``profiles/grant_count.py``), against a fresh
count of the same database after each way a grant appears or vanishes.

The hub of ``test_profiles_kubespawner.py``: a real JupyterHub database (SQLite, in memory),
users wrapped as the hub wraps them (``jupyterhub.user.User``: its ``stop`` is JupyterHub's own,
the one the user, an admin, the culler, the governor and the poll at the hub's startup all go
through), real ``GpuKubeSpawner``s whose pods a fake Kubernetes API server runs. Vision is
guaranteed 2 H100s and may borrow 1 more.
"""

# ruff: noqa: F811  (the fixtures of test_profiles_kubespawner, imported, are arguments here)
from __future__ import annotations

import json
import logging
from datetime import datetime

import pytest
from jupyterhub import orm
from prometheus_client import REGISTRY
from sqlalchemy import text
from test_profiles_kubespawner import (  # noqa: F401  (fixtures)
    cluster,
    fresh_profiles,
    hub,
    make_hub,
    pod_api,
    profiles_config,
)

from jupyter_gpu_gov.core.grant import GRANT_STATE
from jupyter_gpu_gov.profiles import grant_count
from jupyter_gpu_gov.profiles import spawner as spawner_module
from jupyter_gpu_gov.profiles.spawner import GpuRefused

H100 = {"profile": "h100"}


def fresh(hub, spawner) -> list:
    """What a fresh count of the database holds, this spawner's own row left out (the count
    admission made before it was kept)."""
    count = grant_count.KeptCount()
    count.recount(hub.db, spawner.gpu_profiles, "test")
    own = spawner.orm_spawner.id
    return [g for row_id, g in sorted(count.counted._by_key.items()) if row_id != own]


def same(hub, spawner) -> list:
    """The kept count, checked equal to a fresh one."""
    kept = spawner.gpu_usage()
    assert kept == fresh(hub, spawner)
    return kept


def held(usage) -> list[tuple[str, str, bool]]:
    return [(g.server, g.team, g.borrowed) for g in usage]


@pytest.fixture
def said():
    """The warnings of the spawners' log (read on it: a test before may have replaced the root
    logger's handlers, caplog's among them)."""
    records: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(record.getMessage())
    loggers = [grant_count.log, logging.getLogger("traitlets")]
    for logger in loggers:
        logger.addHandler(handler)
    yield records
    for logger in loggers:
        logger.removeHandler(handler)


def drift_total() -> float:
    return REGISTRY.get_sample_value("gpu_gov_grant_count_drift_total") or 0.0


async def test_the_kept_count_equals_a_fresh_one_after_every_way_a_grant_comes_and_goes(
    hub, pod_api
):
    for name in ("v1", "v2", "v3", "v4", "late"):
        hub.user(name, "vision")
    late = hub.spawner("late")
    assert same(hub, late) == []

    # Admitted spawns (the third borrows).
    for name in ("v1", "v2"):
        await hub.started(hub.spawner(name), H100).start()
    await hub.started(hub.spawner("v3", "named"), H100).start()
    assert held(same(hub, late)) == [
        ("v1/", "vision", False),
        ("v2/", "vision", False),
        ("v3/named", "vision", True),
    ]

    # A stop, through JupyterHub's own User.stop (user, admin, culler, governor, poll).
    await hub.users["v1"].stop("")
    assert held(same(hub, late)) == [("v2/", "vision", False), ("v3/named", "vision", True)]

    # A spawn refused at admission records no grant; one that fails after admission is
    # stopped by JupyterHub the same way.
    await hub.started(hub.spawner("v4"), H100).start()
    await hub.users["v4"].stop("")
    assert held(same(hub, late)) == [("v2/", "vision", False), ("v3/named", "vision", True)]

    # A named server renamed (JupyterHub's PATCH sets the row's name), a user renamed.
    hub.users["v3"].orm_spawners["named"].name = "renamed"
    hub.db.commit()
    assert [g.server for g in same(hub, late)] == ["v2/", "v3/renamed"]
    hub.users["v2"].orm_user.name = "v2-renamed"
    hub.db.commit()
    assert [(g.server, g.user) for g in same(hub, late)] == [
        ("v2-renamed/", "v2-renamed"),
        ("v3/renamed", "v3"),
    ]

    # An admin's PATCH of user_options with grant keys: never read as a grant.
    forged = {**H100, "gpu-gov/tier": "h100", "gpu-gov/team": "vision"}
    hub.users["v1"].orm_spawners[""].user_options = forged
    hub.db.commit()
    assert len(same(hub, late)) == 2

    # A user deleted (JupyterHub's UserDict.delete), a named server deleted.
    hub.db.delete(hub.users["v2"].orm_user)
    hub.db.commit()
    assert [g.server for g in same(hub, late)] == ["v3/renamed"]
    spawner = hub.users["v3"].spawners.get("renamed")
    if spawner is not None and spawner.active:
        await hub.users["v3"].stop("renamed")
    else:  # renamed while it ran: the row is what counts
        hub.db.delete(hub.users["v3"].orm_spawners["renamed"])
        hub.db.commit()
    assert same(hub, late) == []


async def test_a_server_found_dead_at_the_hubs_start_is_counted_out(hub, pod_api):
    """A hub restart rebuilds the count from the database; the poll at its startup stops a
    server that died meanwhile (``User.stop``), and the count follows."""
    for name in ("v1", "v2", "late"):
        hub.user(name, "vision")
    for name in ("v1", "v2"):
        await hub.started(hub.spawner(name), H100).start()
    late = hub.spawner("late")
    assert len(same(hub, late)) == 2

    grant_count.forget(hub.db)  # a new hub process: nothing kept
    assert len(same(hub, late)) == 2  # rebuilt from the database
    await hub.users["v1"].stop("")  # as JupyterHub.init_spawners does for a dead server
    assert [g.server for g in same(hub, late)] == ["v2/"]


async def test_what_a_rolled_back_transaction_flushed_is_not_kept(hub, pod_api):
    """A count read between a flush and its rollback saw rows the database no longer holds."""
    for name in ("v1", "late"):
        hub.user(name, "vision")
    late = hub.spawner("late")
    assert same(hub, late) == []
    row = hub.spawner("v1").orm_spawner
    row.started = row.last_activity = orm.Spawner.last_activity.type.python_type.now()
    row.state = {"gpu_gov_grant": {"gpu-gov/tier": "h100", "gpu-gov/team": "vision"}}
    assert len(late.gpu_usage()) == 1  # flushed, not committed
    hub.db.rollback()
    assert same(hub, late) == []


async def test_a_team_at_its_quota_is_refused_after_a_grant_written_behind_the_counts_back(
    hub, pod_api, said
):
    """A grant written to the database directly (no flush of this hub: another process, a hand
    edit) is found at the next use by the fingerprint, logged as drift, counted in
    ``gpu_gov_grant_count_drift_total``, and the spawn refused as a fresh count refuses it."""
    for name in ("v1", "v2", "v3", "alice"):
        hub.user(name, "vision")
    for name in ("v1", "v2"):
        await hub.started(hub.spawner(name), H100).start()
    alice = hub.started(hub.spawner("alice"), H100)
    assert len(same(hub, alice)) == 2

    v3 = hub.started(hub.spawner("v3"), {})  # started without a GPU; then a grant appears
    await v3.start()
    grant = {"gpu-gov/tier": "h100", "gpu-gov/team": "vision", "gpu-gov/borrowed": "true"}
    state = json.dumps({**(v3.orm_spawner.state or {}), "gpu_gov_grant": grant})
    hub.db.execute(
        text("UPDATE spawners SET state = :state WHERE id = :id"),
        {"state": state, "id": v3.orm_spawner.id},
    )
    before = drift_total()

    with pytest.raises(GpuRefused) as refused:
        await alice.start()

    assert "may borrow at most 1 " in refused.value.jupyterhub_message
    [line] = [m for m in said if "drifted" in m]
    assert "found by a fingerprint recount" in line and "1 started server(s) differed" in line
    assert "h100/vision: kept 0, database 1" in line
    assert drift_total() == before + 1
    assert len(same(hub, alice)) == 3


async def test_an_edit_that_keeps_every_length_is_found_by_the_periodic_recount(
    make_hub, pod_api, said
):
    """Two servers' states swapped in the database: the same rows, the same lengths (the
    fingerprint cannot see it), but the borrowed label on the other server. The recount every
    ``recount_every`` seconds (here 0: at every use) finds and corrects it."""
    hub = make_hub(profiles_config(recount_every=0))
    for name in ("v1", "v2", "v3", "late"):
        hub.user(name, "vision")
    for name in ("v1", "v2", "v3"):
        await hub.started(hub.spawner(name), H100).start()
    late = hub.spawner("late")
    assert [g.borrowed for g in same(hub, late)] == [False, False, True]
    rows = {name: hub.users[name].orm_spawners[""].id for name in ("v1", "v3")}
    states = dict(hub.db.execute(text("SELECT id, state FROM spawners")).all())
    for name, other in (("v1", "v3"), ("v3", "v1")):
        hub.db.execute(
            text("UPDATE spawners SET state = :state WHERE id = :id"),
            {"state": states[rows[other]], "id": rows[name]},
        )
    before = drift_total()

    usage = late.gpu_usage()

    assert [g.borrowed for g in usage] == [True, False, False]
    [line] = [m for m in said if "drifted" in m]
    assert "found by a periodic recount" in line and "2 started server(s) differed" in line
    assert drift_total() == before + 2


async def test_a_spawn_reads_only_the_rows_that_changed(hub, pod_api, monkeypatch):
    """At each spawn the hub decoded every started server's state (half a second at 10,000);
    with the count kept it reads the rows that changed since, and one aggregate."""
    grant = {"gpu-gov/tier": "h200-3g", "gpu-gov/team": "nlp", "gpu-gov/borrowed": "true"}
    for i in range(30):  # started servers holding grants, as the database has them
        row = hub.user(f"n{i}", "nlp").orm_user
        hub.db.add(
            orm.Spawner(name="", user=row, started=datetime.now(), state={GRANT_STATE: grant})
        )
    hub.db.commit()
    alice = hub.started(hub.spawner(hub.user("alice", "vision")), H100)
    assert len(same(hub, alice)) == 30
    read = []
    real = grant_count.granted

    def counting(state):
        read.append(state)
        return real(state)

    # Where the count reads each row's grant (before it was kept: spawner.py).
    monkeypatch.setattr(grant_count, "granted", counting)
    monkeypatch.setattr(spawner_module, "granted", counting, raising=False)

    await alice.start()

    assert 0 < len(read) <= 3, len(read)  # its own row's, not the 30 others'
    monkeypatch.undo()
    assert len(same(hub, hub.spawner(hub.user("late", "vision")))) == 31


def test_the_periodic_recount_reads_in_a_thread_of_its_own_and_still_finds_drift(
    tmp_path, monkeypatch, said
):
    """The recount every ``recount_every`` seconds decoded every started server's state on
    the Hub's event loop (0.3-0.5 s at 10,000 servers, every login and proxy call waiting).
    It reads in a thread of its own, on a connection of its own, and the next use compares:
    an edit behind the hub's back that keeps every length (two states swapped by another
    process) is still found and corrected, and a server this hub stopped while the thread
    read is not taken for drift."""
    import threading

    from jupyter_gpu_gov.profiles.config import GpuProfiles

    db = orm.new_session_factory(f"sqlite:///{tmp_path / 'hub.sqlite'}")()
    conf = GpuProfiles(config=profiles_config())
    rows = {}
    for name, borrowed in (("v1", "false"), ("v2", "false"), ("v3", "true")):
        user = orm.User(name=name)
        grant = {"gpu-gov/tier": "h100", "gpu-gov/team": "vision", "gpu-gov/borrowed": borrowed}
        rows[name] = orm.Spawner(
            name="", user=user, started=datetime.now(), state={GRANT_STATE: grant}
        )
        db.add(rows[name])
    db.commit()
    kept = grant_count.kept_count(db)  # (its hub's events mark it)
    kept.sync(db, conf, 600)  # the first use: counted here, before anything can be admitted
    assert sorted(g.borrowed for g in kept.usage(None)) == [False, False, True]

    with db.get_bind().begin() as other:  # another process swaps v1's and v3's states
        states = dict(other.execute(text("SELECT id, state FROM spawners")).all())
        for name, swapped in (("v1", "v3"), ("v3", "v1")):
            other.execute(
                text("UPDATE spawners SET state = :state WHERE id = :id"),
                {"state": states[rows[swapped].id], "id": rows[name].id},
            )
    decoded, reading = [], threading.Event()
    go = threading.Event()
    real = grant_count.granted

    def decoding(state):
        decoded.append(threading.current_thread())
        if threading.current_thread() is not threading.main_thread():
            reading.set()
            go.wait(30)  # (the hub writes while the thread reads)
        return real(state)

    monkeypatch.setattr(grant_count, "granted", decoding)
    before = drift_total()
    kept.checked = -1e9  # recount_every has passed

    kept.sync(db, conf, 600)

    assert threading.main_thread() not in decoded  # before: every state, on the event loop
    assert reading.wait(30)
    rows["v2"].started, rows["v2"].state = None, {}  # the hub stops v2 meanwhile
    db.commit()
    go.set()
    assert kept.checking.done.wait(30)
    kept.sync(db, conf, 600)  # the next use compares

    [line] = [m for m in said if "drifted" in m]
    assert "found by a periodic recount" in line and "2 started server(s) differed" in line
    assert drift_total() == before + 2
    fresh = grant_count.KeptCount()
    fresh.recount(db, conf, "test")
    assert list(kept.usage(None)) == list(fresh.usage(None))
    assert [(g.server, g.borrowed) for g in kept.usage(None)] == [("v1/", True), ("v3/", False)]
    grant_count.forget(db)
    db.close()
