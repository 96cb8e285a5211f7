"""Team quotas and admission: Kueue's guarantee / borrowing / lending semantics, with reasons a
researcher can act on.

The catalogue: whole H100 cards ("H100"), a pair of them ("2 x H100", 2 GPU-equivalents) and the
smallest H200 MIG slice ("H200 1g.18gb", 1/7 of a card). Teams: vision (4 H100 guaranteed, may
borrow 2 more, 2 GPU-equivalents per user), nlp (2 H100 guaranteed, priority 10) and ops (no
guarantee, may borrow up to 3 H100, priority 5).
"""

from __future__ import annotations

import re
from datetime import datetime
from itertools import count
from pathlib import Path

import pytest

from jupyter_gpu_gov.profiles.quota import (
    Grant,
    QuotaError,
    Request,
    admit,
    load_quotas,
    tier_use,
)
from jupyter_gpu_gov.profiles.tiers import load_tiers

TIERS = load_tiers(
    [
        {"name": "h100", "gpu": "H100-80GB", "display_name": "H100"},
        {"name": "h200-1g", "gpu": "H200-141GB", "mig": "1g.18gb", "display_name": "H200 1g.18gb"},
        {"name": "h100x2", "gpu": "H100-80GB", "count": 2, "display_name": "2 x H100"},
    ]
)
QUOTAS = {
    "vision": {
        "guaranteed": {"h100": 4},
        "borrowing_limit": {"h100": 2},
        "user_cap": 2,
        "tiers": ["h100", "h200-1g", "h100x2"],
    },
    "nlp": {"guaranteed": {"h100": 2}, "priority": 10},
    "ops": {"borrowing_limit": {"h100": 3}, "priority": 5},
}
_ids = count(1)


def quotas(**changes):
    return load_quotas({**QUOTAS, **changes}, TIERS)


def grant(team, tier="h100", *, user=None, server=None, borrowed=False, hour=None, priority=None):
    user = user or f"user{next(_ids)}"
    return Grant(
        server=server or f"{user}/",
        user=user,
        team=team,
        tier=tier,
        devices=TIERS[tier].count,
        weight=TIERS[tier].weight,
        borrowed=borrowed,
        priority=QUOTAS[team].get("priority", 0) if priority is None else priority,
        started=None if hour is None else datetime(2025, 3, 1, hour),
    )


def grants(team, n, **kwargs):
    return [grant(team, **kwargs) for _ in range(n)]


def ask(team, tier="h100", usage=(), capacity=None, quota=None, user="alice", server="alice/"):
    return admit(
        Request(server=server, user=user, team=team, tier=tier),
        list(usage),
        {"h100": 8} if capacity is None else capacity,
        quota or quotas(),
        TIERS,
    )


# -- guarantee and borrowing -------------------------------------------------------------------


def test_within_the_guarantee():
    admission = ask("vision", usage=grants("vision", 2))
    assert admission.allowed and not admission.borrowed
    assert admission.reason == (
        "Within team vision's guarantee: 3 of 4 H100 cards in use with this server."
    )


def test_beyond_the_guarantee_a_team_borrows_what_others_leave_unused():
    admission = ask("vision", usage=grants("vision", 4))
    assert admission.allowed and admission.borrowed
    assert "Borrowed from the shared pool" in admission.reason
    assert "team vision's guarantee of 4 H100 cards is in use" in admission.reason
    assert "given back first" in admission.reason


def test_a_team_without_a_guarantee_only_borrows():
    admission = ask("ops")
    assert admission.allowed and admission.borrowed
    assert "team ops has no guarantee on H100" in admission.reason


def test_the_borrowing_limit():
    usage = grants("vision", 4) + grants("vision", 2, borrowed=True)
    admission = ask("vision", usage=usage)
    assert not admission.allowed and not admission.reclaim
    assert admission.reason == (
        "Team vision may borrow at most 2 H100 cards beyond its guarantee of 4; it holds 6, 2 of "
        "them borrowed. Stop one of the team's servers on H100, or pick another tier."
    )
    ops = ask("ops", usage=grants("ops", 3, borrowed=True))
    assert not ops.allowed
    assert ops.reason.startswith(
        "Team ops has no guarantee on H100 and may borrow at most 3 H100 cards; it holds 3, all "
        "borrowed."
    )


def test_a_borrowing_refusal_never_reads_as_more_left_to_borrow():
    """ "Team ops uses 3 and it may borrow at most 3 more H100 cards" refused a 4th card while
    reading as 3 more still to take. The limit is said as a limit, then what the team holds,
    and what a pair still needs beyond it."""
    pairs = quotas(vision={**QUOTAS["vision"], "borrowing_limit": {"h100x2": 2}})
    # A borrowed pair holds 2 cards, the limit; a second one needs 2 more.
    usage = grants("vision", 1, tier="h100x2", borrowed=True)
    pair = ask("vision", tier="h100x2", usage=usage, capacity={"h100x2": 8}, quota=pairs)
    assert not pair.allowed
    assert pair.reason == (
        "Team vision has no guarantee on 2 x H100 and may borrow at most 2 cards on 2 x H100; "
        "it holds 2, all borrowed, and this server needs 2. Stop one of the team's servers on "
        "2 x H100, or pick another tier."
    )
    none = quotas(vision={**QUOTAS["vision"], "borrowing_limit": {"h100": 0}})
    at_guarantee = ask("vision", usage=grants("vision", 4), quota=none)
    assert at_guarantee.reason.startswith(
        "Team vision may not borrow beyond its guarantee of 4 H100 cards; it holds 4, none "
        "borrowed."
    )
    one = quotas(
        vision={**QUOTAS["vision"], "guaranteed": {"h100": 1}, "borrowing_limit": {"h100": 0}}
    )
    assert ask("vision", usage=grants("vision", 1), quota=one).reason.startswith(
        "Team vision may not borrow beyond its guarantee of 1 H100 card; it holds 1, none borrowed."
    )


def test_a_tier_whose_name_counts_its_cards_is_not_counted_twice():
    """A pair tier named "2 x H100 80 GB, NVLink" read "at most 2 2 x H100 80 GB, NVLink cards":
    a name that already counts cards takes the figure as "N cards on <name>"."""
    tiers = load_tiers(
        [{"name": "pair", "gpu": "H100-80GB", "count": 2, "display_name": "2 x H100 80 GB, NVLink"}]
    )
    team = {"vision": {"guaranteed": {"pair": 2}, "borrowing_limit": {"pair": 2}}}
    held = [
        Grant(f"u{i}/", f"u{i}", "vision", "pair", 2, 2.0, borrowed=i == 1, priority=0)
        for i in range(2)
    ]
    refused = admit(
        Request("alice/", "alice", "vision", "pair"), held, {}, load_quotas(team, tiers), tiers
    )
    assert not refused.allowed
    assert refused.reason.startswith(
        "Team vision may borrow at most 2 cards on 2 x H100 80 GB, NVLink beyond its guarantee "
        "of 2; it holds 4, 2 of them borrowed, and this server needs 2."
    )
    full = admit(
        Request("alice/", "alice", "vision", "pair"),
        [],
        {"pair": 0},
        load_quotas(team, tiers),
        tiers,
    )
    assert full.reason.startswith("There is no card on 2 x H100 80 GB, NVLink here.")
    # A name without a count keeps the plain wording.
    assert "at most 2 H100 cards" in ask("vision", usage=grants("vision", 6)).reason


def test_a_lending_limit_keeps_cards_for_the_lending_team():
    # 6 cards: vision holds its 4 and asks for a 5th; nlp uses none of its 2.
    usage = grants("vision", 4)
    lends_all = ask("vision", usage=usage, capacity={"h100": 6})
    assert lends_all.allowed and lends_all.borrowed

    # nlp lends at most 1 of its 2: one card stays free for nlp.
    limited = quotas(nlp={**QUOTAS["nlp"], "lending_limit": {"h100": 1}})
    first = ask("vision", usage=usage, capacity={"h100": 6}, quota=limited)
    assert first.allowed and first.borrowed
    second = ask(
        "vision",
        usage=[*usage, grant("vision", borrowed=True)],
        capacity={"h100": 6},
        quota=limited,
    )
    assert not second.allowed
    assert "none is free to borrow" in second.reason
    assert "kept for other teams' guarantees" in second.reason
    # ... and nlp gets it.
    nlp = ask("nlp", usage=[*usage, grant("vision", borrowed=True)], capacity={"h100": 6})
    assert nlp.allowed and not nlp.borrowed


def test_cards_kept_for_a_guarantee_on_a_tier_that_can_use_them_are_not_lent():
    """Cards other teams keep of an unused guarantee (``lending_limit``) were counted for the
    tier asked for alone. ops keeps its guarantee of an H100 pair (lends none): a borrowed
    single H100 took one of the two cards free, and the pair no longer fit. A class guarantee
    ("any 80 GB card", kept) on the only 80 GB cards free, the H100s: the same. The class's
    cards kept count only as far as the class has no others free (free A100s: lent)."""
    tiers = load_tiers(
        [
            {"name": "h100", "gpu": "H100-80GB", "display_name": "H100"},
            {"name": "h100x2", "gpu": "H100-80GB", "count": 2, "display_name": "H100 pair"},
            {"name": "big", "min_memory_gb": 80, "display_name": "Any 80 GB card"},
        ]
    )
    keeps = {
        "ops": {"guaranteed": {"h100x2": 2}, "lending_limit": {"h100x2": 0}, "tiers": "*"},
        "nlp": {"tiers": "*"},
    }
    nlp = Request("n1/", "n1", "nlp", "h100")
    capacity = {"h100": 2, "h100x2": 2, "big": 2}
    kept = admit(nlp, [], capacity, load_quotas(keeps, tiers), tiers)
    assert not kept.allowed, kept.reason
    assert "kept for other teams' guarantees" in kept.reason, kept.reason
    lends = {**keeps, "ops": {**keeps["ops"], "lending_limit": {"h100x2": 2}}}
    assert admit(nlp, [], capacity, load_quotas(lends, tiers), tiers).allowed
    # Four free, two kept for the pair: one may be lent.
    more = {**capacity, "h100": 4, "big": 4}  # (the class counts the H100s too)
    assert admit(nlp, [], more, load_quotas(keeps, tiers), tiers).allowed

    lab = {"guaranteed": {"big": 1}, "lending_limit": {"big": 0}, "tiers": "*"}
    quotas = load_quotas({"lab": lab, "nlp": {"tiers": "*"}}, tiers)
    only_h100 = {"h100": 1, "h100x2": 0, "big": 1}
    refused = admit(nlp, [], only_h100, quotas, tiers)
    assert not refused.allowed and "kept for other teams' guarantees" in refused.reason
    with_a100s = {"h100": 1, "h100x2": 0, "big": 3}  # two A100s free besides
    assert admit(nlp, [], with_a100s, quotas, tiers).allowed
    # The class itself, as before: its own kept card is not lent.
    big = Request("n2/", "n1", "nlp", "big")
    assert not admit(big, [], with_a100s | {"big": 1}, quotas, tiers).allowed
    assert admit(big, [], with_a100s, quotas, tiers).allowed


def test_capacity_exhausted():
    # The admin promised more than there is: 5 cards, guarantees of 4 + 2, all held within them.
    usage = grants("vision", 3) + grants("nlp", 2)
    admission = ask("vision", usage=usage, capacity={"h100": 5})
    assert not admission.allowed and not admission.reclaim
    assert admission.reason == (
        "All 5 H100 cards are in use. Try again later, or pick another tier than H100."
    )
    # Beyond the guarantee, with nothing lower-priority to reclaim.
    full = grants("vision", 4) + grants("nlp", 2) + grants("ops", 2, borrowed=True)
    admission = ask("vision", usage=full)
    assert not admission.allowed and not admission.reclaim
    assert admission.reason == (
        "Team vision's guarantee of 4 H100 cards is in use, and none is free to borrow: "
        "the others are in use. Try again later, or pick another tier than H100."
    )
    # Every card there is held within the team's own guarantee (a workstation's two): there
    # are no "others" to be in use.
    admission = ask("nlp", usage=grants("nlp", 2), capacity={"h100": 2})
    assert admission.reason == (
        "Team nlp's guarantee of 2 H100 cards is in use, and there is no other H100 to "
        "borrow. Try again later, or pick another tier than H100."
    )


def test_a_tier_without_capacity_is_bounded_by_quotas_alone():
    admission = ask("ops", usage=grants("vision", 50), capacity={})
    assert admission.allowed and admission.borrowed


# -- reclaim ------------------------------------------------------------------------------------


def test_a_team_within_its_guarantee_reclaims_borrowed_cards_lowest_priority_first():
    # 7 cards: vision 4 + 1 borrowed (priority 0), ops 2 borrowed (priority 5); nlp has none.
    vision_borrowed = grant("vision", borrowed=True, hour=9)
    usage = [
        *grants("vision", 4),
        vision_borrowed,
        grant("ops", borrowed=True, hour=10),
        grant("ops", borrowed=True, hour=11),
    ]
    admission = ask("nlp", usage=usage, capacity={"h100": 7})
    assert not admission.allowed
    assert admission.reclaim == (vision_borrowed,)
    assert admission.reason == (
        "All 7 H100 cards are in use, some borrowed by other teams beyond their guarantee. "
        "Team nlp is within its guarantee, so 1 is being taken back from them: try again in a "
        "few minutes."
    )


def test_a_borrowed_pair_holding_the_cards_of_a_guarantee_is_reclaimed():
    # A 4-card workstation: vision's borrowed pair (2 x H100, no guarantee on it: the same
    # cards as H100), vision's H100 and nlp's H100. H100's capacity is what H100 servers hold
    # plus what is free: 2. nlp's second H100 is within its guarantee of 2.
    pair = grant("vision", "h100x2", borrowed=True, hour=9)
    usage = [pair, grant("nlp"), grant("vision")]
    admission = ask("nlp", usage=usage, capacity={"h100": 2, "h100x2": 2})
    # Before, only borrowed H100 servers were candidates: "All 2 H100 cards are in use. Try
    # again later" on a machine of 4, the guarantee never met while the pair ran.
    assert not admission.allowed
    assert admission.reclaim == (pair,)
    assert admission.reason == (  # not "All 2 H100 cards": the pair's are not in H100's count
        "All H100 cards are in use (2 by 2 x H100 servers), some borrowed by other teams beyond "
        "their guarantee. Team nlp is within its guarantee, so 2 are being taken back from "
        "them: try again in a few minutes."
    )
    # Slices of another card are devices of their own: never taken back for a whole card.
    slice_ = grant("vision", "h200-1g", borrowed=True, hour=9)
    refused = ask("nlp", usage=[slice_, grant("nlp"), grant("vision")], capacity={"h100": 2})
    assert not refused.allowed and not refused.reclaim


def test_a_capability_class_guarantee_reclaims_a_borrowed_card_of_a_model_it_takes():
    """ "Any 40 GB card" (a capability class) and "H100" draw on the same cards: a node of H100s
    is in the class. lab is guaranteed one card of the class; ops borrowed the last free card
    as an H100. lab's spawn was refused "There is no 40 GB+ card here. Try again later", no
    reclaim asked: the guarantee never met while ops's server ran, as a pair's
    once was. An H100 (or an 80 GB class's server) holds a card any 40 GB class takes: it is
    asked back. The other way round, a class's server may hold another model (an A100 for
    "any 80 GB card"), and a grant names its tier, not its card: an H100 guarantee takes it
    back only where the hub knows it holds an H100 (on Kubernetes, its pod's node)."""
    tiers = load_tiers(
        [
            {"name": "h100", "gpu": "H100-80GB", "display_name": "H100"},
            {"name": "big", "min_memory_gb": 80, "display_name": "80 GB+"},
            {"name": "any40", "min_memory_gb": 40, "display_name": "40 GB+"},
            {"name": "l4", "gpu": "L4-24GB", "display_name": "L4"},
        ]
    )
    teams = load_quotas(
        {
            "lab": {"guaranteed": {"any40": 1, "big": 1, "h100": 1}, "tiers": "*"},
            "ops": {"tiers": "*", "priority": 5},
        },
        tiers,
    )
    borrowed = Grant("o1/", "o1", "ops", "h100", 1, 1.0, borrowed=True, priority=5)
    # The node's one card, ops's H100: no card of the class is free (another tier's holds it).
    capacity = {"h100": 1, "big": 0, "any40": 0, "l4": 0}
    lab = Request("l1/", "l1", "lab", "any40")
    admission = admit(lab, [borrowed], capacity, teams, tiers)
    assert not admission.allowed
    assert admission.reclaim == (borrowed,), admission.reason
    assert admission.reason == (
        "All 40 GB+ cards are in use (1 by H100 servers), some borrowed by other teams beyond "
        "their guarantee. Team lab is within its guarantee, so 1 is being taken back from "
        "them: try again in a few minutes."
    )
    # A narrower class's server holds a card the wider class takes.
    in_class = Grant("o2/", "o2", "ops", "big", 1, 1.0, borrowed=True, priority=5)
    assert admit(lab, [in_class], capacity, teams, tiers).reclaim == (in_class,)
    # Not a card the class leaves out (an L4's 24 GB), nor the class's server for an H100.
    small = Grant("o3/", "o3", "ops", "l4", 1, 1.0, borrowed=True, priority=5)
    assert admit(lab, [small], capacity, teams, tiers).reclaim == ()
    wider = Grant("o4/", "o4", "ops", "any40", 1, 1.0, borrowed=True, priority=5)
    for_h100 = Request("l2/", "l2", "lab", "h100")
    refused = admit(for_h100, [wider], {**capacity, "h100": 0}, teams, tiers)
    assert not refused.allowed and refused.reclaim == ()
    assert admit(Request("l3/", "l3", "lab", "big"), [wider], capacity, teams, tiers).reclaim == ()
    # Where the hub knows the card a class's server holds (its pod's node), it is asked back
    # for a named card's guarantee on that card, and only then.
    on_h100 = {"o4/": "NVIDIA-H100-80GB-HBM3"}
    taken = admit(for_h100, [wider], {**capacity, "h100": 0}, teams, tiers, on_h100)
    assert taken.reclaim == (wider,), taken.reason
    on_a100 = {"o4/": "NVIDIA-A100-SXM4-80GB"}
    assert admit(for_h100, [wider], {**capacity, "h100": 0}, teams, tiers, on_a100).reclaim == ()


def test_among_equal_priorities_the_newest_borrowed_server_goes_first():
    early, late, middle = (grant("ops", borrowed=True, hour=h) for h in (9, 11, 10))
    usage = [*grants("vision", 4), early, late, middle]
    assert ask("nlp", usage=usage, capacity={"h100": 7}).reclaim == (late,)
    # nlp's second card within its guarantee: two must go.
    two = ask("nlp", usage=[*usage, grant("nlp")], capacity={"h100": 7})
    assert two.reclaim == (late, middle)
    assert "so 2 are being taken back" in two.reason


def test_grants_labelled_borrowed_are_not_reclaimed_once_their_team_is_back_within_its_guarantee():
    # vision's first four servers stopped; the two left were borrowed when they started but are
    # now within vision's guarantee of 4. ops borrowed one card.
    kept = grants("vision", 2, borrowed=True, hour=12)
    ops = grant("ops", borrowed=True, hour=9)
    admission = ask("nlp", usage=[*kept, ops, *grants("nlp", 1)], capacity={"h100": 4})
    assert admission.reclaim == (ops,)
    # Nothing anyone may take back: no reclaim, a plain refusal.
    refused = ask("nlp", usage=[*kept, *grants("nlp", 1)], capacity={"h100": 3})
    assert not refused.allowed and not refused.reclaim
    assert refused.reason.startswith("All 3 H100 cards are in use.")


def test_a_borrowing_team_reclaims_only_from_lower_priority_borrowers():
    vision_borrowed = grant("vision", borrowed=True, hour=10)
    usage = [
        *grants("vision", 4),
        vision_borrowed,
        *grants("nlp", 2),
        grant("ops", borrowed=True, hour=9),
    ]  # 8 of 8
    nlp = ask("nlp", usage=usage)  # priority 10, beyond its guarantee of 2
    assert not nlp.allowed
    assert nlp.reclaim == (vision_borrowed,)  # priority 0 before ops' 5
    assert nlp.reason == (
        "No H100 is free to borrow, but team nlp outranks teams that borrowed some: they are "
        "being reclaimed, try again in a few minutes."
    )
    ops = ask("ops", usage=usage)  # priority 5: only vision's borrowed card is below it
    assert ops.reclaim == (vision_borrowed,)
    vision = ask("vision", usage=usage)  # priority 0: nobody's borrowed card is below it
    assert not vision.allowed and not vision.reclaim


# -- per-user cap, unknown team, tiers not offered --------------------------------------------


def test_the_per_user_cap_counts_gpu_equivalents_across_tiers():
    mine = [
        grant("vision", user="alice", server="alice/train"),
        grant("vision", "h200-1g", user="alice", server="alice/"),
    ]  # 1 + 1/7
    refused = ask("vision", "h100x2", usage=mine, server="alice/big")
    assert not refused.allowed
    assert refused.reason == (
        "You may hold 2 GPU-equivalents at once (team vision's per-user cap); you hold 1.14 "
        "(server 'train' on H100, your default server on H200 1g.18gb) and 2 x H100 counts 2. "
        "Stop one of your servers, or pick a smaller tier (H200 1g.18gb fits)."
    )
    small = ask("vision", "h200-1g", usage=mine, server="alice/small")
    assert small.allowed
    # On the smallest tier there is nothing smaller to pick: the advice says so.
    full = [grant("vision", user="alice", server=f"alice/{n}") for n in ("a", "b")]
    smallest = ask("vision", "h200-1g", usage=full, server="alice/c")
    assert smallest.reason.endswith("counts 0.14. Stop one of your servers first.")
    # Other users' servers do not count against alice.
    assert ask("vision", "h100", usage=grants("vision", 3), server="alice/x").allowed


def test_unknown_team_unknown_tier_and_a_tier_not_offered():
    nobody = ask("robotics")
    assert not nobody.allowed
    assert nobody.reason.startswith("Team 'robotics' has no GPU quota.")
    no_tier = ask("vision", "a100")
    assert not no_tier.allowed
    assert no_tier.reason == "There is no GPU tier 'a100' (tiers: h100, h200-1g, h100x2)."
    not_offered = ask("nlp", "h200-1g")
    assert not not_offered.allowed
    assert not_offered.reason == "H200 1g.18gb is not offered to team nlp (offered: H100)."


def test_the_requests_own_server_is_not_counted_against_it():
    # The hub records a pending spawn before admission runs again: alice's own server is there.
    own = grant("vision", user="alice", server="alice/")
    usage = [own, *grants("vision", 3)]
    admission = ask("vision", usage=usage)
    assert admission.allowed and not admission.borrowed
    assert "4 of 4" in admission.reason
    # Nor against her cap: a 2-card server re-admitted while it holds 2.
    big = grant("vision", "h100x2", user="alice", server="alice/big")
    assert ask("vision", "h100x2", usage=[big], server="alice/big").allowed
    assert not ask("vision", "h100x2", usage=[big], server="alice/other").allowed


# -- the spawn form's lines --------------------------------------------------------------------


def test_tier_use_lines_for_the_spawn_form():
    usage = [*grants("vision", 4), grant("vision", "h200-1g", user="alice", server="alice/x")]
    lines = tier_use("alice", "vision", usage, {"h100": 8, "h200-1g": 7}, quotas(), TIERS)
    assert [line.tier for line in lines] == ["h100", "h200-1g", "h100x2"]
    h100, mig, pair = lines
    assert (h100.team_used, h100.guaranteed, h100.guaranteed_left) == (4, 4, 0)
    assert (h100.in_use, h100.capacity) == (4, 8)
    assert h100.admission.allowed and h100.admission.borrowed
    assert (mig.team_used, mig.in_use, mig.capacity) == (1, 1, 7)
    assert mig.admission.allowed
    assert pair.capacity is None
    assert not pair.admission.allowed  # 1/7 held + 2 > alice's cap of 2
    assert "You may hold 2 GPU-equivalents" in pair.admission.reason

    nlp = tier_use("bob", "nlp", usage, {"h100": 8}, quotas(), TIERS)
    assert [(line.tier, line.guaranteed_left) for line in nlp] == [("h100", 2)]
    assert tier_use("bob", "robotics", usage, {}, quotas(), TIERS) == []


def test_tier_use_leaves_out_the_server_being_spawned():
    own = grant("vision", user="alice", server="alice/")
    lines = tier_use("alice", "vision", [own], {"h100": 1}, quotas(), TIERS, server="alice/")
    assert (lines[0].team_used, lines[0].in_use) == (0, 0)
    assert lines[0].admission.allowed


# -- loading ------------------------------------------------------------------------------------


def test_tiers_offered_to_a_team():
    loaded = quotas()
    assert loaded["vision"].tiers == {"h100", "h200-1g", "h100x2"}
    assert loaded["nlp"].tiers == {"h100"}  # from its guarantee
    assert loaded["ops"].tiers == {"h100"}  # from its borrowing limit
    everything = load_quotas({"all": {"tiers": "*"}}, TIERS)
    assert everything["all"].tiers == set(TIERS)
    assert (loaded["vision"].user_cap, loaded["nlp"].priority) == (2.0, 10)


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"guaranteed": {"h100": 1}, "colour": "red"}, ["'colour'"]),
        ({"guaranteed": {"a100": 1}}, ["'guaranteed'", "'a100'", "not defined"]),
        ({"guaranteed": {"h100": -1}}, ["'guaranteed.h100'", "-1"]),
        ({"guaranteed": {"h100": 1.5}}, ["'guaranteed.h100'", "1.5"]),
        ({"guaranteed": [1]}, ["'guaranteed'"]),
        ({"borrowing_limit": {"h100": True}}, ["'borrowing_limit.h100'"]),
        ({"lending_limit": {"mig": 1}}, ["'lending_limit'", "'mig'"]),
        ({"tiers": ["h100", "v100"]}, ["'tiers'", "'v100'"]),
        ({"tiers": "h100"}, ["'tiers'"]),
        ({"user_cap": 0}, ["'user_cap'", "0"]),
        ({"user_cap": "2"}, ["'user_cap'"]),
        # NaN passed "<= 0": no comparison holds, so a user's held + asked > NaN never was.
        ({"user_cap": float("nan")}, ["'user_cap'", "nan"]),
        ({"user_cap": float("inf")}, ["'user_cap'", "inf"]),
        ({"priority": "high"}, ["'priority'", "'high'"]),
        ({"guaranteed": {"h100x2": 3}}, ["'guaranteed.h100x2'", "multiple of 2", "got 3"]),
        ("4 cards", ["expected a dict"]),
    ],
)
def test_load_errors_name_the_team_and_the_key(entry, words):
    with pytest.raises(QuotaError) as error:
        load_quotas({"vision": QUOTAS["vision"], "bad": entry}, TIERS)
    message = str(error.value)
    assert message.startswith("quota for team 'bad': ")
    for word in words:
        assert word in message


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        (
            {"guaranteed": {"h100": 10**20}},
            "'guaranteed.h100' must be a whole number of devices from 0 to 1,000,000, "
            "got 100000000000000000000",
        ),
        (
            {"borrowing_limit": {"h100": 10**5000}},
            "'borrowing_limit.h100' must be a whole number of devices from 0 to 1,000,000, "
            "got a whole number of 16610 bits",
        ),
        (
            {"user_cap": 10**400},
            "'user_cap' must be a number of GPU-equivalents from 0 (exclusive) to 1,000,000, "
            "got a whole number of 1329 bits",
        ),
        (
            {"user_cap": 1e300},
            "'user_cap' must be a number of GPU-equivalents from 0 (exclusive) to 1,000,000, "
            "got 1e+300",
        ),
        (
            {"priority": 10**30},
            "'priority' must be a whole number from -1,000,000 to 1,000,000, "
            "got 1000000000000000000000000000000",
        ),
    ],
)
def test_a_quota_number_past_its_range_is_refused_naming_the_team_the_key_and_the_range(
    entry, words
):
    """A team's quota had no upper bound: 10**20 guaranteed devices, a cap of 1e300 were taken,
    a cap of 10**400 raised OverflowError (``float()``) naming nothing, 10**5000 devices a
    ValueError from the message's own repr."""
    with pytest.raises(QuotaError) as error:
        load_quotas({"vision": QUOTAS["vision"], "bad": entry}, TIERS)
    assert str(error.value) == f"quota for team 'bad': {words}"


def test_load_refuses_what_is_not_a_dict_of_teams():
    with pytest.raises(QuotaError, match="dict of team: quota"):
        load_quotas([QUOTAS["vision"]], TIERS)
    with pytest.raises(QuotaError, match="non-empty strings"):
        load_quotas({"": {}}, TIERS)


def test_a_tier_beyond_a_limit_on_its_own_is_not_told_to_stop_servers():
    """Nothing held: stopping a server cannot help, the refusal says to pick another tier."""
    tiers = load_tiers(
        [
            {"name": "h100", "display_name": "H100", "gpu": "H100-80GB"},
            {"name": "pair", "display_name": "H100 pair", "gpu": "H100-80GB", "count": 2},
        ]
    )
    capped = load_quotas({"lab": {"guaranteed": {"h100": 1}, "user_cap": 1, "tiers": "*"}}, tiers)
    refused = admit(Request("gus/", "gus", "lab", "pair"), [], {}, capped, tiers)
    assert refused.reason.endswith(
        "you hold 0 (nothing) and H100 pair counts 2. Pick a smaller tier (H100 fits)."
    )
    no_borrowing = load_quotas(
        {"lab": {"guaranteed": {"h100": 1}, "borrowing_limit": {"pair": 0}, "tiers": "*"}}, tiers
    )
    refused = admit(Request("gus/", "gus", "lab", "pair"), [], {}, no_borrowing, tiers)
    assert refused.reason.endswith(
        "may not borrow any; it holds none and this server needs 2. Pick another tier."
    )


def test_the_borrowing_refusal_docs_profiles_md_shows_is_the_one_given():
    """docs/profiles.md quotes the refusal at a team's borrowing limit (the Kubernetes
    example's vision: 10 H100s guaranteed, 4 more borrowed): the words a user gets."""
    tiers = load_tiers([{"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"}])
    vision = load_quotas(
        {"vision": {"guaranteed": {"h100": 10}, "borrowing_limit": {"h100": 4}}}, tiers
    )
    held = [Grant(f"u{i}/", f"u{i}", "vision", "h100", 1, 1.0, borrowed=i >= 10) for i in range(14)]
    refused = admit(Request("ann/", "ann", "vision", "h100"), held, {"h100": 24}, vision, tiers)
    doc = (Path(__file__).resolve().parent.parent / "docs" / "profiles.md").read_text()
    quoted = re.search(r"> (Team vision may borrow.*?another tier\.)", doc, re.S)[1]
    assert refused.reason == " ".join(quoted.replace(">", "").split())
