"""The store on a real PostgreSQL server, the database the docs name for production.

A throwaway cluster (``initdb``, on a Unix socket in a temporary folder) is started for this
module; without PostgreSQL's programs or the ``psycopg`` driver the tests skip and say why
(``.ci/run`` installs both)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
from fake_hub_api import FakeHub
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import DBAPIError
from test_governor import names_kept_as_they_were_move
from test_store_audit import audit_rows_store_as_the_orm_stored
from test_usage_service import ledger_rows_hold_their_sessions_after_every_write
from traitlets import TraitError

from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.core.policy import PolicyError, load_policies
from jupyter_gpu_gov.core.text import stored_name
from jupyter_gpu_gov.core.vocabulary import CULLED, KEY_LENGTH, server_key
from jupyter_gpu_gov.hub.app import GpuGovernor
from jupyter_gpu_gov.hub.hubapi import HubApi
from jupyter_gpu_gov.hub.lease import Lease
from jupyter_gpu_gov.hub.options import Options
from jupyter_gpu_gov.hub.reconcile import Governor
from jupyter_gpu_gov.hub.store import RETYPED, SCHEMA_VERSION, NotHolder, Store

pytest.importorskip("psycopg", reason="the PostgreSQL driver (psycopg) is not installed")


def _pg_bin() -> Path | None:
    found = shutil.which("initdb") or next(
        iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)), None
    )
    return Path(found).parent if found else None


@pytest.fixture(scope="module")
def postgresql() -> Iterator[str]:
    """The URL of an empty database on a PostgreSQL server of this module's own."""
    bin_dir = _pg_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL's initdb is not installed")
    # Not under pytest's temporary folder, which only root may enter.
    root = Path(tempfile.mkdtemp(prefix="gpu-gov-postgresql-"))
    # PostgreSQL will not run as root: as its own user, where the tests run as root (CI).
    as_owner: list[str] = []
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root, and there is no user 'postgres' to run PostgreSQL")
        shutil.chown(root, "postgres")
        as_owner = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", 54329 + os.getpid() % 500

    def pg(*args: str) -> None:
        done = subprocess.run([*as_owner, *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{args[0]}: {done.stderr}"

    pg(str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres")
    options = f"-p {port} -k {root} -c listen_addresses=''"
    pg(
        str(bin_dir / "pg_ctl"),
        "-D",
        str(data),
        "-o",
        options,
        "-w",
        "-l",
        str(root / "log"),
        "start",
    )
    try:
        yield f"postgresql+psycopg://postgres@/postgres?host={root}&port={port}"
    finally:
        pg(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def database(postgresql: str) -> Iterator[str]:
    """A fresh database for one test."""
    admin = create_engine(postgresql, isolation_level="AUTOCOMMIT")
    with admin.connect() as db:
        db.execute(text("DROP DATABASE IF EXISTS gov WITH (FORCE)"))
        db.execute(text("CREATE DATABASE gov"))
    admin.dispose()
    yield postgresql.replace("/postgres?", "/gov?")


def _governor(database: str, hub: FakeHub) -> Governor:
    """A governor on the PostgreSQL store, against the fake Hub, warning at 1 h, culling at 2 h."""
    return Governor(
        Store(database),
        HubApi(hub.api_url, hub.token),
        load_policies([], {"warn_after": "1h", "cull_after": "2h"}),
        Options(),
    )


async def test_a_server_with_jupyterhubs_longest_names_is_governed(database):
    """JupyterHub keeps a user's and a server's name in 255 characters each, so a server's
    key takes 511. The store's key columns held 255: on PostgreSQL one user who named a
    server 255 characters long made the pass's whole write fail, and no server was governed
    (on SQLite, which ignores the length, the tests never saw it)."""
    user, name = "u" * 255, "n" * 255
    async with FakeHub() as hub:
        hub.add_server("alice")
        hub.add_server(user, name)
        gov = _governor(database, hub)
        result = await gov.reconcile()
        assert result.errors == () and result.servers == 2
        key = f"{user}/{name}"
        assert gov.store.server(key).name == name and gov.store.server("alice/") is not None
        # The audit trail, the extension requests and the ledger's sessions take the key too.
        await gov.extend(key, f"user:{user}", "a long run")  # refused or granted: on record
    with gov.store.session() as session:
        keys = {
            table: session.execute(text(f"SELECT {column} FROM {table}")).scalars().all()
            for table, column in (
                ("audit", "server_key"),
                ("extensions", "server_key"),
                ("usage_sessions", "server"),
            )
        }
    assert all(key in found for found in keys.values()), keys


def test_a_store_of_schema_5_is_widened_and_keeps_its_rows(database):
    store = Store(database)
    with store.engine.begin() as db:  # back to schema 5's key columns, as it wrote them
        for statement in RETYPED[6]:
            db.execute(text(statement.replace(f"({KEY_LENGTH})", "(255)")))
        db.execute(text("ALTER TABLE servers DROP COLUMN policy_change"))  # schema 7's
        db.execute(text("ALTER TABLE servers DROP COLUMN warned_beside_tab"))  # schema 10's
        db.execute(
            text(
                'INSERT INTO servers (key, "user", name, labels, running, state, '
                "extension_s, extensions_used, approval_pending, reason, "
                "checkpoint_failures, cull_request_why, hook_failures, reports) "
                "VALUES ('alice/', 'alice', '', '{}', true, 'warned', 0, 1, false, '', "
                "0, '', 0, false)"
            )
        )
        db.execute(text("UPDATE meta SET value = '5' WHERE key = 'schema_version'"))
    store.engine.dispose()

    migrated = Store(database)
    columns = {c["name"]: c["type"] for c in inspect(migrated.engine).get_columns("servers")}
    assert columns["key"].length == KEY_LENGTH
    assert migrated.server("alice/").state == "warned"
    with migrated.session() as session:
        version = session.execute(text("SELECT value FROM meta WHERE key = 'schema_version'"))
        assert version.scalar() == str(SCHEMA_VERSION)


def test_a_store_of_schema_10_moves_a_name_kept_as_it_was_to_its_kept_form(database):
    names_kept_as_they_were_move(database)


async def test_a_policy_with_the_longest_name_the_store_holds_governs(database):
    """A server's row keeps the name of the policy that governs it in 255 characters. A
    policy named longer (an admin's typo, a paste, an apply through the API) made every
    pass's write fail on PostgreSQL — no server was governed — while SQLite, which ignores
    the length, said nothing. Such a name is now refused with the policy's other errors."""
    with pytest.raises(PolicyError, match="'name' may be at most 255 characters"):
        load_policies([{"name": "p" * 256}])
    async with FakeHub() as hub:
        hub.add_server("alice")
        gov = Governor(
            Store(database),
            HubApi(hub.api_url, hub.token),
            load_policies([{"name": "p" * 255}]),
            Options(),
        )
        result = await gov.reconcile()
    assert result.errors == () and gov.store.server("alice/").policy == "p" * 255


def test_the_history_exports_while_the_governor_records_a_new_server(database, monkeypatch):
    """PostgreSQL reads each statement as of its own start (READ COMMITTED): the export read
    the runs, then the history, and a pass that recorded a new server's first row in between
    (its run and its row in one transaction) gave a row whose run the export had not read —
    a KeyError, and an export cut off (the CLI's traceback, the API's broken stream)."""
    from jupyter_gpu_gov.hub import history
    from jupyter_gpu_gov.hub.history import HistoryLog, HistoryOptions, read_history
    from jupyter_gpu_gov.replay.history import HistoryRow

    engine = create_engine(database)
    log = HistoryLog(engine, HistoryOptions())
    now = time.time()  # within the history's retention
    log.append([HistoryRow(t=now - 60, server="alice/", started=now - 600, gpu_sm=0.5)])
    parse_context, written = history.parse_context, []

    def a_pass_meanwhile(text: str):  # called between the export's reads of runs and rows
        if not written:
            written.append(1)
            log.append([HistoryRow(t=now, server="bob/", started=now - 60, gpu_sm=0.1)])
        return parse_context(text)

    monkeypatch.setattr(history, "parse_context", a_pass_meanwhile)
    servers = [row.server for row in read_history(engine)]
    assert written and servers[0] == "alice/" and set(servers) <= {"alice/", "bob/"}, servers


def test_the_history_exports_while_the_governor_prunes_the_runs_it_read(database, monkeypatch):
    """The export reads the runs and contexts a chunk of rows at a time; READ COMMITTED read
    each chunk's as of then, and a prune meanwhile (the rows read past their retention, their
    runs with them) left a row read already without its run: a KeyError, the export cut off.
    Each chunk is now a transaction of its own (REPEATABLE READ: its rows and their runs in one
    snapshot), none held open for the whole export (it held back vacuum): the export goes on
    to its end, without the rows pruned before their chunk was read."""
    from datetime import timedelta

    from jupyter_gpu_gov.hub import history
    from jupyter_gpu_gov.hub.history import HistoryLog, HistoryOptions, read_history
    from jupyter_gpu_gov.replay.history import HistoryRow

    engine = create_engine(database)
    log = HistoryLog(engine, HistoryOptions())
    now = time.time()
    for user in ("alice", "bob"):
        log.append([HistoryRow(t=now - 120, server=f"{user}/", started=now - 600, gpu_sm=0.5)])
    monkeypatch.setattr(history, "CHUNK", 1)  # a row at a time
    parse_context, pruned = history.parse_context, []

    def a_prune_meanwhile(text: str):  # after the first chunk's runs were read
        if not pruned:
            pruned.append(1)
            HistoryLog(engine, HistoryOptions(retention=timedelta(seconds=60))).prune()
        return parse_context(text)

    monkeypatch.setattr(history, "parse_context", a_prune_meanwhile)
    servers = [row.server for row in read_history(engine)]
    assert pruned and servers == ["alice/"]  # bob's row pruned before its chunk was read


def test_a_later_days_sweep_takes_what_the_pruned_rows_named_on_postgresql(database):
    """The sweep after the first checks the runs and contexts up to what the deleted rows
    named, which the prune learns from its DELETEs (RETURNING): the same end on PostgreSQL,
    the stale servers' runs and contexts gone, those the rows left name kept."""
    from datetime import timedelta

    from sqlalchemy import func, select

    from jupyter_gpu_gov.hub.history import CONTEXTS, RUNS, HistoryLog, HistoryOptions
    from jupyter_gpu_gov.replay.history import HistoryRow

    engine = create_engine(database)
    log = HistoryLog(engine, HistoryOptions(retention=timedelta(minutes=30)))
    now = float(int(time.time()))
    log.append([HistoryRow(t=now - 7200, server="first/", started=now - 7200, team="f")])
    log._pruned_at = log._swept_at = -1e12
    log.prune()  # the first sweep since the start: all checked
    for i in range(5):
        log.append([HistoryRow(t=now - 3600, server=f"gone{i}/", started=now - 7200, team=f"{i}")])
    log.append([HistoryRow(t=now, server=f"u{i}/", started=now - 60) for i in range(5)])
    assert log.deleted_named() == (0, 0)
    log._pruned_at = log._swept_at = -1e12
    log.prune()
    with engine.connect() as db:
        left = [db.execute(select(func.count()).select_from(t)).scalar() for t in (RUNS, CONTEXTS)]
    assert left == [5, 1]


async def test_a_project_holding_nul_does_not_stop_the_pass_for_everyone(database):
    """PostgreSQL refuses text holding NUL; a user who spawns with ``{"project": "\\u0000x"}``
    (the Hub's REST API, no profile to grant) made every pass fail for every server."""
    async with FakeHub() as hub:
        hub.add_server("alice")
        hub.add_server("bob", user_options={"project": "\0=cmd"})
        gov = _governor(database, hub)
        for _ in range(2):
            result = await gov.reconcile()
    assert result.errors == ()
    assert gov.store.server("bob/").project == "\ufffd=cmd"  # kept, the NUL replaced


async def test_a_server_whose_name_no_store_holds_is_governed(database):
    """JupyterHub 4.1 to 5.x take any server name, and a Hub on SQLite keeps one holding NUL
    (``POST /hub/api/users/bob/servers/a%00b``), which PostgreSQL refuses, or one longer than
    its 255 characters: every pass's write failed for such a name, so no server was governed;
    then such a server was left out of the pass, and held its GPU ungoverned. Each is now kept
    under its kept form (bounded, text PostgreSQL takes) and governed as any other: culled,
    on record, billed, the Hub told its name as it is."""
    long_ago = clock.utcnow() - timedelta(hours=5)
    names = [("bob", "a\0b"), ("bob", "n" * 300), ("c\0arol", ""), ("d" * 300, "gpu")]
    async with FakeHub() as hub:
        hub.add_server("alice")
        for user, name in names:
            hub.add_server(user, name, started=long_ago, last_activity=long_ago)
        gov = _governor(database, hub)
        for _ in range(3):
            result = await gov.reconcile()
            assert result.errors == ()
        assert hub.running("alice", "")
        for user, name in names:
            key = server_key(user, name)
            assert not hub.running(user, name), f"{key!r:.80} still runs"
            row = gov.store.server(key)
            assert row is not None and row.state == CULLED
            assert (row.user, row.name) == (stored_name(user), stored_name(name))
            assert "cull" in [a.action for a in gov.store.audit_rows(server_key=key)]
        assert len({server_key(u, n) for u, n in names}) == len(names)


def test_the_lease_has_one_holder_on_postgresql(database):
    """hub/lease.py's statements on PostgreSQL: one holder, its writes fenced, a release handed
    over at once, an unrenewed lease taken after its duration and the old holder then refused."""
    store, other = Store(database), create_engine(database)
    first, second = Lease(store.engine, 3), Lease(other, 3)
    assert first.step() and not second.step()
    first.taking = False
    with store.engine.begin() as db:
        first.fence(db)
    with pytest.raises(NotHolder), other.begin() as db:
        second.fence(db)
    first.release()
    assert second.step()  # released: taken at once
    second.taking = False
    assert not first.step() and not first.lost  # (it let it go)
    deadline = time.monotonic() + 30
    while not first.step():  # the second no longer renews: the first takes it once expired
        assert time.monotonic() < deadline, "the unrenewed lease was never taken"
        time.sleep(0.2)
    first.taking = False
    assert not second.step() and second.lost
    with pytest.raises(NotHolder), other.begin() as db:
        second.fence(db)
    other.dispose()


def test_a_holder_paused_in_a_write_does_not_hold_the_lease_for_ever(database):
    """A holder paused (SIGSTOP, a frozen VM) inside a write transaction keeps the lease's row
    locked (its fence): the other's takeover waited on that lock for as long as the pause
    lasted, and no governor acted. Now the paused transaction is ended by PostgreSQL once idle
    for the lease's duration, and the other takes over; the paused one's write is void."""
    store, other = Store(database), create_engine(database)
    first, second = Lease(store.engine, 3), Lease(other, 3)
    assert first.step()
    first.taking = False
    paused = store.engine.connect()
    paused.begin()
    first.fence(paused)  # a write begun, and then nothing: the process is stopped
    pool = ThreadPoolExecutor(1)
    try:
        deadline = time.monotonic() + 60
        while not pool.submit(second.step).result(timeout=30):
            assert time.monotonic() < deadline, "the lease was never taken over"
            time.sleep(0.2)
        with pytest.raises(DBAPIError):  # its transaction was ended: nothing it writes lands
            paused.execute(text("SELECT 1"))
    finally:
        paused.invalidate()  # (a blocked step, if any, ends with it)
        pool.shutdown(wait=True)
        other.dispose()


def test_a_long_lease_still_lets_the_holder_write(database):
    """PostgreSQL's idle-in-transaction timeout holds at most 2^31-1 ms (24.8 days): a lease
    longer than that made every fenced write fail. A lease_duration beyond 600 s is refused at
    start, naming the setting, and the fence keeps within PostgreSQL's range."""
    store = Store(database)
    lease = Lease(store.engine, 3_000_000)
    assert lease.step()
    lease.taking = False
    with store.engine.begin() as db:
        lease.fence(db)
    with pytest.raises(TraitError, match="lease_duration"):
        GpuGovernor(lease_duration=3_000_000)


def test_two_hubs_making_the_left_pods_table_at_once_both_go_on(database):
    """As tests/test_profiles_kubespawner.py's, on a Hub database in PostgreSQL: the second
    CREATE failed (``DuplicateTable``), and with it the stop's record of its pod."""
    from test_profiles_kubespawner import race_to_make_the_left_pods_table

    race_to_make_the_left_pods_table(database)


def test_audit_rows_store_as_the_orm_stored_on_postgresql(database):
    audit_rows_store_as_the_orm_stored(database)


def test_ledger_rows_hold_their_sessions_after_every_write_on_postgresql(database):
    ledger_rows_hold_their_sessions_after_every_write(database)
