"""The files the command line writes (``replay --summary-json``, ``export-trace -o``,
``diagnose --save-model``, all through ``cli.written``), as an admin running them as root in a
folder a user can write finds them: a link the user put there is never written through."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jupyter_gpu_gov import cli
from jupyter_gpu_gov.core import clock

TRACE = Path(__file__).parent / "data" / "traces" / "zombie_open_tab.jsonl"
SECRET = "root:$6$admin's:19000:0:99999:7:::\n"  # a file of the admin's the link points at


def _windows(tmp_path: Path) -> Path:
    from jupyter_gpu_gov.diagnose import faults

    path = tmp_path / "windows.jsonl"
    path.write_text(
        "".join(json.dumps(w.as_dict()) + "\n" for w, _ in faults.generate(8, 20, seed=4))
    )
    return path


def _history(tmp_path: Path) -> str:
    from sqlalchemy import create_engine

    from jupyter_gpu_gov.hub.history import HistoryLog, HistoryOptions
    from jupyter_gpu_gov.replay.history import HistoryRow

    db = f"sqlite:///{tmp_path / 'gov.sqlite'}"
    now = clock.utcnow().timestamp()
    HistoryLog(create_engine(db), HistoryOptions()).append(
        HistoryRow(t=now - 3000 + 60 * i, server="ada/", started=now - 3000, gpu_sm=0.5)
        for i in range(40)
    )
    return db


@pytest.fixture
def commands(tmp_path):
    """Each command, writing to the path it is given."""
    windows, db = _windows(tmp_path), _history(tmp_path)
    return {
        "replay --summary-json": lambda out: ["replay", str(TRACE), "--summary-json", out],
        "export-trace -o": lambda out: ["export-trace", "--since", "1h", "--db-url", db, "-o", out],
        "diagnose --save-model": lambda out: ["diagnose", str(windows), "--save-model", out],
    }


def test_a_symbolic_link_is_not_written_through(commands, tmp_path, capsys):
    """``open(path, "w")`` followed the link: the admin's file was truncated and overwritten
    with the command's output. The command now refuses (status 2, saying so) and writes
    nothing: the file is as it was, the link still a link."""
    victim = tmp_path / "shadow"
    for name, argv in commands.items():
        victim.write_text(SECRET)
        link = tmp_path / "users-folder" / f"{name.split()[0]}.out"
        link.parent.mkdir(exist_ok=True)
        link.symlink_to(victim)
        capsys.readouterr()
        assert cli.main(argv(str(link))) == 2, name
        err = capsys.readouterr().err
        assert "symbolic link" in err, (name, err)
        assert victim.read_text() == SECRET, name
        assert link.is_symlink() and sorted(os.listdir(link.parent)) == [link.name], name
        link.unlink()


def test_a_hard_link_keeps_what_its_other_name_holds(commands, tmp_path, capsys):
    """A hard link to the admin's file (where the system lets a user make one) was written
    through as a symbolic link was. The output is written beside the name and renamed over
    it: the name holds the output, the other name what it held."""
    victim = tmp_path / "shadow"
    for name, argv in commands.items():
        victim.write_text(SECRET)
        out = tmp_path / f"{name.split()[0]}.out"
        os.link(victim, out)
        assert cli.main(argv(str(out))) == 0, (name, capsys.readouterr().err)
        assert victim.read_text() == SECRET, name
        assert out.stat().st_size > 0 and not os.path.samefile(out, victim), name
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".partial")]


def test_outputs_are_written_whole_and_to_a_device_as_it_is(commands, tmp_path, capsys):
    """A new file, a file written again, and ``/dev/null`` (a device: never replaced) are
    written; a folder is refused before anything is done."""
    summary = tmp_path / "run.json"
    for _ in range(2):
        assert cli.main(commands["replay --summary-json"](str(summary))) == 0
        assert json.loads(summary.read_text())["by"] == "policy"
    assert cli.main(commands["export-trace -o"]("/dev/null")) == 0
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")
    capsys.readouterr()
    assert cli.main(commands["export-trace -o"](str(tmp_path))) == 2
    assert "Is a directory" in capsys.readouterr().err
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".partial")]
