"""What one user can make the governor keep by the names they choose (docs/security.md, "What
one user's names make the service keep"): the rows of their stopped servers stay bounded, and
nobody else's are touched."""

from __future__ import annotations

import logging

from fake_hub_api import FakeHub
from test_governor import H100_IDLE_GPU, governor, report_for
from test_lease import with_lease

from jupyter_gpu_gov.core import clock


def _stop(hub: FakeHub, user: str, name: str) -> None:
    """The Hub stops and removes a named server (its user's activity moves, as a stop's does)."""
    u = hub.users[user]
    del u.servers[name]
    u.last_activity = clock.utcnow()
    hub._reindex(u)


async def test_a_user_starting_servers_of_new_names_leaves_a_bounded_number_of_rows(
    tmp_path, caplog
):
    """Mallory starts a server of a new name for each pass and stops it: each left the
    governor's row for good (in memory, ~0.6 kB, and the store), which every owner's page, the
    admin's listing and the diagnosis read through. Now at most ``stopped_kept_per_user`` of a
    user's stopped servers stay (those stopped most lately), the rest forgotten and said in the
    log; alice's stopped server and running ones are kept, as is the store's copy."""
    async with FakeHub() as hub:
        hub.named_servers = True
        hub.add_server("alice", "old")
        hub.add_server("alice", "gpu")
        gov = governor(hub, tmp_path, full_pass_every=1, stopped_kept_per_user=3)
        await gov.reconcile()
        _stop(hub, "alice", "old")
        await gov.reconcile()
        with caplog.at_level(logging.INFO, logger="jupyter_gpu_gov.hub"):
            for i in range(12):
                hub.add_server("mallory", f"x{i}")
                await gov.reconcile()
                _stop(hub, "mallory", f"x{i}")
                clock.advance(1)  # each found stopped a moment after the last
                await gov.reconcile()
        hub.add_server("mallory", "still-running")
        await gov.reconcile()
    clock.reset()

    known = {row.key for row in gov.known_servers(running_only=False)}
    assert {k for k in known if k.startswith("mallory/")} == {
        "mallory/x9",
        "mallory/x10",
        "mallory/x11",
        "mallory/still-running",
    }
    assert {"alice/old", "alice/gpu"} <= known  # another user's rows are not hers to push out
    stored = gov.store.servers()
    assert set(stored) == known  # the store holds what the governor does
    assert "forgot the rows of 1 stopped servers, at most 3 kept a user" in caplog.text
    assert "mallory 1" in caplog.text


async def test_a_report_changing_its_lie_at_every_pass_is_audited_six_times_an_hour(
    tmp_path, caplog
):
    """The allocator gave mallory's server one card; her reports name another GPU at every
    pass (any UUID: a report is hers to write). Each change was a `report-distrusted` row and a
    WARNING of up to 2,000 characters, a pass for each of her servers, for good. Now each change
    at most six times an hour a server, the next row saying how many went unsaid; the report is
    not believed all the same."""
    granted = {"gpu_gov_devices": [H100_IDLE_GPU]}

    def distrusted() -> list[str]:
        rows = [a.reason for a in gov.store.audit_rows("mallory/")]
        return [r for r in rows if r.startswith("report not believed")]

    try:
        async with FakeHub() as hub:
            hub.add_server("mallory", state=granted)
            gov = governor(hub, tmp_path, full_pass_every=1)
            with caplog.at_level(logging.WARNING, logger="jupyter_gpu_gov.hub"):
                for i in range(12):
                    gov.ingest(report_for("mallory", f"GPU-{i:08d}-forged", sm=0.9))
                    await gov.reconcile()
                    clock.advance(60)
                    # not believed: without DCGM, governed as a server sending no report
                    assert "sends no GPU report" in gov.verdict("mallory/")["reason"]
                assert len(distrusted()) == 6
                assert any("GPU-00000005-forged" in r for r in distrusted())
                clock.advance(3600)
                gov.ingest(report_for("mallory", "GPU-99999999-forged", sm=0.9))
                await gov.reconcile()
    finally:
        clock.reset()
    assert len(distrusted()) == 7, distrusted()
    (latest,) = [r for r in distrusted() if "GPU-99999999-forged" in r]
    assert latest.endswith("(6 other contradictions since the last said)"), latest
    assert caplog.text.count("report not believed") == 7


async def test_a_standby_forgets_the_stopped_rows_its_holder_forgot(tmp_path, restore_clock):
    """A standby reads back the rows its holder wrote since its last read; a row the holder
    forgot (deleted) is never written again, so the standby kept it in memory, listed it and
    answered for it, until its whole read ten minutes on: mallory's server of a new name each
    pass grew the standby's rows past the bound its holder kept. It now forgets them as the
    holder's deletes reach the store: both keep the same rows."""
    async with FakeHub() as hub:
        hub.named_servers = True
        hub.add_server("alice", "gpu")
        holder_ = governor(hub, tmp_path, full_pass_every=1, stopped_kept_per_user=3)
        standby = governor(hub, tmp_path, full_pass_every=1, stopped_kept_per_user=3)
        assert with_lease(holder_).held() and not with_lease(standby).held()
        for i in range(8):
            hub.add_server("mallory", f"x{i}")
            await holder_.reconcile()
            await standby.reconcile()
            standby.row("alice/gpu")  # a report's look between passes: the read-back
            _stop(hub, "mallory", f"x{i}")
            clock.advance(1)
            await holder_.reconcile()
            await standby.reconcile()
            standby.row("alice/gpu")

    def mallorys(gov) -> set[str]:
        return {r.key for r in gov.known_servers(running_only=False) if r.user == "mallory"}

    assert mallorys(holder_) == {"mallory/x5", "mallory/x6", "mallory/x7"}
    assert mallorys(standby) == mallorys(holder_)
    assert standby.row("mallory/x0") is None


async def test_a_hub_may_say_fewer_distrusted_reports_an_hour(tmp_path):
    """``distrust_said_per_hour=2``: two rows an hour for a report changing its lie at every
    pass, where the default says six."""
    granted = {"gpu_gov_devices": [H100_IDLE_GPU]}
    try:
        async with FakeHub() as hub:
            hub.add_server("mallory", state=granted)
            gov = governor(hub, tmp_path, full_pass_every=1, distrust_said_per_hour=2)
            for i in range(5):
                gov.ingest(report_for("mallory", f"GPU-{i:08d}-forged", sm=0.9))
                await gov.reconcile()
                clock.advance(60)
    finally:
        clock.reset()
    rows = [a.reason for a in gov.store.audit_rows("mallory/") if a.action == "report-distrusted"]
    assert len(rows) == 2, rows


def test_the_rows_know_each_users_servers_through_every_change():
    """``Rows.of_user`` (what the trim reads in place of every row) is, after any run of
    changes, what a walk through every row finds of that user."""
    import random
    from datetime import datetime, timezone

    from jupyter_gpu_gov.hub.tables import Rows, ServerRow

    now = datetime(2026, 12, 6, tzinfo=timezone.utc)

    def row(user: str, name: str) -> ServerRow:
        return ServerRow(key=f"{user}/{name}", user=user, name=name, session_started=now)

    rng = random.Random(35)
    rows = Rows({"a/": row("a", ""), "a/x": row("a", "x"), "b/": row("b", "")})
    for _ in range(3000):
        user, name = rng.choice("abcd"), rng.choice(["", "x", "y", "z"])
        key, op = f"{user}/{name}", rng.randrange(6)
        if op < 2:
            rows[key] = row(user, name)
        elif op == 2:
            rows.pop(key, None)
        elif op == 3 and key in rows:
            del rows[key]
        elif op == 4:
            rows.setdefault(key, row(user, name))
        else:
            rows.update({key: row(user, name)})
        for u in "abcd":
            walked = sorted(k for k, r in rows.items() if r.user == u)
            assert sorted(r.key for r in rows.of_user(u)) == walked, (u, op, key)
    rows.clear()
    assert rows.of_user("a") == []
