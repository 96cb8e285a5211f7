"""What the command lines say when something is wrong: the file or setting at fault in plain
words, an exit code of 2, and never a traceback or traitlets' search paths."""

from __future__ import annotations

import contextlib
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


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("c.GpuProfiles.tiers = 5", "The 'tiers' trait of a GpuProfiles instance expected a list"),
        ("c.GpuProfiles.tiers = [5]", "expected a dict, not the int 5"),
    ],
)
def test_what_if_names_tiers_of_the_wrong_type(tmp_path, capsys, setting, words):
    """Tiers that are not a list of dicts gave traitlets' traceback (the profile layer's
    check, which names them, ran only once they had a type)."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"t": 0, "server": "alice/", "gpu_sm": 0.0}\n')
    candidate = tmp_path / "candidate.py"
    candidate.write_text(setting + "\n")
    assert cli.main(["what-if", str(trace), "--policy", str(candidate)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jupyter-gpu-gov what-if: error: ") and words in err, err


def answering(answer: bytes):
    """A server on a free local port that reads a request and answers ``answer`` (raw bytes;
    none: it closes at once) and closes, for as many requests as come; its URL."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                conn.recv(65536)
                conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return listener, f"http://127.0.0.1:{listener.getsockname()[1]}/services/gpu-gov/"


def http_200(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (b"", "the connection closed without an answer"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "not an HTTP answer"),
        (http_200("caf\xe9".encode("latin-1")), "not UTF-8"),
    ],
)
@pytest.mark.parametrize("command", [["usage"], ["diagnose", "--cluster"]])
def test_a_url_that_is_not_the_governors_is_named_not_a_traceback(capsys, command, answer, words):
    """--url pointing at something else (an SSH port, a server that hangs up, one answering
    Latin-1) gave http.client's or the codec's traceback."""
    listener, url = answering(answer)
    try:
        assert cli.main([*command, "--url", url, "--token", "t"]) == 2
    finally:
        listener.close()
    err = capsys.readouterr().err
    assert err.startswith(f"jupyter-gpu-gov {command[0]}: error: {url}api/"), err
    assert words in err and "Traceback" not in err and "\n" not in err.rstrip("\n"), err


@pytest.mark.parametrize("body", [b"[]", b'{"cost": {"causes": {"zombie": {}}}}', b'"x"'])
def test_a_cluster_report_of_another_shape_is_named_not_a_traceback(capsys, body):
    """JSON that is not a cluster report (another service, another version) raised
    AttributeError or KeyError out of the text report."""
    listener, url = answering(http_200(body))
    try:
        assert cli.main(["diagnose", "--cluster", "--url", url, "--token", "t"]) == 2
    finally:
        listener.close()
    out, err = capsys.readouterr()
    assert out == "" and "error: the service's answer is not a cluster report" in err, err


@pytest.mark.parametrize("status", [b"200 OK", b"500 Internal Server Error"])
def test_a_url_answering_without_end_is_named_not_read_into_memory(status):
    """A wrong --url may answer without end (a stream, a file served at its size): ``diagnose
    --cluster`` read the whole answer (an error's too) before looking at it, and took memory
    until it died. It stops past 64 MiB, naming the limit; an error's text past 64 KiB."""
    import resource
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:  # a head with no length, then zeros until the client hangs up
        conn, _ = listener.accept()
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 " + status + b"\r\nConnection: close\r\n\r\n")
            block = b"0" * (1 << 20)
            while True:
                conn.sendall(block)

    threading.Thread(target=serve, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/services/gpu-gov/"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_")}

    def bounded() -> None:  # what it took before, cut short: 2 GiB of memory
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    try:
        argv = ["diagnose", "--cluster", "--url", url, "--token", "t"]
        result = subprocess.run(
            [sys.executable, "-m", "jupyter_gpu_gov.cli", *argv],
            cwd=REPO,
            env=clean,
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=bounded,
        )
    finally:
        listener.close()
    assert result.returncode == 2, result.stderr[-500:]
    assert "Traceback" not in result.stderr, result.stderr[-500:]
    assert result.stderr.startswith(f"jupyter-gpu-gov diagnose: error: {url}api/diagnosis?")
    if status.startswith(b"200"):
        assert "the answer is longer than 67,108,864 bytes (64 MiB)" in result.stderr
    else:  # the error's text, cut as every quoted text is
        assert "HTTP 500: 000" in result.stderr and "more characters)" in result.stderr
        assert len(result.stderr) < 3000, len(result.stderr)


@pytest.mark.parametrize("command", ["diagnose", "diagnose --baseline", "export-trace"])
def test_output_piped_into_head_ends_quietly(tmp_path, command):
    """``jupyter-gpu-gov diagnose windows.jsonl | head`` ended in a BrokenPipeError traceback
    (export-trace said "error: [Errno 32] Broken pipe", status 2; the streamed ``--baseline``
    "cannot read windows.jsonl: Broken pipe"): a reader that has read enough is no error to
    report."""
    import json

    from sqlalchemy import create_engine

    from jupyter_gpu_gov.core import clock
    from jupyter_gpu_gov.diagnose import faults
    from jupyter_gpu_gov.hub.history import HistoryLog, HistoryOptions
    from jupyter_gpu_gov.replay.history import HistoryRow

    if command.startswith("diagnose"):
        path = tmp_path / "windows.jsonl"
        with open(path, "w") as f:
            for window, _ in faults.generate(30, 30, seed=4):
                f.write(json.dumps(window.as_dict()) + "\n")
        args = [*command.split(), str(path)]
    else:
        db = f"sqlite:///{tmp_path / 'gov.sqlite'}"
        now = clock.utcnow().timestamp()
        HistoryLog(create_engine(db), HistoryOptions()).append(
            HistoryRow(t=now - 86_000 + 60 * i, server=f"u{s}/", started=now - 86_000)
            for i in range(0, 1400, 5)
            for s in range(20)
        )
        args = ["export-trace", "--since", "1d", "--step", "1m", "--db-url", db]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_")}
    reader = subprocess.Popen(
        [sys.executable, "-m", "jupyter_gpu_gov.cli", *args],
        cwd=REPO,
        env=clean,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert reader.stdout.readline()  # as head -1: one line, then the pipe is closed
    reader.stdout.close()
    err = reader.stderr.read()
    assert reader.wait(timeout=120) == 1 and err.count("\n") <= 1, err
    assert "Traceback" not in err and "error" not in err, err


def test_a_parameter_count_too_large_to_compute_with_is_named(capsys):
    """``1e308`` parameters overflowed the arithmetic: a traceback (and on the hub's estimate
    endpoint, an error page)."""
    assert cli.main(["estimate", "1e308"]) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith("error: params: '1e308' is more than 1,000T parameters"), err


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "FILE"],
        ["replay", "-"],
        ["what-if", "-", "--policy", "POLICY"],
        ["diagnose", "FILE"],
        ["diagnose", "--baseline", "FILE"],
        ["diagnose", "-"],
    ],
)
def test_an_endless_input_is_a_line_too_long_not_all_memory_or_disk(tmp_path, argv):
    """A file handed to the admin may be a link to ``/dev/zero`` (or a pipe that never ends a
    line): ``replay`` read it into memory without end (a pipe's lines were kept), ``diagnose
    FILE`` read it for ever, and ``diagnose -`` copied it to a temporary file without end (8 GB
    of disk in a minute). Each now stops at the first line past 1 MiB, naming it."""
    import resource

    link = tmp_path / "trace.jsonl"
    link.symlink_to("/dev/zero")
    policy = tmp_path / "policy.py"
    policy.write_text("c.GpuGovernor.policies = []\n")
    args = [{"FILE": str(link), "POLICY": str(policy)}.get(a, a) for a in argv]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_")}

    def bounded() -> None:  # what it took before, cut short: 2 GiB of memory
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    with open("/dev/zero") as zero:
        result = subprocess.run(
            [sys.executable, "-m", "jupyter_gpu_gov.cli", *args],
            cwd=REPO,
            env={**clean, "TMPDIR": str(tmp_path)},
            stdin=zero,
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=bounded,
        )
    assert result.returncode == 2, result.stderr[-500:]
    assert "line 1: longer than 1,048,576 characters" in result.stderr, result.stderr[-500:]
    assert "Traceback" not in result.stderr
