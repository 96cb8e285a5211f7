"""What happens between a cull's decision and the Hub's DELETE: the pass decides, writes its
decisions (in the store's writer thread, the event loop answering reports and people
meanwhile), then culls. Against the fake Hub over real HTTP and a real SQLite store."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from fake_hub_api import FakeHub
from test_governor import (
    BUSY_LIMITS,
    H100_IDLE_GPU,
    actions_of,
    answer,
    governor,
    manifest,
    report_for,
)

from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.core.clock import parse
from jupyter_gpu_gov.core.policy import load_policies
from jupyter_gpu_gov.hub.people import SessionChanged
from jupyter_gpu_gov.hub.store import Store


async def alice_seen(hub: FakeHub, tmp_path, sm: float = 0.0, **options):
    """alice's server, one report of hers (her GPU at ``sm``) and one pass: the governor
    knows her session."""
    hub.add_server("alice")
    gov = governor(hub, tmp_path, **options)
    gov.ingest(report_for("alice", H100_IDLE_GPU, sm=sm))
    await gov.reconcile()
    return gov


async def ready_to_cull(hub: FakeHub, tmp_path, **options):
    """alice's GPU idle two hours, her checkpoint saved: the next pass culls her server."""
    gov = await alice_seen(hub, tmp_path, **options)
    for step in (61 * 60, 60 * 60):
        clock.advance(step)
        gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))
        await gov.reconcile()
    answer(gov, manifest("done"))
    return gov


def busy_limited(hub: FakeHub, tmp_path):
    """A governor (a new one, as after a restart, on the same store) under BUSY_LIMITS: a
    cell running past its notice is interrupted."""
    gov = governor(hub, tmp_path)
    gov.policies = load_policies([], BUSY_LIMITS)
    return gov


def cell_running(idle_since, busy_since=None) -> dict:
    """alice's report: her GPU idle since ``idle_since``, a cell running since ``busy_since``
    (the same moment unless given)."""
    report = report_for("alice", H100_IDLE_GPU, sm=0.0)
    report["window"]["gpu_idle_since"] = clock.isoformat(idle_since)
    busy_since = clock.isoformat(busy_since or idle_since)
    report["targets"][0].update(execution_state="busy", busy_since=busy_since)
    return report


async def once_decided(gov, key: str = "alice/"):
    """Start a pass and return (its task) once it has decided the cull, before the DELETE."""
    task = asyncio.ensure_future(gov.reconcile())
    while gov.row(key).state != "culled":
        assert not task.done(), "the pass ended without deciding the cull"
        await asyncio.sleep(0)
    return task


async def test_an_admins_exemption_between_the_decision_and_the_delete_holds(
    tmp_path, restore_clock
):
    async with FakeHub() as hub:
        gov = await ready_to_cull(hub, tmp_path)
        task = await once_decided(gov)
        until = clock.utcnow() + timedelta(days=1)
        outcome = await gov.exempt("alice/", "user:root", until, "the demo is tomorrow")
        assert outcome["status"] == "exempt"
        await task
        assert hub.running("alice"), "culled although an admin exempted it"
        assert gov.row("alice/").state == "exempt"
        await gov.reconcile()
        assert hub.running("alice") and gov.row("alice/").state == "exempt"
    actions = [a.action for a in actions_of(gov) if a.action != "state"]
    assert actions[-3:] == ["cull", "exempt", "cull-skipped"]


async def test_an_admins_immediate_cull_racing_the_pass_stops_the_server_once(
    tmp_path, restore_clock
):
    async with FakeHub() as hub:
        gov = await ready_to_cull(hub, tmp_path)
        task = await once_decided(gov)
        await gov.cull_now("alice/", "user:root", "runaway", immediately=True)
        await task
        assert not hub.running("alice")
        assert hub.counters["stops"] == 1
    culls = [a for a in actions_of(gov) if a.action == "cull"]
    assert [c.actor for c in culls] == ["governor", "user:root"]
    assert "outcome" in culls[1].details
    # the pass's cull is on record as not carried out: the admin's came first
    (skipped,) = [a for a in actions_of(gov) if a.action == "cull-skipped"]
    assert "not culled" in skipped.reason


def cell_started(report: dict) -> str:
    report["targets"][0].update(execution_state="busy", busy_since=report["sampled_at"])
    return "a cell started"


def owner_typed(report: dict) -> str:
    report["server"]["last_activity"] = report["sampled_at"]
    return "its owner was at work"


# full_pass_every=1: the pass's own listing brought alice (no read of the Hub before the cull).
@pytest.mark.parametrize("full_pass_every", [10, 1])
@pytest.mark.parametrize("since", [cell_started, owner_typed])
async def test_a_report_between_the_decision_and_the_delete_holds_an_idle_cull(
    tmp_path, restore_clock, since, full_pass_every
):
    async with FakeHub() as hub:
        gov = await ready_to_cull(hub, tmp_path, full_pass_every=full_pass_every)
        task = await once_decided(gov)
        report = report_for("alice", H100_IDLE_GPU, sm=0.0)  # the GPU still idle
        what = since(report)
        gov.ingest(report)
        await task
        assert hub.running("alice"), f"culled although {what} after it was decided"
        assert gov.row("alice/").state == "warned"
    (skipped,) = [a for a in actions_of(gov) if a.action == "cull-skipped"]
    assert f"not culled: {what} since it was decided" in skipped.reason


async def test_a_cell_started_after_a_hard_deadline_was_decided_does_not_hold_it(
    tmp_path, restore_clock
):
    """A hard deadline (here an admin's cull now, after its notice and checkpoint) is not
    put off by work: a cell that starts at the last moment does not hold it."""
    async with FakeHub() as hub:
        gov = await alice_seen(hub, tmp_path, sm=0.9)
        await gov.cull_now("alice/", "user:root", "the node is drained")
        answer(gov, manifest("done"))
        task = await once_decided(gov)
        report = report_for("alice", H100_IDLE_GPU, sm=0.9)
        cell_started(report)
        gov.ingest(report)
        await task
        assert not hub.running("alice")


async def test_an_extension_asked_once_the_cull_is_decided_is_refused_truthfully(
    tmp_path, restore_clock
):
    """The deadline came: the owner's Extend a moment later is refused as such (not granted
    and then culled anyway), and the cull is carried out once."""
    async with FakeHub() as hub:
        gov = await ready_to_cull(hub, tmp_path)
        task = await once_decided(gov)
        code, answer_ = await gov.extend("alice/", "user:alice", "one more minute")
        await task
        assert not hub.running("alice") and hub.counters["stops"] == 1
    assert code == 409 and "nothing to extend: the server is culled" in answer_["message"]
    assert [a.action for a in actions_of(gov) if a.action.startswith("cull")] == ["cull"]


async def test_an_interrupt_the_store_could_not_record_is_not_asked(
    tmp_path, restore_clock, monkeypatch
):
    """A cell past busy_limit: the interrupt is asked in the server's verdict only once it is
    on record. The store refused the pass's write (a full disk): nothing is on record, so the
    server must not be asked to interrupt its cell (it was, until its report showed it done)."""
    from jupyter_gpu_gov.hub import records
    from jupyter_gpu_gov.hub.store import StoreUnavailable

    monkeypatch.setattr(records, "STORE_RETRY_AFTER", 0.0)
    async with FakeHub() as hub:
        hub.add_server("alice")
        gov = busy_limited(hub, tmp_path)
        started = clock.utcnow()
        save = gov.store.save_async

        async def full_disk(*args, **kwargs):
            monkeypatch.setattr(gov.store, "save_async", save)  # refused once
            raise StoreUnavailable(gov.store.url, OSError("database or disk is full"))

        for step in (0, 31 * 60, 61 * 60):  # busy, warned, the interrupt (after its notice)
            clock.advance(step)
            gov.ingest(cell_running(started))
            if step == 61 * 60:
                monkeypatch.setattr(gov.store, "save_async", full_disk)
            result = await gov.reconcile()
        assert result.errors, "the store should have refused this pass"
        assert gov.verdict("alice/")["requests"] == {}
        assert not [a for a in gov.store.audit_rows("alice/") if a.action == "interrupt"]
        await gov.reconcile()  # the store takes it now: on record, then asked
        assert [a.action for a in gov.store.audit_rows("alice/")].count("interrupt") == 1
        assert {"checkpoint", "interrupt_kernels"} <= set(gov.verdict("alice/")["requests"])


async def test_an_interrupt_decided_before_a_restart_is_still_asked_after_it(
    tmp_path, restore_clock
):
    """The busy limit: the interrupt and its checkpoint went on record, and the service
    restarted before the server fetched its verdict. The record says the cell was interrupted
    and the checkpoint is asked again; the interrupt, held in memory, was lost: the checkpoint
    was asked alone while the cell ran on. Asked again for that cell, not for one started
    since."""
    async with FakeHub() as hub:
        hub.add_server("alice")
        gov = busy_limited(hub, tmp_path)
        started = clock.utcnow()
        for step in (0, 31 * 60, 61 * 60):  # busy, warned, the interrupt (after its notice)
            clock.advance(step)
            gov.ingest(cell_running(started))
            await gov.reconcile()
        asked = gov.verdict("alice/")["requests"]
        assert {"checkpoint", "interrupt_kernels"} <= set(asked)
        await gov.close()

        gov = busy_limited(hub, tmp_path)  # the service restarted
        clock.advance(30)
        gov.ingest(cell_running(started))
        await gov.reconcile()
        again = gov.verdict("alice/")["requests"]
        row = gov.row("alice/")  # asked again from the restart, still one request
        assert row.checkpoint_requested_at == row.interrupted_at
        assert again["checkpoint"]["requested_at"] > asked["checkpoint"]["requested_at"]
        assert again["interrupt_kernels"]["kernels"] == asked["interrupt_kernels"]["kernels"]

        # That cell ended; another started since: it is not the one interrupted.
        await gov.close()
        gov2 = busy_limited(hub, tmp_path)
        clock.advance(30)
        gov2.ingest(cell_running(started, clock.utcnow()))
        await gov2.reconcile()
        assert "interrupt_kernels" not in gov2.verdict("alice/")["requests"]


async def test_an_extension_during_the_passs_write_of_the_same_row_is_kept(tmp_path, restore_clock):
    """The pass warns alice and writes its decisions in the store's writer thread; the owner's
    Extend lands meanwhile, on the same row. The pass must not write its older copy over it:
    the extension holds in memory, in the store, and at the next pass."""
    async with FakeHub() as hub:
        gov = await alice_seen(hub, tmp_path)
        clock.advance(61 * 60)
        gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))
        task = asyncio.ensure_future(gov.reconcile())
        while gov.row("alice/").state != "warned":
            assert not task.done()
            await asyncio.sleep(0)
        code, _ = await gov.extend("alice/", "user:alice", "a figure")
        extended = gov.row("alice/").extension_s
        await task
        assert code == 200 and extended > 0
        stored = gov.store.server("alice/")
        assert (stored.extensions_used, stored.extension_s) == (1, extended)
        await gov.reconcile()
        assert gov.row("alice/").extension_s == extended


async def test_the_owners_stop_retried_under_shutdown_kernels_stops_the_server(
    tmp_path, restore_clock
):
    """The owner pressed Stop; the Hub failed to stop the server (its spawner raised). The
    stop is on record and sent again later: it must stop the server the owner asked to stop,
    not shut its kernels down because the policy's cull action says so."""
    async with FakeHub() as hub:
        hub.add_server("alice")
        gov = governor(hub, tmp_path)
        gov.policies = load_policies(
            [], {"warn_after": "1h", "cull_after": "2h", "cull_action": "shutdown-kernels"}
        )
        gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))
        await gov.reconcile()
        hub.stop_errors.append(500)
        await gov.stop_by_owner("alice/", "user:alice", "done for today")
        await gov.background_done()
        assert hub.running("alice")
        clock.advance(3 * 60)  # past CULL_RETRY_AFTER
        gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))
        await gov.reconcile()
        assert not hub.running("alice"), gov.row("alice/").reason
        assert "shutdown_kernels" not in gov.verdict("alice/")["requests"]
    (retry,) = [a for a in actions_of(gov) if a.action == "cull-retry"]
    assert retry.details["cull_action"] == "stop-server", retry.details


async def test_an_immediate_cull_of_a_server_already_culled_sends_nothing_again(
    tmp_path, restore_clock
):
    """The pass culled alice's server; an admin's immediate cull a moment later (the admin
    view not yet refreshed) answers that it is culled: no second cull on record, no second
    DELETE sent to the Hub."""
    async with FakeHub() as hub:
        gov = await ready_to_cull(hub, tmp_path)
        hub.users["alice"].servers[""].slow_stop = 3  # the Hub still stopping it
        await gov.reconcile()
        deletes = hub.counters["DELETE /users/{name}/server(s)"]
        assert deletes == 1 and gov.row("alice/").state == "culled"
        outcome = await gov.cull_now("alice/", "user:root", "runaway", immediately=True)
        assert outcome["status"] == "culled"
        assert hub.counters["DELETE /users/{name}/server(s)"] == deletes
    culls = [a for a in actions_of(gov) if a.action.startswith("cull")]
    assert [(c.action, c.actor) for c in culls] == [("cull", "governor")]


async def test_an_exemption_during_a_failed_immediate_cull_is_kept(tmp_path, restore_clock):
    """An admin's immediate cull waits for the Hub; another admin exempts the server
    meanwhile, and the Hub fails the stop: the exemption stays (the failed cull put the record
    back as it was before it, over the exemption)."""
    async with FakeHub() as hub:
        gov = await alice_seen(hub, tmp_path)
        hub.latency, hub.stop_errors = 2.0, [500]  # the exemption lands during the DELETE
        cull = asyncio.ensure_future(
            gov.cull_now("alice/", "user:root", "runaway", immediately=True)
        )
        while hub.in_flight == 0:
            assert not cull.done()
            await asyncio.sleep(0.01)
        until = clock.utcnow() + timedelta(days=1)
        await gov.exempt("alice/", "user:bob", until, "the demo is tomorrow")
        with pytest.raises(Exception, match="500"):
            await cull
        assert gov.row("alice/").state == "exempt"
        assert gov.store.servers()["alice/"].state == "exempt"


async def test_a_hub_failing_a_cull_is_asked_again_with_a_growing_pause(tmp_path, restore_clock):
    """The Hub answers 503 to a cull (its spawner cannot reach the cluster). The cull is
    retried after 2 minutes, then 4, ... (not at every pass, each writing its cull and its
    failure again); each failure says when it is tried again, the server's reason says why
    it still runs; once the Hub stops it, it is culled."""
    async with FakeHub() as hub:
        gov = await ready_to_cull(hub, tmp_path)
        hub.stop_errors = [503] * 20

        async def a_pass(seconds: float) -> None:
            clock.advance(seconds)
            gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))
            await gov.reconcile()

        def tries() -> int:
            return hub.counters["DELETE /users/{name}/server(s)"]

        await a_pass(0)
        assert tries() == 1 and hub.running("alice")
        (failed,) = [a for a in actions_of(gov) if a.action == "cull-failed"]
        assert "503" in failed.reason and "tried again at" in failed.reason, failed.reason
        row = gov.row("alice/")
        assert "503" in row.reason and "tried again at" in row.reason, row.reason
        audits = len(actions_of(gov))
        for _ in range(3):  # passes every 30 s: within the pause, nothing is sent or recorded
            await a_pass(30)
        assert tries() == 1 and len(actions_of(gov)) == audits
        await a_pass(40)  # 2 min 10 s after the failure
        assert tries() == 2
        for _ in range(7):  # then 4 minutes
            await a_pass(30)
        assert tries() == 2
        await a_pass(40)
        assert tries() == 3
        hub.stop_errors.clear()
        await a_pass(8 * 60 + 10)
        assert not hub.running("alice") and tries() == 4
    failures = [a for a in actions_of(gov) if a.action == "cull-failed"]
    assert len(failures) == 3


async def test_an_interrupt_and_its_checkpoint_asked_before_an_outage_are_asked_again(
    tmp_path, restore_clock
):
    """The busy limit asked for an interrupt and a checkpoint, and the service went down for
    longer than checkpoint_timeout before the server fetched them. The server could not hear
    them meanwhile: at the restart both are asked again, still paired, from the restart (they
    timed out unheard: a false checkpoint-failed, and the warning's path instead)."""
    async with FakeHub() as hub:
        hub.add_server("alice")
        gov = busy_limited(hub, tmp_path)
        started = clock.utcnow()
        for step in (0, 31 * 60, 61 * 60):  # busy, warned, the interrupt (after its notice)
            clock.advance(step)
            gov.ingest(cell_running(started))
            await gov.reconcile()
        assert {"checkpoint", "interrupt_kernels"} <= set(gov.verdict("alice/")["requests"])
        await gov.close()

        clock.advance(10 * 60)  # down for twice checkpoint_timeout
        gov = busy_limited(hub, tmp_path)
        await gov.reconcile()
        gov.ingest(cell_running(started))  # its first report since: the cell runs on
        await gov.reconcile()
        actions = [a.action for a in actions_of(gov)]
        assert "checkpoint-failed" not in actions, gov.row("alice/").reason
        assert gov.row("alice/").state == "checkpointing", gov.row("alice/").reason
        assert {"checkpoint", "interrupt_kernels"} <= set(gov.verdict("alice/")["requests"])
        row = gov.row("alice/")
        assert row.checkpoint_requested_at == row.interrupted_at  # still one request


async def test_a_kernel_shutdown_asked_before_a_restart_is_still_asked_after_it(
    tmp_path, restore_clock
):
    """Under shutdown-kernels the cull asks the server (in its verdict) to shut its GPU
    kernels down. The service restarted before the server fetched it: the request, held in
    memory, was lost, and the idle kernel kept its GPU for a whole new warn-and-cull cycle.
    It is asked again after the restart, of the same kernels (a kernel id names one kernel:
    one started since is never asked)."""
    shutdown = {"warn_after": "1h", "cull_after": "2h", "cull_action": "shutdown-kernels"}
    async with FakeHub() as hub:
        gov = await ready_to_cull(hub, tmp_path)
        gov.policies = load_policies([], shutdown)
        gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))
        await gov.reconcile()
        asked = gov.verdict("alice/")["requests"]["shutdown_kernels"]
        assert hub.running("alice") and asked["kernels"]
        await gov.close()

        clock.advance(30)
        gov = governor(hub, tmp_path)  # the service restarted
        gov.policies = load_policies([], shutdown)
        await gov.reconcile()
        gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))  # the kernel is still there
        again = gov.verdict("alice/")["requests"].get("shutdown_kernels")
        assert again is not None and again["kernels"] == asked["kernels"]
        await gov.reconcile()
        assert "waiting for the server to shut kernels down" in gov.row("alice/").reason

        done = report_for("alice", H100_IDLE_GPU, sm=0.0)
        done["targets"] = [t for t in done["targets"] if t["kind"] != "kernel"]
        clock.advance(30)
        gov.ingest(done)  # shut down: they are asked no more
        await gov.reconcile()
        now = gov.verdict("alice/")["requests"].get("shutdown_kernels") or {"kernels": []}
        assert not set(now["kernels"]) & set(asked["kernels"])


async def test_a_server_restarted_between_the_decision_and_the_delete_is_not_culled(
    tmp_path, restore_clock
):
    """The pass's own listing brought alice's idle server and decided its cull; before the
    DELETE (the rest of the pass, the store's write) she stopped it and started it again. The
    new session's first report says so (its server started since): only a claim, so the
    Hub is asked, and the new session is not culled for the old one's idleness."""
    async with FakeHub() as hub:
        gov = await ready_to_cull(hub, tmp_path, full_pass_every=1)  # listed this pass
        task = await once_decided(gov)
        restarted = clock.utcnow() + timedelta(seconds=5)
        hub.users["alice"].servers[""].started = restarted  # the Hub's new session
        report = report_for("alice", H100_IDLE_GPU, sm=0.0)
        report["server"]["started"] = clock.isoformat(restarted)
        gov.ingest(report)  # the new server's first report
        await task
        assert hub.running("alice"), "the new session was culled for the old one's idleness"
    (skipped,) = [a for a in actions_of(gov) if a.action == "cull-skipped"]
    assert "not culled: the server restarted since it was decided" in skipped.reason


async def test_a_server_restarted_before_the_delete_is_not_culled_before_it_reports(
    tmp_path, restore_clock
):
    """The same restart, its new server not reporting yet when the DELETE goes out (a slow
    start, or a server without the extension): the Hub's own ``started``, read once the
    DELETE holds its slot, says the session is not the one the cull was decided for."""
    async with FakeHub() as hub:
        gov = await ready_to_cull(hub, tmp_path, full_pass_every=1)  # listed this pass
        task = await once_decided(gov)
        hub.users["alice"].servers[""].started = clock.utcnow() + timedelta(seconds=5)
        await task
        assert hub.running("alice"), "the new session was culled for the old one's idleness"
        assert hub.counters["stops"] == 0
    (skipped,) = [a for a in actions_of(gov) if a.action == "cull-skipped"]
    assert "not culled: the server restarted since it was decided" in skipped.reason


async def test_a_report_claiming_a_restart_does_not_hold_a_cull_the_hub_contradicts(
    tmp_path, restore_clock
):
    """The same claim, false (the Hub runs the same session): the cull is carried out."""
    async with FakeHub() as hub:
        gov = await ready_to_cull(hub, tmp_path, full_pass_every=1)
        task = await once_decided(gov)
        report = report_for("alice", H100_IDLE_GPU, sm=0.0)
        report["server"]["started"] = report["sampled_at"]
        gov.ingest(report)
        await task
        assert not hub.running("alice")
        assert hub.counters["GET /users/{name}"] == 1  # the claim cost one read


async def test_a_cull_waiting_for_a_slow_hub_is_checked_when_it_is_sent(tmp_path, restore_clock):
    """A burst of culls against a slow Hub: the requests wait for a slot (the client's bound
    on requests in flight), minutes with a Hub answering in 30 s. An admin exempts a server
    whose cull is waiting: it is not culled (the last check ran before the wait, and the
    DELETE went out whatever landed during it)."""
    async with FakeHub() as hub:
        gov = governor(hub, tmp_path, full_pass_every=1)
        for user in ("alice", "bob"):
            hub.add_server(user)
        for step in (0, 61 * 60, 60 * 60):
            clock.advance(step)
            for user in ("alice", "bob"):
                gov.ingest(report_for(user, H100_IDLE_GPU, sm=0.0))
            await gov.reconcile()
        for user in ("alice", "bob"):
            answer(gov, manifest("done"), user=user)
        gov.hub.close()
        gov.hub.concurrency, hub.latency = 1, 3.0  # one request at a time, each 3 s
        task = asyncio.ensure_future(gov.reconcile())
        while hub.counters["DELETE /users/{name}/server(s)"] == 0:  # the first cull is sent
            assert not task.done()
            await asyncio.sleep(0.01)
        until = clock.utcnow() + timedelta(days=1)
        for key in ("alice/", "bob/"):  # (the one sent already is culled all the same)
            await gov.exempt(key, "user:root", until, "the demo is tomorrow")
        await task
        assert hub.counters["DELETE /users/{name}/server(s)"] == 1
        assert hub.running("alice") != hub.running("bob")


async def test_the_owners_stop_stands_while_the_hub_fails_it(tmp_path, restore_clock):
    """The owner pressed Stop and the Hub failed the stop, twice: the owner's request stands
    (on record as stopped, sent again after a growing pause) until the Hub takes it. The
    second failure turned it into a governed server, warned, running on with its GPU."""
    async with FakeHub() as hub:
        gov = await alice_seen(hub, tmp_path, sm=0.9)  # working, not idle
        hub.stop_errors = [500, 500]
        await gov.stop_by_owner("alice/", "user:alice", "done for today")
        await gov.background_done()
        for _ in range(8):  # passes every minute: the stop is sent again, and again
            clock.advance(60)
            gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.9))
            await gov.reconcile()
            if not hub.running("alice"):
                break
            assert gov.row("alice/").state == "culled", gov.row("alice/").reason
        assert not hub.running("alice")
        assert hub.counters["DELETE /users/{name}/server(s)"] == 3


async def test_a_wall_clock_step_moves_a_failed_culls_pause_with_it(
    tmp_path, restore_clock, monkeypatch
):
    """The Hub failed a cull, tried again in 2 minutes; the wall clock then jumped an hour
    ahead: the pause is still 2 minutes of real time, not over at once."""
    async with FakeHub() as hub:
        gov = await ready_to_cull(hub, tmp_path)
        hub.stop_errors = [503] * 5
        gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))
        await gov.reconcile()
        assert hub.counters["DELETE /users/{name}/server(s)"] == 1
        steps = iter([3600.0])
        monkeypatch.setattr(clock, "adopt_step", lambda: next(steps, 0.0))
        clock.advance(3600 + 30)  # the jump, and 30 s
        gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))
        await gov.reconcile()
        assert hub.counters["DELETE /users/{name}/server(s)"] == 1


async def test_an_admins_kernel_shutdown_is_asked_again_after_a_restart(tmp_path, restore_clock):
    """The same for an admin's immediate cull under shutdown-kernels."""
    shutdown = {"warn_after": "1h", "cull_after": "2h", "cull_action": "shutdown-kernels"}
    async with FakeHub() as hub:
        hub.add_server("alice")
        gov = governor(hub, tmp_path)
        gov.policies = load_policies([], shutdown)
        gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))
        await gov.reconcile()
        await gov.cull_now("alice/", "user:root", "the node is drained", immediately=True)
        asked = gov.verdict("alice/")["requests"]["shutdown_kernels"]
        await gov.close()

        clock.advance(30)
        gov = governor(hub, tmp_path)  # the service restarted
        gov.policies = load_policies([], shutdown)
        await gov.reconcile()
        gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))
        again = gov.verdict("alice/")["requests"].get("shutdown_kernels")
        assert again is not None and again["kernels"] == asked["kernels"]


@pytest.mark.parametrize("immediately", [True, False])
@pytest.mark.parametrize("pass_since", [True, False])
async def test_an_admins_cull_of_the_session_they_saw_spares_the_one_started_since(
    tmp_path, restore_clock, immediately, pass_since
):
    """An admin opened the dashboard on alice's idle server; she stopped it and started it
    again; the admin then clicks Cull now for the session they saw. Refused, naming the
    change (409 on the page and the API), with nothing on record or sent to the Hub: the new
    session is not the one they meant. ``pass_since``: the governor's pass saw the restart
    (its record is the new session's); else only the Hub knows so far."""
    async with FakeHub() as hub:
        gov = await alice_seen(hub, tmp_path)
        seen = gov.listing(gov.row("alice/"))["session"]  # as the dashboard and the API list it
        clock.advance(60)
        restarted = clock.utcnow()
        hub.users["alice"].servers[""].started = restarted  # the owner's new session
        if pass_since:
            await gov.reconcile()
            assert gov.listing(gov.row("alice/"))["session"] == clock.isoformat(restarted)
        before = [a.action for a in actions_of(gov)]
        with pytest.raises(SessionChanged, match="it restarted since") as refused:
            await gov.cull_now(
                "alice/", "user:root", "runaway", immediately=immediately, session=parse(seen)
            )
        assert seen in str(refused.value) and clock.isoformat(restarted) in str(refused.value)
        assert hub.running("alice") and hub.counters["stops"] == 0
        assert gov.row("alice/").state != "culled" and gov.row("alice/").cull_requested_at is None
        assert [a.action for a in actions_of(gov)] == before
        if not pass_since:
            return
        # The session running now, as listed since: culled.
        outcome = await gov.cull_now(
            "alice/", "user:root", "runaway", immediately=True, session=restarted
        )
        assert outcome["status"] in ("stopped", "stopping"), outcome
        assert not hub.running("alice")


async def test_an_admins_immediate_cull_spares_a_session_started_during_it(tmp_path, restore_clock):
    """The owner restarts while the admin's immediate cull waits for its slot to the Hub: the
    Hub's model read in that slot names another session, so nothing is stopped; the cull is on
    record as skipped, with why, and the admin hears it (409)."""
    async with FakeHub() as hub:
        gov = await alice_seen(hub, tmp_path)
        seen = gov.row("alice/").session_started
        hub.latency = 0.5
        reads = hub.counters["GET /users/{name}"]
        cull = asyncio.ensure_future(
            gov.cull_now("alice/", "user:root", "runaway", immediately=True, session=seen)
        )
        # The session checked as it was asked (one read), then in the DELETE's slot (another,
        # answered after the Hub's latency: she restarts meanwhile).
        while hub.counters["GET /users/{name}"] < reads + 2:
            assert not cull.done()
            await asyncio.sleep(0.01)
        hub.users["alice"].servers[""].started = clock.utcnow() + timedelta(seconds=5)
        with pytest.raises(SessionChanged, match="not culled: the server restarted"):
            await cull
        assert hub.running("alice") and hub.counters["stops"] == 0
        assert gov.row("alice/").state != "culled"
    culls = [(a.action, a.actor) for a in actions_of(gov) if a.action.startswith("cull")]
    assert culls == [("cull", "user:root"), ("cull-skipped", "user:root")]


async def test_an_admins_pending_cull_dropped_by_a_restart_is_on_record(tmp_path, restore_clock):
    """An admin's Cull now waits for alice's checkpoint; she restarts her server before the
    pass culls it. The new session does not carry the cull (it was for the session the admin
    saw), and the admin learns so: a cull-skipped row names the request and both sessions.
    Nothing is stopped, and the new session is governed as any other."""
    async with FakeHub() as hub:
        gov = await alice_seen(hub, tmp_path)
        seen = gov.row("alice/").session_started
        outcome = await gov.cull_now("alice/", "user:root", "the node is drained", session=seen)
        assert outcome["status"] == "requested" and outcome["verdict"]["state"] == "checkpointing"

        clock.advance(60)
        restarted = clock.utcnow()
        hub.users["alice"].servers[""].started = restarted  # before the checkpoint came back
        gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))
        await gov.reconcile()
        assert gov.row("alice/").cull_requested_at is None
        assert gov.verdict("alice/")["state"] != "checkpointing"
        await gov.reconcile()  # once only
        assert hub.running("alice") and hub.counters["stops"] == 0
    (skipped,) = [a for a in actions_of(gov) if a.action == "cull-skipped"]
    assert "culled by user:root: the node is drained" in skipped.reason
    assert "restarted" in skipped.reason
    assert clock.isoformat(seen) in skipped.reason
    assert clock.isoformat(restarted) in skipped.reason


def owner_stopped(hub: FakeHub) -> None:
    """alice stops her server herself (the Hub's User.stop: gone, her activity moved)."""
    user = hub.users["alice"]
    user.servers.pop("", None)
    user.last_activity = clock.utcnow()
    hub._reindex(user)


async def test_an_admins_pending_cull_on_a_server_that_stopped_is_settled_on_record(
    tmp_path, restore_clock
):
    """An admin's Cull now waits for alice's checkpoint; she stops her server herself (or the
    Hub's culler does, or it crashes) and never starts it again. The request stayed on her
    record for ever, with no audit row saying how it ended: the pass that finds the server
    gone writes one cull-skipped row naming the request and the session, and her record no
    longer holds a cull; starting a new session later writes no second row."""
    async with FakeHub() as hub:
        hub.add_server("alice")
        gov = governor(hub, tmp_path)
        gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))
        await gov.reconcile()
        seen = gov.row("alice/").session_started
        outcome = await gov.cull_now("alice/", "user:root", "the node is drained", session=seen)
        assert outcome["status"] == "requested"

        clock.advance(60)
        owner_stopped(hub)  # before the checkpoint came back
        await gov.reconcile()
        row = gov.row("alice/")
        assert not row.running and row.cull_requested_at is None
        assert row.checkpoint_status is None
        listed = gov.listing(row)
        assert "not culled: the server stopped before it was done" in listed["reason"]
        assert listed["checkpoint"]["status"] != "requested"
        await gov.reconcile()  # once only
        again = Store(gov.store.url).servers()["alice/"]  # as a restarted governor reads it
        assert again.cull_requested_at is None and again.checkpoint_status is None

        clock.advance(3600)
        hub.add_server("alice")  # a new session, an hour on: nothing more on record
        gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))
        await gov.reconcile()
        assert hub.running("alice") and hub.counters["stops"] == 0
    (skipped,) = [a for a in actions_of(gov) if a.action == "cull-skipped"]
    assert "culled by user:root: the node is drained" in skipped.reason
    assert "not culled: the server stopped before it was done" in skipped.reason
    assert clock.isoformat(seen) in skipped.reason
    assert "restarted" not in skipped.reason


async def test_an_admins_cull_carried_out_is_not_skipped_by_the_next_session(
    tmp_path, restore_clock
):
    """The pass culled alice's server for the admin; she starts it again: the cull happened,
    so nothing is on record as skipped."""
    async with FakeHub() as hub:
        gov = await alice_seen(hub, tmp_path)
        await gov.cull_now("alice/", "user:root", "the node is drained")
        answer(gov, manifest("done"))
        await gov.reconcile()
        assert not hub.running("alice")
        clock.advance(60)
        hub.add_server("alice")
        gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))
        await gov.reconcile()
        assert gov.row("alice/").state != "culled"
    actions = [a.action for a in actions_of(gov)]
    assert "cull" in actions and "cull-skipped" not in actions
