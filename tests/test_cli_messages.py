"""What the command lines say when something is wrong: the file or setting at fault in plain
words, an exit code of 2, and never a traceback or traitlets' search paths."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_gpu_gov import cli

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["replay", "trace.jsonl", "--config", "/nowhere/gov.py"], "--config"),
        (["estimate", "7B", "--tiers", "/nowhere/tiers.py"], "--tiers"),
    ],
)
def test_a_missing_config_file_is_named(argv, option, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith(f"error: cannot load {option}: {argv[-1]}: no such file")
    assert "ConfigFileNotFound" not in err and "search paths" not in err


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_")}
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=REPO,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_governor_started_by_hand_says_it_is_a_hub_service():
    done = run("jupyter_gpu_gov.hub")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "python -m jupyter_gpu_gov.hub: error: $JUPYTERHUB_API_TOKEN is not set" in done.stderr
    assert "add_governor" in done.stderr
    missing = run("jupyter_gpu_gov.hub", "--config=/nowhere/gpu_gov_config.py")
    assert missing.returncode == 2
    assert "--config /nowhere/gpu_gov_config.py: no such file" in missing.stderr
    assert run("jupyter_gpu_gov.hub", "--help").returncode == 0


def test_the_replay_benchmark_names_itself():
    done = run("benchmarks.replay", "--no-such-option")
    assert done.returncode == 2
    assert "python -m benchmarks.replay: error: unrecognized arguments" in done.stderr
    assert "__main__.py" not in done.stderr


@pytest.mark.parametrize(
    "url", ["http://[::1", "not a url", "ftp://hub/services/gpu-gov/", "http://exa mple/"]
)
@pytest.mark.parametrize("command", [["usage"], ["diagnose", "--cluster"]])
def test_a_bad_url_is_named_not_a_traceback(command, url):
    done = run("jupyter_gpu_gov.cli", *command, "--url", url, "--token", "t")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"error: --url {url!r}: " in done.stderr, done.stderr


def test_a_token_that_cannot_be_sent_is_named_and_not_printed():
    secret = "s3cret\nX-Injected: 1"
    done = run("jupyter_gpu_gov.cli", "usage", "--url", "http://127.0.0.1:1/", "--token", secret)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "s3cret" not in done.stderr
    assert "error: --token: " in done.stderr, done.stderr


def test_a_parameter_count_too_large_to_compute_with_is_named(capsys):
    """``1e308`` parameters overflowed the arithmetic: a traceback (and on the hub's estimate
    endpoint, an error page)."""
    assert cli.main(["estimate", "1e308"]) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith("error: params: '1e308' is more than 1,000T parameters"), err
