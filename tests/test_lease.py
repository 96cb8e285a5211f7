"""Exactly one governor acts on a store (hub/lease.py): two real governor services on one SQLite
store and one Hub (the fake one, over real HTTP), as in a rolling update of the Deployment or a
second replica by mistake. Only the lease's holder warns, culls, bills and records; the other
takes over when the holder stops renewing (killed, paused) at the lease's expiry, and at once
when it stops cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from fake_hub_api import FakeHub
from hub_harness import free_port
from sqlalchemy import create_engine, select
from test_governor import (
    H100_IDLE_GPU,
    Exporter,
    answer,
    checkpoint_asked,
    governor,
    manifest,
    report_for,
    warned_after_70_idle_minutes,
)
from tornado.httpclient import AsyncHTTPClient

from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.core.ledger import STATES
from jupyter_gpu_gov.hub.lease import Lease
from jupyter_gpu_gov.hub.prepared_auth import ADMIN_SCOPE, METRICS_SCOPE
from jupyter_gpu_gov.hub.reconcile import STANDBY, Governor
from jupyter_gpu_gov.hub.store import NotHolder, Store
from jupyter_gpu_gov.hub.tables import LEASE

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parent.parent
LEASE_S = 6  # the lease's duration in these tests (seconds): renewed every 1.5 s
GRANT = {"gpu_gov_grant": {"gpu-gov/team": "vision", "gpu-gov/tier": "h100", "gpu-gov/weight": "1"}}


def start_governor(hub: FakeHub, db: Path, log: Path) -> subprocess.Popen:
    """The service as JupyterHub starts it; no reports (its servers are governed on the Hub's
    activity, jupyterhub-idle-culler's rule: culled after --timeout of inactivity)."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "JUPYTERHUB_API_URL": hub.api_url,
        "JUPYTERHUB_API_TOKEN": hub.token,
        "JUPYTERHUB_SERVICE_NAME": "gpu-gov",
        "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}",
        "JUPYTERHUB_SERVICE_PREFIX": "/services/gpu-gov/",
        "JUPYTERHUB_CLIENT_ID": "service-gpu-gov",
    }
    args = [
        f"--db-url=sqlite:///{db}",
        "--timeout=600",
        "--cull-every=0.3",
        f"--GpuGovernor.lease_duration={LEASE_S}",
        "--GpuGovernor.usage_write_every=0",
    ]
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "jupyter_gpu_gov.hub", *args],
            cwd=db.parent,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    process.port = port
    return process


PROBE = "lease-probe"  # a governor admin's token, with the metrics scope


async def admin_reads(hub: FakeHub, process: subprocess.Popen) -> tuple[dict, str]:
    """A governor's ``api/`` and ``metrics``, as an admin reads them (on this event loop: the
    fake Hub answers the governor's token check on it)."""
    hub.add_token(PROBE, {"access:services!service=gpu-gov", ADMIN_SCOPE, METRICS_SCOPE})
    base = f"http://127.0.0.1:{process.port}/services/gpu-gov/"
    client = AsyncHTTPClient()
    headers = {"Authorization": f"token {PROBE}"}
    info = await client.fetch(base + "api/", headers=headers)
    metrics = await client.fetch(base + "metrics", headers=headers)
    return json.loads(info.body), metrics.body.decode()


def lease_row(db: Path):
    """The lease's row as the store has it; None before any took it."""
    engine = create_engine(f"sqlite:///{db}")
    try:
        with engine.connect() as c:
            return c.execute(select(LEASE)).first()
    except Exception:  # not created yet
        return None
    finally:
        engine.dispose()


def holder(db: Path) -> tuple[str, int, int] | None:
    """(holder id, its pid, beat) as the store says; None before any took it."""
    row = lease_row(db)
    return None if row is None else (row.holder, row.pid, row.beat)


async def up(log: Path) -> None:
    """Until the service is up: it has read the lease (holds it or stands by) and listens."""
    await until(lambda: log.exists() and "listening on" in log.read_text(), f"{log.name}'s start")


async def said(log: Path, line: str) -> None:
    """Until the service's log says ``line`` (its takeover's line follows the store's row)."""
    await until(lambda: line in log.read_text(), f"{log.name} to say {line!r}")


async def until(check, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def held_by(db: Path, process: subprocess.Popen) -> bool:
    found = holder(db)
    return bool(found and found[0] and found[1] == process.pid)


def culls(db: Path, key: str) -> list:
    store = Store(f"sqlite:///{db}")
    try:
        return [a for a in store.audit_rows(key) if a.action == "cull"]
    finally:
        store.engine.dispose()


def billed_s(db: Path, user: str) -> float:
    store = Store(f"sqlite:///{db}")
    try:
        return sum(b.values.get(s, 0.0) for b in store.usage(user=user) for s in STATES)
    finally:
        store.engine.dispose()


def stop(*processes: subprocess.Popen) -> None:
    for p in processes:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


@contextlib.asynccontextmanager
async def holder_and_standby(hub: FakeHub, tmp_path: Path):
    """Two services on one store (``tmp_path/gov.sqlite``): the first holds the lease, the
    second is up on standby; both killed at the end."""
    db = tmp_path / "gov.sqlite"
    first = start_governor(hub, db, tmp_path / "first.log")
    second = None
    try:
        await until(lambda: held_by(db, first), "the first governor to take the lease")
        second = start_governor(hub, db, tmp_path / "second.log")
        await up(tmp_path / "second.log")
        yield first, second
    finally:
        stop(first, *([second] if second else []))


def idle_server(hub: FakeHub, user: str) -> None:
    """A server its owner left two hours ago: the holder's next pass culls it."""
    ago = clock.utcnow() - timedelta(hours=2)
    hub.add_server(user, started=ago, last_activity=ago)


async def test_two_governors_cull_once_and_bill_once(tmp_path):
    db = tmp_path / "gov.sqlite"
    async with FakeHub() as hub:
        hub.add_server("bob", state=GRANT)  # one GPU, in use: billed, never culled
        started = time.monotonic()
        async with holder_and_standby(hub, tmp_path) as (first, second):
            assert "on standby" in (tmp_path / "second.log").read_text()
            await up(tmp_path / "first.log")
            # Which one acts, for an admin: each one's api/ and metrics say the same.
            for gov, held, leader in ((first, True, 1), (second, False, 0)):
                info, metrics = await admin_reads(hub, gov)
                assert info["lease"]["held"] is held
                assert info["lease"]["holder"]["pid"] == first.pid
                assert f"jupyter_gpu_gov_leader {leader}.0" in metrics
            # A user learns whether the one they reached acts, not which pod does.
            hub.add_user_token("bob", "bob-token", extra_scopes=["access:services!service=gpu-gov"])
            answer_ = await AsyncHTTPClient().fetch(
                f"http://127.0.0.1:{second.port}/services/gpu-gov/api/",
                headers={"Authorization": "token bob-token"},
            )
            assert json.loads(answer_.body)["lease"] == {"held": False}
            idle_server(hub, "alice")
            await until(lambda: not hub.running("alice"), "alice's idle server culled")
            # Several of the second one's passes: had it acted, it had by now.
            beat = holder(db)[2]
            await until(lambda: holder(db)[2] >= beat + 8, "two whole leases more")
            assert held_by(db, first) and second.poll() is None
            stop(first, second)  # killed: no clean stop writes anything more
            elapsed = time.monotonic() - started
        assert hub.counters["DELETE /users/{name}/server(s)"] == 1
    assert len(culls(db, "alice/")) == 1
    # bob's one GPU ran all along: billed once, not once per governor.
    assert 0 < billed_s(db, "bob") <= elapsed


async def test_a_killed_holder_is_taken_over_within_the_lease(tmp_path):
    db = tmp_path / "gov.sqlite"
    async with FakeHub() as hub:
        async with holder_and_standby(hub, tmp_path) as (first, second):
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
            killed = clock.utcnow()
            idle_server(hub, "alice")
            await until(lambda: held_by(db, second), "the second governor to take over")
            # At its next step, not once the lease ran out: the first's process is gone where
            # the second can tell (the same machine and pid namespace, as when JupyterHub
            # starts a crashed service again).
            await said(tmp_path / "second.log", f"pid {first.pid} is gone)")
            # Within the lease (and the step it is read at), counted from the kill to when the
            # second took it by its own clock: the store's row, not when this test's poll saw it.
            took = clock.parse(lease_row(db).since) - killed
            assert took.total_seconds() <= LEASE_S * 1.25 + 5, took
            await until(lambda: not hub.running("alice"), "alice's idle server culled")
        assert hub.counters["DELETE /users/{name}/server(s)"] == 1
    assert len(culls(db, "alice/")) == 1


async def test_a_clean_stop_hands_over_at_once(tmp_path):
    db = tmp_path / "gov.sqlite"
    async with FakeHub() as hub, holder_and_standby(hub, tmp_path) as (first, second):
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0
        # Released: taken at the other's next look, not once it expired.
        await until(lambda: held_by(db, second), "the second governor to take over")
        await said(tmp_path / "second.log", "took the store's lease (released)")
        idle_server(hub, "alice")
        await until(lambda: not hub.running("alice"), "alice's idle server culled")
    assert len(culls(db, "alice/")) == 1


async def test_a_paused_holder_does_not_act_when_it_resumes(tmp_path):
    """SIGSTOP: the other takes over; the paused one, resumed, finds it lost and stops, having
    culled nothing (its idle server was taken by the other, once)."""
    db = tmp_path / "gov.sqlite"
    async with FakeHub() as hub:
        async with holder_and_standby(hub, tmp_path) as (first, second):
            first.send_signal(signal.SIGSTOP)
            await until(lambda: held_by(db, second), "the second governor to take over")
            second.send_signal(signal.SIGSTOP)  # so that only the resumed one could act
            idle_server(hub, "alice")  # due at once: whoever acts first culls it
            first.send_signal(signal.SIGCONT)
            code = await until(
                lambda: first.poll() is not None and [first.returncode],
                "the resumed governor to find the lease lost and stop",
            )
            assert code == [1]
            assert hub.running("alice") and not culls(db, "alice/")
            assert "another governor took the store's lease" in (tmp_path / "first.log").read_text()
            second.send_signal(signal.SIGCONT)
            await until(lambda: not hub.running("alice"), "alice's idle server culled")
            # (Alive, if stopped: the second waited for the lease to expire.)
            await said(tmp_path / "second.log", f"pid {first.pid} did not renew it")
        assert hub.counters["DELETE /users/{name}/server(s)"] == 1
    assert len(culls(db, "alice/")) == 1


# -- two Governor instances on one store, as the review's reproduction ran them ------------------


def with_lease(gov: Governor, duration: float = 30) -> Lease:
    """The lease as the service wires it (hub/app.py), and its first step taken."""
    lease = gov.store.lease = Lease(gov.store.engine, duration)
    gov.hub.may_act = lambda: gov.acting
    gov.hub.why_not_acting = gov.why_not_acting
    lease.step()
    lease.taking = False
    return lease


async def alice_idle_for_two_hours(holder_: Governor, standby: Governor) -> list:
    """Both get each of alice's reports of an idle GPU, an hour apart, and run their passes
    side by side: the holder warns, then asks her checkpoint. The standby's pass results."""
    standbys = []
    for step in (0, 61 * 60, 60 * 60):
        clock.advance(step)
        for gov in (holder_, standby):
            gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))
        standbys.append((await asyncio.gather(holder_.reconcile(), standby.reconcile()))[1])
    return standbys


async def test_the_standby_warns_asks_culls_and_bills_nothing(tmp_path, restore_clock):
    """Both get every report (a load balancer in front of two pods) and both run their passes:
    one warning, one checkpoint asked (by the holder's verdicts only), one cull, two hours of
    one GPU billed as two."""
    async with FakeHub() as hub:
        hub.add_server("alice")
        holder_, standby = governor(hub, tmp_path), governor(hub, tmp_path)
        assert with_lease(holder_).held() and not with_lease(standby).held()
        for result in await alice_idle_for_two_hours(holder_, standby):
            assert result.errors == (STANDBY,) and not result.actions
        asked = checkpoint_asked(holder_, "alice")
        # The standby's verdict: the store's record, asking nothing of the server.
        verdict = standby.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))
        assert verdict["state"] == holder_.verdict("alice/")["state"] == "checkpointing"
        assert not verdict.get("requests") and holder_.verdict("alice/")["requests"]
        answer(holder_, manifest("done"), requested_at=asked["requested_at"])
        answer(standby, manifest("done"), requested_at=asked["requested_at"])
        await asyncio.gather(holder_.reconcile(), standby.reconcile())
        for gov in (holder_, standby):
            gov.flush_usage()
        assert hub.counters["DELETE /users/{name}/server(s)"] == 1
    actions = [a.action for a in holder_.store.audit_rows("alice/")]
    assert actions.count("warn") == 1 and actions.count("cull") == 1, actions
    billed = (*STATES, "unobserved")  # (its reports an hour apart: unobserved, mostly)
    hours = sum(b.values.get(s, 0) for b in holder_.store.usage() for s in billed) / 3600
    assert hours == pytest.approx(2 + 1 / 60, abs=0.05)  # 121 minutes of one GPU


async def test_the_standby_reads_back_what_the_holder_wrote_not_every_row(
    tmp_path,
    restore_clock,
):
    """A standby answers reports and authorises them from the rows the holder writes. It read
    every row of the store again at every pass (10,000 servers: every row read and built each
    pass, for the few the holder changed); it now reads back what the holder wrote since its
    last read, and sees it as before: a server the holder saw start, one it saw stop."""
    async with FakeHub() as hub:
        for n in range(20):
            hub.add_server(f"user{n}")
        holder_, standby = governor(hub, tmp_path), governor(hub, tmp_path)
        assert with_lease(holder_).held() and not with_lease(standby).held()
        await holder_.reconcile()  # the holder writes every row
        read: list[int] = []
        whole = standby.store.servers

        def servers(*args, **kwargs):
            rows = whole(*args, **kwargs)
            read.append(len(rows))
            return rows

        standby.store.servers = servers
        await standby.reconcile()
        assert standby.row("user0/").running and read == [20]  # read whole, once
        clock.advance(15 * 60)  # the rows written then are older than the read-back's overlap
        hub.add_server("late")
        hub.users["user3"].servers.pop("")  # user3 stops their server
        hub.users["user3"].last_activity = clock.utcnow()  # as the Hub's User.stop does
        hub._reindex(hub.users["user3"])
        await holder_.reconcile()
        for _ in range(3):
            assert (await standby.reconcile()).errors == (STANDBY,)
            standby.row("user0/")  # a report's look between passes
        assert standby.row("late/").running and not standby.row("user3/").running
        # Read whole once; then back from a little before the newest row read (the first
        # read-back: the holder's first rows too); then what it wrote lately: 2 rows, not 21.
        assert read == [20, 21, 2, 2], read


async def test_a_store_that_cannot_renew_the_lease_acts_on_nothing(tmp_path):
    """The store locked (a backup, an admin's sqlite3) past three quarters of the lease: the
    holder is no longer sure it holds it, and its pass acts on nothing, records nothing; once
    renewed (nobody took it meanwhile) it governs again. A write while unsure is refused."""
    async with FakeHub() as hub:
        idle_server(hub, "alice")
        gov = governor(hub, tmp_path)
        lease = with_lease(gov, duration=3)
        assert lease.held()
        locker = create_engine(f"sqlite:///{tmp_path / 'gov.sqlite'}").connect()
        locker.exec_driver_sql("BEGIN EXCLUSIVE")
        try:
            await until(lambda: not lease.step() and not lease.held(), "the lease to lapse")
        finally:
            locker.rollback()
            locker.close()
        result = await gov.reconcile()
        assert not gov.store.audit_rows("alice/")
        # Said as it is: its own lease lapsed, no other governor acts (the admin's Extend
        # after a long lock was answered "another one acts", with no other one).
        [why] = result.errors
        assert "lease on the store has lapsed" in why and "another" not in why, why
        with pytest.raises(NotHolder) as refused:
            gov.store.audit([gov._audit_row(None, "note", "a write while unsure")])
        assert "has lapsed" in str(refused.value) and "another" not in str(refused.value)
        assert lease.step() and lease.held() and not lease.lost  # renewed: still ours
        result = await gov.reconcile()
        assert not result.errors and gov.store.audit_rows("alice/")


class CountingExporter(Exporter):
    """The exporter, counting the reads it answers."""

    reads = 0

    def answer(self, request) -> None:
        self.reads += 1
        super().answer(request)


async def test_a_takeover_governs_on_a_fresh_dcgm_read(tmp_path):
    """A standby reads nothing from DCGM (it decides nothing); the governor that takes over
    reads it before its first pass, as at a start, not a snapshot from its standby hours ago
    (stale: the pass's GPUs unknown), nor stops on a read it did not start. Told by the reads
    the exporter answered, not by a snapshot's age: with a 1 s dcgm_max_age a loaded machine
    made the takeover's own read stale (a 2.5 s pass)."""
    exporter = CountingExporter("h100-8gpu-k8s-pod-attributed.txt")
    async with FakeHub() as hub:
        hub.add_server("alice")
        first = governor(hub, tmp_path, exporter.url)
        second = governor(hub, tmp_path, exporter.url)
        with_lease(first)
        lease = with_lease(second)
        for _ in range(2):
            assert (await second.reconcile()).errors == (STANDBY,)
            await second.background_done()
        assert exporter.reads == 0  # nothing read on standby: nothing to go stale
        first.store.lease.release()
        assert lease.step() and lease.taking
        second.take_over()
        lease.taking = False
        result = await second.reconcile()
        assert exporter.reads >= 1 and second._dcgm_latest.evidence  # read for this pass
        assert not result.errors and not result.dcgm_errors, result
        for gov in (first, second):
            await gov.close()
    exporter.stop()


async def test_a_takeover_from_a_holder_whose_clock_ran_ahead_keeps_times_as_observed(
    tmp_path, restore_clock
):
    """The holder's clock ran 10 minutes ahead of the machine that takes over from it. Every
    time it wrote lay 10 minutes in the new holder's future: alice's warning gave her 10
    minutes more than her notice, her idle time read 10 minutes short. The new holder keeps to
    the clock they were written by until its first pass moves them back, audited."""
    async with FakeHub() as hub:
        hub.add_server("alice")
        old, new = governor(hub, tmp_path), governor(hub, tmp_path)
        with_lease(old)
        lease = with_lease(new)
        began = time.monotonic()  # before the old holder's last write
        warned = await warned_after_70_idle_minutes(old)
        notice_left = warned.cull_at - clock.utcnow()
        old.store.lease.release()
        clock.advance(-600)  # the new holder's clock: 10 minutes behind the old one's
        assert lease.step()
        new.take_over()
        took = time.monotonic() - began  # real seconds from that write to the takeover, at most
        lease.taking = False
        new.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))
        await new.reconcile()
        row = new.row("alice/")
        assert abs(row.cull_at - clock.utcnow() - notice_left) < timedelta(minutes=1)
        (step,) = [a for a in new.store.audit_rows() if a.action == "clock-step"]
        # 10 minutes back from the old holder's last write, less the real moments from it to
        # the takeover (not more: "-60" would fail at -599 s, the takeover 0.5 s late).
        stepped = float(re.search(r"stepped by ([+-]\d+) s", step.reason)[1])
        assert -600 - 1 <= stepped <= -600 + took + 1, (step.reason, took)
        for gov in (old, new):
            await gov.close()


def test_a_store_with_no_connection_to_spare_is_a_failed_step_not_a_crash(tmp_path):
    """Every connection of the pool in use (a slow PostgreSQL, a burst of requests): the
    lease's step cannot run. It says so and is tried again at the next; it never raises (it
    ended the service's task that renews the lease, and the governor stayed on standby, its
    lease lapsed, without a word)."""
    url = f"sqlite:///{tmp_path / 'gov.sqlite'}"
    Store(url).engine.dispose()  # (the tables)
    engine = create_engine(url, pool_size=1, max_overflow=0, pool_timeout=0.1)
    lease = Lease(engine, 3)
    assert lease.step()
    lease.taking = False
    busy = engine.connect()
    try:
        assert lease.step() is True  # not renewed, still within its time
    finally:
        busy.close()
    assert lease.step() and lease.held()
    engine.dispose()


def test_a_shorter_lease_elsewhere_waits_for_the_holders_own(tmp_path):
    """A rolling update that shortens lease_duration: the new pod (2 s) watching the old one
    (30 s) took the lease after 2 s of its own, while the old one still acted for 22.5 s: two
    governors at once. Its expiry is the holder's own duration, as the store records it."""
    store = Store(f"sqlite:///{tmp_path / 'gov.sqlite'}")
    old, new = Lease(store.engine, 30), Lease(store.engine, 2)
    assert old.step() and not new.step()
    old.taking = False
    time.sleep(2.5)  # past the new one's duration, well within the old one's
    assert old.held() and not new.step()
    store.engine.dispose()


async def test_a_checkpoint_asked_by_the_old_holder_is_asked_again_by_the_new(
    tmp_path,
    restore_clock,
):
    """As at a restart: the server heard the old holder's request only in its verdicts, so
    the governor that takes over asks it again from the takeover (its timeout counted from
    then), and the server's answer to it is taken."""
    async with FakeHub() as hub:
        hub.add_server("alice")
        old, new = governor(hub, tmp_path), governor(hub, tmp_path)
        with_lease(old)
        lease = with_lease(new)
        await alice_idle_for_two_hours(old, new)
        asked = checkpoint_asked(old, "alice")["requested_at"]
        clock.advance(600)  # the old one stops; 10 minutes later the new one holds the lease
        old.store.lease.release()
        assert lease.step()
        new.take_over()
        lease.taking = False
        new.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))
        await new.reconcile()
        again = checkpoint_asked(new, "alice")["requested_at"]
        assert clock.parse(again) >= clock.parse(asked) + timedelta(minutes=10)
        answer(new, manifest("done"), requested_at=again)
        await new.reconcile()
        assert hub.counters["DELETE /users/{name}/server(s)"] == 1
    assert [a.action for a in new.store.audit_rows("alice/")].count("cull") == 1


async def test_a_standby_says_a_reclaim_the_holder_lifted(tmp_path, restore_clock):
    """Both pods answer reports (a load balancer in front of them); only the holder syncs the
    spawn queue, where the hub says which reclaims it lifted. The standby's verdicts, made of
    the rows the holder wrote, lost alice's deadline and said nothing of why: her JupyterLab
    showed "reclaim lifted" or not by which pod her report reached. It reads back the holder's
    ``reclaim-withdrawn`` audit rows at each pass, as it reads back the rows."""
    async with FakeHub() as hub:
        hub.add_server("alice")
        holder_, standby = governor(hub, tmp_path), governor(hub, tmp_path)
        assert with_lease(holder_).held() and not with_lease(standby).held()
        await holder_.reconcile()
        assert (await standby.reconcile()).errors == (STANDBY,)
        assert standby.verdict("alice/")["reclaim_withdrawn"] is None
        lifted = {"server": "alice/", "team": "vision", "asked_at": "2026-01-05T10:00:00Z"}
        holder_.spawn_queue._withdrawn([{**lifted, "by": "vera/"}], clock.utcnow())
        told = holder_.verdict("alice/")["reclaim_withdrawn"]
        assert told is not None
        await asyncio.gather(holder_.reconcile(), standby.reconcile())
        for gov in (holder_, standby):
            assert gov.verdict("alice/")["reclaim_withdrawn"] == told
            assert json.loads(gov.answer("alice/"))["verdict"]["reclaim_withdrawn"] == told
        clock.advance(16 * 60)  # said long enough, on either
        await asyncio.gather(holder_.reconcile(), standby.reconcile())
        for gov in (holder_, standby):
            assert gov.verdict("alice/")["reclaim_withdrawn"] is None
        await standby.close()
