"""The GPU memory estimate, the smallest tier that holds it, and ``jupyter-gpu-gov estimate``.

memory = parameters x bytes per parameter x redundancy x (1 + reserve), in 10^9-byte GB.
"""

from __future__ import annotations

import json

import pytest

from jupyter_gpu_gov.cli import EXIT_USAGE, main
from jupyter_gpu_gov.profiles.estimate import (
    DEFAULT_TIERS,
    estimate_memory,
    parse_params,
    smallest_tier,
)
from jupyter_gpu_gov.profiles.tiers import load_tiers

CATALOGUE = load_tiers(DEFAULT_TIERS)


# -- the formula, on examples worked by hand ------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "precision", "mode", "options", "weights", "working", "total"),
    [
        # 7e9 x 2 B = 14 GB of weights; x 1.3 = 18.2 GB; + 12 % = 20.384 GB
        ("7B", "bf16", "inference", {}, 14.0, 18.2, 20.384),
        # 7e9 x 2 B = 14 GB; x 5 (weights, grads, Adam moments) = 70 GB; + 12 % = 78.4 GB
        ("7B", "bf16", "training", {}, 14.0, 70.0, 78.4),
        # 3.5e8 x 4 B = 1.4 GB; x 6 = 8.4 GB; + 15 % = 9.66 GB
        ("350M", "fp32", "training", {"redundancy": 6, "reserve": 0.15}, 1.4, 8.4, 9.66),
        # 7e10 x 0.5 B = 35 GB; x 1.5 = 52.5 GB; + 10 % = 57.75 GB
        ("70e9", "int4", "inference", {"redundancy": 1.5, "reserve": 0.10}, 35.0, 52.5, 57.75),
        # 1.3e9 x 2 B = 2.6 GB; x 1.2 = 3.12 GB; + 12 % = 3.4944 GB
        ("1.3b", "fp16", "inference", {"redundancy": 1.2}, 2.6, 3.12, 3.4944),
        # 1.3e10 x 1 B = 13 GB; x 4 = 52 GB; + 12 % = 58.24 GB
        (13_000_000_000, "int8", "training", {"redundancy": 4}, 13.0, 52.0, 58.24),
    ],
)
def test_worked_examples(params, precision, mode, options, weights, working, total):
    estimate = estimate_memory(params, precision, mode, **options)
    assert estimate.weights_gb == pytest.approx(weights)
    assert estimate.working_gb == pytest.approx(working)
    assert estimate.gb == pytest.approx(total)
    assert estimate.bytes == round(total * 1e9)
    assert estimate.reserve_gb == pytest.approx(total - working)
    assert estimate.breakdown["total_gb"] == pytest.approx(total)


def test_defaults_are_bf16_inference_with_a_12_percent_reserve():
    estimate = estimate_memory("7B")
    assert (estimate.precision, estimate.mode, estimate.redundancy, estimate.reserve) == (
        "bf16",
        "inference",
        1.3,
        0.12,
    )
    assert estimate_memory("7B", mode="training").redundancy == 5


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("7B", 7_000_000_000),
        ("350M", 350_000_000),
        ("1.3b", 1_300_000_000),
        ("70e9", 70_000_000_000),
        ("7E9", 7_000_000_000),
        ("13 B", 13_000_000_000),
        ("125k", 125_000),
        ("1.5T", 1_500_000_000_000),
        ("7_000_000_000", 7_000_000_000),
        ("7,000,000,000", 7_000_000_000),
        (7_000_000_000, 7_000_000_000),
        (7e9, 7_000_000_000),
    ],
)
def test_parameter_counts_as_people_write_them(text, count):
    assert parse_params(text) == count


# -- bad input names the argument and the value ------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "words"),
    [
        (("seven billion",), {}, ["params", "'seven billion'"]),
        (("7X",), {}, ["params", "'7X'"]),
        (("-7B",), {}, ["params", "'-7B'"]),
        ((0,), {}, ["params", "0"]),
        (("1e400",), {}, ["params", "'1e400'"]),
        ((True,), {}, ["params", "True"]),
        ((None,), {}, ["params", "None"]),
        (("7B", "fp8"), {}, ["precision", "'fp8'", "bf16"]),
        (("7B", "bf16", "train"), {}, ["mode", "'train'", "training", "inference"]),
        (("7B", "bf16", "training"), {"redundancy": 3}, ["redundancy", "3", "4-6", "training"]),
        (("7B", "bf16", "training"), {"redundancy": 7}, ["redundancy", "7", "4-6"]),
        (("7B", "bf16", "inference"), {"redundancy": 5}, ["redundancy", "5", "1.2-1.5"]),
        (("7B", "bf16", "inference"), {"redundancy": 1.1}, ["redundancy", "1.1", "1.2-1.5"]),
        (("7B",), {"redundancy": "high"}, ["redundancy", "'high'"]),
        (("7B",), {"reserve": 0.09}, ["reserve", "0.09", "0.1-0.15"]),
        (("7B",), {"reserve": 12}, ["reserve", "12", "0.1-0.15"]),  # a percentage, not a fraction
        (("7B",), {"reserve": float("nan")}, ["reserve", "nan"]),
    ],
)
def test_bad_input(args, kwargs, words):
    with pytest.raises(ValueError) as error:
        estimate_memory(*args, **kwargs)
    for word in words:
        assert word in str(error.value)


@pytest.mark.parametrize(
    ("mode", "redundancy"),
    [("training", 4), ("training", 6), ("inference", 1.2), ("inference", 1.5)],
)
def test_the_ends_of_each_range_are_allowed(mode, redundancy):
    assert estimate_memory("1B", "bf16", mode, redundancy=redundancy, reserve=0.15).redundancy == (
        redundancy
    )


@pytest.mark.parametrize("precision", ["BF16", "bfloat16", " bf16 "])
def test_precision_spellings(precision):
    assert estimate_memory("7B", precision).precision == "bf16"


# -- the smallest tier ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "precision", "mode", "tier"),
    [
        ("125M", "int4", "inference", "h200-1g"),  # 0.09 GB: the smallest slice, 18 GB
        ("7B", "bf16", "inference", "h200-1g-35"),  # 20.4 GB: 1g.35gb (1/4) before 2g.35gb (2/7)
        ("13B", "bf16", "inference", "h200-3g"),  # 37.9 GB: too big for 35 GB slices
        ("70B", "int4", "inference", "h200-3g"),  # 35 x 1.3 x 1.12 = 50.96 GB
        # 78.4 GB: h100 (80 GB), h200 and h200-7g (141 GB) all weigh 1; the least memory wins.
        ("7B", "bf16", "training", "h100"),
        ("13B", "bf16", "training", "h100x2"),  # 145.6 GB: 2 x 80 GB before 2 x 141 GB
        ("70B", "bf16", "training", "h200x8"),  # 784 GB: 8 x 141 = 1128 GB
        ("405B", "bf16", "training", None),  # 4536 GB: more than 8 H200 hold
    ],
)
def test_smallest_tier_of_the_default_catalogue(params, precision, mode, tier):
    chosen = smallest_tier(estimate_memory(params, precision, mode), CATALOGUE)
    assert (chosen.name if chosen else None) == tier


def test_fits_lists_the_tiers_that_hold_it_smallest_first():
    names = [t.name for t in estimate_memory("7B", "bf16", "training").fits(CATALOGUE)]
    assert names == ["h100", "h200", "h200-7g", "h100x2", "h200x2", "h200x4", "h200x8"]


def test_equal_tiers_are_chosen_by_name():
    tiers = load_tiers(
        [{"name": "b-h100", "gpu": "H100-80GB"}, {"name": "a-h100", "gpu": "H100-80GB"}]
    )
    assert smallest_tier(estimate_memory("7B"), tiers).name == "a-h100"


def test_a_time_shared_card_counts_only_its_share_of_the_memory():
    tiers = load_tiers(
        [{"name": "l4-shared", "gpu": "L4-24GB", "replicas": 4}, {"name": "l4", "gpu": "L4-24GB"}]
    )
    # 20.4 GB would fit the L4's 24 GB, but three other servers share that card.
    assert smallest_tier(estimate_memory("7B"), tiers).name == "l4"
    # 7e9 x 0.5 x 1.3 x 1.12 = 5.1 GB fits a quarter (6 GB).
    assert smallest_tier(estimate_memory("7B", "int4"), tiers).name == "l4-shared"


def test_a_capability_class_counts_all_its_cards():
    tiers = load_tiers([{"name": "big", "min_memory_gb": 80, "count": 2}])
    assert smallest_tier(estimate_memory("13B", mode="training"), tiers).name == "big"  # 145.6
    assert smallest_tier(estimate_memory("30B", mode="training"), tiers) is None  # 336 GB


# -- jupyter-gpu-gov estimate --------------------------------------------------------------------


def test_cli_prints_the_breakdown_and_the_suggestion(capsys):
    assert main(["estimate", "7B"]) == 0
    out = capsys.readouterr().out
    assert "7B parameters x 2 bytes (bf16) = 14.0 GB of weights" in out
    assert "x 1.3 for inference" in out
    assert "18.2 GB" in out
    assert "+ 12 % reserve = 20.4 GB of GPU memory" in out
    assert "Suggested: h200-1g-35 (MIG slice 1g.35gb of an H200-141GB · 35 GB GPU memory)" in out


def test_cli_suggests_a_mig_slice(capsys):
    assert main(["estimate", "13B", "--precision", "bf16", "--mode", "inference"]) == 0
    out = capsys.readouterr().out
    assert "Suggested: h200-3g (MIG slice 3g.71gb of an H200-141GB · 71 GB GPU memory)" in out


def test_cli_training_across_several_cards_says_it_needs_sharding(capsys):
    assert main(["estimate", "70B", "--mode", "training", "--redundancy", "5"]) == 0
    out = capsys.readouterr().out
    assert "= 784.0 GB of GPU memory" in out
    assert "Suggested: h200x8 (8 x H200-141GB · 1128 GB GPU memory)" in out
    assert "split across 8 GPUs" in out


def test_cli_when_nothing_fits(capsys):
    assert main(["estimate", "405B", "--precision", "fp32", "--mode", "training"]) == 0
    out = capsys.readouterr().out
    assert "Suggested" not in out
    assert "No tier holds 9,072.0 GB: the largest, h200x8, has 1,128.0 GB." in out


def test_cli_json(capsys):
    assert main(["estimate", "7B", "--mode", "training", "--reserve", "15%", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    result = json.loads(out)
    assert result["params"] == 7_000_000_000
    assert (result["precision"], result["mode"]) == ("bf16", "training")
    assert (result["redundancy"], result["reserve"]) == (5, 0.15)
    assert result["gb"] == pytest.approx(80.5)  # 14 x 5 x 1.15: no longer fits an H100
    assert result["breakdown"]["weights_gb"] == pytest.approx(14)
    assert result["breakdown"]["reserve_gb"] == pytest.approx(10.5)
    # 141 GB, weight 1: the whole H200 and its 7g.141gb slice tie; the name decides.
    assert result["tier"] == "h200"


def test_cli_json_when_nothing_fits(capsys):
    assert main(["estimate", "1T", "--mode", "training", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tier"] is None


def test_cli_reads_tiers_from_a_config_file(tmp_path, capsys):
    config = tmp_path / "jupyterhub_config.py"
    config.write_text(
        "c.GpuProfiles.tiers = [\n"
        "    {'name': 'a100-1g', 'gpu': 'A100-40GB', 'mig': '1g.5gb'},\n"
        "    {'name': 'a100-3g', 'gpu': 'A100-40GB', 'mig': '3g.20gb'},\n"
        "    {'name': 'a100', 'gpu': 'A100-40GB'},\n"
        "]\n"
        "c.GpuProfiles.tiers.append({'name': 'l40s', 'gpu': 'L40S-48GB'})\n"
    )
    assert main(["estimate", "7B", "--tiers", str(config)]) == 0  # 20.4 GB
    assert "Suggested: a100 (1 x A100-40GB · 40 GB GPU memory)" in capsys.readouterr().out
    assert main(["estimate", "3B", "--tiers", str(config), "--json"]) == 0  # 8.7 GB
    assert json.loads(capsys.readouterr().out)["tier"] == "a100-3g"
    assert main(["estimate", "13B", "--tiers", str(config)]) == 0  # 37.9 GB
    assert "Suggested: a100 " in capsys.readouterr().out
    assert main(["estimate", "20B", "--tiers", str(config)]) == 0  # 58.2 GB
    assert "No tier holds 58.2 GB: the largest, l40s, has 48.0 GB." in capsys.readouterr().out


def test_cli_reads_tiers_appended_to_an_empty_list(tmp_path, capsys):
    config = tmp_path / "config.py"
    config.write_text("c.GpuProfiles.tiers.append({'name': 'l4', 'gpu': 'L4-24GB'})\n")
    assert main(["estimate", "7B", "--tiers", str(config), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tier"] == "l4"


@pytest.mark.parametrize(
    ("argv", "config", "words"),
    [
        (["7X"], None, ["params", "'7X'"]),
        (["7B", "--precision", "fp8"], None, ["precision", "'fp8'"]),
        (["7B", "--mode", "serving"], None, ["mode", "'serving'"]),
        (["7B", "--mode", "training", "--redundancy", "9"], None, ["redundancy", "9", "4-6"]),
        (["7B", "--redundancy", "lots"], None, ["--redundancy", "'lots'"]),
        (["7B", "--reserve", "20%"], None, ["reserve", "0.2", "0.1-0.15"]),
        (["7B", "--reserve", "some"], None, ["--reserve", "'some'"]),
        (["7B", "--tiers", "TMP/missing.py"], None, ["--tiers", "missing.py"]),
        (
            ["7B", "--tiers", "TMP/c.py"],
            "c.GpuProfiles.tiers = [{'name': 'x'}]\n",
            ["tier 0 ('x')"],
        ),
        (
            ["7B", "--tiers", "TMP/c.py"],
            "c.GpuProfiles.tiers = [{'name': 'x', 'gpu': 'H100-80GB', 'mig': '1g.5gb'}]\n",
            ["tier 0 ('x')", "'mig'", "'1g.5gb'"],
        ),
        (["7B", "--tiers", "TMP/c.py"], "c.GpuProfiles.tiers = 'h100'\n", ["c.GpuProfiles.tiers"]),
        (["7B", "--tiers", "TMP/c.py"], "c.Other.x = 1\n", ["sets no tiers"]),
        (["7B", "--tiers", "TMP/c.py"], "c.GpuProfiles.tiers = [\n", ["SyntaxError"]),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, config, words):
    if config is not None:
        (tmp_path / "c.py").write_text(config)
    argv = [arg.replace("TMP", str(tmp_path)) for arg in argv]
    assert main(["estimate", *argv]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("jupyter-gpu-gov estimate: error: ")
    for word in words:
        assert word in lines[0]
