"""GPU tiers as an admin writes them: whole cards, capability classes, MIG slices, time-shares."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jupyter_gpu_gov.profiles.tiers import (
    GPU_RESOURCE,
    GPU_TOLERATION,
    SHARED_RESOURCE,
    CardError,
    TierError,
    load_cards,
    load_tiers,
)


def one(entry: dict):
    (tier,) = load_tiers([entry]).values()
    return tier


# -- whole cards and capability classes --------------------------------------------------------


def test_whole_card_selects_its_product_and_counts_one_gpu_equivalent_per_card():
    tiers = load_tiers(
        [
            {"name": "l4", "gpu": "L4-24GB"},
            {"name": "h100x2", "gpu": "H100-80GB", "count": 2, "interconnect": "nvlink"},
        ]
    )
    assert list(tiers) == ["l4", "h100x2"]  # the admin's order is the spawn form's order

    l4 = tiers["l4"]
    assert (l4.kind, l4.resource, l4.count, l4.memory_gb, l4.weight) == (
        "whole",
        GPU_RESOURCE,
        1,
        24,
        1.0,
    )
    assert l4.node_selector == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    assert l4.tolerations == (GPU_TOLERATION,)

    pair = tiers["h100x2"]
    assert (pair.count, pair.weight) == (2, 2.0)
    # Two GPU feature discovery product names (SXM and PCIe): an "In" affinity, not a selector.
    assert {"key": "nvidia.com/gpu.product", "operator": "In"}.items() <= pair.node_affinity[
        0
    ].items()
    assert set(pair.node_affinity[0]["values"]) == {"NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe"}
    assert pair.summary == "2 x H100-80GB, nvlink · 160 GB GPU memory"


def test_capability_class_selects_nodes_by_memory_not_by_model():
    big = one({"name": "big", "min_memory_gb": 80, "count": 2, "max_age": "3d"})
    assert (big.kind, big.card, big.memory_gb, big.weight) == ("whole", None, 80, 2.0)
    # GFD reports MiB; an "80 GB" H100 shows 81559 MiB, so the floor is 95 % of 80 GiB.
    (expression,) = big.node_affinity
    assert expression["key"] == "nvidia.com/gpu.memory"
    assert expression["operator"] == "Gt"
    assert 46068 < int(expression["values"][0]) < 81559  # an L40S does not qualify
    assert big.summary == "2 x ≥ 80 GB GPU · 160 GB GPU memory · up to 3d"


# -- MIG ----------------------------------------------------------------------------------------

# (card, profile, resource, memory GB, weight): the weight is the larger of the compute share
# (g of 7) and the memory share (rounded to eighths of the card).
MIG_CASES = [
    ("A100-40GB", "1g.5gb", "nvidia.com/mig-1g.5gb", 5, 0.1429),  # 1/7 compute
    ("A100-40GB", "1g.10gb", "nvidia.com/mig-1g.10gb", 10, 0.25),  # 2/8 memory > 1/7
    ("A100-40GB", "3g.20gb", "nvidia.com/mig-3g.20gb", 20, 0.5),  # half the memory
    ("A100-40GB", "7g.40gb", "nvidia.com/mig-7g.40gb", 40, 1.0),
    ("A100-80GB", "1g.10gb", "nvidia.com/mig-1g.10gb", 10, 0.1429),
    ("A100-80GB", "2g.20gb", "nvidia.com/mig-2g.20gb", 20, 0.2857),  # 2/7 > 2/8
    ("A100-80GB", "4g.40gb", "nvidia.com/mig-4g.40gb", 40, 0.5714),  # 4/7 > 4/8
    ("H100-80GB", "1g.10gb", "nvidia.com/mig-1g.10gb", 10, 0.1429),
    ("H100-80GB", "1g.20gb", "nvidia.com/mig-1g.20gb", 20, 0.25),
    ("H100-80GB", "3g.40gb", "nvidia.com/mig-3g.40gb", 40, 0.5),
    ("H200-141GB", "1g.18gb", "nvidia.com/mig-1g.18gb", 18, 0.1429),
    ("H200-141GB", "1g.35gb", "nvidia.com/mig-1g.35gb", 35, 0.25),
    ("H200-141GB", "2g.35gb", "nvidia.com/mig-2g.35gb", 35, 0.2857),
    ("H200-141GB", "3g.71gb", "nvidia.com/mig-3g.71gb", 71, 0.5),
    ("H200-141GB", "4g.71gb", "nvidia.com/mig-4g.71gb", 71, 0.5714),
    ("H200-141GB", "7g.141gb", "nvidia.com/mig-7g.141gb", 141, 1.0),
]


@pytest.mark.parametrize(("card", "profile", "resource", "memory", "weight"), MIG_CASES)
def test_mig_slice_asks_for_the_mixed_strategy_resource(card, profile, resource, memory, weight):
    tier = one({"name": "slice", "gpu": card, "mig": profile})
    assert tier.kind == "mig"
    assert tier.resource == resource
    assert tier.memory_gb == memory
    assert tier.weight == pytest.approx(weight, abs=1e-4)
    assert tier.weight >= 1 / 8
    assert tier.node_selector["nvidia.com/mig.strategy"] == "mixed"
    assert tier.summary == f"MIG slice {profile} of an {card} · {memory} GB GPU memory"


def test_h200_slices_select_h200_and_h200_nvl_nodes():
    tier = one({"name": "h200-3g", "gpu": "H200-141GB", "mig": "3g.71gb", "max_age": "8h"})
    (expression,) = tier.node_affinity
    assert set(expression["values"]) == {"NVIDIA-H200", "NVIDIA-H200-NVL"}
    assert tier.max_age == timedelta(hours=8)


# -- time-slicing and the 1/8 floor -------------------------------------------------------------


@pytest.mark.parametrize(("replicas", "weight"), [(2, 0.5), (4, 0.25), (8, 0.125)])
def test_time_shared_card_counts_its_share(replicas, weight):
    tier = one({"name": "l4-shared", "gpu": "L4-24GB", "replicas": replicas})
    assert (tier.kind, tier.resource, tier.replicas) == ("shared", SHARED_RESOURCE, replicas)
    assert tier.weight == weight
    assert tier.summary.startswith(f"1/{replicas} time-share of an L4-24GB")


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"name": "tiny", "gpu": "L4-24GB", "replicas": 16}, ["'replicas'", "2 to 8", "16"]),
        ({"name": "tiny", "gpu": "L4-24GB", "weight": 0.1}, ["'weight'", "0.1", "1/8"]),
        (
            {"name": "tiny", "gpu": "H100-80GB", "mig": "1g.10gb", "weight": 0.1},
            ["'weight'", "0.1", "1/8"],
        ),
    ],
)
def test_nothing_smaller_than_an_eighth_of_a_card(entry, words):
    with pytest.raises(TierError) as error:
        load_tiers([entry])
    assert "tier 0 ('tiny')" in str(error.value)
    for word in words:
        assert word in str(error.value)


def test_an_admin_weight_overrides_the_computed_one():
    tier = one({"name": "a10", "gpu": "A10-24GB", "weight": 0.5})
    assert tier.weight == 0.5


# -- validation: every error names the entry and the key ---------------------------------------

GOOD = {"name": "ok", "gpu": "H100-80GB"}


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"name": "bad", "gpu": "H100-80GB", "colour": "red"}, "'colour'"),
        ({"name": "Bad Name", "gpu": "H100-80GB"}, "'name'"),
        ({"name": "bad\n", "gpu": "H100-80GB"}, "'name'"),  # a YAML block scalar's newline
        ({"name": "bad", "gpu": "H100-80GB", "formerly": ["old\n"]}, "'formerly'"),
        ({"name": "bad", "gpu": "V100"}, "'gpu'"),
        ({"name": "bad"}, "'min_memory_gb'"),
        ({"name": "bad", "gpu": "H100-80GB", "min_memory_gb": 80}, "'min_memory_gb'"),
        ({"name": "bad", "min_memory_gb": -1}, "'min_memory_gb'"),
        ({"name": "bad", "gpu": "H100-80GB", "count": 0}, "'count'"),
        ({"name": "bad", "gpu": "H100-80GB", "count": 17}, "'count'"),
        ({"name": "bad", "gpu": "H100-80GB", "count": "2"}, "'count'"),
        ({"name": "bad", "gpu": "L4-24GB", "mig": "1g.5gb"}, "'mig'"),
        ({"name": "bad", "gpu": "H100-80GB", "mig": "1g.5gb"}, "'mig'"),  # an A100 profile
        ({"name": "bad", "gpu": "H100-80GB", "mig": "1g.10gb", "replicas": 2}, "'replicas'"),
        ({"name": "bad", "gpu": "H100-80GB", "mig": "1g.10gb", "count": 2}, "'count'"),
        ({"name": "bad", "min_memory_gb": 24, "replicas": 2}, "'replicas'"),
        ({"name": "bad", "gpu": "L4-24GB", "replicas": 1}, "'replicas'"),
        ({"name": "bad", "gpu": "H100-80GB", "weight": True}, "'weight'"),
        ({"name": "bad", "gpu": "H100-80GB", "weight": 0}, "'weight'"),
        # NaN passed "<= 0" and "< 1/8" (every comparison is false): showback billed NaN
        # GPU-hours, and a quota's sum of them admitted everything. inf: never admitted.
        ({"name": "bad", "gpu": "H100-80GB", "weight": float("nan")}, "'weight'"),
        ({"name": "bad", "gpu": "H100-80GB", "weight": float("inf")}, "'weight'"),
        ({"name": "bad", "gpu": "H100-80GB", "weight": 1e308}, "'weight'"),
        ({"name": "bad", "min_memory_gb": float("nan")}, "'min_memory_gb'"),  # named no key
        ({"name": "bad", "min_memory_gb": float("inf")}, "'min_memory_gb'"),  # OverflowError
        ({"name": "bad", "min_memory_gb": 1e300}, "'min_memory_gb'"),
        ({"name": "bad", "gpu": "H100-80GB", "max_age": "soon"}, "'max_age'"),
        ({"name": "bad", "gpu": "H100-80GB", "max_age": -5}, "'max_age'"),
        ({"name": "bad", "gpu": "H100-80GB", "display_name": 3}, "'display_name'"),
        ({"name": "bad", "gpu": "H100-80GB", "node_selector": {"zone": 1}}, "'node_selector'"),
        ({"name": "bad", "gpu": "H100-80GB", "tolerations": {}}, "'tolerations'"),
        ({"name": "bad", "gpu": "H100-80GB", "node_affinity": "x"}, "'node_affinity'"),
        ({"name": "bad", "gpu": "H100-80GB", "kubespawner_override": []}, "'kubespawner_override'"),
        ({"name": "bad", "gpu": "H100-80GB", "formerly": "h100"}, "'formerly'"),
        ({"name": "bad", "gpu": "H100-80GB", "formerly": ["bad"]}, "'formerly'"),
        ({"name": "bad", "gpu": "H100-80GB", "formerly": ["Old Name"]}, "'formerly'"),
    ],
)
def test_errors_name_the_entry_and_the_key(entry, key):
    with pytest.raises(TierError) as error:
        load_tiers([GOOD, entry])
    message = str(error.value)
    assert message.startswith(f"tier 1 ({entry['name']!r}):")
    assert key in message


def test_a_former_name_belongs_to_one_tier_and_no_tier_has_it_now():
    with pytest.raises(TierError, match=r"tier 'new': 'formerly' names 'ok', which is also"):
        load_tiers([GOOD, {"name": "new", "gpu": "H100-80GB", "formerly": ["ok"]}])
    twice = [{**GOOD, "formerly": ["old"]}, {"name": "new", "gpu": "L4-24GB", "formerly": ["old"]}]
    with pytest.raises(TierError, match=r"'formerly' names 'old'"):
        load_tiers(twice)


def test_a_name_used_twice_and_a_non_dict_entry_are_refused():
    with pytest.raises(TierError, match=r"tier 1 \('ok'\): the name is used twice"):
        load_tiers([GOOD, dict(GOOD)])
    with pytest.raises(TierError, match=r"tier 1: expected a dict, got str"):
        load_tiers([GOOD, "h100"])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (3600, timedelta(hours=1)),
        ("90m", timedelta(minutes=90)),
        ("1h30m", timedelta(minutes=90)),
        ("3d", timedelta(days=3)),
        (timedelta(hours=2), timedelta(hours=2)),
    ],
)
def test_max_age(value, expected):
    entry = {**GOOD, "max_age": value} if value is not None else GOOD
    assert one(entry).max_age == expected


# -- matching local devices (NVML names) ---------------------------------------------------------

H100_SXM = "NVIDIA H100 80GB HBM3"
CATALOGUE = load_tiers(
    [
        {"name": "h100", "gpu": "H100-80GB"},
        {"name": "h100-1g", "gpu": "H100-80GB", "mig": "1g.10gb"},
        {"name": "a100-1g", "gpu": "A100-80GB", "mig": "1g.10gb"},
        {"name": "big", "min_memory_gb": 80},
        {"name": "l40s", "gpu": "L40S-48GB"},
    ]
)


@pytest.mark.parametrize(
    ("tier", "name", "mig", "memory_mb", "fits"),
    [
        ("h100", H100_SXM, None, 81559, True),
        ("h100", "NVIDIA H100 PCIe", None, 81559, True),
        ("h100", "NVIDIA A100-SXM4-80GB", None, 81920, False),
        ("h100", f"{H100_SXM} MIG 1g.10gb", "1g.10gb", 9984, False),  # a slice is not a card
        ("h100-1g", f"{H100_SXM} MIG 1g.10gb", "1g.10gb", 9984, True),
        ("h100-1g", f"{H100_SXM} MIG 1g.20gb", "1g.20gb", 19968, False),
        ("h100-1g", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", "1g.10gb", 9984, False),
        ("h100-1g", H100_SXM, None, 81559, False),  # a whole card is not a slice
        ("a100-1g", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", "1g.10gb", 9984, True),
        ("big", H100_SXM, None, 81559, True),  # reports a little under 80 GiB
        ("big", "NVIDIA A100-SXM4-80GB", None, 81920, True),
        ("big", "NVIDIA L40S", None, 46068, False),
        ("big", H100_SXM, None, None, False),  # memory unknown
        ("big", f"{H100_SXM} MIG 7g.80gb", "7g.80gb", 81000, False),
        ("l40s", "NVIDIA L40S", None, 46068, True),
    ],
)
def test_fits_device(tier, name, mig, memory_mb, fits):
    assert CATALOGUE[tier].fits_device(name, mig, memory_mb) is fits


# -- the catalogue ------------------------------------------------------------------------------

# Every card the catalogue must know, a GPU feature discovery product of it, and its MIG
# profiles as NVIDIA's MIG user guide lists them ("Supported MIG Profiles").
CATALOGUE_CARDS = [
    ("A30-24GB", "NVIDIA-A30", ["1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"]),
    ("A100-40GB", "NVIDIA-A100-SXM4-40GB",
     ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
    ("A100-80GB", "NVIDIA-A100-80GB-PCIe",
     ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    ("H100-SXM-80GB", "NVIDIA-H100-80GB-HBM3",
     ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    ("H100-PCIe-80GB", "NVIDIA-H100-PCIe",
     ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    ("H100-NVL-94GB", "NVIDIA-H100-NVL",
     ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"]),
    ("H200-141GB", "NVIDIA-H200",
     ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]),
    ("GH200-96GB", "NVIDIA-GH200-480GB",
     ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"]),
    ("GH200-144GB", "NVIDIA-GH200-144G-HBM3e",
     ["1g.18gb", "1g.18gb+me", "1g.36gb", "2g.36gb", "3g.72gb", "4g.72gb", "7g.144gb"]),
    ("B200-180GB", "NVIDIA-B200",
     ["1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"]),
    ("L4-24GB", "NVIDIA-L4", []),
    ("L40S-48GB", "NVIDIA-L40S", []),
    ("T4-16GB", "Tesla-T4", []),
    ("V100-16GB", "Tesla-V100-SXM2-16GB", []),
    ("V100-32GB", "Tesla-V100-PCIE-32GB", []),
]  # fmt: skip


@pytest.mark.parametrize(("card", "product", "profiles"), CATALOGUE_CARDS)
def test_the_catalogue_knows_the_card_and_every_mig_profile(card, product, profiles):
    whole = one({"name": "whole", "gpu": card})
    selected = whole.node_selector.get("nvidia.com/gpu.product")
    assert product == selected or product in whole.node_affinity[0]["values"]
    for profile in profiles:
        tier = one({"name": "slice", "gpu": card, "mig": profile})
        # The device plugin spells '+' as '.': '+' is no character of a resource name.
        assert tier.resource == "nvidia.com/mig-" + profile.replace("+", ".")
        assert 1 / 8 <= tier.weight <= 1
    if not profiles:
        with pytest.raises(TierError, match="'mig' needs 'gpu' naming a MIG-capable card"):
            load_tiers([{"name": "slice", "gpu": card, "mig": "1g.10gb"}])


def test_a30_slices_are_quarters_of_the_card():
    """The A30 has 4 compute and 4 memory slices, not the 7 and 8 of the larger cards."""
    quarter = one({"name": "a30-1g", "gpu": "A30-24GB", "mig": "1g.6gb"})
    half = one({"name": "a30-2g", "gpu": "A30-24GB", "mig": "2g.12gb+me"})
    assert (quarter.weight, half.weight) == (0.25, 0.5)
    assert half.resource == "nvidia.com/mig-2g.12gb.me"
    assert half.summary == "MIG slice 2g.12gb+me of an A30-24GB · 12 GB GPU memory"


def test_admin_cards_extend_the_catalogue_and_errors_name_the_card():
    cards = load_cards(
        {
            "RTX-6000-Ada-48GB": {"products": ["NVIDIA-RTX-6000-Ada-Generation"], "memory_gb": 48},
            "H100-80GB": {"products": ["NVIDIA-H100-80GB-HBM3"], "memory_gb": 80},  # SXM only
        }
    )
    tiers = load_tiers(
        [{"name": "rtx", "gpu": "RTX-6000-Ada-48GB"}, {"name": "h100", "gpu": "H100-80GB"}], cards
    )
    assert tiers["rtx"].node_selector == {
        "nvidia.com/gpu.product": "NVIDIA-RTX-6000-Ada-Generation"
    }
    assert tiers["h100"].node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert "B200-180GB" in cards  # the built-in ones stay
    with pytest.raises(TierError, match=r"add one with c\.GpuProfiles\.cards"):
        load_tiers([{"name": "rtx", "gpu": "RTX-6000-Ada-48GB"}])

    for entry, words in [
        ({"memory_gb": 48}, "'products'"),
        ({"products": ["a b"], "memory_gb": 48}, "'products'"),
        ({"products": ["X"], "memory_gb": "48"}, "'memory_gb'"),
        ({"products": ["X"], "memory_gb": 48, "mig_profiles": ["half"]}, "'mig_profiles'"),
        ({"products": ["X"], "memory_gb": 48, "mig_profiles": ["1g.96gb"]}, "larger than"),
        ({"products": ["X"], "memory_gb": 48, "mig_slices": [9, 8]}, "'mig_slices'"),
        ({"products": ["X"], "memory_gb": 48, "colour": "red"}, "'colour'"),
    ]:
        with pytest.raises(CardError) as error:
            load_cards({"X-48GB": entry})
        assert str(error.value).startswith("card 'X-48GB':") and words in str(error.value)
