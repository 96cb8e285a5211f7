"""The command lines write what they read as it comes, in memory bounded whatever its size:
``usage`` the service's answer, ``diagnose`` its file."""

from __future__ import annotations

import threading
import tracemalloc
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from jupyter_gpu_gov import cli

HEADER = "day,user,team,gpu_hours\r\n"


def _line(i: int) -> str:
    # A CRLF every line, a control character now and then, a name of two-byte characters:
    # pieces split mid-line, mid-CRLF and mid-character.
    return (
        f"2026-01-{1 + i % 28:02d},u{i:06d},t\x1b{i % 7},{i * 0.25}\r\n"
        if i % 9
        else (f"2026-01-01,é{i},ü,1.0\r\n")
    )


def _serving(lines: int, cut_after: int | None = None):
    """A server answering ``GET .../api/usage`` as the governor does: CSV streamed in chunks
    (a chunk of 1,000 lines), cut off after ``cut_after`` lines where given."""

    class Governor(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/csv; charset=UTF-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            parts = [HEADER]
            for i in range(lines):
                if cut_after is not None and i == cut_after:
                    self.wfile.write(b"5\r\nab")  # a chunk left half-way: the transfer cut
                    self.close_connection = True
                    return
                parts.append(_line(i))
                if len(parts) >= 1000:
                    self._chunk("".join(parts))
                    parts.clear()
            self._chunk("".join(parts))
            self.wfile.write(b"0\r\n\r\n")

        def _chunk(self, text: str) -> None:
            data = text.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Governor)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/services/gpu-gov/"


def test_usage_writes_the_answer_as_it_comes_in_bounded_memory(tmp_path, monkeypatch):
    """``jupyter-gpu-gov usage`` read the whole answer (a year by user and day is millions of
    rows), decoded it and copied it twice before printing a line: 4.7 MB of CSV took 18.5 MB.
    Now a piece at a time, the same text written (control characters shown as escapes,
    CRLF as a newline)."""
    lines = 150_000  # about 4.7 MB
    server, url = _serving(lines)
    out = tmp_path / "usage.csv"
    try:
        with open(out, "w", encoding="utf-8", newline="") as stream:
            monkeypatch.setattr("sys.stdout", stream)
            cli.main(["usage", "--url", url, "--token", "t"])  # (imports, caches: not measured)
            stream.seek(0)
            stream.truncate()
            tracemalloc.start()
            try:
                assert cli.main(["usage", "--url", url, "--token", "t"]) == 0
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
    finally:
        server.shutdown()
    body = HEADER + "".join(_line(i) for i in range(lines))
    assert out.read_text(encoding="utf-8") == cli.shown(body)  # as it was printed whole
    assert len(body) > 4_000_000 and peak < 2_000_000, f"{peak / 1e6:.1f} MB"


def test_usage_cut_off_by_the_service_says_so(tmp_path, monkeypatch, capsys):
    """The service cuts a streamed answer off where it fails: the command says the answer
    stopped part-way (status 2), not that all is well."""
    server, url = _serving(5000, cut_after=3000)
    try:
        assert cli.main(["usage", "--url", url, "--token", "t"]) == 2
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    assert "the answer stopped part-way (what was written is incomplete)" in err, err


def test_diagnose_baseline_reads_its_file_a_window_at_a_time(tmp_path, monkeypatch, capsys):
    """``diagnose --baseline FILE`` held the file's text and every window before printing a
    line; the rules read each window alone, so now it holds a line (the file read twice:
    checked whole first, so that a bad file still prints nothing), and prints the same."""
    import json

    from jupyter_gpu_gov.diagnose import faults, rules
    from jupyter_gpu_gov.diagnose.features import read_windows

    path = tmp_path / "windows.jsonl"
    with open(path, "w") as f:
        for window, _ in faults.generate(100, 100, seed=4):  # 10,000 windows, 4 MB
            f.write(json.dumps(window.as_dict()) + "\n")
    out = tmp_path / "out.jsonl"
    with open(out, "w") as stream:
        monkeypatch.setattr("sys.stdout", stream)
        small = tmp_path / "small.jsonl"  # (imports, caches: not measured)
        small.write_text(path.read_text().split("\n", 1)[0] + "\n")
        cli.main(["diagnose", "--baseline", str(small)])
        stream.seek(0)
        stream.truncate()
        capsys.readouterr()
        tracemalloc.start()
        try:
            assert cli.main(["diagnose", "--baseline", str(path)]) == 0
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    windows = read_windows(path)
    expected = [
        json.dumps({"server": w.server, "t": w.t, **rules.baseline(w).as_dict()}) for w in windows
    ]
    assert out.read_text().splitlines() == expected
    summary = json.loads(capsys.readouterr().err)
    assert summary["windows"] == 10_000 and sum(summary["labels"].values()) == 10_000
    assert peak < 2_000_000, f"{peak / 1e6:.1f} MB"  # before: 12.9 MB


def test_diagnose_with_a_model_reads_its_file_a_window_at_a_time(tmp_path, monkeypatch, capsys):
    """``diagnose --model PATH FILE`` held the file's text and every window (twice: as read and
    in context) before printing a line. A file in time order (the hub's windows and exports
    are) is now read a window at a time, three times (checked whole, so that a bad file
    still prints nothing; the young nodes' learning; the diagnoses), holding each server's
    last few running windows: the same bytes out. A file in another order is held, as
    before, and answers the same."""
    import json
    import random

    from jupyter_gpu_gov.diagnose import faults
    from jupyter_gpu_gov.diagnose.counterfactual import Diagnoser
    from jupyter_gpu_gov.diagnose.features import read_windows

    windows = sorted((w for w, _ in faults.generate(100, 100, seed=4)), key=lambda w: w.t)
    path = tmp_path / "windows.jsonl"  # 10,000 windows, in time order
    path.write_text("".join(json.dumps(w.as_dict()) + "\n" for w in windows))
    model = tmp_path / "model.pkl"  # learnt elsewhere: most of this file's nodes are young
    Diagnoser().fit([w for w, _ in faults.generate(8, 40, seed=5)]).save(model)

    def expected(source) -> tuple[str, dict]:
        read = read_windows(source)
        results = Diagnoser.load(model).diagnose_many(read)
        lines = [
            json.dumps({"server": w.server, "t": w.t, **r.as_dict()}) + "\n"
            for w, r in zip(read, results, strict=True)
        ]
        return "".join(lines), dict(sorted(Counter(r.label for r in results).items()))

    out = tmp_path / "out.jsonl"
    with open(out, "w") as stream:
        monkeypatch.setattr("sys.stdout", stream)
        small = tmp_path / "small.jsonl"  # (imports, caches: not measured)
        small.write_text(path.read_text().split("\n", 1)[0] + "\n")
        cli.main(["diagnose", "--model", str(model), str(small)])
        stream.seek(0)
        stream.truncate()
        capsys.readouterr()
        tracemalloc.start()
        try:
            assert cli.main(["diagnose", "--model", str(model), str(path)]) == 0
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    text, labels = expected(path)
    assert out.read_text() == text
    summary = json.loads(capsys.readouterr().err)
    assert summary == {"windows": 10_000, "by": f"model {model}", "labels": labels}
    assert peak < 2_000_000, f"{peak / 1e6:.1f} MB"  # before: 17.6 MB (0.85 MB now)

    shuffled = tmp_path / "shuffled.jsonl"  # another order: held, the same answers
    lines = path.read_text().splitlines(keepends=True)[:2000]
    random.Random(1).shuffle(lines)
    shuffled.write_text("".join(lines))
    with open(out, "w") as stream:
        monkeypatch.setattr("sys.stdout", stream)
        assert cli.main(["diagnose", "--model", str(model), str(shuffled)]) == 0
    assert out.read_text() == expected(shuffled)[0]


def test_diagnose_reads_stdin_a_window_at_a_time(tmp_path, monkeypatch, capsys):
    """``diagnose -`` held standard input's text and every window (twice) before printing a
    line, and the model learns from the whole of it. Now standard input is copied to a file
    a piece at a time and read as a file is: the model learns from a sort on disk, the rows
    are diagnosed as read again. A file by server, then time (as the simulator writes), prints
    the same bytes as the held reading; so do --baseline and --model; a bad row is still
    named with its line, and nothing printed."""
    import json

    from jupyter_gpu_gov.diagnose import faults, features
    from jupyter_gpu_gov.diagnose.counterfactual import Diagnoser
    from jupyter_gpu_gov.diagnose.features import read_windows

    path = tmp_path / "windows.jsonl"  # 10,000 windows, 4 MB, by server then time
    path.write_text(
        "".join(json.dumps(w.as_dict()) + "\n" for w, _ in faults.generate(100, 100, seed=4))
    )
    model = tmp_path / "model.pkl"
    Diagnoser().fit([w for w, _ in faults.generate(8, 40, seed=5)]).save(model)
    read = read_windows(path)
    learnt = Diagnoser().fit(sorted(read, key=lambda w: w.t or 0.0))  # as the held reading did
    expected = "".join(
        json.dumps({"server": w.server, "t": w.t, **r.as_dict()}) + "\n"
        for w, r in zip(read, learnt.diagnose_many(read), strict=True)
    )
    monkeypatch.setattr(features, "SORT_RUN", 1000)  # (10 runs: the sort's merge is read)

    def diagnose(*args: str, stdin=path) -> int:
        with open(stdin) as source, open(tmp_path / "out", "w") as out:
            monkeypatch.setattr("sys.stdin", source)
            monkeypatch.setattr("sys.stdout", out)
            return cli.main(["diagnose", *args])

    def printed(*args: str, stdin=path) -> tuple[int, str, str]:
        status = diagnose(*args, stdin=stdin)
        return status, (tmp_path / "out").read_text(), capsys.readouterr().err

    small = tmp_path / "small.jsonl"  # (imports, caches: not measured)
    small.write_text(path.read_text().split("\n", 1)[0] + "\n")
    diagnose("-", stdin=small)
    capsys.readouterr()
    tracemalloc.start()
    try:
        status = diagnose("-")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert status == 0 and (tmp_path / "out").read_text() == expected
    summary = json.loads(capsys.readouterr().err)
    assert summary["windows"] == 10_000 and summary["trained_on"] == learnt.trained_on
    assert peak < 3_000_000, f"{peak / 1e6:.1f} MB"  # before: 22.3 MB (1.7 MB now)

    for options in (["--baseline"], ["--model", str(model)]):
        assert printed(*options, "-")[:2] == printed(*options, str(path))[:2]

    bad = tmp_path / "bad.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    bad.write_text("".join(lines[:5000]) + '{"server": "a/", "sm_active": 2}\n' + lines[5000])
    for options in ([], ["--baseline"], ["--model", str(model)]):
        status, out, err = printed(*options, "-", stdin=bad)
        assert status == 2 and out == "", options
        assert "<stdin>: line 5001, column sm_active: must be in [0, 1]" in err, err


def test_the_sort_on_disk_sorts_as_sorted_does(tmp_path, monkeypatch):
    """``features.sorted_on_disk``, which ``diagnose`` learns from: the windows in ``sorted``'s
    order, ties in the order given (each named by its place), however many runs it writes and
    merges in groups, as often as it is read; a file in time order is one run."""
    import random

    from jupyter_gpu_gov.diagnose import features
    from jupyter_gpu_gov.diagnose.features import Window, sorted_on_disk, time_key

    monkeypatch.setattr(features, "SORT_RUN", 7)
    monkeypatch.setattr(features, "SORT_FAN_IN", 3)  # 30 runs: 10, 4, then 2 to merge
    rng = random.Random(3)
    times = [float(t) for t in range(20)]  # in order at first: the first run
    times += [rng.choice([None, *range(30)]) for _ in range(200)]  # ties, times missing
    windows = [Window(server=f"s{i}", t=t, sm_active=0.5) for i, t in enumerate(times)]
    expected = [w.server for w in sorted(windows, key=time_key)]
    for n, shuffled in ((len(windows), windows), (20, windows[:20])):
        directory = tmp_path / str(n)
        directory.mkdir()
        read = sorted_on_disk(iter(shuffled), time_key, directory)
        want = expected if n == len(windows) else [w.server for w in shuffled]
        assert [w.server for w in read()] == want
        assert [w.as_dict() for w in read()] == [
            w.as_dict() for w in sorted(shuffled, key=time_key)
        ]
        assert len(list(directory.iterdir())) == (2 if n == len(windows) else 1)


def test_diagnose_names_its_source_in_every_error_about_a_row(tmp_path, monkeypatch, capsys):
    """A bad value was named ``<stdin>: line 4, column t``, but a header without a diagnosis
    column, a line that is not JSON or a row with more cells than the header only ``line N``:
    every such error now says which input, as the first does."""
    cases = {
        "a,b\n1,2\n": "line 1: no diagnosis columns",
        '{"sm_active": 0.1}\n{bad\n': "line 2: not JSON",
        "server,sm_active\na/,0.5,9\n": "line 2: 3 cells, the header has 2",
        "server,sm_active\na/,1.5\n": "line 2, column sm_active: must be in [0, 1]",
        # A line of megabytes, read whole before anything looked at it (the first line too):
        '{"sm_active": 0.1}\n{"note": "'
        + "z" * 1_100_000
        + '"}\n': "line 2: longer than 1,048,576",
        "server," + "z" * 1_100_000 + "\n": "line 1: longer than 1,048,576 characters",
        '{"t": 1' + "0" * 400 + "}\n": "line 1, column t: expected a finite number",
    }
    for text, error in cases.items():
        path = tmp_path / "windows.txt"
        path.write_text(text)
        for argument, name in (("-", "<stdin>"), (str(path), str(path))):
            for options in ([], ["--baseline"]):
                with open(path) as source:
                    monkeypatch.setattr("sys.stdin", source)
                    assert cli.main(["diagnose", *options, argument]) == 2
                err = capsys.readouterr().err
                assert f"{name}: {error}" in err, (options, argument, err)
