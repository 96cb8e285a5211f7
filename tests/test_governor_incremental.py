"""Deciding only the servers whose inputs changed (``full_pass_every`` > 1, hub/unchanged.py)
decides exactly what deciding every server does: two governors, one per path, each with its
own fake Hub, fed the same world pass by pass, must agree on every verdict, row, audit row and
Hub action."""

from __future__ import annotations

import copy
import json
import random
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import timedelta

import pytest
from fake_hub_api import FakeHub
from test_governor import report_for

from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.core.grant import GRANT_STATE
from jupyter_gpu_gov.core.health import DRAIN, RESET, UNHEALTHY, Health
from jupyter_gpu_gov.core.policy import load_policies
from jupyter_gpu_gov.hub import ingest, metrics, trusted
from jupyter_gpu_gov.hub.dcgm import DcgmSnapshot, GpuEvidence
from jupyter_gpu_gov.hub.deadlines import NextTimes
from jupyter_gpu_gov.hub.diagnosis import DiagnosisOptions
from jupyter_gpu_gov.hub.hubapi import HubApi
from jupyter_gpu_gov.hub.options import Options
from jupyter_gpu_gov.hub.reconcile import Governor
from jupyter_gpu_gov.hub.store import Store
from jupyter_gpu_gov.hub.unchanged import DcgmRead, dcgm_read
from jupyter_gpu_gov.replay.history import KEYFRAME_S

pytestmark = pytest.mark.usefixtures("restore_clock")  # every test moves the clock


@dataclass
class Dcgm:
    """DCGM as the governor's source sees it: one node's GPUs and their activity (None:
    unknown); ``down`` reads nothing."""

    activity: dict[str, float | None] = field(default_factory=dict)
    health: dict[str, Health] = field(default_factory=dict)  # GPUs DCGM says are not well
    pods: dict[str, tuple[str, str]] = field(default_factory=dict)  # GPU -> (namespace, pod)
    down: bool = False

    async def fetch(self) -> DcgmSnapshot:
        if self.down:
            return DcgmSnapshot((), clock.utcnow(), errors=("exporter down",))
        evidence = tuple(
            GpuEvidence(
                uuid=uuid,
                gpu_index=i,
                hostname="node-1",
                activity=a,
                activity_source="gpu_util",
                health=self.health.get(uuid, Health()),
                **dict(zip(("namespace", "pod"), self.pods.get(uuid, (None, None)), strict=True)),
            )
            for i, (uuid, a) in enumerate(sorted(self.activity.items()))
        )
        return DcgmSnapshot(evidence, clock.utcnow())


@dataclass
class Server:
    user: str
    uuid: str
    granted: bool  # the Hub's records name its GPU or its pod (DCGM's word is final)
    reports: bool  # it runs the extension
    active: bool
    idle_since: str | None = None  # as its sampler keeps it, while idle
    started: str = ""


SHORT = [f"user{i}" for i in range(1, 200, 3)]  # a maximum age: a deadline of their own
KERNELS = [f"user{i}" for i in range(2, 200, 3)]  # culled by shutting their kernels down


FAILURES = [
    Health(UNHEALTHY, ("XID 79: the GPU fell off the bus",), RESET),
    Health(UNHEALTHY, ("XID 48: a double-bit ECC error",), DRAIN),
    Health(),
    Health(),
]


def governor(hub: FakeHub, tmp_path, name: str, dcgm: Dcgm, full_every: int) -> Governor:
    policies = load_policies(
        [
            {"name": "short", "match": {"users": SHORT}, "max_age": "3h"},
            {"name": "kernels", "match": {"users": KERNELS}, "cull_action": "shutdown-kernels"},
        ],
        {"warn_after": "20m", "cull_after": "40m", "away_after": "1h", "inactive_timeout": "90m"},
    )
    # The diagnosis on (a zombie is an owner away), its training (hours apart) off.
    options = Options(full_pass_every=full_every, diagnosis=DiagnosisOptions(min_windows=10**9))
    store = Store(f"sqlite:///{tmp_path / name}.sqlite")
    # Pages of 3 users: a full listing of this small fleet takes as many requests as a large
    # one's, so asking for the users of the servers to decide is worth it (hub/listing.py).
    return Governor(store, HubApi(hub.api_url, hub.token, page_size=3), policies, options, dcgm)


def _encoded(verdict: dict) -> bytes:
    return json.dumps({"verdict": verdict}).encode()  # as the report route answered


def columns(row) -> tuple:
    return tuple(getattr(row, c.name) for c in row.__table__.columns if c.name != "id")


def everything(gov: Governor, hub: FakeHub) -> dict:
    """What a user or an admin could notice: verdicts, rows, the audit trail, the Hub."""
    keys = sorted(gov.rows)
    return {
        "verdicts": {k: gov.verdict(k) for k in keys},
        "rows": {k: columns(gov.rows[k]) for k in keys},
        # Every row, in any order: a pass decides servers in the order the Hub lists them,
        # which listing only the users active since the last listing changes.
        "audit": sorted((columns(a) for a in gov.store.audit_rows(limit=100_000)), key=repr),
        "running": sorted(
            (u.name, s.name) for u in hub.users.values() for s in u.servers.values() if s.active
        ),
        "stops": hub.counters["stops"],
    }


def samples() -> dict[tuple, tuple[str, float]]:
    """The governor's /metrics as Prometheus reads it, but its timing series (histograms of
    durations) and counters' creation times: series -> (type, value). Both governors share the
    process's registry: gauges are set whole by each pass, counters only add."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): (family.type, s.value)
        for family in metrics.REGISTRY.collect()  # what /metrics writes out
        if family.type != "histogram"
        for s in family.samples
        if not s.name.endswith("_created")
    }


def counting(gov: Governor, method: str = "_govern") -> list[int]:
    calls = [0]
    original = getattr(gov, method)

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    setattr(gov, method, counted)
    return calls


@pytest.mark.parametrize("seed, quiet", [(1, False), (2, False), (3, False), (4, True)])
async def test_deciding_only_what_changed_decides_what_deciding_everything_does(
    tmp_path, monkeypatch, seed, quiet
):
    """``quiet``: DCGM changes a tenth as often, so most passes look only at the servers
    marked or due (hub/deadlines.py) rather than at every kept one."""
    rng = random.Random(seed)
    odds = 0.1 if quiet else 1.0  # of DCGM's changes
    dcgm = Dcgm()
    servers: dict[str, Server] = {}
    step = [0.0]
    monkeypatch.setattr(clock, "adopt_step", lambda: step[0])
    # Both governors ask the Hub about every server their last pass did not see: its answers
    # kept for HUB_LOOKUP_EVERY seconds of real time would expire at different passes for the
    # two on a loaded machine, and the same report be taken by one and refused by the other.
    monkeypatch.setattr(ingest, "HUB_LOOKUP_EVERY", -1.0)
    frozen = [clock.utcnow()]  # both governors decide at the very same times
    monkeypatch.setattr(clock, "utcnow", lambda: frozen[0])
    monkeypatch.setattr(
        clock, "advance", lambda s: frozen.__setitem__(0, frozen[0] + timedelta(seconds=s))
    )
    async with FakeHub() as full_hub, FakeHub() as inc_hub:
        hubs = (full_hub, inc_hub)
        full = governor(full_hub, tmp_path, "full", dcgm, full_every=1)
        inc = governor(inc_hub, tmp_path, "inc", dcgm, full_every=1000)
        decided_full, decided_inc = counting(full), counting(inc)
        fresh_reads = counting(inc.hub, "get_server")  # culls on models not listed this pass

        def start(i: int) -> None:
            user = f"user{i}"
            uuid = f"GPU-{i:08d}-0000-0000-0000-000000000000"
            s = Server(user, uuid, rng.random() < 0.4, rng.random() < 0.85, rng.random() < 0.7)
            servers[user] = s
            s.started = clock.isoformat(clock.utcnow())
            dcgm.activity[uuid] = 0.9 if s.active else 0.0
            state = {"gpu_gov_devices": [uuid]} if s.granted else {}
            if s.granted and i % 2:  # KubeSpawner's pod instead, DCGM's records labelled with it
                state = {"pod_name": f"jupyter-{user}", "namespace": "jhub"}
                dcgm.pods[uuid] = ("jhub", f"jupyter-{user}")
            if rng.random() < 0.3:  # the owner said how long it should take, at spawn
                grant = {"gpu-gov/expected-duration": rng.choice(["30m", "2h"])}
                state[GRANT_STATE] = grant
            for hub in hubs:
                hub.add_server(user, last_activity=clock.utcnow(), state=copy.deepcopy(state))

        for i in range(24):
            start(i)
        listed_some = 0  # passes that listed only the users active since the last listing
        for n in range(80):
            # The world moves on: time, work, reports, DCGM, the Hub.
            clock.advance(rng.choice([60] * 12 + [20, 300, 900, 2400]))
            step[0] = rng.choice([0.0] * 30 + [600.0, -300.0])
            if step[0]:
                clock.advance(step[0])
            for s in list(servers.values()):
                if rng.random() < 0.05:
                    s.active = not s.active
                    if not s.active:  # kept once active again, as a window's last idle time
                        s.idle_since = clock.isoformat(clock.utcnow())
                if rng.random() < 0.05 * odds:
                    dcgm.activity[s.uuid] = rng.choice([None, 0.0, 0.9])
                if rng.random() < 0.02 * odds:  # the GPU fails (an XID), needs a drain, or recovers
                    dcgm.health[s.uuid] = rng.choice(FAILURES)
                elif rng.random() < 0.2 * odds:
                    dcgm.activity[s.uuid] = 0.9 if s.active else 0.0
                if s.reports and rng.random() < 0.9:
                    report = report_for(s.user, s.uuid, sm=0.9 if s.active else 0.0)
                    window = report["window"]
                    window["gpu_idle_since"] = s.idle_since or window["gpu_idle_since"]
                    if s.active and rng.random() < 0.5:  # active by its kernel's SM alone
                        window["gpu_active_fraction"] = 0.0
                        window["gpu_idle_since"] = s.idle_since or s.started
                    if not s.active and rng.random() < 0.2:  # a cell running, GPU idle
                        kernel = report["targets"][0]
                        kernel["execution_state"] = "busy"
                        kernel["busy_since"] = clock.isoformat(clock.utcnow() - timedelta(hours=1))
                    answer = checkpoint_answer(full, f"{s.user}/", rng)
                    if answer is not None:
                        report["checkpoint"] = answer
                    # The route's answer (``ingest_answer``: kept on the row while what it is
                    # made of stays) is the other governor's verdict, encoded anew.
                    said = [
                        gov.ingest_answer(copy.deepcopy(report))
                        for gov in (full, inc)
                        if await gov.hub_runs(f"{s.user}/")
                    ]
                    if said:
                        assert said == [_encoded(full.verdict(f"{s.user}/"))] * 2, f"pass {n}"
            dcgm.down = rng.random() < 0.05 * odds
            if rng.random() < 0.15:
                start(100 + n)
            if rng.random() < 0.1 and servers:
                gone = rng.choice(sorted(servers))
                for hub in hubs:
                    user = hub.users[gone]
                    user.servers.pop("", None)
                    user.last_activity = clock.utcnow()  # as the Hub's User.stop does
                    hub._reindex(user)
            if rng.random() < 0.1 and servers:
                touched = rng.choice(sorted(servers))
                for hub in hubs:
                    server = hub.users[touched].servers.get("")
                    if server is not None:  # activity posted: the server's and its user's
                        server.last_activity = hub.users[touched].last_activity = clock.utcnow()
            # People's requests, between passes: an extension, an exemption, a cull now.
            if rng.random() < 0.2:
                key = f"{rng.choice(sorted(servers))}/"
                request = rng.choice(["extend", "exempt", "lift", "cull"])
                until = clock.utcnow() + timedelta(minutes=rng.choice([30, 90]))
                for gov in (full, inc):
                    if key not in gov.rows or not gov.rows[key].running:
                        continue
                    if request == "extend":
                        await gov.extend(key, key[:-1], "a run to finish")
                    elif request == "exempt":
                        await gov.exempt(key, "admin", until, "a demo")
                    elif request == "lift":
                        await gov.exempt(key, "admin", None, "over")
                    else:
                        await gov.cull_now(key, "admin", "needed elsewhere")
            exposed = [samples()]
            for gov in (full, inc):
                await gov.reconcile()
                await gov.background_done()
                exposed.append(samples())
            listed_some += not inc.hub_listing.full
            for key in inc.rows:  # a kept answer after a pass and people's requests
                assert inc.answer(key) == _encoded(inc.verdict(key)), f"pass {n}: {key}"
            a, b = everything(full, full_hub), everything(inc, inc_hub)
            for part in a:
                assert a[part] == b[part], f"pass {n}: {part} differ (seed {seed})"
            # /metrics: the same gauges, and each counter moved as much in either pass.
            before, after_full, after_inc = exposed
            assert after_full.keys() == after_inc.keys(), f"pass {n}: series differ"
            for series, kind in after_full.items():
                if kind[0] == "counter":
                    moved = after_full[series][1] - before.get(series, ("", 0.0))[1]
                    # (the shared counter's float sum rounds: the difference, not the amount)
                    assert after_inc[series][1] - after_full[series][1] == pytest.approx(moved)
                else:
                    assert after_inc[series] == after_full[series], f"pass {n}: {series}"
        await full.close()
        await inc.close()
    # It did decide and list less: the comparison is not between two full passes.
    assert listed_some > 40, listed_some
    assert decided_inc[0] < 0.9 * decided_full[0], (decided_inc, decided_full)
    assert fresh_reads[0] > 0  # and culled servers its listing did not bring
    names = {name for name, _ in samples()}  # the comparison saw what it is about
    assert {"jupyter_gpu_gov_server_gpu_equivalents", "jupyter_gpu_gov_warnings_total"} <= names
    trail = full.store.audit_rows(limit=100_000)
    said = {a.action for a in trail}
    assert said >= {"warn", "state", "checkpoint", "checkpoint-done", "checkpoint-failed"}, said
    if not quiet:  # GPUs fail in the busy worlds
        assert any("→ gpu-failed" in a.reason for a in trail if a.action == "state")
    assert any((a.details or {}).get("cull_action") == "shutdown-kernels" for a in trail)


def checkpoint_answer(gov: Governor, key: str, rng: random.Random) -> dict | None:
    """Now and then, the checkpoint a server took for the governor's request (done or failed),
    or one it took before the request (which answers nothing); else none yet."""
    row = gov.rows.get(key)
    if row is None or row.checkpoint_status != "requested" or rng.random() < 0.5:
        return None
    asked = row.checkpoint_requested_at
    if rng.random() < 0.2:
        asked -= timedelta(hours=1)  # an older checkpoint: no answer to this request
    status = rng.choice(["done", "failed"])
    errors = ["disk full"] if status == "failed" else []
    manifest = {"format": 1, "id": "c1", "source": "governor", "status": status, "errors": errors}
    return {"requested_at": clock.isoformat(asked), "status": status, "manifest": manifest}


def test_due_times_come_out_right_after_many_reschedules_and_stale_entries_are_dropped():
    """Each kept server's next time sits in a heap; moving it leaves the old entry there,
    stale, and the heap is rebuilt from the live times once the stale ones outnumber them
    (+1,024): every time kept in the heap cost ~2 MB at 10,000 servers for four times as many.
    After thousands of moves each key still comes out when its latest time comes, once, and
    never before; and the heap never holds more than twice its live entries (+1,024)."""
    rng = random.Random(43)
    times, due = NextTimes(), {}  # due: what each key was last set to, the model
    keys = [f"user{i}/" for i in range(3000)]
    now, rebuilt = 0.0, 0
    for step in range(60_000):
        key, roll, held = rng.choice(keys), rng.random(), len(times._heap)
        if roll < 0.03:
            times.at(key, None)
            due.pop(key, None)
        elif roll < 0.05:
            times.forget(key)
            due.pop(key, None)
        else:  # a time in the next while, often the one it already has, sometimes one just gone
            when = round(now + rng.uniform(-1, 6000)) if roll < 0.9 else due.get(key, now + 5)
            times.at(key, when)
            due[key] = when
            rebuilt += len(times._heap) < held  # ``at`` only adds, but when it rebuilds
            assert len(times._heap) <= 2 * len(due) + 1024, (step, len(times._heap), len(due))
        if step % 500 == 499:
            now += 60
            came = {k for k, t in due.items() if t <= now}
            assert times.take(now) == came, step
            for k in came:
                del due[k]
            assert all((k in times) == (k in due) for k in keys)
    assert rebuilt > 5  # the bound above held because the heap was rebuilt, many times
    now += 10_000
    assert times.take(now) == set(due)  # the rest, each at its latest time
    assert times.take(now + 1e6) == set()


async def test_a_deadline_is_met_in_its_pass_though_nothing_else_changed(tmp_path, monkeypatch):
    """A busy server reporting the same thing every minute is not decided again until its
    maximum age's warning falls due: that very pass warns it, and the pass at the age itself
    acts (a checkpoint first, then the cull)."""
    frozen = [clock.utcnow()]
    monkeypatch.setattr(clock, "utcnow", lambda: frozen[0])
    dcgm = Dcgm()
    async with FakeHub() as hub:
        hub.add_server("user1", last_activity=frozen[0])  # policy "short": max_age 3h
        gov = governor(hub, tmp_path, "gov", dcgm, full_every=1000)
        decided, worked_out = counting(gov), counting(gov, "_inputs")
        uuid = "GPU-00000001-0000-0000-0000-000000000000"
        said: dict[int, set[str]] = {}  # minute -> what the audit trail gained in that pass
        seen = 0
        for minute in range(1, 3 * 60 + 2):
            frozen[0] += timedelta(minutes=1)
            gov.ingest(report_for("user1", uuid, sm=0.9))
            await gov.reconcile()
            audits = gov.store.audit_rows("user1/", limit=1000)
            if len(audits) > seen:
                said[minute] = {a.action for a in audits[: len(audits) - seen]}
                seen = len(audits)
        await gov.close()
    assert sorted(said) == [2 * 60, 3 * 60], said  # warned an hour before the age, at the age
    assert "max-age-warn" in said[2 * 60]
    assert said[3 * 60] & {"checkpoint", "cull"}, said
    assert decided[0] < 12  # and not decided in between
    # Its deadline's pass finds it due by its time alone: what else its kept decision read (DCGM,
    # the diagnosis) is not worked out to compare.
    assert worked_out[0] == 0


async def test_a_kept_decision_keeps_no_report_but_the_latest(tmp_path, monkeypatch):
    """A server's kept decision holds no older report than its latest (one report a server in
    memory, not two: docs/benchmarks-history.md, "Issue 26, wave 13"): a report the same for a
    decision takes the old one's place, and the decision still holds; one that moved drops the kept
    decision, and the next pass decides the server on it."""
    frozen = [clock.utcnow()]
    monkeypatch.setattr(clock, "utcnow", lambda: frozen[0])
    uuid = "GPU-00000001-0000-0000-0000-000000000000"
    async with FakeHub() as hub:
        hub.add_server("user0", last_activity=frozen[0])
        gov = governor(hub, tmp_path, "gov", Dcgm(), full_every=1000)
        decided = counting(gov)
        for _ in range(3):  # the first report's pass marks the row as reporting: not kept
            frozen[0] += timedelta(minutes=1)
            gov.ingest(report_for("user0", uuid, sm=0.9))
            await gov.reconcile()
        key, before = "user0/", decided[0]
        assert gov.unchanged.kept[key].received is gov.reports[key]

        frozen[0] += timedelta(minutes=1)
        gov.ingest(report_for("user0", uuid, sm=0.9))  # the same but for its time
        assert gov.unchanged.kept[key].received is gov.reports[key]
        await gov.reconcile()
        assert decided[0] == before  # its decision held

        # A kernel message moved the kernel's own last activity (a widget's comm, an output):
        # no decision reads it (the owner's presence is the server's last_activity).
        frozen[0] += timedelta(minutes=1)
        moved = report_for("user0", uuid, sm=0.9)
        moved["targets"][0]["last_activity"] = clock.isoformat(frozen[0])
        gov.ingest(moved)
        assert gov.unchanged.kept[key].received is gov.reports[key]
        await gov.reconcile()
        assert decided[0] == before

        frozen[0] += timedelta(minutes=1)
        gov.ingest(report_for("user0", uuid, sm=0.0))  # its GPU went idle
        assert key not in gov.unchanged.kept
        await gov.reconcile()
        assert decided[0] == before + 1
        assert gov.verdict(key)["state"] == "idle"
        await gov.close()


async def test_a_server_listed_as_it_was_is_kept_once(tmp_path, monkeypatch):
    """A full listing brings every server's Hub model anew (here at every pass: a Hub older
    than JupyterHub 5); one equal to what its kept decision read is that one: one model a
    server in memory, not two (docs/benchmarks-history.md, "Issue 26, wave 15"). A model that moved
    is taken and decided on."""
    frozen = [clock.utcnow()]
    monkeypatch.setattr(clock, "utcnow", lambda: frozen[0])
    users = [f"user{i}" for i in range(0, 30, 3)]
    async with FakeHub() as hub:
        hub.version, hub.sorts = "4.1.6", False
        for user in users:
            hub.add_server(user, last_activity=frozen[0])
        gov = governor(hub, tmp_path, "gov", Dcgm(), full_every=1000)
        decided = counting(gov)
        for _ in range(4):
            frozen[0] += timedelta(minutes=1)
            await gov.reconcile()
            assert gov.hub_listing.full
        keys = [f"{user}/" for user in users]
        assert all(gov._servers[k] is gov.unchanged.kept[k].server for k in keys)
        before, model = decided[0], gov._servers["user3/"]
        hub.users["user3"].servers[""].last_activity = frozen[0]  # activity on the Hub
        frozen[0] += timedelta(minutes=1)
        await gov.reconcile()
        assert decided[0] == before + 1
        assert gov._servers["user3/"].last_activity > model.last_activity
        kept = gov.unchanged.kept
        assert len(kept) >= 9 and all(gov._servers[k] is kept[k].server for k in kept)
        await gov.close()


async def test_a_servers_labels_are_kept_once_for_its_row_and_its_kept_view(tmp_path, monkeypatch):
    """Each pass resolves a server's labels anew (its grant's, its team, tier, user); the row
    keeps them, and so did the view its kept decision was made on, a copy each (~2 MB at
    10,000 servers): the view now holds the row's, equal; labels that change are taken."""
    frozen = [clock.utcnow()]
    monkeypatch.setattr(clock, "utcnow", lambda: frozen[0])
    grant = {"gpu_gov_grant": {"gpu-gov/team": "physics", "gpu-gov/tier": "a100"}}
    async with FakeHub() as hub:
        hub.add_server("alice", last_activity=frozen[0], state=dict(grant))
        gov = governor(hub, tmp_path, "gov", Dcgm(), full_every=1000)
        for _ in range(3):
            frozen[0] += timedelta(minutes=1)
            await gov.reconcile()
        row, view = gov.rows["alice/"], gov.unchanged.kept["alice/"].view
        assert row.labels["gpu-gov/team"] == "physics", row.labels
        assert view.labels is row.labels
        hub.users["alice"].servers[""].state = {"gpu_gov_grant": {"gpu-gov/team": "nlp"}}
        frozen[0] += timedelta(minutes=1)
        await gov.reconcile()
        row, view = gov.rows["alice/"], gov.unchanged.kept["alice/"].view
        assert row.labels["gpu-gov/team"] == "nlp" and view.labels is row.labels
        await gov.close()


@pytest.mark.parametrize("version, sorts", [("4.1.6", True), ("6.1.0", False)])
async def test_a_hub_that_cannot_sort_by_activity_is_listed_whole(
    tmp_path, monkeypatch, version, sorts
):
    """Listing only the users active since the last listing needs a Hub that sorts them by
    activity: one older than JupyterHub 5 (which ignores ``sort``), or one whose listing comes
    back out of that order, is listed whole at every pass."""
    frozen = [clock.utcnow()]
    monkeypatch.setattr(clock, "utcnow", lambda: frozen[0])
    async with FakeHub() as hub:
        hub.version, hub.sorts = version, sorts
        for i in range(12):  # in id order, the most recently active last
            hub.add_server(f"user{i}", last_activity=frozen[0] - timedelta(seconds=60 - i))
        gov = governor(hub, tmp_path, "gov", Dcgm(), full_every=1000)
        for _ in range(4):
            frozen[0] += timedelta(minutes=1)
            await gov.reconcile()
            assert gov.hub_listing.full
            assert len(gov.hub_listing.listed) == 12
        await gov.close()
    assert gov.hub_listing.sorts is False


def inactive_governor(hub: FakeHub, tmp_path, name: str) -> Governor:
    """Servers without reports, culled by jupyterhub-idle-culler's rule (``inactive_timeout``)
    on their Hub activity, deciding only what changed."""
    return governor(hub, tmp_path, name, Dcgm(), full_every=1000)


@pytest.mark.parametrize("change", ["none", "activity", "restart"])
async def test_a_cull_rests_on_the_hub_model_read_just_before_it(tmp_path, monkeypatch, change):
    """Between full listings a server is decided on the model its user's last listing brought;
    its cull reads the user afresh first. A server with new activity on the Hub, or restarted,
    that the listing missed (its user's activity did not move: late, past the listing's lag) is
    not culled: the cull is skipped on record and the next pass, asking for that user, decides
    on what the Hub says. Nothing changed: the cull goes ahead at its deadline."""
    frozen = [clock.utcnow()]
    monkeypatch.setattr(clock, "utcnow", lambda: frozen[0])
    async with FakeHub() as hub:
        start = frozen[0]
        hub.add_server("user0", last_activity=start)  # the default policy: inactive after 90m
        gov = inactive_governor(hub, tmp_path, "gov")
        fresh_reads = counting(gov.hub, "get_server")
        for _ in range(8):  # 80 minutes: no cull yet
            frozen[0] += timedelta(minutes=10)
            await gov.reconcile()
        assert not gov.hub_listing.full  # the user's activity is old: not listed
        assert "user0" not in gov.hub_listing.listed
        server = hub.users["user0"].servers[""]
        if change == "activity":  # reached the Hub's server model, not (yet) the user's
            server.last_activity = frozen[0]
        elif change == "restart":  # a new session, which the Hub saw start
            server.started = server.last_activity = frozen[0]
        frozen[0] += timedelta(minutes=11)  # 91 minutes: inactive, as the model last listed
        await gov.reconcile()
        await gov.background_done()
        said = [(a.action, a.reason) for a in gov.store.audit_rows("user0/", limit=100)]
        # (a cull sent reads the Hub's session once more, in its DELETE's slot)
        assert fresh_reads[0] == (2 if change == "none" else 1)
        if change == "none":
            assert not hub.running("user0")
            assert said[0][0] == "cull" and "inactive since" in said[0][1]
            await gov.close()
            return
        assert hub.running("user0")
        assert hub.counters["stops"] == 0
        action, why = said[0]
        assert action == "cull-skipped"
        assert ("new activity on the Hub" if change == "activity" else "restarted") in why
        # The next pass asks for the user and decides on the Hub's model: not inactive now.
        frozen[0] += timedelta(minutes=1)
        await gov.reconcile()
        await gov.background_done()
        assert "user0" in gov.hub_listing.listed
        assert hub.running("user0")
        assert gov.verdict("user0/")["state"] == "active"
        await gov.close()


async def test_the_users_of_culled_servers_are_read_once_and_a_new_server_of_theirs_is_seen(
    tmp_path, monkeypatch
):
    """A stop stamps its user's activity as it happens (``User.stop``), not late: the users
    of the servers a pass culled, without a server now, are read at the next pass (their
    servers found gone) and not again at each pass while their activity is within the Hub's
    lag (hub/listing.py). One who starts a server again is active, and read back that lag: the
    next pass sees the new server, even if the Hub's activity of it is a few minutes old."""
    frozen = [clock.utcnow()]
    monkeypatch.setattr(clock, "utcnow", lambda: frozen[0])
    async with FakeHub() as hub:
        users = [f"user{i}" for i in (0, 3, 6, 9)]  # the default policy: inactive after 90m
        for user in users:
            hub.add_server(user, last_activity=frozen[0])
        hub.add_server("user12", last_activity=frozen[0] + timedelta(minutes=90))  # stays
        gov = inactive_governor(hub, tmp_path, "gov")
        for _ in range(9):  # 90 minutes
            frozen[0] += timedelta(minutes=10)
            await gov.reconcile()
        frozen[0] += timedelta(minutes=1)
        await gov.reconcile()
        await gov.background_done()
        assert not any(hub.running(u) for u in users)  # culled
        frozen[0] += timedelta(minutes=1)
        await gov.reconcile()  # finds them gone
        assert set(users) <= gov.hub_listing.listed
        assert not any(gov.rows[f"{u}/"].running for u in users)
        for _ in range(3):  # within the Hub's activity lag of the culls
            frozen[0] += timedelta(minutes=1)
            await gov.reconcile()
            assert not gov.hub_listing.full
            assert not set(users) & gov.hub_listing.listed
        # user3 starts a server again; the Hub's activity of it lags by 4 minutes.
        hub.add_server("user3", started=frozen[0], last_activity=frozen[0] - timedelta(minutes=4))
        frozen[0] += timedelta(minutes=1)
        await gov.reconcile()
        assert not gov.hub_listing.full
        assert gov.hub_listing.listed & set(users) == {"user3"}
        assert gov.rows["user3/"].running
        assert gov.verdict("user3/")["state"] == "active"
        await gov.close()


async def test_reports_of_servers_not_running_are_forgotten_once_stale(tmp_path, monkeypatch):
    """A report of a server no pass sees running (stopped, or not started yet) is kept until it
    goes stale (``report_stale_after``, 5 minutes) and then forgotten; a later report keeps it
    that much longer; a running server's report is kept (hub/incremental.py: a heap of stale
    times, not every such report looked at every pass)."""
    frozen = [clock.utcnow()]
    monkeypatch.setattr(clock, "utcnow", lambda: frozen[0])
    uuid = "GPU-00000000-0000-0000-0000-000000000000"
    async with FakeHub() as hub:
        for user in ("user0", "user3"):
            hub.add_server(user, last_activity=frozen[0])
        gov = governor(hub, tmp_path, "gov", Dcgm(), full_every=1000)

        async def minute(*reporting: str) -> None:
            frozen[0] += timedelta(minutes=1)
            for user in reporting:
                gov.ingest(report_for(user, uuid, sm=0.9))
            await gov.reconcile()

        await minute("user0", "user3", "user6")  # user6 has no server on the Hub
        user = hub.users["user0"]  # user0's server stops, as the Hub's User.stop does
        user.servers.pop("")
        user.last_activity = frozen[0]
        hub._reindex(user)
        await minute("user3", "user6")
        assert not gov.rows["user0/"].running and "user0/" in gov.reports  # not stale yet
        for _ in range(5):  # user0's report 6 minutes old, user6's (renewed a minute later) 5
            await minute()
        assert "user0/" not in gov.reports
        assert "user6/" in gov.reports and "user3/" in gov.reports
        await minute()
        assert "user6/" not in gov.reports  # 6 minutes old now
        assert "user3/" in gov.reports  # its server runs (stale, and said so in its verdict)
        await gov.close()


async def test_culls_past_a_pass_s_bound_of_fresh_reads_wait_for_the_next_pass(
    tmp_path, monkeypatch
):
    """A pass asks for at most ``fresh_reads`` users before their culls (hub/listing.py): the
    culls past it are not decided this pass (``cull-waits`` on record once per wait, the
    server still running and warned of nothing new) and are made at a later pass."""
    frozen = [clock.utcnow()]
    monkeypatch.setattr(clock, "utcnow", lambda: frozen[0])
    monkeypatch.setattr("jupyter_gpu_gov.hub.reconcile.fresh_reads", lambda *_: 2)
    async with FakeHub() as hub:
        users = [f"user{i}" for i in (0, 3, 6, 9, 12)]  # the default policy
        for user in users:
            hub.add_server(user, last_activity=frozen[0])
        gov = inactive_governor(hub, tmp_path, "gov")
        for _ in range(8):
            frozen[0] += timedelta(minutes=10)
            await gov.reconcile()
        assert all(hub.running(u) for u in users)
        frozen[0] += timedelta(minutes=11)  # 91 minutes: all five inactive at once
        await gov.reconcile()
        await gov.background_done()
        culled = [u for u in users if not hub.running(u)]
        waiting = [u for u in users if hub.running(u)]
        assert len(culled) == 2 and len(waiting) == 3
        for user in waiting:
            (action, why), *_ = [(a.action, a.reason) for a in gov.store.audit_rows(f"{user}/")]
            assert action == "cull-waits" and "waits for the next pass" in why, why
            assert gov.verdict(f"{user}/")["state"] == "active"
        # The culls past the bound move by one pass: two more culled at the next, then the last.
        for remaining in (1, 0):
            frozen[0] += timedelta(minutes=1)
            await gov.reconcile()
            await gov.background_done()
            assert sum(hub.running(u) for u in users) == remaining
        # Three culls waited, the last for two passes: each wait on record once.
        waits = [
            a for u in users for a in gov.store.audit_rows(f"{u}/") if a.action == "cull-waits"
        ]
        assert len(waits) == 3
        await gov.close()


async def test_a_pass_visits_only_the_servers_whose_inputs_moved(tmp_path, monkeypatch):
    """Between full passes, servers that report what they did are not visited: each report was
    compared as it arrived, and the ledger, the history and the gauges take the others as they
    were without a look at each. A pass looks at the one server whose report moved, and at the
    servers whose history keyframe falls due; the ledger still bills every server to the last
    pass, and the gauges still count every one."""
    frozen = [clock.utcnow()]
    monkeypatch.setattr(clock, "utcnow", lambda: frozen[0])
    users = [f"user{i}" for i in range(0, 60, 3)]  # 20 servers, the default policy
    uuids = {u: f"GPU-{i:08d}-0000-0000-0000-000000000000" for i, u in enumerate(users)}
    async with FakeHub() as hub:
        start = frozen[0]
        for user in users:
            hub.add_server(user, last_activity=start)
        gov = governor(hub, tmp_path, "gov", Dcgm(), full_every=1000)
        observed, recorded = counting(gov, "_observe"), counting(gov, "_look")
        compared, gauged = counting(gov, "_report_moved"), counting(gov.gauges, "set")
        visits = []  # per pass: (observed, recorded, compared in the pass, gauges set)

        async def minute(moved: str | None = None) -> None:
            frozen[0] += timedelta(minutes=1)
            for user in users:
                gov.ingest(report_for(user, uuids[user], sm=0.0 if user == moved else 0.9))
            before = observed[0], recorded[0], compared[0], gauged[0]
            await gov.reconcile()
            after = observed[0], recorded[0], compared[0], gauged[0]
            visits.append(tuple(b - a for a, b in zip(before, after, strict=True)))

        for _ in range(6):
            await minute()
        await minute(moved="user3")
        # The first pass decides every server; it wrote their rows, but deciding them again on
        # the same inputs would write nothing: the second decides none (``_settled``).
        assert visits[0] == (20, 20, 0, 20)
        assert visits[1:6] == [(0, 0, 0, 0)] * 5  # then none: nothing moved
        assert visits[6] == (1, 1, 0, 1)  # only the server whose report moved
        gov.flush_usage()  # the ledger's write: billed to the last pass, every one
        for user in users:
            session = gov.ledger.open[f"{user}/"]
            assert session.at == frozen[0]
            assert session.allocated == pytest.approx(7 * 60 * session.gpus, abs=1)
        team = {
            labels: value
            for (name, labels), (_, value) in samples().items()
            if name == "jupyter_gpu_gov_team_servers"
        }
        assert sum(team.values()) == 20
        while frozen[0] - start < timedelta(seconds=KEYFRAME_S + 60):
            await minute()  # user3 active again: decided once (its row's write settled)
        assert visits[7] == (1, 1, 0, 1)
        assert set(visits[8:-1]) == {(0, 0, 0, 0)}
        # The others' history keyframes fell due (15 minutes after their first rows): recorded
        # then, on their kept views, without being observed again.
        assert visits[-1] == (0, 19, 0, 0)
        await gov.close()


@dataclass
class JitteringDcgm:
    """DCGM as a real exporter reads: each read a new record of every GPU, whose power, memory
    free, clocks' effects, PCIe bytes (under the floor when idle, far over it when busy), SM,
    DRAM and tensor activity and a busy GPU's memory used (within a 64 MiB step) move at every
    scrape though no GPU's work changed. ``records``: what each GPU's work is now."""

    records: dict[str, GpuEvidence] = field(default_factory=dict)
    reads: int = 0

    async def fetch(self) -> DcgmSnapshot:
        rng = random.Random(self.reads)
        self.reads += 1
        evidence = []
        for e in self.records.values():
            busy = bool(e.activity)
            evidence.append(
                replace(
                    e,
                    power_w=rng.uniform(250, 400) if busy else rng.uniform(55, 70),
                    memory_free_mb=rng.uniform(1000, 9000),
                    memory_used_mb=e.memory_used_mb + rng.randrange(32),  # within its step
                    pcie_bytes_per_s=(e.pcie_bytes_per_s or 0) + rng.uniform(0, 9e4),
                    sm_active=rng.uniform(0.5, 0.9) if busy else rng.uniform(0, 0.01),
                    dram_active=rng.uniform(0.2, 0.6) if busy else 0.0,
                    tensor_active=rng.uniform(0.1, 0.5) if busy else 0.0,
                )
            )
        return DcgmSnapshot(tuple(evidence), clock.utcnow())


def test_a_dcgm_record_reads_the_same_whatever_was_read_before():
    """What a decision reads of a DCGM record (``unchanged.dcgm_read``, every record of each new
    read) holds each activity's steps once read: a record reads as a fresh reader reads it,
    its activity read before, new, or back after more activities than are held."""
    read = dcgm_read([0.3, 0.05, 0.3], 1e6)

    def record(activity: float | None) -> GpuEvidence:
        return GpuEvidence(
            uuid="GPU-1",
            namespace="jhub",
            pod="jupyter-ann",
            activity=activity,
            pcie_bytes_per_s=2e6,
            memory_used_mb=1000.0,
        )

    activities = [i / 997 for i in range(3000)] + [0.05, 0.3, 0.0, 1.0, None, 0.29999]
    for _ in range(2):  # (the second time: read before, or forgotten and read anew)
        for activity in activities:
            got = read(record(activity))
            assert type(got) is DcgmRead
            assert got == dcgm_read([0.05, 0.3], 1e6)(record(activity))
    reached = {a: read(record(a)).activity for a in (0.0, 0.04, 0.05, 0.29999, 0.3, 1.0, None)}
    assert reached == {
        0.0: (0, 0),
        0.04: (4, 0),
        0.05: (5, 1),  # at an idle threshold: reaches it
        0.29999: (30, 1),
        0.3: (30, 2),
        1.0: (100, 2),
        None: None,
    }
    assert read(record(0.5)).pcie_busy and read(record(0.5)).memory == 15


async def test_a_dcgm_record_moving_in_what_no_decision_reads_decides_nobody_again(
    tmp_path, monkeypatch
):
    """A real dcgm-exporter's records move at every scrape (power, memory, PCIe bytes, the SM
    activity the diagnosis reads) while the GPUs' work stands still: the servers found in DCGM
    by their pod are decided once, not again at every pass; a move in what a decision or its
    history row reads of a record (``unchanged.dcgm_read``: the activity against the idle
    threshold and in the history's steps, PCIe against the floor, memory used in the history's
    steps, health, the pod) decides that server again, as deciding every server does. Compared
    whole, the records had every server decided at every pass (docs/benchmarks-history.md,
    "Issue 26, wave 39")."""
    monkeypatch.setattr(clock, "adopt_step", lambda: 0.0)
    monkeypatch.setattr(ingest, "HUB_LOOKUP_EVERY", -1.0)
    frozen = [clock.utcnow()]
    monkeypatch.setattr(clock, "utcnow", lambda: frozen[0])
    dcgm = JitteringDcgm()
    users = [f"user{i}" for i in range(8)]
    async with FakeHub() as full_hub, FakeHub() as inc_hub:
        full = governor(full_hub, tmp_path, "full", dcgm, full_every=1)
        inc = governor(inc_hub, tmp_path, "inc", dcgm, full_every=1000)
        decided: list[str] = []  # the servers the incremental governor decided
        govern = inc._govern

        def deciding(server, *args):
            decided.append(server.user)
            return govern(server, *args)

        inc._govern = deciding
        # Whose kept inputs (what a decision read of DCGM and the diagnosis) the incremental
        # governor worked out to compare, in the pass now: a server looked at is compared once,
        # as the pass plans, never a second time as it is decided.
        worked_out: Counter[str] = Counter()
        inputs = inc._inputs

        def working_out(key, *args):
            worked_out[key] += 1
            return inputs(key, *args)

        inc._inputs = working_out
        for i, user in enumerate(users):
            uuid = f"GPU-{i:08d}-0000-0000-0000-000000000000"
            busy = i % 2 == 0
            dcgm.records[uuid] = GpuEvidence(
                uuid=uuid,
                gpu_index=i,
                hostname="node-1",
                namespace="jhub",
                pod=f"jupyter-{user}",
                activity=0.9 if busy else 0.0,
                activity_source="gr_engine_active",
                pcie_bytes_per_s=3e8 if busy else 1e5,
                memory_used_mb=20480.0 if busy else 0.0,
                health=Health(),
            )
            state = {"pod_name": f"jupyter-{user}", "namespace": "jhub"}
            for hub in (full_hub, inc_hub):
                hub.add_server(user, last_activity=clock.utcnow(), state=dict(state))

        idle_since = clock.isoformat(clock.utcnow())

        async def passes(n: int) -> set[str]:
            """``n`` passes of both governors, 10 s apart; whom the incremental one decided.
            Both decide the same, each pass (``everything``)."""
            decided.clear()
            for _ in range(n):
                frozen[0] += timedelta(seconds=10)
                for gov in (full, inc):
                    for i, user in enumerate(users):
                        if i % 4 == 1:  # some run the extension: their reports as well
                            uuid = f"GPU-{i:08d}-0000-0000-0000-000000000000"
                            report = report_for(user, uuid, sm=0.0)
                            report["window"]["gpu_idle_since"] = idle_since  # as kept
                            gov.ingest(report)
                    worked_out.clear()
                    await gov.reconcile()
                    await gov.background_done()
                    assert max(worked_out.values(), default=0) <= 1, worked_out
                a, b = everything(full, full_hub), everything(inc, inc_hub)
                assert a == b
            return set(decided)

        await passes(3)  # the first decides every server, the next their reports' first moves
        assert await passes(3) == set()  # every record moved at every read: nobody decided

        def change(i: int, **fields) -> None:
            uuid = f"GPU-{i:08d}-0000-0000-0000-000000000000"
            dcgm.records[uuid] = replace(dcgm.records[uuid], **fields)

        # Each change of what a decision reads decides its server again, and nobody else: in
        # the pass whose read (taken after the pass before) has it, and in the next if that
        # decision changed something (one that did is never kept).
        for i, fields in [
            (0, {"activity": 0.0, "pcie_bytes_per_s": 1e5}),  # work stopped: idle
            (2, {"pcie_bytes_per_s": 1e5, "activity": 0.01}),  # idle, a history step over 0
            (3, {"pcie_bytes_per_s": 5e6}),  # copies over the floor: busy
            (4, {"memory_used_mb": 20480.0 + 200}),  # memory over a history step
            (6, {"activity": 0.049}),  # busy still (its PCIe), some history steps lower
            (2, {"activity": 0.0199}),  # idle still (the threshold: 0.02), in the step of 2 %
            (2, {"activity": 0.0201}),  # busy, in the same history step
            (7, {"pod": "jupyter-user7-2"}),  # another pod holds it now
            (5, {"health": FAILURES[0]}),  # an XID (decided at every pass while it lasts)
            (5, {"health": Health()}),  # and cleared
        ]:
            change(i, **fields)
            assert await passes(3) == {users[i]}, fields
        assert await passes(2) == set()
        await full.close()
        await inc.close()


async def test_a_pass_reads_each_servers_hub_records_once(tmp_path, monkeypatch):
    """A decided server's Hub records (its spawner state: the pod KubeSpawner runs it in) and
    DCGM's records of its GPUs are read once a pass, however many parts of the pass ask (its
    decision, the check of its report against them, its kept inputs, the ledger, its history
    row): read for each, they were five to seven times a server. Read from its Hub model,
    never its report, and anew for a new model (a restart in another pod) and a new DCGM read:
    what they say is this pass's."""
    frozen = [clock.utcnow()]
    monkeypatch.setattr(clock, "utcnow", lambda: frozen[0])
    users = [f"user{i}" for i in range(0, 12, 3)]
    uuids = {u: f"GPU-{i:08d}-0000-0000-0000-000000000000" for i, u in enumerate(users)}
    dcgm = Dcgm(
        activity=dict.fromkeys(uuids.values(), 0.0),
        pods={uuids[u]: ("jhub", f"jupyter-{u}") for u in users},
    )
    read: Counter[str] = Counter()  # the spawner states read, by the pod they name
    of = trusted.Granted.of.__func__

    def reading(cls, state):
        read[(state or {}).get("pod_name")] += 1
        return of(cls, state)

    monkeypatch.setattr(trusted.Granted, "of", classmethod(reading))
    async with FakeHub() as hub:
        for user in users:
            state = {"pod_name": f"jupyter-{user}", "namespace": "jhub"}
            hub.add_server(user, last_activity=frozen[0], state=state)
        gov = governor(hub, tmp_path, "gov", dcgm, full_every=1)  # every server decided

        async def minute() -> dict[str, str]:
            frozen[0] += timedelta(minutes=1)
            for user in users:
                gov.ingest(report_for(user, uuids[user], sm=0.0))  # its report: idle
            read.clear()
            await gov.reconcile()
            return {user: gov.verdict(f"{user}/")["state"] for user in users}

        assert set((await minute()).values()) == {"idle"}
        assert read == {f"jupyter-{user}": 1 for user in users}
        dcgm.activity[uuids["user0"]] = 0.9  # DCGM's word on the pod's GPU is final
        states = await minute()
        assert states["user0"] == "active" and states["user3"] == "idle"
        assert read == {f"jupyter-{user}": 1 for user in users}
        # user3 restarted in user0's pod (its busy GPU): its new model is read, not the last.
        hub.users["user3"].servers[""].state = {"pod_name": "jupyter-user0", "namespace": "jhub"}
        dcgm.activity[uuids["user0"]] = 0.0
        dcgm.activity[uuids["user3"]] = 0.9  # its old pod's GPU: no longer its own
        states = await minute()
        assert states["user3"] == "idle" and states["user0"] == "idle"
        assert read == {"jupyter-user0": 2, "jupyter-user6": 1, "jupyter-user9": 1}
        await gov.close()
