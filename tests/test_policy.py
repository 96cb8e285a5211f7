"""The policy engine, cycle by cycle, as the governor would run it."""

from __future__ import annotations

import weakref
from dataclasses import fields, replace
from datetime import datetime, timedelta, timezone

import pytest

from jupyter_gpu_gov.core import policy as p
from jupyter_gpu_gov.core.durations import parse_duration

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)
MIN = timedelta(minutes=1)

POLICY = p.Policy(
    warn_after=timedelta(minutes=30),
    cull_after=timedelta(minutes=60),
    user_activity_grace=timedelta(minutes=10),
    busy_grace=timedelta(minutes=20),
    extension_step=timedelta(minutes=30),
    max_extensions=1,
    checkpoint_timeout=timedelta(minutes=5),
)


# Culled at 3 h of age whatever it does, warned 30 min before.
CAPPED = replace(POLICY, max_age=timedelta(hours=3), max_age_warning=timedelta(minutes=30))


def active_view(**kw) -> p.ServerView:
    return replace(idle_view(**kw), gpu=p.GpuSignal(True, True))


def idle_view(**kw) -> p.ServerView:
    gpu = p.GpuSignal(holds_gpu=True, active=False)
    return p.ServerView("alice", started=T0, reports=True, gpu=gpu, **kw)


def run(view, policy=POLICY, minutes=120, record=None, step=1, on_checkpoint=None):
    """Decide once a minute until a cull; return the actions as (minute, action, state) and the
    last decision."""
    record = record or p.Record()
    seen = []
    decision = None
    for minute in range(0, minutes + 1, step):
        now = T0 + minute * MIN
        if record.checkpoint_status == "requested" and on_checkpoint is not None:
            record = replace(record, checkpoint_status=on_checkpoint)
        v = view(minute) if callable(view) else view
        decision = p.decide(v, record, policy, now)
        record = decision.record
        seen += [(minute, action, decision.state) for action in decision.actions]
        if decision.state == "culled":
            break
    return seen, decision


def test_idle_gpu_is_warned_then_checkpointed_then_culled():
    actions, last = run(idle_view(), minutes=61, on_checkpoint="done")
    assert actions == [
        (30, "warn", "warned"),
        (60, "checkpoint", "checkpointing"),
        (61, "cull", "culled"),
    ]
    assert "GPU idle for 1h 1m" in last.reason and "checkpoint saved" in last.reason
    assert last.cull_reason == "gpu-idle"


def test_active_gpu_is_never_warned_whatever_jupyter_says():
    view = p.ServerView(
        "alice",
        started=T0,
        hub_last_activity=T0,
        user_last_activity=T0,
        reports=True,
        gpu=p.GpuSignal(holds_gpu=True, active=True),
    )
    actions, last = run(view, minutes=600)
    assert actions == [] and last.state == "active"


def test_gpu_activity_restarts_the_idle_clock():
    def view(m):
        return (
            idle_view() if m < 25 or m > 26 else replace(idle_view(), gpu=p.GpuSignal(True, True))
        )

    actions, _ = run(view, on_checkpoint="done")
    assert actions[0] == (57, "warn", "warned")


def test_unknown_gpu_data_is_never_idle():
    view = replace(
        idle_view(), gpu=p.GpuSignal(holds_gpu=True, active=None, detail="MIG without GPM")
    )
    actions, last = run(view, minutes=600)
    assert actions == [] and last.state == "unknown" and "MIG without GPM" in last.reason


def test_unknown_stretch_does_not_count_as_idle_time():
    unknown = replace(idle_view(), gpu=p.GpuSignal(True, None))
    view = lambda m: unknown if m < 100 else idle_view()  # noqa: E731
    actions, _ = run(view, minutes=200, on_checkpoint="done")
    assert actions[0] == (130, "warn", "warned")


def test_unknown_pauses_the_idle_clock_and_keeps_extensions():
    unknown = replace(idle_view(), gpu=p.GpuSignal(True, None))
    record = p.Record()
    for minute in range(0, 31):
        record = p.decide(idle_view(), record, POLICY, T0 + minute * MIN).record
    record = p.extend(record, POLICY, "almost done").record
    for minute in range(31, 80):  # the GPU goes unknown for 49 minutes
        record = p.decide(unknown, record, POLICY, T0 + minute * MIN).record
    assert record.state == "unknown" and record.extensions_used == 1
    decision = p.decide(idle_view(), record, POLICY, T0 + 80 * MIN)
    # 31 idle minutes before the pause: the deadline (60 + 30 extension) moved by 49 minutes.
    assert decision.cull_at == T0 + (90 + 49) * MIN
    assert decision.record.extensions_used == 1


def test_recent_user_activity_holds_the_cull_back_but_not_the_warning():
    short = replace(POLICY, warn_after=timedelta(minutes=55))  # a 5-minute notice
    view = lambda m: replace(idle_view(), user_last_activity=T0 + min(m, 58) * MIN)  # noqa: E731
    actions, _ = run(view, short, minutes=90, on_checkpoint="done")
    # Active until minute 58: the cull waits for user_activity_grace (10 minutes), the longer.
    assert actions[:2] == [(55, "warn", "warned"), (68, "checkpoint", "checkpointing")]


def test_an_owner_back_after_the_warning_gets_its_full_notice():
    # Warned at minute 30 while away; back and active until minute 58: a 10-minute grace would
    # cull at 68, but a person who has read the warning gets its notice (30 minutes) from their
    # last interaction.
    view = lambda m: replace(idle_view(), user_last_activity=T0 + min(m, 58) * MIN)  # noqa: E731
    actions, _ = run(view, minutes=100, on_checkpoint="done")
    assert actions[:2] == [(30, "warn", "warned"), (88, "checkpoint", "checkpointing")]
    assert [a for a in actions if a[1] == "warn"] == [(30, "warn", "warned")]  # warned once


def test_a_presence_limit_bounds_how_long_interaction_alone_holds_an_idle_gpu():
    """A person at the notebook (or a server that says so: its word is all there is) holds an
    idle GPU's cull for as long as they interact. With `presence_limit`, that hold ends that
    long after the GPU went idle, plus what Extend granted: the warning's notice runs then."""
    typing = lambda m: replace(idle_view(), user_last_activity=T0 + (m // 10) * 10 * MIN)  # noqa: E731
    actions, last = run(typing, minutes=24 * 60, on_checkpoint="done")
    assert [a[1] for a in actions] == ["warn"] and last.state == "warned"  # never culled

    limited = replace(POLICY, presence_limit=timedelta(hours=4))
    actions, last = run(typing, limited, minutes=24 * 60, on_checkpoint="done")
    assert [a for a in actions if a[1] != "warn"] == [
        (240, "checkpoint", "checkpointing"),
        (241, "cull", "culled"),
    ]
    assert [a[1] for a in actions].count("warn") == 1  # warned once, at 30 minutes
    # An Extend moves the limit by its step (30 minutes here), as it moves the idle clock.
    record = p.Record()
    for minute in range(0, 100):
        record = p.decide(typing(minute), record, limited, T0 + minute * MIN).record
    record = p.extend(record, limited, "writing the paper").record
    checkpointed = None
    for minute in range(100, 24 * 60):
        record = p.decide(typing(minute), record, limited, T0 + minute * MIN).record
        if record.checkpoint_status == "requested":
            checkpointed = minute
            break
    assert checkpointed == 240 + 30
    with pytest.raises(p.PolicyError, match="'presence_limit': 'soon' is not a duration"):
        p.load_policies([], {"presence_limit": "soon"})
    assert p.load_policies([], {"presence_limit": None})[0].presence_limit is None


def test_an_owner_away_for_hours_is_warned_as_soon_as_the_gpu_goes_idle():
    # A training run finished unattended at T0; its owner last touched the notebook 3 h before.
    away = replace(idle_view(), user_last_activity=T0 - 3 * 60 * MIN)
    actions, _ = run(away, minutes=31, on_checkpoint="done")
    assert actions == [
        (0, "warn", "warned"),
        (30, "checkpoint", "checkpointing"),
        (31, "cull", "culled"),
    ]
    warned = p.decide(away, p.Record(), POLICY, T0 + 10 * MIN)
    assert "nobody has used the notebook since 2026-01-05 06:00 UTC" in warned.reason
    # The cull's reason says why it came at 31 minutes, not "cull after 1h".
    culled = run(away, minutes=31, on_checkpoint="done")[1]
    assert "cull after the warning's notice of 30m" in culled.reason, culled.reason
    assert "nobody has used the notebook since 2026-01-05 06:00 UTC" in culled.reason
    assert "cull after 1h" not in culled.reason


def test_a_warning_nobody_can_read_stands_only_as_long_as_the_hubs_lag():
    """The owner away (no interaction for away_after) and no Hub activity on the server since
    the warning went out (no tab open to show it, no kernel message): its notice is the Hub's
    own lag (15 min), enough for anyone who opens the notebook to show in the Hub's record,
    then the checkpoint and the cull. Anyone who turns up gets the full notice back."""
    gone = {"user_last_activity": T0 - 180 * MIN, "hub_last_activity": T0 - 5 * MIN}
    actions, last = run(idle_view(**gone), minutes=31, on_checkpoint="done")
    assert actions == [
        (0, "warn", "warned"),
        (15, "checkpoint", "checkpointing"),
        (16, "cull", "culled"),
    ]
    assert last.cull_reason == "gpu-idle"
    assert "no tab open to read it, so its notice is the Hub's own lag, 15m" in last.reason
    assert "cull after the warning's notice of 15m" in last.reason
    # The warning itself says the time it will keep: never a later reading bringing it forward.
    warned = p.decide(idle_view(**gone), p.Record(), POLICY, T0)
    assert warned.actions == ("warn",) and warned.cull_at == T0 + 15 * MIN
    assert "server stopped at 2026-01-05 09:15 UTC unless extended" in warned.reason

    # Someone opens the notebook at minute 10 (the Hub sees the tab): the full notice again.
    def arrives(minute):
        hub = T0 - 5 * MIN if minute < 10 else T0 + minute * MIN
        return idle_view(user_last_activity=T0 - 180 * MIN, hub_last_activity=hub)

    assert run(arrives, minutes=40, on_checkpoint="done")[0][:2] == [
        (0, "warn", "warned"),
        (30, "checkpoint", "checkpointing"),
    ]
    # A tab open all along, an owner who left an hour ago (not away at the warning), a
    # server DCGM alone sees, Hub activity unknown, away_after off: the notice as before.
    tab = lambda m: idle_view(user_last_activity=T0 - 180 * MIN, hub_last_activity=T0 + m * MIN)  # noqa: E731
    recently = idle_view(user_last_activity=T0 - 60 * MIN, hub_last_activity=T0 - 60 * MIN)
    for view, policy, stop_at in (  # its checkpoint, or its cull where none can be asked
        (tab, POLICY, 30),
        (recently, POLICY, 60),
        (dcgm_view(hub_last_activity=T0 - 5 * MIN), POLICY, 60),
        (idle_view(user_last_activity=T0 - 180 * MIN), POLICY, 30),
        (idle_view(**gone), replace(POLICY, away_after=None), 60),
    ):
        actions = run(view, policy, minutes=61, on_checkpoint="done")[0]
        assert actions[0][1] == "warn" and actions[1][0] == stop_at, (view, actions)
    # Extended (the owner, or an admin, was there): the usual clock and the extension.
    extended = p.extend(warned.record, POLICY, "a figure").record
    later = p.decide(idle_view(**gone), extended, POLICY, T0 + 14 * MIN)
    assert later.actions == () and later.cull_at >= T0 + 60 * MIN


def test_a_hub_that_gathers_activity_less_often_never_reads_a_present_owner_as_away():
    """The unread-warning rule reads the Hub's silence since the warning as nobody there. A
    Hub that gathers activity every 30 minutes (``last_activity_interval``, and the servers
    post theirs as seldom) shows the owner's open tab only at its next gathering: under the
    15 minutes of the default lag she was culled at minute 16 while reading the warning. Its
    own lag (65 minutes) is longer than the notice: she gets the full notice; and a lag not
    known judges no warning unread."""

    # Her tab is open all along; the Hub's record of it moves every 30 minutes.
    def present(minute, lag):
        seen = T0 - 5 * MIN + (minute + 5) // 30 * 30 * MIN
        return idle_view(
            user_last_activity=T0 - 180 * MIN, hub_last_activity=seen, hub_activity_lag=lag
        )

    assert p.hub_activity_lag(30 * MIN) == 65 * MIN
    assert p.hub_activity_lag(5 * MIN) == p.hub_activity_lag(MIN) == 15 * MIN
    default = run(lambda m: present(m, p.HUB_ACTIVITY_LAG), minutes=61, on_checkpoint="done")
    assert default[0][1] == (15, "checkpoint", "checkpointing")  # the wrong reading: gone
    for lag in (p.hub_activity_lag(30 * MIN), None):
        actions = run(lambda m, lag=lag: present(m, lag), minutes=61, on_checkpoint="done")[0]
        assert actions[:2] == [(0, "warn", "warned"), (30, "checkpoint", "checkpointing")]
    # Nobody there at all (no activity since the warning): its own lag is the notice, and the
    # reason names it; not known, the full notice.
    gone = {"user_last_activity": T0 - 180 * MIN, "hub_last_activity": T0 - 5 * MIN}
    slow = idle_view(**gone, hub_activity_lag=p.hub_activity_lag(10 * MIN))
    assert p.decide(slow, p.Record(), POLICY, T0).cull_at == T0 + 25 * MIN
    last = run(slow, minutes=61, on_checkpoint="done")[1]
    assert "no tab open to read it, so its notice is the Hub's own lag, 25m" in last.reason
    unknown = idle_view(**gone, hub_activity_lag=None)
    assert p.decide(unknown, p.Record(), POLICY, T0).cull_at == T0 + 30 * MIN


def test_a_tabs_polling_reads_no_warning_only_a_persons_interaction_does():
    """An owner away for away_after, a tab open all along (its report names a connection; its
    polling keeps the Hub's activity fresh whether or not anyone is at it): the warning's
    notice is the Hub's lag, as with no tab, until a person acts; whoever then does gets the
    full notice. A tab opened after the warning (none when it went out) is someone arriving."""
    away = T0 - 180 * MIN

    def tab(minute, acted=None):
        back = away if acted is None or minute < acted else T0 + acted * MIN
        return idle_view(
            user_last_activity=back, hub_last_activity=T0 + minute * MIN, tab_open=True
        )

    actions, last = run(tab, minutes=31, on_checkpoint="done")
    assert actions == [
        (0, "warn", "warned"),
        (15, "checkpoint", "checkpointing"),
        (16, "cull", "culled"),
    ]
    assert (
        "a tab open polls whether or not anyone is at it, so its notice is the Hub's own lag"
        in last.reason
    )
    # Someone runs a cell at minute 10: no longer away, the whole idle clock (an hour).
    actions = run(lambda m: tab(m, acted=10), minutes=61, on_checkpoint="done")[0]
    assert actions[:2] == [(0, "warn", "warned"), (60, "checkpoint", "checkpointing")]

    # No tab when it went out, one opened at minute 10 (the Hub sees it): the full notice.
    def opened(minute):
        hub = T0 - 5 * MIN if minute < 10 else T0 + minute * MIN
        return idle_view(user_last_activity=away, hub_last_activity=hub, tab_open=minute >= 10)

    assert run(opened, minutes=40, on_checkpoint="done")[0][:2] == [
        (0, "warn", "warned"),
        (30, "checkpoint", "checkpointing"),
    ]
    # The server says no tab (or nothing: an older one): the Hub's activity reads it, as before.
    for said in (False, None):
        view = lambda m, said=said: replace(tab(m), tab_open=said)  # noqa: E731
        assert run(view, minutes=31, on_checkpoint="done")[0][1][0] == 30
    # A new idle stretch forgets the tab of the last warning.
    warned = p.decide(tab(0), p.Record(), POLICY, T0).record
    assert warned.warned_beside_tab and not warned.new_idle_stretch().warned_beside_tab


def test_an_owner_away_for_less_than_away_after_gets_the_whole_idle_clock():
    recently = replace(idle_view(), user_last_activity=T0 - 90 * MIN)  # away_after is 2 h
    assert run(recently, minutes=61, on_checkpoint="done")[0][0] == (30, "warn", "warned")
    # An owner who leaves does not make a GPU that went idle earlier any less idle: the clock
    # runs from the idle start as before, and the warning it already sent keeps its notice.
    leaving = lambda m: replace(idle_view(), user_last_activity=T0 - 100 * MIN)  # noqa: E731
    actions, _ = run(leaving, minutes=61, on_checkpoint="done")
    assert actions[0] == (20, "warn", "warned") and actions[1] == (
        50,
        "checkpoint",
        "checkpointing",
    )
    # None turns it off.
    never = replace(POLICY, away_after=None)
    away = replace(idle_view(), user_last_activity=T0 - 3 * 60 * MIN)
    assert run(away, never, minutes=61, on_checkpoint="done")[0][0] == (30, "warn", "warned")


def test_an_away_owner_who_comes_back_gets_the_normal_clock_back():
    # Warned at once, back at minute 10: no longer away, the cull waits for the hour of GPU
    # idleness (which is also more than the warning's notice from their return).
    def view(m):
        back = T0 - 3 * 60 * MIN if m < 10 else T0 + 10 * MIN
        return replace(idle_view(), user_last_activity=back)

    actions, _ = run(view, minutes=60, on_checkpoint="done")
    assert actions[:2] == [(0, "warn", "warned"), (60, "checkpoint", "checkpointing")]


def test_a_deadline_given_by_an_extension_is_never_brought_forward_by_a_later_diagnosis():
    # Warned at 30, extended at 35 (the owner was there): the new deadline is 120. Later the
    # diagnosis (which a service restart also starts afresh) reads a confident zombie: the
    # owner is not warned "at once" again, and the deadline stands.
    idle = p.decide(idle_view(), p.Record(), POLICY, T0)
    warned = p.decide(idle_view(), idle.record, POLICY, T0 + 30 * MIN)
    assert warned.actions == ("warn",)
    extended = p.extend(warned.record, POLICY, "a figure").record
    before = p.decide(idle_view(), extended, POLICY, T0 + 35 * MIN)
    zombie = replace(idle_view(), cause="zombie", cause_confident=True)
    after = p.decide(zombie, before.record, POLICY, T0 + 40 * MIN)
    assert before.cull_at == T0 + 90 * MIN
    assert after.cull_at == before.cull_at and after.state == before.state


def busy_view(since, **kw) -> p.ServerView:
    """A kernel executing a cell since ``since`` while its GPU idles."""
    return replace(idle_view(**kw), gpu=p.GpuSignal(True, False, kernel_busy_since=since))


def dcgm_view(**kw) -> p.ServerView:
    """No extension: DCGM sees the pod's card idle, not its kernels."""
    gpu = p.GpuSignal(True, False, sees_cells=False, detail="DCGM, no report")
    return p.ServerView("bob", started=T0, gpu=gpu, **kw)


def test_a_cell_running_with_its_gpu_idle_gets_a_notice_naming_the_cause_not_a_cull():
    """The CPU stage of a pipeline holds its GPU context for hours: nobody is at the notebook
    to press Extend, and its cull would lose the work. Past busy_grace it is listed as busy
    with a notice naming the cause and what to do; the idle warning it got before the cell
    started does not stand."""

    def view(minute):
        if minute < 50:
            return idle_view()
        return busy_view(T0 + 50 * MIN, cause="cpu_serial", cause_confident=True)

    actions, last = run(view, minutes=470, on_checkpoint="done")
    assert actions == [(30, "warn", "warned"), (70, "busy-notice", "busy")]
    assert last.state == "busy" and last.cull_at == T0 + (480 + 30) * MIN
    assert "a kernel is executing a cell since 2026-01-05 09:50 UTC" in last.reason
    assert "(the diagnosis: a CPU-bound step)" in last.reason
    assert "press Extend" in last.reason and "interrupted and checkpointed" in last.reason
    # Extend works as for an idle kernel: the busy limit moves by the extension step.
    granted = p.extend(last.record, POLICY, "the next stage is training")
    assert granted.status == "granted"
    later = p.decide(view(471), granted.record, POLICY, T0 + 471 * MIN)
    assert later.state == "busy" and later.cull_at == T0 + (480 + 30 + 30) * MIN


def test_a_short_cpu_cell_after_the_warning_keeps_one_warning_and_its_deadline():
    """Warned at minute 30 (cull at 60), the owner runs a 5-minute CPU cell, the GPU idle
    throughout: the warning stands through the cell — the same state, warning time and
    deadline in JupyterLab, no second ``warn`` — and the cull comes at 60, after the cell.
    Someone working on CPU cells with a GPU held is not warned again after every cell."""

    def cell(start, end, person=False):
        def view(minute):
            back = {"user_last_activity": T0 + start * MIN} if person and minute >= start else {}
            return (
                busy_view(T0 + start * MIN, **back) if start <= minute < end else idle_view(**back)
            )

        return view

    actions, _ = run(cell(40, 45), minutes=70, on_checkpoint="done")
    assert actions == [
        (30, "warn", "warned"),
        (60, "checkpoint", "checkpointing"),
        (61, "cull", "culled"),
    ]
    # What JupyterLab shows, minute by minute, from the warning to the deadline.
    record, shown = p.Record(), set()
    for minute in range(0, 60):
        decision = p.decide(cell(40, 45)(minute), record, POLICY, T0 + minute * MIN)
        record = decision.record
        verdict = p.verdict(decision, POLICY).to_json()
        if minute >= 30:
            shown.add((verdict["state"], verdict["warn_at"], verdict["cull_at"]))
        if minute == 42:
            assert "a kernel is executing a cell since 2026-01-05 09:40 UTC" in decision.reason
            assert "server stopped at 2026-01-05 10:00 UTC unless extended, not while" in (
                decision.reason
            )
            during = decision
    assert shown == {("warned", "2026-01-05T09:30:00.000Z", "2026-01-05T10:00:00.000Z")}
    # The owner ran the cell: present, they get the warning's full notice from their last
    # interaction (as with any interaction), still one warning; the deadline only moves later.
    actions, _ = run(cell(40, 45, person=True), minutes=80, on_checkpoint="done")
    assert actions[:2] == [(30, "warn", "warned"), (70, "checkpoint", "checkpointing")]
    # Extend works during the cell as at any time: the next warning announces the new deadline.
    granted = p.extend(during.record, POLICY, "one more stage")
    assert granted.status == "granted"
    record, seen = granted.record, []
    for minute in range(43, 100):
        decision = p.decide(cell(40, 45)(minute), record, POLICY, T0 + minute * MIN)
        record = decision.record
        seen += [(minute, a) for a in decision.actions]
    assert seen[:2] == [(60, "warn"), (90, "checkpoint")]


def test_a_cell_that_outlives_the_warned_deadline_is_never_culled_and_warned_afresh_after():
    """A cell still running at the deadline it was warned of holds the cull: its own rules
    take over (the notice past busy_grace), and when it ends the owner gets a new warning
    with a full notice, not a cull as the cell finishes."""

    def view(minute):
        return busy_view(T0 + 50 * MIN) if 50 <= minute < 90 else idle_view()

    actions, _ = run(view, minutes=130, on_checkpoint="done")
    assert actions == [
        (30, "warn", "warned"),
        (70, "busy-notice", "busy"),
        (90, "warn", "warned"),
        (120, "checkpoint", "checkpointing"),
        (121, "cull", "culled"),
    ]


def test_a_checkpoint_asked_for_before_a_cell_ran_is_not_taken_as_the_culls():
    """The cull's checkpoint was asked for at minute 60 and a cell started as it went out (a
    cell submitted a moment before, the kernel not shown busy yet): whatever the answer, it
    does not describe the state the cell leaves. No cull while the cell runs, and after it the
    cull asks for a checkpoint of its own before it lands."""

    def view(minute, person=False):
        back = {"user_last_activity": T0 + 60 * MIN} if person and minute > 60 else {}
        return busy_view(T0 + 60 * MIN, **back) if 61 <= minute < 63 else idle_view(**back)

    actions, last = run(view, minutes=100, on_checkpoint="done")
    assert actions == [
        (30, "warn", "warned"),
        (60, "checkpoint", "checkpointing"),
        # The cell outlived the deadline it was warned of: a new warning with its notice.
        (63, "warn", "warned"),
        (93, "checkpoint", "checkpointing"),
        (94, "cull", "culled"),
    ]
    assert "checkpoint saved" in last.reason
    # The owner ran it: present, the warning stands (no second one) with their full notice.
    actions, _ = run(lambda m: view(m, person=True), minutes=100, on_checkpoint="done")
    assert actions == [
        (30, "warn", "warned"),
        (60, "checkpoint", "checkpointing"),
        (90, "checkpoint", "checkpointing"),
        (91, "cull", "culled"),
    ]


def run_sleep_loop(policy, on_checkpoint="done", owner_back=None, minutes=200):
    """A `while True: time.sleep(1)` cell until it is interrupted; the owner interacts at
    minute ``owner_back``, if given. Returns the actions and the last decision."""
    interrupted = []

    def view(minute):
        back = (
            {}
            if owner_back is None or minute < owner_back
            else {"user_last_activity": T0 + owner_back * MIN}
        )
        return idle_view(**back) if interrupted else busy_view(T0, **back)

    record, seen = p.Record(), []
    for minute in range(0, minutes):
        if record.checkpoint_status == "requested":
            record = replace(record, checkpoint_status=on_checkpoint)
        decision = p.decide(view(minute), record, policy, T0 + minute * MIN)
        record = decision.record
        seen += [(minute, a, decision.state) for a in decision.actions]
        interrupted += [minute] if "interrupt" in decision.actions else []
        if decision.state == "culled":
            break
    return seen, decision


def test_the_busy_limit_warns_then_interrupts_and_checkpoints_then_culls_as_announced():
    """after_interrupt "cull" (opt-in): the warning says the cell is interrupted and
    checkpointed, then the server stopped; once the interrupt's checkpoint is saved, the
    server is culled at once: no second warning, no second checkpoint."""
    limited = replace(POLICY, busy_limit=timedelta(hours=2), after_interrupt="cull")
    seen, decision = run_sleep_loop(limited)
    assert seen == [
        (20, "busy-notice", "busy"),
        (120, "warn", "warned"),
        (150, "interrupt", "checkpointing"),
        (150, "checkpoint", "checkpointing"),
        (151, "cull", "culled"),
    ]
    assert decision.cull_reason == "busy-limit"
    assert decision.warn_at == T0 + 120 * MIN  # the warning that announced it
    assert "its cell was interrupted at 2026-01-05 11:30 UTC past its limit" in decision.reason
    assert "checkpoint saved: server stopped, as the warning of 2026-01-05 11:00 UTC said" in (
        decision.reason
    )
    warned = p.decide(busy_view(T0), p.Record(idle_since=T0), limited, T0 + 121 * MIN)
    assert "the cell interrupted and checkpointed, then the server stopped at" in warned.reason
    # While the checkpoint is taken, the stop is due (JupyterLab: "saving a checkpoint, then
    # this server will be stopped").
    _, waiting = run_sleep_loop(limited, on_checkpoint="requested", minutes=153)
    assert (waiting.state, waiting.cull_at) == ("checkpointing", T0 + 150 * MIN)
    # Its checkpoint request says why the cull follows (the owner's "stopped because").
    assert waiting.cull_reason == "busy-limit"
    shutdown = replace(limited, cull_action="shutdown-kernels")
    warned = p.decide(busy_view(T0), p.Record(idle_since=T0), shutdown, T0 + 121 * MIN)
    assert "then the kernels shut down at" in warned.reason


def test_after_interrupt_warn_the_idle_rules_start_over_as_they_do_when_nobody_was_told():
    """after_interrupt "warn" (the default: the interrupt keeps the kernel and its state); and,
    whatever the key, an owner back since the warning, or a checkpoint that failed: the idle
    rules warn with their own notice and checkpoint again."""
    warn = replace(POLICY, busy_limit=timedelta(hours=2))
    assert warn.after_interrupt == "warn"
    seen, decision = run_sleep_loop(warn)
    assert seen[3:] == [
        (150, "checkpoint", "checkpointing"),
        (151, "warn", "warned"),  # the cell stopped: the idle rules warn with their own notice
        (181, "checkpoint", "checkpointing"),
        (182, "cull", "culled"),
    ]
    assert decision.cull_reason == "gpu-idle"
    warned = p.decide(busy_view(T0), p.Record(idle_since=T0), warn, T0 + 121 * MIN)
    assert "the cell interrupted and checkpointed at" in warned.reason
    assert "then the" not in warned.reason
    limited = replace(warn, after_interrupt="cull")
    # The owner interacted after the warning (without Extend): present, so no cull at once.
    # (Back after the warning: the interrupt waits the notice from then, 135 + 30.)
    seen, decision = run_sleep_loop(limited, owner_back=135)
    assert [a[:2] for a in seen][2:5] == [(165, "interrupt"), (165, "checkpoint"), (166, "warn")]
    assert decision.cull_reason == "gpu-idle"
    # The interrupt's checkpoint failed: the work is not saved, the idle rules take over.
    seen, decision = run_sleep_loop(limited, on_checkpoint="failed", minutes=400)
    assert [a[:2] for a in seen][3:5] == [(150, "checkpoint"), (151, "warn")]
    assert decision.cull_reason == "gpu-idle"


def test_the_verdict_says_a_cells_limit_interrupts_it_where_an_idle_warning_culls():
    """JupyterLab words the deadline from the verdict: with the default policy a cell's limit
    interrupts and checkpoints it and keeps the server (at_deadline "interrupt"), from the
    notice through the interrupt; an idle warning, after_interrupt "cull" and an earlier hard
    deadline are culls (null)."""
    limited = replace(POLICY, busy_limit=timedelta(hours=2))
    assert (limited.on_busy_limit, limited.after_interrupt) == ("interrupt", "warn")

    def at_deadline(policy, minute, record=None, view=None):
        view = view or busy_view(T0)
        decision = p.decide(view, record or p.Record(idle_since=T0), policy, T0 + minute * MIN)
        return decision.state, p.verdict(decision, policy).to_json()["at_deadline"]

    assert at_deadline(limited, 21) == ("busy", "interrupt")
    assert at_deadline(limited, 121) == ("warned", "interrupt")
    warned = p.Record(idle_since=T0, warned_at=T0 + 120 * MIN)
    assert at_deadline(limited, 150, warned) == ("checkpointing", "interrupt")
    _, waiting = run_sleep_loop(limited, on_checkpoint="requested", minutes=153)
    assert waiting.state == "checkpointing" and waiting.at_deadline == "interrupt"
    assert at_deadline(limited, 31, view=idle_view()) == ("warned", None)
    assert at_deadline(replace(limited, after_interrupt="cull"), 121) == ("warned", None)
    assert at_deadline(replace(limited, on_busy_limit="cull"), 121) == ("warned", None)
    # A maximum age due before the interrupt: the cull comes first.
    capped = replace(limited, max_age=timedelta(minutes=140))
    assert at_deadline(capped, 121) == ("warned", None)
    # A hard deadline announced that falls after the interrupt: the deadline shown is the
    # interrupt, which Extend moves, so the verdict does not call it hard (JupyterLab would
    # say "Hard deadline: the running cell will be interrupted" and disable Extend).
    announced = p.Record(idle_since=T0, state="warned", max_age_warned_at=T0 + 100 * MIN)
    interrupt = p.Decision(announced, cull_at=T0 + 150 * MIN, at_deadline="interrupt")
    assert p.verdict(interrupt, limited).to_json()["hard_deadline"] is False
    stop = replace(interrupt, at_deadline=None)
    assert p.verdict(stop, limited).to_json()["hard_deadline"] is True


def test_a_cell_the_interrupt_does_not_stop_is_culled_after_another_notice():
    limited = replace(POLICY, busy_limit=timedelta(hours=2))
    actions, last = run(busy_view(T0), limited, minutes=190, on_checkpoint="done")
    assert [a[:2] for a in actions] == [
        (20, "busy-notice"),
        (120, "warn"),
        (150, "interrupt"),
        (150, "checkpoint"),
        (151, "warn"),
        (181, "checkpoint"),
        (182, "cull"),
    ]
    assert last.cull_reason == "busy-limit" and "past the busy limit of 2h" in last.reason


def test_on_busy_limit_cull_interrupts_the_cell_for_its_checkpoint_then_culls():
    culls = replace(POLICY, busy_limit=timedelta(hours=2), on_busy_limit="cull")
    actions, last = run(busy_view(T0), culls, minutes=160, on_checkpoint="done")
    assert [a[:2] for a in actions][-3:] == [(150, "interrupt"), (150, "checkpoint"), (151, "cull")]
    assert last.cull_reason == "busy-limit" and "checkpoint saved" in last.reason


def test_restarting_cells_does_not_reset_the_busy_limit():
    limited = replace(POLICY, busy_limit=timedelta(hours=2))

    def view(minute):  # a new cell every 50 minutes, the GPU idle all along
        return busy_view(T0 + (minute // 50) * 50 * MIN)

    actions, _ = run(view, limited, minutes=150, on_checkpoint="done")
    assert (150, "interrupt", "checkpointing") in actions


def quiet_view(since, quiet, **kw) -> p.ServerView:
    """A cell running since ``since``, its GPU idle, its kernel's CPU and I/O as ``quiet`` says
    (True: a sleep or poll loop; False: a CPU stage; None: no CPU section in the report)."""
    gpu = p.GpuSignal(True, False, kernel_busy_since=since, cell_quiet=quiet)
    return replace(idle_view(**kw), gpu=gpu)


def test_a_quiet_cell_is_warned_at_its_own_limit_then_interrupted_a_cpu_stage_is_not():
    """A `time.sleep` poll (its kernel does nothing) gets quiet_cell_limit (at least busy_grace)
    from when it went quiet, a warning with the notice, then the interrupt and a checkpoint,
    never a server stop; a CPU stage, or a report without CPU figures, keeps busy_limit."""
    policy = replace(POLICY, busy_grace=timedelta(hours=1), busy_limit=timedelta(hours=8))
    policy = replace(policy, quiet_cell_limit=timedelta(hours=2))
    actions, last = run(quiet_view(T0, True), policy, minutes=151, on_checkpoint="done")
    assert [a[:2] for a in actions][:4] == [
        (60, "busy-notice"),
        (120, "warn"),
        (150, "interrupt"),
        (150, "checkpoint"),
    ]
    assert "the quiet-cell limit of 2h" in last.reason and "no CPU, no I/O" in last.reason
    for quiet in (False, None):
        actions, last = run(quiet_view(T0, quiet), policy, minutes=400)
        assert actions == [(60, "busy-notice", "busy")] and last.state == "busy"
        assert "busy limit of 8h" in last.reason


def test_the_quiet_clock_restarts_whenever_the_kernel_works_and_never_undercuts_busy_grace():
    policy = replace(POLICY, busy_grace=timedelta(hours=1), quiet_cell_limit=timedelta(hours=2))

    def view(minute):  # a poll loop that works for a minute every 90 minutes
        return quiet_view(T0, minute % 90 != 89)

    actions, _ = run(view, policy, minutes=400)
    assert [a[1] for a in actions] == ["busy-notice"]
    # A limit shorter than busy_grace is read as busy_grace: "quiet", which only the report
    # says, never makes the governor less patient than DCGM alone.
    short = replace(policy, quiet_cell_limit=timedelta(minutes=10))
    actions, _ = run(quiet_view(T0, True), short, minutes=100)
    assert [a[:2] for a in actions][:3] == [(60, "warn"), (90, "interrupt"), (90, "checkpoint")]
    off = replace(policy, quiet_cell_limit=None)
    assert run(quiet_view(T0, True), off, minutes=400)[0] == [(60, "busy-notice", "busy")]


def test_a_zombie_by_the_hubs_record_gets_zombie_idle_an_open_tab_or_dcgm_alone_does_not():
    """The GPU idle, no cell running and no Hub activity since it went idle: warned once the
    silence outlasts the Hub's activity lag (15 min), culled zombie_idle (30 min) after it
    began, after a checkpoint. Hub activity (an open tab polls the API) keeps the usual
    clock; so does a server DCGM alone sees (a cell may run)."""
    policy = replace(POLICY, zombie_idle=timedelta(minutes=30))
    actions, last = run(idle_view(hub_last_activity=T0), policy, minutes=31, on_checkpoint="done")
    assert actions == [
        (15, "warn", "warned"),
        (30, "checkpoint", "checkpointing"),
        (31, "cull", "culled"),
    ]
    record = p.Record(idle_since=T0)
    warned = p.decide(idle_view(hub_last_activity=T0), record, policy, T0 + 15 * MIN)
    assert "the Hub has seen no activity" in warned.reason and warned.cull_at == T0 + 30 * MIN
    assert last.cull_reason == "gpu-idle"

    def tab_open(minute):
        return idle_view(hub_last_activity=T0 + minute * MIN)

    assert run(tab_open, policy, minutes=61, on_checkpoint="done")[0][0] == (30, "warn", "warned")
    assert run(tab_open, policy, minutes=61, on_checkpoint="done")[0][-1] == (61, "cull", "culled")
    # The tab closed at minute 20: the zombie clock runs from then.
    closed = idle_view(hub_last_activity=T0 + 20 * MIN)
    actions, _ = run(closed, policy, minutes=60, on_checkpoint="done")
    assert actions[:2] == [(30, "warn", "warned"), (50, "checkpoint", "checkpointing")]
    # A person's interaction the report names (here after the Hub's) only delays it.
    later = idle_view(hub_last_activity=T0, user_last_activity=T0 + 20 * MIN)
    assert run(later, policy, minutes=60, on_checkpoint="done")[0][1][:2] == (50, "checkpoint")
    # No Hub activity known, DCGM alone, or the rule off: the usual clock.
    for view, rule in (
        (idle_view(), policy),
        (dcgm_view(hub_last_activity=T0), policy),
        (idle_view(hub_last_activity=T0), replace(policy, zombie_idle=None)),
    ):
        assert run(view, rule, minutes=31)[0] == [(30, "warn", "warned")]


def test_the_new_limits_are_policy_keys():
    (default,) = p.load_policies([])
    # Opt-in: a quiet cell may be waiting on a job elsewhere, and a zombie's owner is not
    # there to see its warning.
    assert default.quiet_cell_limit is None and default.zombie_idle is None
    (on,) = p.load_policies([], {"zombie_idle": "30m", "quiet_cell_limit": "2h"})
    assert on.zombie_idle == timedelta(minutes=30) and on.quiet_cell_limit == timedelta(hours=2)
    (off,) = p.load_policies([], {"quiet_cell_limit": None, "zombie_idle": None})
    assert off.quiet_cell_limit is None and off.zombie_idle is None
    with pytest.raises(p.PolicyError, match="'zombie_idle'"):
        p.load_policies([], {"zombie_idle": "soon"})


def test_quiet_means_no_cpu_no_io_wait_no_reads():
    assert p.is_quiet(0.004, 0.0, 0.0) is True
    assert p.is_quiet(0.004, None, None) is True  # I/O not readable: CPU decides
    assert p.is_quiet(None, 0.0, 0.0) is None  # CPU unknown: nothing is decided
    assert p.is_quiet(0.3, 0.0, 0.0) is False  # a CPU stage, a download
    assert p.is_quiet(0.01, 0.4, 0.0) is False  # blocked on a disk
    assert p.is_quiet(0.01, 0.0, 80.0) is False  # reading a dataset


def test_a_confident_zombie_is_warned_at_once_an_unsure_diagnosis_decides_nothing():
    sure = idle_view(cause="zombie", cause_confident=True)
    actions, _ = run(sure, minutes=31, on_checkpoint="done")
    assert actions == [
        (0, "warn", "warned"),
        (30, "checkpoint", "checkpointing"),
        (31, "cull", "culled"),
    ]
    unsure = idle_view(cause="zombie", cause_confident=False)
    assert run(unsure, minutes=31)[0] == [(30, "warn", "warned")]


def test_without_a_report_a_running_cell_is_assumed_for_busy_grace():
    # DCGM alone sees the card, not the kernels (nor does the Hub: a silent cell updates no
    # activity, an open tab does): the cull waits busy_grace as if a cell ran. Nobody can be
    # asked for a checkpoint.
    actions, last = run(dcgm_view(), minutes=65)
    assert actions == [(30, "warn", "warned"), (60, "cull", "culled")]
    assert "no checkpoint (it sends no GPU report)" in last.reason
    long = replace(POLICY, busy_grace=timedelta(minutes=80))
    actions, last = run(dcgm_view(), long, minutes=79)
    assert actions == [(30, "warn", "warned")]
    assert "held back by a cell may be running" in last.reason
    assert run(dcgm_view(), long, minutes=90)[0][-1] == (80, "cull", "culled")


def test_extensions_postpone_then_need_an_admin():
    record = p.Record()
    for minute in range(0, 31):
        record = p.decide(idle_view(), record, POLICY, T0 + minute * MIN).record
    assert record.state == "warned"

    granted = p.extend(record, POLICY, reason="finishing a figure")
    assert granted.status == "granted" and "0 left" in granted.message
    decision = p.decide(idle_view(), granted.record, POLICY, T0 + 31 * MIN)
    assert decision.state == "idle" and decision.cull_at == T0 + 90 * MIN

    record = p.decide(idle_view(), decision.record, POLICY, T0 + 61 * MIN).record
    assert record.state == "warned"
    pending = p.extend(record, POLICY, reason="one more")
    assert pending.status == "pending" and "admin" in pending.message
    assert p.decide(idle_view(), pending.record, POLICY, T0 + 91 * MIN).actions == ("checkpoint",)

    approved = p.approve(pending.record, 3600)
    decision = p.decide(idle_view(), approved, POLICY, T0 + 91 * MIN)
    assert decision.state == "idle" and decision.cull_at == T0 + 150 * MIN


def test_an_extension_counts_from_the_deadline_the_owner_was_told():
    # The pass that warns comes 10 minutes late (a slow pass, a loaded hub): the warning's full
    # notice puts the deadline at 70, not 60. "Extend 30m" then means 100, and the admin's
    # hour after the next warning (late again) an hour past that one's deadline.
    idle = p.decide(idle_view(), p.Record(), POLICY, T0)
    warned = p.decide(idle_view(), idle.record, POLICY, T0 + 40 * MIN)
    assert warned.actions == ("warn",) and warned.cull_at == T0 + 70 * MIN
    extended = p.extend(warned.record, POLICY, "a figure").record
    assert p.decide(idle_view(), extended, POLICY, T0 + 41 * MIN).cull_at == T0 + 100 * MIN

    warned = p.decide(idle_view(), extended, POLICY, T0 + 75 * MIN)  # due at 70: late again
    assert warned.actions == ("warn",) and warned.cull_at == T0 + 105 * MIN
    pending = p.extend(warned.record, POLICY, "one more").record
    approved = p.approve(pending, 3600, POLICY)
    assert p.decide(idle_view(), approved, POLICY, T0 + 76 * MIN).cull_at == T0 + 165 * MIN


def test_extension_refusals_say_why():
    assert p.extend(p.Record(state="active"), POLICY, None).status == "refused"
    strict = replace(POLICY, extension_reason="required")
    outcome = p.extend(p.Record(state="warned"), strict, "  ")
    assert outcome.status == "refused" and "reason is required" in outcome.message


def test_failed_checkpoint_postpones_by_default_and_proceeds_when_told():
    actions, last = run(idle_view(), minutes=61, on_checkpoint="failed")
    assert actions == [
        (30, "warn", "warned"),
        (60, "checkpoint", "checkpointing"),
        (61, "warn", "warned"),
    ]
    assert "checkpoint failed (1 of 2 retries): cull postponed to 2026-01-05 10:31 UTC" in (
        last.reason
    )
    proceed = replace(POLICY, on_checkpoint_failure="proceed")
    actions, last = run(idle_view(), proceed, minutes=90, on_checkpoint="failed")
    assert [a for _, a, _ in actions] == ["warn", "checkpoint", "cull"]
    assert "culling anyway" in last.reason


def test_an_always_failing_checkpoint_postpones_the_cull_a_bounded_time():
    """Issue 18: a hook that always raises used to postpone the cull for ever, re-warning at
    every try. Now: by the notice, then twice that, at most checkpoint_retries (2) times and
    never past checkpoint_max_delay (1 h) after the cull's own time; one warning per failure."""
    actions, last = run(idle_view(), minutes=400, on_checkpoint="failed")
    assert actions == [
        (30, "warn", "warned"),
        (60, "checkpoint", "checkpointing"),
        (61, "warn", "warned"),  # 1 of 2: postponed by the notice, to 91
        (91, "checkpoint", "checkpointing"),
        (92, "warn", "warned"),  # 2 of 2: by twice the notice, cut to 60 + 1 h
        (120, "checkpoint", "checkpointing"),
        (121, "cull", "culled"),
    ]
    assert "checkpoint failed, culling anyway (after 3 failed checkpoints)" in last.reason
    short = replace(POLICY, checkpoint_max_delay=timedelta(minutes=45), checkpoint_retries=9)
    actions, last = run(idle_view(), short, minutes=400, on_checkpoint="failed")
    assert actions[-1] == (106, "cull", "culled")
    assert "checkpoint_max_delay of 45m spent" in last.reason


def test_a_failing_checkpoint_postpones_a_hard_deadline_by_one_retry_at_most():
    capped, active = CAPPED, active_view()
    actions, last = run(active, capped, minutes=300, on_checkpoint="failed")
    assert actions == [
        (150, "max-age-warn", "active"),
        (180, "checkpoint", "checkpointing"),
        (181, "checkpoint", "checkpointing"),  # the one retry, without a new warning
        (182, "cull", "culled"),
    ]
    assert "a hard deadline waits for one retry only" in last.reason
    # A checkpoint that never answers: two checkpoint_timeouts at most.
    actions, last = run(active, capped, minutes=300)
    assert [a[:2] for a in actions][-3:] == [
        (180, "checkpoint"),
        (185, "checkpoint"),
        (190, "cull"),
    ]


def test_a_hook_that_failed_at_earlier_deadlines_is_taken_as_broken_and_not_waited_for():
    """The governor counts the failed checkpoints its requests got, across deadlines (and
    sessions: next_session keeps the count). After checkpoint_broken_after (2) in a row, the
    next failure culls at once, saying why; fewer, or a saved checkpoint since, keep the
    bounded backoff. A timeout neither counts nor clears. Off by default: the count is kept,
    the backoff stays."""
    actions, last = run(idle_view(), minutes=400, on_checkpoint="failed")
    assert last.record.hook_failures == 3  # this deadline's three attempts
    broken = p.Record(hook_failures=2)
    assert run(idle_view(), minutes=400, record=broken, on_checkpoint="failed")[0][-1] == (
        121,
        "cull",
        "culled",
    )
    two = replace(POLICY, checkpoint_broken_after=2)
    actions, last = run(idle_view(), two, minutes=400, record=broken, on_checkpoint="failed")
    assert actions == [
        (30, "warn", "warned"),
        (60, "checkpoint", "checkpointing"),
        (61, "cull", "culled"),
    ]
    assert (
        "checkpoint failed, culling anyway (its hook had failed 2 times in a row before: taken "
        "as broken (checkpoint_broken_after 2), so no retry)" in last.reason
    )
    assert last.record.hook_failures == 3
    once = p.Record(hook_failures=1)
    actions, _ = run(idle_view(), two, minutes=400, record=once, on_checkpoint="failed")
    assert actions[-1] == (121, "cull", "culled")  # the bounded backoff, as for a new hook
    # It works again: a saved checkpoint clears the count.
    _, last = run(idle_view(), two, minutes=400, record=broken, on_checkpoint="done")
    assert last.record.hook_failures == 0 and "checkpoint saved" in last.reason
    _, last = run(idle_view(), two, minutes=400, record=broken, on_checkpoint="timeout")
    assert last.record.hook_failures == 2
    # A hard deadline skips its one retry for a broken hook, and never waits longer.
    capped = replace(CAPPED, checkpoint_broken_after=2)
    actions, last = run(active_view(), capped, minutes=300, record=broken, on_checkpoint="failed")
    assert [a[:2] for a in actions] == [(150, "max-age-warn"), (180, "checkpoint"), (181, "cull")]
    assert "taken as broken" in last.reason
    # What a new session keeps of the server: its hook's record, nothing else.
    fresh = replace(last.record, warned_at=T0, extensions_used=2).next_session()
    assert fresh == p.Record(hook_failures=3)


def test_a_server_without_a_report_or_out_of_reach_is_never_asked_for_a_checkpoint():
    capped = replace(POLICY, max_age=timedelta(minutes=75), max_age_warning=timedelta(0))
    silent = p.ServerView("carol", started=T0, hub_last_activity=T0 + 70 * MIN)
    actions, last = run(silent, capped, minutes=100)
    assert actions == [(75, "max-age-warn", "culled"), (75, "cull", "culled")]
    assert "no checkpoint (it sends no GPU report)" in last.reason
    unreachable = replace(idle_view(), reachable=False, gpu=p.GpuSignal(True, True))
    actions, last = run(unreachable, capped, minutes=100)
    assert [a[1] for a in actions] == ["max-age-warn", "cull"]
    assert "no checkpoint (it cannot be reached)" in last.reason


def test_an_admins_cull_warns_checkpoints_and_culls_even_a_busy_exempt_server():
    asked = p.Record(
        cull_requested_at=T0 + 10 * MIN,
        cull_request_reason="admin",
        cull_request_why="culled by root: the node is drained",
        exempt_until=T0 + 600 * MIN,
    )
    busy = replace(idle_view(), gpu=p.GpuSignal(True, True))
    actions, last = run(busy, minutes=20, record=asked, on_checkpoint="done")
    assert actions == [
        (10, "admin-warn", "checkpointing"),
        (10, "checkpoint", "checkpointing"),
        (11, "cull", "culled"),
    ]
    assert last.cull_reason == "admin" and "the node is drained; checkpoint saved" in last.reason
    assert p.extend(replace(asked, state="warned"), POLICY, "no").status == "refused"


def test_excluded_servers_still_reach_their_maximum_age():
    """jupyterhub-idle-culler applies --max-age to every server, excluded by
    --cull-default-servers=false or not."""
    capped = replace(POLICY, max_age=timedelta(minutes=90))
    excluded = idle_view(excluded="not governed: default servers are excluded")
    actions, _ = run(excluded, capped, minutes=95, on_checkpoint="done")
    assert [a[:2] for a in actions] == [(30, "max-age-warn"), (90, "checkpoint"), (91, "cull")]
    assert run(excluded, minutes=300)[0] == []


def test_task_types_match_policies_and_default_to_interactive():
    policies = p.load_policies(
        [{"name": "batch", "match": {"task_types": ["batch"]}, "busy_limit": "24h"}]
    )
    batch = p.ServerView("a", labels={"gpu-gov/task-type": "batch"})
    assert p.select(policies, batch).busy_limit == timedelta(hours=24)
    for labels in ({}, {"gpu-gov/task-type": "training"}):
        view = p.ServerView("a", labels=labels)
        assert view.task_type == "interactive" and p.select(policies, view).name == "default"


def test_a_server_past_its_expected_duration_gets_one_notice():
    view = replace(active_view := idle_view(), gpu=p.GpuSignal(True, True))
    view = replace(view, labels={"gpu-gov/expected-duration": "2h"})
    actions, last = run(view, minutes=300)
    assert actions == [(120, "overrun-notice", "active")]
    assert "running past the 2h expected at spawn (since 2026-01-05 11:00 UTC)" in last.reason
    quiet = replace(POLICY, expected_duration_notice=False)
    assert run(view, quiet, minutes=300)[0] == [] and active_view.labels == {}


def test_an_exemption_keeps_the_count_of_extensions_used():
    record = p.Record(state="warned", extensions_used=1, approval_pending=True)
    granted = replace(record, exempt_until=T0 + 60 * MIN)
    decision = p.decide(idle_view(), granted, POLICY, T0)
    assert decision.state == "exempt"
    assert (decision.record.extensions_used, decision.record.approval_pending) == (1, True)


def test_checkpoint_that_never_answers_times_out():
    actions, last = run(idle_view(), replace(POLICY, on_checkpoint_failure="proceed"), minutes=70)
    assert actions[-1] == (65, "cull", "culled") and "checkpoint timeout" in last.reason


def test_exempt_by_label_policy_or_admin_grant():
    labelled = replace(idle_view(), labels={"gpu-gov/exempt": "true"})
    assert run(labelled, minutes=300)[0] == []
    assert run(idle_view(), replace(POLICY, exempt=True), minutes=300)[0] == []
    granted = p.Record(exempt_until=T0 + 200 * MIN)
    actions, _ = run(idle_view(), minutes=300, record=granted, on_checkpoint="done")
    assert actions[0] == (230, "warn", "warned")


def test_max_age_is_a_hard_cap_with_its_own_warning():
    capped, active = CAPPED, active_view()
    actions, last = run(active, capped, minutes=181, on_checkpoint="done")
    assert actions == [
        (150, "max-age-warn", "active"),
        (180, "checkpoint", "checkpointing"),
        (181, "cull", "culled"),
    ]
    assert "maximum age of 3h" in last.reason and last.cull_reason == "max-age"


def test_the_tier_max_age_label_applies_when_stricter_than_the_policy():
    """The profile layer labels a server with its tier's max age (seconds); the stricter wins."""
    capped = replace(POLICY, max_age=timedelta(hours=3), max_age_warning=timedelta(minutes=30))
    active = replace(idle_view(labels={"gpu-gov/max-age": "3600"}), gpu=p.GpuSignal(True, True))
    actions, last = run(active, capped, minutes=61, on_checkpoint="done")
    assert [a[:2] for a in actions] == [(30, "max-age-warn"), (60, "checkpoint"), (61, "cull")]
    assert "maximum age of 1h for this tier" in last.reason
    # A looser tier limit, or an unreadable label, leaves the policy's in force.
    for label in ("86400", "soon"):
        view = replace(active, labels={"gpu-gov/max-age": label})
        actions, last = run(view, capped, minutes=181, on_checkpoint="done")
        assert actions[-1][:2] == (181, "cull") and "of 3h for this profile" in last.reason


def test_a_reclaimed_borrowed_gpu_is_warned_at_once_and_given_back_after_the_grace():
    """A team within its guarantee was refused for want of cards borrowers hold: the profile
    layer labels the borrowed server, which is warned and culled after reclaim_grace, even busy."""
    asked = T0 + 10 * MIN
    labels = {
        "gpu-gov/borrowed": "true",
        "gpu-gov/reclaim": asked.isoformat(),
        "gpu-gov/reclaim-for": "nlp",
    }
    busy = replace(idle_view(labels=labels), gpu=p.GpuSignal(True, True))
    actions, last = run(busy, POLICY, minutes=26, on_checkpoint="done")
    assert [a[:2] for a in actions] == [(10, "reclaim-warn"), (25, "checkpoint"), (26, "cull")]
    assert last.cull_reason == "reclaim"
    assert "team nlp, within its guarantee, needs this borrowed GPU back" in last.reason
    warning = p.decide(busy, p.Record(), POLICY, asked)
    assert warning.notice == (
        "team nlp, within its guarantee, needs this borrowed GPU back: "
        "it will be given back at 09:25 UTC"
    )
    # Only borrowed servers are reclaimed; a server within its team's guarantee keeps its GPU.
    own = replace(busy, labels={**labels, "gpu-gov/borrowed": "false"})
    assert run(own, POLICY, minutes=60)[0] == []


def test_a_withdrawn_reclaim_leaves_no_hard_deadline_behind():
    """alice's idle borrowed GPU is asked back (warned: a hard deadline), then the reclaim is
    withdrawn (its labels gone). The deadline left is her idle policy's, which GPU work puts
    off: her verdict said it was still a hard deadline ("whatever the GPU does"), so JupyterLab
    kept a hard deadline's warning at the idle deadline's time and never said the reclaim was
    lifted. A reclaim asked again is warned of again."""
    asked = T0 + 10 * MIN
    reclaim = {"gpu-gov/reclaim": asked.isoformat(), "gpu-gov/reclaim-for": "nlp"}
    borrowed = {"gpu-gov/borrowed": "true"}
    warned = p.decide(idle_view(labels={**borrowed, **reclaim}), p.Record(), POLICY, asked)
    assert "reclaim-warn" in warned.actions and p.verdict(warned, POLICY).hard_deadline
    lifted = p.decide(idle_view(labels=borrowed), warned.record, POLICY, asked + MIN)
    assert lifted.cull_at is not None and lifted.cull_reason != "reclaim"
    assert not p.verdict(lifted, POLICY).hard_deadline
    again = {"gpu-gov/reclaim": (asked + 5 * MIN).isoformat(), "gpu-gov/reclaim-for": "nlp"}
    view = idle_view(labels={**borrowed, **again})
    warned_again = p.decide(view, lifted.record, POLICY, asked + 5 * MIN)
    assert "reclaim-warn" in warned_again.actions
    assert p.verdict(warned_again, POLICY).hard_deadline


def test_server_without_reports_follows_the_idle_culler_rule():
    view = p.ServerView("bob", started=T0, hub_last_activity=T0 + 10 * MIN)
    actions, last = run(view, replace(POLICY, inactive_timeout=timedelta(minutes=60)), minutes=80)
    assert actions == [(70, "cull", "culled")]
    assert "sends no GPU report" in last.reason and "idle-culler rule" in last.reason


def test_culled_is_final_and_idempotent():
    record = p.Record(state="culled", culled_at=T0)
    assert p.decide(idle_view(), record, POLICY, T0 + 500 * MIN).actions == ()


def test_trusted_idle_wins_over_a_report_saying_active():
    assert p.merge_evidence(True, False) == (
        False,
        "the report says active but the trusted source says idle",
    )
    assert p.merge_evidence(False, True) == (True, "")
    assert p.merge_evidence(None, None) == (None, "")


def test_policies_match_first_and_always_end_with_a_catch_all():
    policies = p.load_policies(
        [
            {
                "name": "borrowed",
                "match": {"labels": {"gpu-gov/borrowed": "true"}},
                "cull_after": "45m",
                "warn_after": "15m",
            },
            {"name": "mig", "match": {"tiers": ["mig-1g"]}, "cull_action": "shutdown-kernels"},
        ],
        {"warn_after": "2h", "cull_after": "4h"},
    )
    assert [x.name for x in policies] == ["borrowed", "mig", "default"]
    borrowed = p.ServerView("a", labels={"gpu-gov/borrowed": "true"}, tier="mig-1g")
    assert p.select(policies, borrowed).cull_after == timedelta(minutes=45)
    assert p.select(policies, p.ServerView("a", tier="mig-1g")).warn_after == timedelta(hours=2)
    assert p.select(policies, p.ServerView("a", name="x")).name == "default"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "x", "warn_afer": "1h"}, "policy 0 ('x'): unknown key 'warn_afer'"),
        (
            {"name": "x", "cull_after": "soon"},
            "policy 0 ('x'): 'cull_after': 'soon' is not a duration",
        ),
        ({"name": "x", "cull_action": "delete"}, "policy 0 ('x'): 'cull_action' must be one of"),
        ({"name": "x", "match": {"team": "a"}}, "policy 0 ('x'): unknown key 'match.team'"),
        (
            {"name": "x", "warn_after": "3h", "cull_after": "2h"},
            "'cull_after' must be longer than 'warn_after' (the notice)",
        ),
        # No notice: every server already past the limit was warned and culled in one pass
        # when an admin applied such a policy.
        (
            {"name": "x", "warn_after": "5m", "cull_after": "5m"},
            "'cull_after' must be longer than 'warn_after' (the notice)",
        ),
        ({"cull_after": "2h"}, "policy 0: 'name' is required"),
        ({"name": "x", "max_extensions": -1}, "'max_extensions' must be a whole number"),
        ({"name": "x", "busy_limit": "1h"}, "'busy_limit' must not be shorter than 'busy_grace'"),
        ({"name": "x", "on_busy_limit": "kill"}, "'on_busy_limit' must be one of interrupt, cull"),
        ({"name": "x", "after_interrupt": "stop"}, "'after_interrupt' must be one of cull, warn"),
        ({"name": "x", "checkpoint_broken_after": 0}, "'checkpoint_broken_after' must be a whole"),
        ({"name": "x", "checkpoint_retries": 1.5}, "'checkpoint_retries' must be a whole number"),
        ({"name": "x", "checkpoint_max_delay": "later"}, "'checkpoint_max_delay': 'later' is not"),
        ({"name": "x", "match": {"task_types": "training"}}, "'match.task_types' must name"),
        ({"name": "x", "expected_duration_notice": "yes"}, "must be true or false"),
        # Read as the text 'True' before, which no label's value is: the policy for borrowed
        # GPUs silently matched none of them.
        (
            {"name": "x", "match": {"labels": {"gpu-gov/borrowed": True}}},
            "'match.labels' must map label names to strings, got 'gpu-gov/borrowed': True",
        ),
        ({"name": "x", "match": {"labels": {"a": None}}}, "got 'a': None"),
        ({"name": "x", "match": {"labels": {"a": ["b"]}}}, "got 'a': ['b']"),
    ],
)
def test_bad_policies_name_the_entry_and_key(entry, message):
    with pytest.raises(p.PolicyError) as info:
        p.load_policies([entry])
    assert message in str(info.value)


@pytest.mark.parametrize("key", ["max_extensions", "checkpoint_retries", "checkpoint_broken_after"])
@pytest.mark.parametrize("count", [1001, 10**300, 10**5000], ids=["1001", "1e300", "1e5000"])
def test_a_count_past_a_thousand_is_refused_naming_the_key(key, count):
    """10**300 extensions were taken (a policy's JSON, a config file's number), and went
    out on every verdict as ``extensions_left`` (Infinity in the JupyterLab panel); past
    4,300 digits the error itself failed (an int that large has no repr) and named no key."""
    with pytest.raises(p.PolicyError) as info:
        p.load_policies([{"name": "x", key: count}])
    assert f"policy 0 ('x'): '{key}' must be a whole number from" in str(info.value)
    assert "to 1,000" in str(info.value)
    assert len(str(info.value)) < 200
    assert p.load_policies([{"name": "x", key: p.MAX_COUNT}])[0].__dict__[key] == p.MAX_COUNT


def test_a_policy_list_longer_than_the_limit_is_refused_naming_it():
    """Each server's decision tries the policies in order: 20,000 of them (a 1 MiB body)
    took seconds to check on the service's event loop, then ~15 ms each server decision."""
    many = [{"name": f"p{i}", "match": {"users": [f"u{i}"]}} for i in range(p.MAX_POLICIES)]
    assert len(p.load_policies(many)) == p.MAX_POLICIES + 1  # the catch-all
    with pytest.raises(p.PolicyError, match=r"at most 1000 policies, got 20000"):
        p.load_policies(many * 20)


def test_defaults_cannot_set_what_each_policy_is():
    """``match`` in the defaults was every policy's, the catch-all's too: a server it did not
    match had no policy, and every pass logged "deciding alice/ failed" and governed it not at
    all (never warned, never culled)."""
    for key, value in (("match", {"users": ["x"]}), ("name", "all")):
        with pytest.raises(p.PolicyError, match=f"defaults: {key!r} is not a default"):
            p.load_policies([], {key: value})


def test_durations():
    assert parse_duration("1h30m") == timedelta(minutes=90)
    assert parse_duration(90) == timedelta(seconds=90)
    with pytest.raises(ValueError, match=r"^'x' must be a duration from 0 to 100 years, got -5$"):
        parse_duration(-5, "'x'")


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (1e12, "1000000000000.0"),
        ("36501d", "'36501d'"),
        (-1, "-1"),
        (10**5000, "a whole number of 16610 bits"),  # no repr: a ValueError naming nothing
    ],
    ids=["1e12", "36501d", "-1", "10**5000"],
)
def test_a_policy_duration_out_of_range_names_the_key_the_range_and_the_value(value, said):
    """As the settings' ranges say it (``core/traits.py``): the key, the range, the value. It
    said "is longer than 100 years" or "is negative"; an int past 4,300 digits raised
    ``Exceeds the limit (4300 digits)`` from its own repr, naming no key."""
    with pytest.raises(p.PolicyError) as info:
        p.load_policies([{"name": "x", "warn_after": value}])
    assert str(info.value) == (
        f"policy 0 ('x'): 'warn_after' must be a duration from 0 to 100 years, got {said}"
    )


def test_evolve_is_dataclasses_replace_for_the_decision_records():
    t = datetime(2026, 11, 29, 12, tzinfo=timezone.utc)
    gpu = p.GpuSignal(holds_gpu=True, active=False, idle_since=t)
    view = p.ServerView(user="alice", labels={"gpu-gov/team": "vision"}, gpu=gpu)
    record = p.Record(state=p.IDLE, idle_since=t, reason="idle")
    decision = p.Decision(record, ("warn",), warn_at=t)
    cases = [
        (gpu, {"active": True, "detail": "DCGM"}),
        (view, {"reports": True, "gpu": None, "user_last_activity": t}),
        (record, {"state": p.WARNED, "warned_at": t}),
        (decision, {"notice": "soon"}),
        (record, {}),
    ]
    for obj, changes in cases:
        evolved, replaced = p.evolve(obj, **changes), replace(obj, **changes)
        assert evolved == replaced and type(evolved) is type(obj) and evolved is not obj
        assert [getattr(evolved, f.name) for f in fields(obj)] == [
            getattr(replaced, f.name) for f in fields(obj)
        ]
        assert not hasattr(evolved, "__dict__")  # slotted: one kept per server
        if not isinstance(obj, p.ServerView):  # its labels are a dict
            assert hash(evolved) == hash(replaced)
    assert weakref.ref(view)() is view  # the history refers to a view weakly
    assert p.evolve(record, state=p.ACTIVE).state == p.ACTIVE and record.state == p.IDLE
    with pytest.raises(TypeError, match="no field"):
        p.evolve(record, sate=p.ACTIVE)


def test_records_compare_field_by_field():
    """``Record.__eq__`` (its fields read in C, not the generated tuples): equal exactly when every
    field is, whichever way the record was made; hashes agree with it."""
    t = T0 + 5 * MIN
    record = p.Record(state=p.WARNED, idle_since=T0, warned_at=t, reason="idle")
    same = p.evolve(p.Record(), state=p.WARNED, idle_since=T0, warned_at=t, reason="idle")
    assert record == same and hash(record) == hash(same)
    assert record == replace(record) and p.Record() == p.Record()
    others = {
        f.name: ("other" if f.type == "str" else 3 if f.type == "int" else 2.5)
        for f in fields(p.Record)
        if f.type in ("str", "int", "float")
    }
    others.update({f.name: t + MIN for f in fields(p.Record) if "datetime" in f.type})
    others.update(approval_pending=True, checkpoint_status="done", cull_request_reason="admin")
    others.update(warned_beside_tab=True)
    assert set(others) == {f.name for f in fields(p.Record)}  # every field moved once below
    for name, value in others.items():
        moved = p.evolve(record, **{name: value})
        assert moved != record, name
        assert moved == replace(record, **{name: value}) and moved != same, name
    assert record != "idle" and record != p.Decision(record)


def test_reason_times_read_as_strftime_writes_them():
    """Reasons name times as ``%Y-%m-%d %H:%M UTC`` (``_at`` formats them without strftime)."""
    zones = (timezone.utc, timezone(timedelta(hours=-7)), None)
    times = [
        datetime(2026, 12, 31, 23, 59, 59, 999999),
        datetime(1970, 1, 1),
        datetime(9999, 1, 2, 3, 4),
    ]
    times += [T0 + k * 7919 * MIN for k in range(200)]
    for when in (t.replace(tzinfo=z) for t in times for z in zones):
        assert p._at(when) == f"{when:%Y-%m-%d %H:%M} UTC"


@pytest.mark.parametrize(
    "key",
    [
        "warn_after",
        "idle_threshold",
        "cull_action",
        "max_extensions",
        "checkpoint_broken_after",
        "checkpoint",
        "match.task_types",
        "match.users",
    ],
)
def test_a_huge_bad_value_is_named_briefly(key):
    """A policy error quotes at most a few dozen characters of the value: a pasted 100,000
    characters came back whole in the start-up error, the API's 400 and the policy page."""
    huge = "x" * 100_000
    entry = {"name": "x", "match": {key[6:]: [huge, 1]}} if "." in key else {"name": "x", key: huge}
    with pytest.raises(p.PolicyError) as info:
        p.load_policies([entry])
    assert key.split(".")[-1] in str(info.value) and len(str(info.value)) < 300


# -- a policy applied while servers run (Policy.in_force_since) ---------------------------------


def run_applied(view, old, new, applied, minutes, on_checkpoint="done"):
    """``run`` under ``old``, then under ``new`` as an admin applied it at minute ``applied``;
    also returns each decision's (minute, cull_at, notice) from then on."""
    new = replace(new, in_force_since=T0 + applied * MIN)
    record, seen, told = p.Record(), [], []
    for minute in range(minutes + 1):
        if record.checkpoint_status == "requested":
            record = replace(record, checkpoint_status=on_checkpoint)
        decision = p.decide(view, record, old if minute < applied else new, T0 + minute * MIN)
        record = decision.record
        seen += [(minute, action) for action in decision.actions]
        if minute >= applied:
            told.append((minute, decision.cull_at, decision.notice))
        if decision.state == "culled":
            break
    return seen, told


LONG = replace(POLICY, warn_after=timedelta(hours=2), cull_after=timedelta(hours=4))


def test_a_warned_server_gets_a_shorter_applied_policys_full_notice_from_the_apply():
    """Warned at 11:00 of a cull at 13:00 (notice 2h); a policy with a 30-minute notice is
    applied at 11:40: the server is warned again, once, naming the new time (12:10), and culled
    then. Before, the new notice counted from the old warning (11:30), already past: the pass
    that first read the policy asked a checkpoint and stopped the server at once."""
    seen, told = run_applied(idle_view(), LONG, POLICY, applied=160, minutes=240)
    assert seen == [(120, "warn"), (160, "warn"), (190, "checkpoint"), (191, "cull")]
    _, cull_at, notice = told[0]
    assert cull_at == T0 + 190 * MIN and "stopped at 2026-01-05 12:10 UTC" in notice
    assert "(set by a policy applied at 2026-01-05 11:40 UTC)" in notice
    assert notice.endswith("it replaces the deadline warned of at 2026-01-05 11:00 UTC")
    assert all(notice is None for _, _, notice in told[1:])  # said once, not every pass
    # A longer policy withdraws the warning of the shorter one: its own comes in its time.
    seen, _ = run_applied(idle_view(), POLICY, LONG, applied=40, minutes=250)
    assert seen == [(30, "warn"), (120, "warn"), (240, "checkpoint"), (241, "cull")]
    # Applied once the announced deadline came (its checkpoint asked for): the cull goes on as
    # announced, with that checkpoint, not a later one over a checkpoint saved before it.
    seen, _ = run_applied(idle_view(), LONG, POLICY, applied=241, minutes=250)
    assert seen == [(120, "warn"), (240, "checkpoint"), (241, "cull")]


def test_a_checkpoint_saved_for_a_deadline_a_longer_policy_moved_is_not_reused():
    """The cull's checkpoint is saved at 10:00 when a policy with a 4-hour idle limit is
    applied: the stop it was saved for no longer comes. The stop the new policy brings, hours
    later, asks for a checkpoint of its own; before, it stopped the server on the one saved at
    10:00, and what the owner did since (a notebook edited, no cell run) was lost unsaid."""
    seen, _ = run_applied(idle_view(), POLICY, LONG, applied=61, minutes=250)
    assert seen == [
        (30, "warn"),
        (60, "checkpoint"),
        (120, "warn"),
        (240, "checkpoint"),
        (241, "cull"),
    ]


@pytest.mark.parametrize("quiet", [None, True])
def test_a_warned_cells_limit_gets_a_shorter_applied_policys_full_notice(quiet):
    """A cell warned at its limit (the busy limit, or the quiet-cell limit of a sleep loop) of
    an interrupt 2 h later; an apply with a 30-minute notice 10 minutes on: interrupted 30
    minutes after the apply, not 20."""
    limits = {"busy_limit": timedelta(minutes=90), "quiet_cell_limit": timedelta(minutes=90)}
    if quiet is None:
        limits["quiet_cell_limit"] = None
    old = replace(LONG, warn_after=timedelta(hours=1), cull_after=timedelta(hours=3), **limits)
    new = replace(POLICY, **limits)
    seen, told = run_applied(quiet_view(T0, quiet), old, new, applied=100, minutes=140)
    assert [s for s in seen if s[1] != "busy-notice"][:4] == [
        (90, "warn"),
        (100, "warn"),
        (130, "interrupt"),
        (130, "checkpoint"),
    ]
    assert told[0][1] == T0 + 130 * MIN and "it replaces the deadline" in told[0][2]


def the_change_told(view, old, new, applied, by, minutes):
    """The reason, notice and verdict's ``policy_change`` of the first decision that tells the
    owner of ``new``, brought in at minute ``applied`` (``by``: how)."""
    new = replace(new, in_force_since=T0 + applied * MIN, in_force_by=by)
    record = p.Record()
    for minute in range(minutes + 1):
        decision = p.decide(view, record, old if minute < applied else new, T0 + minute * MIN)
        record = decision.record
        if minute >= applied and decision.notice:
            change = p.verdict(decision, new).to_json()["policy_change"]
            return decision.reason, decision.notice, change
    raise AssertionError("the owner was never told")


@pytest.mark.parametrize(
    ("by", "words"),
    [
        ("applied", "a policy applied at 2026-01-05 11:40 UTC"),
        (
            "config-changed",
            "the policy changed in the config file, in force at 2026-01-05 11:40 UTC",
        ),
    ],
)
def test_the_owner_is_told_how_the_policy_that_moved_their_deadline_came_in(by, words):
    """A policy brought in while a server was warned moves its deadline: by an admin's apply,
    its reason says a policy was applied; by the config file changed at a restart (nobody
    applied anything), it says so. The verdict carries it as a code (``policy_change``) for
    JupyterLab's toast, whatever the words."""
    reason, notice, change = the_change_told(idle_view(), LONG, POLICY, 160, by, 240)
    assert f"(set by {words})" in reason and f"(set by {words})" in notice
    assert change == by
    assert by == "applied" or "applied" not in notice
    # A maximum age brought in past its warning's time: the same words, the same code.
    capped = replace(CAPPED, max_age=parse_duration("2h"))
    reason, notice, change = the_change_told(active_view(), CAPPED, capped, 160, by, 200)
    assert f"({words})" in notice and f"({words})" in reason
    assert change == by
    # Unchanged policy: no code.
    decision = p.decide(idle_view(), p.Record(), POLICY, T0 + 40 * MIN)
    assert p.verdict(decision, POLICY).to_json()["policy_change"] is None


def test_a_reclaim_under_way_gets_a_shorter_applied_grace_from_the_apply():
    """Reclaimed at 09:10 with a grace of 1h (given back at 10:10); a grace of 15 minutes
    applied at 09:30: given back at 09:45, warned again of it. Before: at once (09:25)."""
    labels = {
        "gpu-gov/borrowed": "true",
        "gpu-gov/reclaim": (T0 + 10 * MIN).isoformat(),
        "gpu-gov/reclaim-for": "nlp",
    }
    busy = replace(idle_view(labels=labels), gpu=p.GpuSignal(True, True))
    old = replace(POLICY, reclaim_grace=timedelta(hours=1))
    seen, told = run_applied(busy, old, POLICY, applied=30, minutes=60)
    assert seen == [(10, "reclaim-warn"), (30, "reclaim-warn"), (45, "checkpoint"), (46, "cull")]
    assert told[0][2] == (
        "team nlp, within its guarantee, needs this borrowed GPU back (its grace of 15m from a "
        "policy applied at 2026-01-05 09:30 UTC): it will be given back at 09:45 UTC"
    )


def test_a_maximum_age_warned_of_then_shortened_gets_its_warning_again_from_the_apply():
    """Warned at 11:30 of its maximum age (3h) at 12:00; a maximum age of 2h (past) or 2h50m
    (at 11:50, too soon for the 30 minutes' warning) applied at 11:40: stopped at 12:10. Before,
    a server warned before the apply was stopped in the pass that first read the policy."""
    for max_age, words in (("2h", "past the maximum age of 2h"), ("2h50m", "reaching at")):
        new = replace(CAPPED, max_age=parse_duration(max_age))
        seen, told = run_applied(active_view(), CAPPED, new, applied=160, minutes=200)
        assert seen == [
            (150, "max-age-warn"),
            (160, "max-age-warn"),
            (190, "checkpoint"),
            (191, "cull"),
        ]
        assert words in told[0][2] and "stopped at 12:10 UTC" in told[0][2]
    # Applied once the stop it announced came (its checkpoint asked for): it goes on.
    seen, _ = run_applied(active_view(), CAPPED, new, applied=181, minutes=200)
    assert seen == [(150, "max-age-warn"), (180, "checkpoint"), (181, "cull")]


def test_a_policy_in_force_since_start_up_decides_as_before():
    """No apply (``in_force_since`` None): a shorter policy governs a warned server as it
    always has — the config file's policies at start-up mean what they say."""
    record = run(idle_view(), LONG, minutes=150)[1].record
    assert p.decide(idle_view(), record, POLICY, T0 + 160 * MIN).actions == ("checkpoint",)
