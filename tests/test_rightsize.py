"""Right-sizing: the smallest tier a server's measured use fits (``core.rightsize``), from the
profile layer's tiers (``profiles.estimate.tier_sizes``) to the verdict, the admin list and the
usage ledger of a governor fed with reports."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest
from fake_hub_api import FakeHub
from test_report import REPORT

from jupyter_gpu_gov.core import clock, ledger
from jupyter_gpu_gov.core.policy import load_policies
from jupyter_gpu_gov.core.rightsize import (
    TierSizeError,
    Use,
    load_tier_sizes,
    right_size,
)
from jupyter_gpu_gov.hub import showback
from jupyter_gpu_gov.hub.hubapi import HubApi
from jupyter_gpu_gov.hub.options import Options
from jupyter_gpu_gov.hub.reconcile import Governor
from jupyter_gpu_gov.hub.store import Store
from jupyter_gpu_gov.profiles.estimate import tier_sizes

# The demo hub's tiers (hub_config/jupyterhub_config.py): an H100 and three of its MIG slices.
TIERS = [
    {"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"},
    {"name": "h100-3g", "display_name": "Half an H100", "gpu": "H100-80GB", "mig": "3g.40gb"},
    {"name": "h100-2g", "display_name": "H100 MIG 2g.20gb", "gpu": "H100-80GB", "mig": "2g.20gb"},
    {"name": "h100-1g", "display_name": "Small slice", "gpu": "H100-80GB", "mig": "1g.10gb"},
]
SIZES = load_tier_sizes(tier_sizes(TIERS))
HOUR = timedelta(hours=1)


def test_the_catalogue_is_the_profile_layers_tiers_as_the_estimate_counts_them():
    assert {name: (s.memory_gb, round(s.weight, 3)) for name, s in SIZES.items()} == {
        "h100": (80, 1.0),
        "h100-3g": (40, 0.5),  # its memory share: half the card
        "h100-2g": (20, 0.286),
        "h100-1g": (10, 0.143),
    }
    assert SIZES["h100-1g"].label == "Small slice"


@pytest.mark.parametrize(
    ("memory_mb", "activity", "fits"),
    [
        (6_000, 0.05, "h100-1g"),  # 6.3 GB + 12 % and 5 % of a card: a 1g slice
        (9_000, 0.05, "h100-2g"),  # 9.4 GB + 12 % is over 10 GB
        (6_000, 0.20, "h100-2g"),  # 20 % of a card would be 140 % of a 1g slice
        (30_000, 0.30, "h100-3g"),
        (60_000, 0.05, None),  # only the whole card holds it
        (6_000, 0.70, None),  # the busiest minute needs the whole card
    ],
)
def test_the_smallest_tier_that_holds_the_peak_memory_and_activity(memory_mb, activity, fits):
    found = right_size("h100", Use(memory_mb, activity, 2 * HOUR), SIZES)
    assert (found and found[0].name) == fits
    if fits:
        hint = found[1]
        assert hint["tier"] == fits and hint["label"] == SIZES[fits].label
        assert hint["reason"].startswith("it used at most ") and "over 2h; " in hint["reason"]
        # The smaller tier named with its figures, its share said as this tier's.
        size = SIZES[fits]
        share = f"{size.weight:.0%}"
        assert hint["reason"].endswith(
            f"{size.label} has {size.memory_gb:g} GB and counts {share} of H100 80 GB's "
            "GPU-equivalents"
        )


def test_no_hint_without_enough_evidence_or_a_known_tier():
    small = Use(6_000, 0.05, 2 * HOUR)
    assert right_size("h100", Use(6_000, 0.05, 30 * timedelta(minutes=1)), SIZES) is None
    assert right_size("h100", Use(6_000, 0.0, 2 * HOUR), SIZES) is None  # never worked: idle
    assert right_size("a100", small, SIZES) is None and right_size(None, small, SIZES) is None
    assert right_size("h100-1g", small, SIZES) is None  # already the smallest
    _, hint = right_size("h100", small, SIZES, cause="small_work")
    assert "(the diagnosis: too little work per step)" in hint["reason"]


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([{"name": "x", "memory_gb": 10}], "tier 0 ('x'): 'weight' must be a number > 0"),
        (
            [{"name": "x", "memory_gb": float("nan"), "weight": 1}],
            "tier 0 ('x'): 'memory_gb' must be a number > 0",
        ),
        (
            [{"name": "x", "memory_gb": 10, "weight": float("inf")}],
            "tier 0 ('x'): 'weight' must be a number > 0",
        ),
        ([{"name": "x", "memory_gb": 10, "weight": 1, "gpu": "H100"}], "unknown key 'gpu'"),
        ([{"memory_gb": 10, "weight": 1}], "'name' (and 'label') must be non-empty strings"),
        (["h100"], "tier 0: expected a dict"),
        (
            [{"name": "x", "memory_gb": 10, "weight": 1, "formerly": "old"}],
            "tier 0 ('x'): 'formerly' must be a list of earlier names",
        ),
        (
            [
                {"name": "x", "memory_gb": 10, "weight": 1, "formerly": ["y"]},
                {"name": "y", "memory_gb": 10, "weight": 1},
            ],
            "tier 'x': 'formerly' names 'y', which is also another tier's name",
        ),
    ],
)
def test_a_bad_catalogue_entry_is_named(entries, message):
    with pytest.raises(TierSizeError) as info:
        load_tier_sizes(entries)
    assert message in str(info.value)


def small_report(user: str, memory_mb: float, sm: float) -> dict:
    report = copy.deepcopy(REPORT)
    report["server"]["user"] = user
    report["sampled_at"] = clock.isoformat(clock.utcnow())
    report["targets"][0]["gpu"].update(memory_mb=memory_mb, sm=sm, holds_context=True)
    report["window"]["gpu_active_fraction"] = 1.0 if sm else 0.0
    return report


async def test_a_server_using_a_slice_of_its_card_is_told_and_showback_counts_the_hours(
    tmp_path,
):
    clock.reset()
    try:
        async with FakeHub() as hub:
            grant = {"gpu-gov/tier": "h100", "gpu-gov/team": "vision"}
            # The profile layer's record of the grant, in the spawner's state.
            state = {"gpu_gov_grant": grant}
            hub.add_server("alice", started=clock.utcnow(), state=state)
            hub.add_server("bob", started=clock.utcnow(), state=state)
            gov = Governor(
                Store(f"sqlite:///{tmp_path / 'gov.sqlite'}"),
                HubApi(hub.api_url, hub.token),
                load_policies([]),
                Options(tier_sizes=SIZES, ledger_max_gap=timedelta(minutes=3)),
            )
            for _ in range(80):  # 80 minutes of reports, a pass a minute
                gov.ingest(small_report("alice", 6_000, 0.05))  # a notebook on a small model
                gov.ingest(small_report("bob", 60_000, 0.9))  # training that needs the card
                await gov.reconcile()
                clock.advance(60)
            verdict, listed = gov.verdict("alice/"), gov.listing(gov.row("alice/"))
            gov.flush_usage()
            (row,) = showback.usage(gov.store, gov.options, ["user"], "all", None, user="alice")
    finally:
        clock.reset()
    assert verdict["right_size"]["tier"] == "h100-1g"
    assert listed["right_size"] == verdict["right_size"]
    assert gov.verdict("bob/")["right_size"] is None
    # From the pass that knew (an hour of reports), 6/7 of each GPU-hour would have been free.
    freed = row["gpu_hours_right_size_freed"]
    assert freed == pytest.approx(20 / 60 * (1 - 1 / 7), abs=0.03)
    assert row["gpu_hours_allocated"] == pytest.approx(80 / 60, abs=0.03)
    assert ledger.RIGHT_SIZE_FREED in ledger.FIELDS


def test_a_renamed_tier_reaches_the_governor_with_its_former_names():
    """The profile layer's ``formerly`` is passed on with the tiers the governor sizes
    (``add_governor(c, tiers=tier_sizes(...))``): without it the governor could not tell a
    server granted under the old name from one of an unknown tier."""
    renamed = [{**TIERS[0], "name": "h100-sxm", "formerly": ["h100"]}, *TIERS[1:]]
    sizes = load_tier_sizes(tier_sizes(renamed))
    assert sizes["h100-sxm"].formerly == ("h100",) and sizes["h100-3g"].formerly == ()
    options = Options(tier_sizes=sizes, gpu_hour_cost={"h100-sxm": 3.0})
    assert options.tier_names("h100") == options.tier_names("h100-sxm") == ("h100-sxm", "h100")
    assert options.tier_names("h100-3g") == ("h100-3g",)
    assert options.cost_per_hour("h100") == 3.0  # a past row under the old name
