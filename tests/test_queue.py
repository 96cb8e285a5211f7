"""The spawn queue's core: the order of the line (a team within its guarantee, then priority,
then arrival), two requests for one freed GPU, nobody jumping the line, expiry, the record kept in
the spawner's state (what survives a restart), the estimated wait and what would start sooner.
Pure: ``core.queue`` and ``profiles.queue`` over ``quota.admit``; and the governor's forecast
(``hub.queue.releases``)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from traitlets import TraitError

from jupyter_gpu_gov.core import clock, policy
from jupyter_gpu_gov.core import queue as records
from jupyter_gpu_gov.core.queue import (
    CANCELLED,
    CLAIM_WITHIN_LABEL,
    EXPIRED,
    LINE,
    MAX_REFUSED,
    QUEUE_STATE,
    QUEUED_AT_LABEL,
    REFUSED_WITHIN,
    STARTED,
    USER_CAP,
    Departure,
    QueuedRequest,
    QueueFormatError,
    Release,
    Waiting,
    estimate,
    from_state,
    ordinal,
    refused_from_json,
    releases_from_json,
    releases_to_json,
    waiting_for_a_gpu,
)
from jupyter_gpu_gov.core.vocabulary import CULL_REASONS
from jupyter_gpu_gov.hub import showback
from jupyter_gpu_gov.hub.app import GpuGovernor
from jupyter_gpu_gov.hub.evidence import Received
from jupyter_gpu_gov.hub.hubapi import HubApiError, HubServer
from jupyter_gpu_gov.hub.options import Options
from jupyter_gpu_gov.hub.queue import LEFT_POD_RETRY, RETRY_AFTER, QueueSync, line_starts, releases
from jupyter_gpu_gov.hub.store import Store
from jupyter_gpu_gov.hub.tables import ServerRow
from jupyter_gpu_gov.hub.views import Views
from jupyter_gpu_gov.profiles.config import GpuProfiles
from jupyter_gpu_gov.profiles.queue import (
    QUEUEABLE,
    Refusals,
    admit_in_line,
    line,
    offer,
    offer_words,
    ordered,
)
from jupyter_gpu_gov.profiles.quota import Grant, Request, admit, load_quotas
from jupyter_gpu_gov.profiles.tiers import load_tiers

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
TIERS = load_tiers(
    [
        {"name": "h100", "gpu": "H100-80GB", "display_name": "H100"},
        {"name": "h100-1g", "gpu": "H100-80GB", "mig": "1g.10gb", "display_name": "Small slice"},
    ]
)
QUOTAS = load_quotas(
    {
        "vision": {"guaranteed": {"h100": 1}, "tiers": "*"},
        "nlp": {"guaranteed": {"h100": 1}, "priority": 10},
        "ops": {"borrowing_limit": {"h100": 1}, "priority": 5},
    },
    TIERS,
)
CAPACITY = {"h100": 2, "h100-1g": 2}


def held(user, team, tier="h100", borrowed=False):
    t = TIERS[tier]
    return Grant(f"{user}/", user, team, tier, t.count, t.weight, borrowed, 0, T0)


def waiting(user, team, minutes, tier="h100", expires=60):
    at = T0 + timedelta(minutes=minutes)
    return QueuedRequest(
        user=user,
        name="",
        team=team,
        tier=tier,
        options={"profile": tier, "team": team},
        queued_at=at,
        expires_at=at + timedelta(minutes=expires),
    )


NOW = T0 + timedelta(minutes=30)
FULL = [held("v1", "vision"), held("o1", "ops", borrowed=True)]  # both cards taken


def test_a_team_within_its_guarantee_first_then_priority_then_arrival():
    # nlp has its guarantee of one card left; ops (priority 5) and vision (beyond its
    # guarantee, priority 0) borrow. Arrival alone would say v2, o2, n1.
    queued = [waiting("v2", "vision", 0), waiting("o2", "ops", 5), waiting("n1", "nlp", 10)]
    free_nlp = [held("v1", "vision"), held("x1", "vision", borrowed=True)]
    order = ordered(queued, free_nlp, QUOTAS, TIERS, NOW)
    assert [q.user for q in order] == ["n1", "o2", "v2"]
    # Same standing: arrival decides.
    later = [waiting("n2", "nlp", 20), waiting("n1", "nlp", 10)]
    assert [q.user for q in ordered(later, free_nlp, QUOTAS, TIERS, NOW)] == ["n1", "n2"]


def test_two_requests_for_one_freed_gpu_the_first_in_line_is_ready_the_second_waits():
    queued = [waiting("v2", "vision", 0), waiting("v3", "vision", 1)]
    freed = [held("v1", "vision")]  # o1 stopped: one card free
    first, second = line(queued, freed, CAPACITY, QUOTAS, TIERS, {}, NOW)
    assert (first.request.user, first.position, first.ready) == ("v2", 1, True)
    assert (second.request.user, second.position, second.ready) == ("v3", 2, False)
    # Admission says the same to each, from its own place: v2 in, v3 behind v2.
    request = Request("v3/", "v3", "vision", "h100")
    decided = admit_in_line(
        request, freed, CAPACITY, QUOTAS, TIERS, queued=queued, now=NOW,
        queued_at=queued[1].queued_at,
    )  # fmt: skip
    assert not decided.allowed and decided.limit == LINE
    assert decided.reason.startswith("1 request is waiting in line for H100 before you")
    mine = admit_in_line(
        Request("v2/", "v2", "vision", "h100"), freed, CAPACITY, QUOTAS, TIERS,
        queued=queued, now=NOW, queued_at=queued[0].queued_at,
    )  # fmt: skip
    assert mine.allowed
    # Once v2 holds the card, v3 waits for the cards again, not for the line.
    after = line([queued[1]], [*freed, held("v2", "vision")], CAPACITY, QUOTAS, TIERS, {}, NOW)
    assert [(w.position, w.ready) for w in after] == [(1, False)]


def test_a_newcomer_does_not_jump_the_line_but_may_take_what_nobody_waits_for():
    queued = [waiting("v2", "vision", 0)]
    freed = [held("v1", "vision")]
    newcomer = Request("v9/", "v9", "vision", "h100")
    assert admit(newcomer, freed, CAPACITY, QUOTAS, TIERS).allowed  # without the line: in
    decided = admit_in_line(newcomer, freed, CAPACITY, QUOTAS, TIERS, queued=queued, now=NOW)
    assert (decided.allowed, decided.limit) == (False, LINE)
    assert LINE in QUEUEABLE
    # Nobody waits for the small slices: the newcomer takes one.
    small = Request("v9/", "v9", "vision", "h100-1g")
    assert admit_in_line(small, freed, CAPACITY, QUOTAS, TIERS, queued=queued, now=NOW).allowed
    # A team within its guarantee arriving now goes ahead of those who borrow.
    nlp = Request("n9/", "n9", "nlp", "h100")
    assert admit_in_line(nlp, freed, CAPACITY, QUOTAS, TIERS, queued=queued, now=NOW).allowed


def test_a_request_ahead_that_cannot_start_anyway_blocks_nobody():
    # ops may borrow one card and holds it: its waiting request cannot start when a card
    # frees, so vision's request behind it is ready.
    queued = [waiting("o2", "ops", 0), waiting("v2", "vision", 5)]
    usage = [held("o1", "ops", borrowed=True)]
    order = line(queued, usage, CAPACITY, QUOTAS, TIERS, {}, NOW)
    assert {w.request.user: w.ready for w in order} == {"o2": False, "v2": True}
    (o2,) = [w for w in order if w.request.user == "o2"]
    assert "may borrow at most 1 " in o2.reason


def test_an_expired_request_leaves_the_line():
    queued = [waiting("v2", "vision", 0, expires=10), waiting("v3", "vision", 1)]
    assert not queued[0].live(T0 + timedelta(minutes=10)) and queued[0].live(T0)
    order = line(queued, [held("v1", "vision")], CAPACITY, QUOTAS, TIERS, {}, NOW)
    assert [(w.request.user, w.position, w.ready) for w in order] == [("v3", 1, True)]


def test_a_request_survives_in_the_spawners_state_and_a_damaged_one_is_ignored():
    request = waiting("v2", "vision", 0)
    state = {QUEUE_STATE: request.to_json(), "pid": 12}
    assert from_state(state) == request
    assert from_state({}) is None and from_state(None) is None
    damaged = [
        "not a record",
        {**request.to_json(), "queued_at": "yesterday"},
        {**request.to_json(), "expires_at": "2026-03-01T00:00:00Z"},  # before it joined
        {**request.to_json(), "options": {f"k{i}": "v" for i in range(40)}},
        {**request.to_json(), "options": {"profile": 3}},
        {**request.to_json(), "user": "u" * 300},
        {**request.to_json(), "tier": ""},
    ]
    for record in damaged:
        assert from_state({QUEUE_STATE: record}) is None, record
    with pytest.raises(QueueFormatError, match="'queued_at' must be an ISO 8601 time"):
        QueuedRequest.from_json(damaged[1])


def test_the_line_as_the_governor_reads_it_round_trips_and_bounds_what_it_reads():
    (entry,) = line(
        [waiting("v2", "vision", 0)], FULL, CAPACITY, QUOTAS, TIERS,
        {"o1/": Release(NOW + timedelta(minutes=20), "o1/ idle, culled at 09:50")}, NOW,
    )  # fmt: skip
    assert Waiting.from_json(entry.to_json()) == entry
    with pytest.raises(QueueFormatError, match="'position'"):
        Waiting.from_json({**entry.to_json(), "position": 0})
    releases = {"a/": Release(NOW, "deadline"), "b/": Release(None, "")}
    assert releases_from_json(releases_to_json(releases)) == releases
    junk = {"a/": {"at": "soon", "why": 5}, "x" * 300: {"at": None}, "b/": "no"}
    assert releases_from_json(junk) == {"a/": Release(None, "")}
    with pytest.raises(QueueFormatError):
        releases_from_json([])


def test_each_request_in_line_says_what_it_waits_for_and_an_older_hub_is_not_guessed():
    """The line carries admission's ``limit``: the cluster report's ``queued`` counts those
    waiting for a card (n1 and v2), not for a quota (o2, at ops' borrowing limit). A hub that
    does not send it (older) leaves the count unknown; a value outside the list is refused."""
    order = line(
        [waiting("v2", "vision", 0), waiting("o2", "ops", 1), waiting("n1", "nlp", 2)],
        FULL, CAPACITY, QUOTAS, TIERS, {}, NOW,
    )  # fmt: skip
    limits = {w.request.user: w.limit for w in order}
    assert limits == {"n1": records.CAPACITY, "v2": records.CAPACITY, "o2": records.BORROWING}
    assert waiting_for_a_gpu(order) == 2
    read = [Waiting.from_json(w.to_json()) for w in order]
    assert read == order and waiting_for_a_gpu(read) == 2
    older = [
        Waiting.from_json({k: v for k, v in w.to_json().items() if k != "limit"}) for w in order
    ]
    assert {w.limit for w in older} == {None} and waiting_for_a_gpu(older) is None
    (ready,) = line([waiting("v2", "vision", 0)], [], CAPACITY, QUOTAS, TIERS, {}, NOW)
    assert ready.ready and ready.limit == "" and waiting_for_a_gpu([ready]) == 0
    # A ready request from an older hub says nothing, and needs not: it does not wait.
    assert waiting_for_a_gpu([replace(ready, limit=None)]) == 0
    for bad in ("cpacity", 3, ["capacity"], {"limit": "capacity"}):
        with pytest.raises(QueueFormatError, match="'limit' must be one of"):
            Waiting.from_json({**order[0].to_json(), "limit": bad})


def test_the_refusals_the_hub_counts_are_per_server_recent_and_bounded():
    refusals = Refusals()
    refusals.refused("ann/", NOW)
    refusals.refused("ann/", NOW + timedelta(minutes=5))  # retried: one server, once
    refusals.refused("bob/", NOW + timedelta(minutes=10))
    refusals.refused("cat/x", NOW + timedelta(minutes=20))
    assert refusals.count(NOW + timedelta(minutes=30)) == 3
    refusals.forget("cat/x")  # joined the line, or started
    assert refusals.count(NOW + timedelta(minutes=30)) == 2
    assert refusals.count(NOW + REFUSED_WITHIN + timedelta(minutes=7)) == 1  # ann's is old now
    assert refusals.count(NOW + REFUSED_WITHIN + timedelta(minutes=11)) == 0
    # Per user, at most per_user servers, their newest: the oldest is named, for the log.
    assert refusals.refused("dan/a", NOW, "h100", "dan", 2) is None
    assert refusals.refused("dan/b", NOW, "h100", "dan", 2) is None
    assert refusals.refused("dan/a", NOW, "h100", "dan", 2) is None  # retried: still two
    assert refusals.refused("dan/c", NOW, "a100", "dan", 2) == "dan/b"
    assert refusals.tiers(NOW) == {"h100": 1, "a100": 1}
    refusals.forget("dan/a")
    assert refusals.refused("dan/d", NOW, "h100", "dan", 2) is None
    assert refusals.count(NOW) == 2
    assert refused_from_json(None) is None  # an older hub does not count them
    assert refused_from_json(0) == 0 and refused_from_json(MAX_REFUSED) == MAX_REFUSED
    for bad in (-1, 1.5, True, "3", MAX_REFUSED + 1, [1]):
        with pytest.raises(QueueFormatError, match="'refused' must be a whole number"):
            refused_from_json(bad)


def test_the_estimate_is_the_kth_earliest_known_release():
    soon, later = NOW + timedelta(minutes=20), NOW + timedelta(hours=2)
    releases = [Release(later, "b/ reaches its maximum age"), Release(soon, "a/ idle")]
    first, second = estimate(1, releases, NOW), estimate(2, releases, NOW)
    assert (first.until, second.until) == (soon, later)
    assert first.words(NOW) == "about 20m (a/ idle)"
    unknown = estimate(3, releases, NOW)
    assert unknown.until is None and unknown.words(NOW).startswith("no estimate")
    assert (
        estimate(1, [Release(NOW - timedelta(minutes=5), "x")], NOW)
        .words(NOW)
        .startswith("any moment now")
    )


def test_the_offer_names_the_place_the_estimate_and_a_smaller_tier_free_now():
    queued = [waiting("v2", "vision", 0)]
    request = Request("v3/", "v3", "vision", "h100")
    refused = admit(request, FULL, CAPACITY, QUOTAS, TIERS)
    releases = {
        "v1/": Release(NOW + timedelta(hours=3), "v1/ reaches its maximum age"),
        "o1/": Release(NOW + timedelta(minutes=40), "o1/ idle: culled by 09:40"),
    }
    place = offer(request, refused, FULL, CAPACITY, QUOTAS, TIERS, queued, releases, NOW)
    assert (place.position, place.ready) == (2, False)
    assert place.until == NOW + timedelta(hours=3)  # the second release: v2 takes the first
    assert place.sooner == ("Small slice",)
    words = offer_words(place, TIERS)
    assert words == (
        "Or wait in line: 2nd for H100, about 3h (v1/ reaches its maximum age). "
        "Sooner: Small slice is free now."
    )
    # A refusal waiting cannot change (a tier not offered to the team) gets no offer.
    nope = Request("n3/", "n3", "nlp", "h100-1g")
    assert offer(nope, admit(nope, FULL, CAPACITY, QUOTAS, TIERS), FULL, CAPACITY, QUOTAS,
                 TIERS, queued, releases, NOW) is None  # fmt: skip
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "111th"
    ]  # fmt: skip


def test_the_estimate_counts_a_reclaim_due_on_a_tier_that_frees_its_cards():
    """Three H100s, held by ops's borrowed pair (a tier of its own: two cards) and v1 (in use,
    no deadline). nlp, within its guarantee of one H100, joins the line: the pair is asked back
    and is due to stop in 15 minutes. The estimate read only the H100 tier's own servers: "no
    estimate: the GPUs it waits for are in use, with no deadline in sight", a reclaim due on
    another tier's server that frees two of its cards left out. A pair waits for two cards:
    one single card stopping starts none."""
    tiers = load_tiers(
        [
            {"name": "h100", "gpu": "H100-80GB", "display_name": "H100"},
            {"name": "h100x2", "gpu": "H100-80GB", "count": 2, "display_name": "H100 pair"},
        ]
    )
    quotas = load_quotas(
        {
            "nlp": {"guaranteed": {"h100": 1}},
            "ops": {"tiers": "*"},
            "vision": {"guaranteed": {"h100": 1}, "tiers": "*"},
        },
        tiers,
    )
    pair = Grant("o1/", "o1", "ops", "h100x2", 2, 2.0, True, 0, T0)
    usage = [Grant("v1/", "v1", "vision", "h100", 1, 1.0, False, 0, T0), pair]
    # On the cluster a tier's count leaves out the cards other tiers' servers hold.
    capacity = {"h100": 1, "h100x2": 2}
    request = Request("n1/", "n1", "nlp", "h100")
    refused = admit(request, usage, capacity, quotas, tiers)
    assert refused.reclaim == (pair,) and not refused.allowed
    due = NOW + timedelta(minutes=15)
    releases = {"o1/": Release(due, "a server holding it is due to stop by 09:45 UTC")}
    place = offer(request, refused, usage, capacity, quotas, tiers, [], releases, NOW)
    assert place.until == due, place.estimate
    assert place.estimate == "about 15m (a server holding it is due to stop by 09:45 UTC)"
    assert offer_words(place, tiers) == (
        "Or wait in line: 1st for H100, about 15m (a server holding it is due to stop by "
        "09:45 UTC)."
    )
    # The pair's two cards: a second single card waiting counts on them too.
    queued = [waiting("n1", "nlp", 0), waiting("v2", "vision", 1)]
    assert [w.until for w in line(queued, usage, capacity, quotas, tiers, releases, NOW)] == [
        due,
        due,
    ]
    # A pair in line waits for two cards: v1's card alone (due first) frees no pair.
    early = {**releases, "v1/": Release(NOW + timedelta(minutes=5), "v1 idle")}
    queued = [waiting("v2", "vision", 1, tier="h100x2")]
    (pair_wait,) = line(queued, usage, capacity, quotas, tiers, early, NOW)
    assert pair_wait.until == due


def test_the_estimate_for_a_named_card_counts_class_servers_known_to_hold_it():
    """Two H100s, held by v1 (no deadline) and l1, a server on "Any 80 GB card" due to stop
    in 15 minutes. An H100 request read only the H100 tiers' servers: "no estimate". l1 known
    to hold an H100 (its pod's node, ``cards_held``) counts; on an A100, or not known, it does
    not (its stop frees no H100)."""
    tiers = load_tiers(
        [
            {"name": "h100", "gpu": "H100-80GB", "display_name": "H100"},
            {"name": "big", "min_memory_gb": 80, "display_name": "Any 80 GB card"},
        ]
    )
    quotas = load_quotas(
        {"lab": {"guaranteed": {"big": 1}}, "vision": {"guaranteed": {"h100": 1}, "tiers": "*"}},
        tiers,
    )
    usage = [
        Grant("v1/", "v1", "vision", "h100", 1, 1.0, False, 0, T0),
        Grant("l1/", "l1", "lab", "big", 1, 1.0, False, 0, T0),
    ]
    capacity = {"h100": 0, "big": 0}
    request = Request("v2/", "v2", "vision", "h100")
    refused = admit(request, usage, capacity, quotas, tiers)
    assert not refused.allowed and refused.limit == "capacity"
    due = NOW + timedelta(minutes=15)
    releases = {"l1/": Release(due, "l1 idle")}
    product = tiers["h100"].card.products[0]
    for held_cards, until in (
        ({"l1/": product}, due),
        ({"l1/": "NVIDIA-A100-SXM4-80GB"}, None),
        (None, None),
    ):
        place = offer(
            request, refused, usage, capacity, quotas, tiers, [], releases, NOW, held_cards
        )
        assert place.until == until, (held_cards, place.estimate)
    assert place.estimate.startswith("no estimate"), place.estimate


def test_at_their_own_cap_the_offer_says_their_own_server_stopping_starts_it_not_a_gpu():
    """A user at their cap waits for one of their own servers to stop: a card freeing
    elsewhere starts nothing. The offer said "starts by itself when the GPU frees"."""
    quotas = load_quotas({"vision": {"guaranteed": {"h100": 2}, "user_cap": 1}}, TIERS)
    usage = [held("v1", "vision")]
    request = Request("v1/more", "v1", "vision", "h100")
    refused = admit(request, usage, CAPACITY, quotas, TIERS)
    assert (refused.allowed, refused.limit) == (False, USER_CAP)
    releases = {"v1/": Release(NOW + timedelta(minutes=40), "v1/ idle: culled by 09:40")}
    place = offer(request, refused, usage, CAPACITY, quotas, TIERS, [], releases, NOW)
    assert place is not None and place.limit == USER_CAP
    words = offer_words(place, TIERS)
    assert words == (
        "Or wait in line: 1st for H100, about 40m (v1/ idle: culled by 09:40). It starts "
        "when one of your own GPU servers stops (you stop it, or it is culled)."
    ), words
    assert "GPU frees" not in words


def test_what_would_start_sooner_is_worked_out_only_for_the_requests_shown():
    """Each request's "sooner" costs a pass over the line per smaller tier: the line is the
    same when it is worked out only for the requests a page shows (the sync shows none), and
    theirs is the same too."""
    queued = [waiting(u, "vision", m) for u, m in (("v2", 0), ("v3", 1), ("v4", 2))]
    queued += [waiting("n2", "nlp", 3), waiting("o2", "ops", 4)]
    full = line(queued, FULL, CAPACITY, QUOTAS, TIERS, {}, NOW)
    slice_ = ("Small slice",)  # vision may take one; nlp and ops have no slices
    assert {w.request.user: w.sooner for w in full} == {
        "n2": (), "o2": (), "v2": slice_, "v3": slice_, "v4": slice_
    }  # fmt: skip
    for shown in ("v3", "o2", None):
        part = line(
            queued,
            FULL,
            CAPACITY,
            QUOTAS,
            TIERS,
            {},
            NOW,
            sooner_for=lambda q, s=shown: q.user == s,
        )
        assert part == [w if w.request.user == shown else replace(w, sooner=()) for w in full]


def test_a_departure_is_read_back_bounded_and_the_governors_forecast_from_planned_stops():
    request = waiting("v2", "vision", 0)
    gone = request.left(EXPIRED, request.expires_at)
    assert Departure.from_json(gone) == Departure("v2/", "vision", "h100", "", EXPIRED, 3600.0)
    assert Departure.from_json({**gone, "waited_s": 1e12}).waited_s == 366 * 86400.0
    for bad in ({**gone, "outcome": "vanished"}, {**gone, "waited_s": "long"}, "x"):
        with pytest.raises(QueueFormatError):
            Departure.from_json(bad)
    planned = ServerRow(key="a/", user="a", cull_at=NOW, running=True)
    in_use = ServerRow(key="b/", user="b", running=True)
    assert releases({"a/": planned, "b/": in_use}) == {
        "a/": Release(NOW, "a server holding it is due to stop by 09:30 UTC"),
        "b/": Release(None, ""),
    }


def test_a_server_started_from_the_line_that_nobody_opens_is_given_back():
    """The grant says when it came from the line and how long its owner has to open it; a
    person's request to a kernel, or Hub activity after the start, claims it; a server whose
    kernels cannot be seen (no report) is never given back on a guess."""
    started = T0
    labels = {QUEUED_AT_LABEL: "2026-03-02T08:30:00.000Z", CLAIM_WITHIN_LABEL: "900"}
    gpu = policy.GpuSignal(holds_gpu=True, active=False)
    view = policy.ServerView("ben", started=started, reports=True, gpu=gpu, labels=labels)
    rules = policy.Policy()
    soon, late = started + timedelta(minutes=14), started + timedelta(minutes=15)
    assert policy.decide(view, policy.Record(), rules, soon).cull_reason is None
    gone = policy.decide(view, policy.Record(), rules, late)
    assert (gone.cull_reason, gone.record.state) == ("unclaimed", policy.CULLED)
    assert "not opened within 15m: its GPU is given back to the line" in gone.record.reason
    assert "unclaimed" in CULL_REASONS
    claimed = [
        replace(view, user_last_activity=started + timedelta(minutes=3)),
        replace(view, hub_last_activity=started + timedelta(minutes=2)),
        replace(view, gpu=None),  # no report: abstain
        replace(view, labels={QUEUED_AT_LABEL: labels[QUEUED_AT_LABEL]}),  # no claim window
    ]
    for kept in claimed:
        assert policy.decide(kept, policy.Record(), rules, late).cull_reason != "unclaimed"
    # The Hub's own stamp while the server starts does not count as opening it.
    stamped = replace(view, hub_last_activity=started + timedelta(seconds=20))
    assert policy.decide(stamped, policy.Record(), rules, late).cull_reason == "unclaimed"


def test_the_owners_other_servers_are_told_a_server_started_from_the_line_until_it_is_opened(
    monkeypatch,
):
    """ben's default server started from the line; the verdicts of his other servers carry it
    (his JupyterLab tab there says so), never his own, nobody else's, and not once he opened
    it, it was given back, or its path is not one of the Hub's."""
    labels = {QUEUED_AT_LABEL: "2026-03-02T08:30:00.000Z", CLAIM_WITHIN_LABEL: "900"}
    gpu = HubServer("ben", "", url="/user/ben/", started=T0, ready=True)
    notes = HubServer("ben", "notes", url="/user/ben/notes/", started=T0, ready=True)
    other = HubServer("ann", "", url="/user/ann/", started=T0, ready=True)
    servers = {s.key: s for s in (gpu, notes, other)}
    rows = {
        "ben/": ServerRow(key="ben/", user="ben", tier="h100", labels=labels, running=True),
        "ben/notes": ServerRow(key="ben/notes", user="ben", running=True),
        "ann/": ServerRow(key="ann/", user="ann", running=True),
    }
    index = line_starts(servers, rows, {})
    assert set(index) == {"ben"}
    (unopened,) = index["ben"]
    assert unopened.notice.to_json() == {
        "name": "",
        "url": "/user/ben/",
        "tier": "h100",
        "started": "2026-03-02T09:00:00.000Z",
        "claim_by": "2026-03-02T09:15:00.000Z",
    }
    # A person's request to one of its kernels (its report) opens it; so does the Hub's
    # activity after its start (its own stamp while starting does not).
    report = {"server": {"user": "ben", "last_activity": "2026-03-02T09:01:00Z"}}
    assert line_starts(servers, rows, {"ben/": Received(report, T0)}) == {}
    seen = {**servers, "ben/": replace(gpu, last_activity=T0 + timedelta(minutes=2))}
    assert line_starts(seen, rows, {}) == {}
    stamped = {**servers, "ben/": replace(gpu, last_activity=T0 + timedelta(seconds=20))}
    assert line_starts(stamped, rows, {}) == index
    for url in ("//evil.example/", "https://evil.example/", ""):
        assert line_starts({**servers, "ben/": replace(gpu, url=url)}, rows, {}) == {}

    class Governor(Views):
        options = Options()

    governor = Governor()
    governor.line_starts = index
    monkeypatch.setattr(clock, "utcnow", lambda: T0 + timedelta(minutes=5))
    assert governor.started_from_line(rows["ben/notes"]) == (unopened.notice,)
    assert governor.started_from_line(rows["ben/"]) == ()  # its own tab needs no notice
    assert governor.started_from_line(rows["ann/"]) == ()
    monkeypatch.setattr(clock, "utcnow", lambda: T0 + timedelta(minutes=15))  # given back now
    assert governor.started_from_line(rows["ben/notes"]) == ()


def test_queue_time_is_metered_in_showback_per_team_and_tier(tmp_path):
    """What the governor records as requests leave the line (its audit trail) comes back as
    showback's queue columns, grouped like the GPU-hours."""
    store = Store(f"sqlite:///{tmp_path / 'gov.sqlite'}")
    sync = QueueSync(hub=None, store=store)
    sync._meter(Departure("v2/", "vision", "h100", "batch", STARTED, 1800.0), "queue-started", "x")
    sync._meter(Departure("v3/", "vision", "h100", "", STARTED, 600.0), "queue-started", "x")
    sync._meter(Departure("n1/", "nlp", "h100", "", EXPIRED, 3600.0), "queue-left", "x")
    rows = {r["team"]: r for r in showback.usage(store, Options(), ["team"], "all", None)}
    assert (rows["vision"]["queue_starts"], rows["vision"]["queue_hours"]) == (2, 0.6667)
    assert (rows["nlp"]["queue_starts"], rows["nlp"]["queue_expired"]) == (0, 1)
    assert rows["nlp"]["queue_hours"] == 0  # an expired request waited, and got nothing
    (mine,) = showback.usage(store, Options(), ["user", "tier"], "day", None, user="v2")
    assert (mine["tier"], mine["queue_starts"], mine["queue_hours"]) == ("h100", 1, 0.5)
    assert mine["gpu_hours_allocated"] == 0  # waiting holds no GPU
    assert {"queue_starts", "queue_hours", "queue_expired"} <= set(showback.COLUMNS)


def test_a_request_the_hub_took_out_tells_its_owner_why_in_the_audit_trail(tmp_path):
    """A request that can no longer start leaves the line with the hub's reason, which the
    owner reads in their own audit trail (``GET api/audit``); bounded like any text read."""
    store = Store(f"sqlite:///{tmp_path / 'gov.sqlite'}")
    request = waiting("v2", "vision", 0)
    why = "it can no longer start: You are not in team 'vision'; choose one of: nlp."
    gone = request.left(CANCELLED, request.queued_at + timedelta(minutes=5), why)
    assert Departure.from_json({**gone, "why": "x" * 10_000}).why == "x" * 500
    QueueSync(hub=None, store=store)._read({"line": [], "left": [gone]})
    (row,) = store.audit_rows(user="v2")
    assert row.action == "queue-left"
    assert row.reason == f"left the line (cancelled: {why}) after 300s"


def test_a_loop_of_joining_and_cancelling_is_one_row_a_sync_written_at_once(tmp_path, monkeypatch):
    """A user may join the line and cancel as fast as the hub answers: 283 times in 10 s from
    one session on a loaded 2-core machine (a tier full; the hub's pages, with the form's
    XSRF token). Each was a departure in the next sync, and the governor wrote each as an
    audit row in a transaction of its own: at a pass a minute, ~1,700 writes on the event loop
    every pass (every report waiting) and ~2.4 million rows a day from one user. A server's
    cancels in one sync are one row that says how many; the sync's rows, one write. What
    showback counts (starts, expiries) is unchanged, and the histogram counts every one."""
    store = Store(f"sqlite:///{tmp_path / 'gov.sqlite'}")
    writes = []
    audit = store.audit
    monkeypatch.setattr(store, "audit", lambda rows: (writes.append(1), audit(rows)))
    hal, ann = waiting("hal", "lab", 0), waiting("ann", "lab", 0)
    cancels = [hal.left(CANCELLED, hal.queued_at + timedelta(seconds=1)) for _ in range(283)]
    expired = ann.left(EXPIRED, ann.queued_at + timedelta(hours=1))
    QueueSync(hub=None, store=store)._read({"line": [], "left": [*cancels, expired]})
    (row,) = store.audit_rows(user="hal")
    assert row.action == "queue-left"
    assert row.reason == "left the line (cancelled) after 1s; 283 times since the last sync"
    assert [r.action for r in store.audit_rows(user="ann")] == ["queue-left"]
    assert len(writes) == 1
    (usage,) = showback.usage(store, Options(), ["team"], "all", None)
    assert (usage["queue_starts"], usage["queue_expired"]) == (0, 1)


def test_the_queues_settings_are_checked_at_startup():
    assert GpuProfiles(queue_expire_after="90m").queue_expiry == timedelta(minutes=90)
    bad = {
        "queue_expire_after": ("5s", "must be from 10 seconds to 30 days, got '5s'"),
        "queue_claim_within": ("2d", "must be from 10 seconds to 1 day, got '2d'"),
        "queue_per_user": (0, "must be a whole number of servers from 1 to 100, got 0"),
    }
    for name, (value, words) in bad.items():
        with pytest.raises(TraitError, match=f"GpuProfiles.{name} {words}"):
            GpuProfiles(**{name: value})


class FakeHubApi:
    """The Hub API as the governor's sync uses it: the line, and starts (refused or not)."""

    def __init__(self, line, sync_status=200, start_status=201, **answer):
        self.line, self.sync_status, self.start_status = line, sync_status, start_status
        self.answer = answer  # more of the sync's answer (``refused``)
        self.calls: list[tuple[str, str, dict]] = []

    async def request(self, method, path, body=None):
        self.calls.append((method, path, body))
        if path == "gpu-gov/queue":
            if self.sync_status != 200:
                raise HubApiError(self.sync_status, "no", method=method, url=path)
            return {"line": self.line, "left": [{"outcome": "lost"}], **self.answer}
        if self.start_status >= 400:
            raise HubApiError(self.start_status, "refused", method=method, url=path)
        return {}


async def test_the_governor_starts_ready_requests_and_does_not_hammer_a_refusing_hub(tmp_path):
    ready, behind = line(
        [waiting("v2", "vision", 0), waiting("v3", "vision", 1)],
        [held("v1", "vision")], CAPACITY, QUOTAS, TIERS, {}, NOW,
    )  # fmt: skip
    entries = [ready.to_json(), {"user": "broken"}, behind.to_json()]
    store = Store(f"sqlite:///{tmp_path / 'gov.sqlite'}")
    hub = FakeHubApi(entries, start_status=403)
    sync = QueueSync(hub, store)
    got = await sync.sync(NOW)
    assert [w.request.user for w in got] == ["v2", "v3"]  # the broken entry is skipped
    starts = [c for c in hub.calls if c[0] == "POST" and c[1] != "gpu-gov/queue"]
    assert starts == [("POST", "users/v2/server", {"profile": "h100", "team": "vision"})]
    await sync.sync(NOW + timedelta(seconds=30))  # refused a moment ago: not asked again
    await sync.sync(NOW + timedelta(minutes=2))  # but after a while
    starts = [c for c in hub.calls if c[0] == "POST" and c[1] != "gpu-gov/queue"]
    assert len(starts) == 2
    audited = [a.action for a in store.audit_rows("v2/")]
    assert audited.count("queue-start") == 2 and "queue-started" not in audited
    # A hub without the profile layer (404), or without the scope (403): asked once.
    for status in (404, 403):
        quiet = FakeHubApi([], sync_status=status)
        sync = QueueSync(quiet, store)
        assert await sync.sync(NOW) == [] and await sync.sync(NOW) == []
        assert len(quiet.calls) == 1


async def test_a_refused_start_is_tried_again_after_the_setting_not_before(tmp_path):
    """``c.GpuGovernor.queue_retry_after`` (default a minute) is the wait before a start the Hub
    refused is asked again: the real-hub test of a failed start sets it short."""
    app = GpuGovernor()
    app.initialize(["--GpuGovernor.queue_retry_after=10"])
    retry_after = app.make_options().queue_retry_after
    assert retry_after == timedelta(seconds=10) and Options().queue_retry_after == RETRY_AFTER
    (ready,) = line([waiting("v2", "vision", 0)], [], CAPACITY, QUOTAS, TIERS, {}, NOW)
    hub = FakeHubApi([ready.to_json()], start_status=403)
    sync = QueueSync(hub, Store(f"sqlite:///{tmp_path / 'gov.sqlite'}"), retry_after=retry_after)

    def starts() -> int:
        return len([c for c in hub.calls if c[0] == "POST" and c[1] != "gpu-gov/queue"])

    await sync.sync(NOW)
    await sync.sync(NOW + timedelta(seconds=9.9))
    assert starts() == 1
    await sync.sync(NOW + timedelta(seconds=10))
    assert starts() == 2


async def test_the_governor_keeps_the_lines_demand_for_the_cluster_report(tmp_path, caplog):
    """After each sync: the requests waiting for a card and the hub's recent refusals for want
    of one; unknown (None) before the first sync, from a hub without a line, after a failed
    sync, and where an older hub does not say."""
    order = line(
        [waiting("v2", "vision", 0), waiting("o2", "ops", 1)], FULL, CAPACITY, QUOTAS, TIERS,
        {}, NOW,
    )  # fmt: skip
    store = Store(f"sqlite:///{tmp_path / 'gov.sqlite'}")
    hub = FakeHubApi([w.to_json() for w in order], refused=3)
    sync = QueueSync(hub, store)
    assert (sync.queued, sync.refused) == (None, None)
    await sync.sync(NOW)
    assert (sync.queued, sync.refused) == (1, 3)  # v2 waits for a card, o2 for ops' limit
    hub.answer["refused"] = -2  # damaged: said, and not counted
    await sync.sync(NOW)
    assert (sync.queued, sync.refused) == (1, None)
    assert "'refused' must be a whole number" in caplog.text
    older = [{k: v for k, v in w.to_json().items() if k != "limit"} for w in order]
    sync = QueueSync(FakeHubApi(older), store)
    assert len(await sync.sync(NOW)) == 2 and (sync.queued, sync.refused) == (None, None)
    failing = FakeHubApi([], sync_status=502)
    sync = QueueSync(failing, store)
    sync.queued = sync.refused = 4  # as of an earlier sync
    assert await sync.sync(NOW) == [] and (sync.queued, sync.refused) == (None, None)
    for status in (404, 403):  # no line in this hub
        sync = QueueSync(FakeHubApi([], sync_status=status), store)
        await sync.sync(NOW)
        assert sync.absent and (sync.queued, sync.refused) == (None, None)


# A pod vic's stop left running, as the hub's sweep names it to the governor.
LEFT_POD = {
    "server": "vic/",
    "namespace": "jhub",
    "name": "jupyter-vic",
    "uid": "uid-1",
    "stopped_at": "2026-01-05T08:00:00.000Z",
}


async def test_a_left_pod_is_audited_once_in_a_dry_run_not_at_every_sync(tmp_path):
    """A dry run deletes nothing, so the hub names the pod a stop left running at every sync
    for as long as it runs: its ``left-pod-delete`` is on record once (it was a row every
    ``LEFT_POD_RETRY``, a sync's, for ever), and the hub is never asked. Acting, a delete the
    hub could not carry out is asked, and audited, again."""
    pod = dict(LEFT_POD)
    store = Store(f"sqlite:///{tmp_path / 'gov.sqlite'}")
    hub = FakeHubApi([], left_pods=[pod])
    sync = QueueSync(hub, store, dry_run=True)
    for minute in range(60):
        await sync.sync(NOW + timedelta(minutes=minute))
    rows = [a for a in store.audit_rows("vic/") if a.action == "left-pod-delete"]
    assert len(rows) == 1 and rows[0].dry_run
    assert not [c for c in hub.calls if c[1] == "gpu-gov/left-pods"]
    # Another pod left by a later stop of the same server: on record too.
    hub.answer["left_pods"] = [{**pod, "uid": "uid-2"}]
    await sync.sync(NOW + timedelta(minutes=61))
    assert len([a for a in store.audit_rows("vic/") if a.action == "left-pod-delete"]) == 2
    acting = QueueSync(hub, store)
    await acting.sync(NOW)
    await acting.sync(NOW + timedelta(minutes=1))
    assert len([c for c in hub.calls if c[1] == "gpu-gov/left-pods"]) == 2


async def test_a_left_pods_failed_delete_is_asked_again_after_the_setting_not_before(tmp_path):
    """``c.GpuGovernor.left_pod_retry`` (default 15 s) is the wait before the delete of a pod a
    stop left running, which the hub still names (its delete failed), is asked and audited
    again: the real-hub test of a failing Kubernetes API sets it short."""
    app = GpuGovernor()
    app.initialize(["--GpuGovernor.left_pod_retry=3"])
    retry = app.make_options().left_pod_retry
    assert retry == timedelta(seconds=3) and Options().left_pod_retry == LEFT_POD_RETRY
    pod = dict(LEFT_POD)
    store = Store(f"sqlite:///{tmp_path / 'gov.sqlite'}")
    hub = FakeHubApi([], left_pods=[pod])
    sync = QueueSync(hub, store, left_pod_retry=retry)

    def asked() -> int:
        return len([c for c in hub.calls if c[1] == "gpu-gov/left-pods"])

    def audited() -> int:
        return len([a for a in store.audit_rows("vic/") if a.action == "left-pod-delete"])

    await sync.sync(NOW)
    await sync.sync(NOW + timedelta(seconds=2.9))
    assert (asked(), audited()) == (1, 1)
    await sync.sync(NOW + timedelta(seconds=3))
    assert (asked(), audited()) == (2, 2)
