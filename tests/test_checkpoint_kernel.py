"""The kernel side of checkpoints (jupyter_gpu_gov.checkpoint): hooks, hooks.json, restore, the
magic; in-process, then across two real kernels as the server runs them."""

from __future__ import annotations

import errno
import json
import os
import pickle
import shutil
import stat
import tempfile
import threading
import uuid
from pathlib import Path

import pytest

from jupyter_gpu_gov import checkpoint
from jupyter_gpu_gov.checkpoint_layout import new_checkpoint_dir

NOTEBOOK = "work/train.ipynb"
NO_TORCH = "torch is an optional test extra: pip install torch==2.13.0"


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No hooks left from another test; checkpoints under tmp_path; running from train.ipynb."""
    monkeypatch.setattr(checkpoint, "_HOOKS", {})
    monkeypatch.setenv(checkpoint.ROOT_ENV, str(tmp_path / "checkpoints"))
    monkeypatch.setenv("JPY_SESSION_NAME", NOTEBOOK)
    return tmp_path / "checkpoints"


def kernel_dir(root: Path, ckpt_id: str, kid: str = "k1") -> Path:
    return root / ckpt_id / "kernels" / kid


def read_hooks(directory: Path) -> dict:
    return json.loads((directory / "hooks.json").read_text())


# --- in-process ----------------------------------------------------------------------------------


def test_register_forms_replace_and_unregister():
    @checkpoint.register
    def plots(directory):
        pass

    @checkpoint.register(name="tok")
    def save_tokenizer(directory):
        pass

    def logs(directory):
        pass

    assert checkpoint.register(logs) is logs
    checkpoint.save_variables("x", namespace={"x": 1})
    assert checkpoint.hooks() == ["plots", "tok", "logs", "variables"]

    checkpoint.register(logs, name="plots")  # re-running a cell replaces, keeps the place
    assert checkpoint.hooks() == ["plots", "tok", "logs", "variables"]
    assert checkpoint._HOOKS["plots"].fn is logs

    checkpoint.unregister("tok")
    assert checkpoint.hooks() == ["plots", "logs", "variables"]
    with pytest.raises(KeyError, match=r"no checkpoint hook named 'tok' \(registered: plots, "):
        checkpoint.unregister("tok")
    with pytest.raises(ValueError, match=r"hook name '<lambda>' cannot be a directory name"):
        checkpoint.register(lambda d: None)
    with pytest.raises(ValueError, match=r"'a/b'"):
        checkpoint.register(logs, name="a/b")
    with pytest.raises(ValueError, match=r"'logs\\n'"):  # ("$" matched before a final newline)
        checkpoint.register(logs, name="logs\n")


def test_save_variables_adds_names_and_names_what_is_missing():
    ns = {"x": 1, "y": 2, "model": object()}
    checkpoint.save_variables("x", namespace=ns)
    checkpoint.save_variables("y", "x", namespace=ns)
    assert checkpoint._HOOKS["variables"].variables == ["x", "y"]
    with pytest.raises(NameError, match=r"'modle' is not defined in the notebook namespace"):
        checkpoint.save_variables("x", "modle", namespace=ns)
    with pytest.raises(ValueError, match=r"variable names as strings, got 3"):
        checkpoint.save_variables(3, namespace=ns)
    with pytest.raises(ValueError, match=r"needs a model, an optimizer"):
        checkpoint.save_torch()


def test_run_hooks_writes_files_sizes_and_hooks_json(isolated):
    ns = {"x": [1, 2, 3], "cfg": {"lr": 0.1}}
    checkpoint.save_variables("x", "cfg", namespace=ns)

    @checkpoint.register
    def results(directory):
        (directory / "sub").mkdir()
        (directory / "sub" / "r.txt").write_text("hello")
        return {"rows": 5}

    target = kernel_dir(isolated, "20260101T000000Z")
    answer = checkpoint._run_hooks(str(target), "gpu-idle")

    record = read_hooks(target)
    assert record == answer
    assert record["format"] == 1
    assert record["notebook"] == NOTEBOOK
    assert record["reason"] == "gpu-idle"
    assert record["started_at"].endswith("Z") and record["completed_at"] >= record["started_at"]
    variables, res = record["hooks"]
    sizes = {f: (target / "variables" / f).stat().st_size for f in ("cfg.pkl", "x.pkl")}
    assert variables == {
        "name": "variables",
        "kind": "variables",
        "status": "done",
        "files": [{"path": f"variables/{f}", "bytes": n} for f, n in sizes.items()],
        "bytes": sum(sizes.values()),
        "seconds": variables["seconds"],
        "error": None,
        "note": None,
    }
    assert isinstance(variables["seconds"], float) and variables["seconds"] >= 0
    assert res["kind"] == "function" and res["status"] == "done" and res["note"] == {"rows": 5}
    assert res["files"] == [{"path": "results/sub/r.txt", "bytes": 5}] and res["bytes"] == 5
    assert not list(target.rglob(".*.tmp"))


def test_no_hooks_writes_nothing(isolated):
    target = kernel_dir(isolated, "20260101T000000Z")
    assert checkpoint._run_hooks(str(target), "gpu-idle") == {"hooks": []}
    assert not target.exists()


def test_hooks_json_says_which_hook_is_running(isolated):
    target = kernel_dir(isolated, "20260101T000000Z")
    seen = []

    @checkpoint.register
    def first(directory):
        seen.append([(h["name"], h["status"]) for h in read_hooks(target)["hooks"]])

    @checkpoint.register
    def second(directory):
        seen.append([(h["name"], h["status"]) for h in read_hooks(target)["hooks"]])

    checkpoint._run_hooks(str(target), "admin")
    # What the server finds if the kernel hangs in a hook: the hooks before it, and it "running".
    assert seen == [[("first", "running")], [("first", "done"), ("second", "running")]]
    assert read_hooks(target)["completed_at"] is not None


def test_a_raising_hook_is_recorded_and_the_next_still_runs(isolated):
    @checkpoint.register
    def broken(directory):
        (directory / "half.txt").write_text("half")
        raise ValueError("the results table is empty")

    checkpoint.save_variables("x", namespace={"x": 42})
    target = kernel_dir(isolated, "20260101T000000Z")
    record = checkpoint._run_hooks(str(target), "gpu-idle")

    broken_entry, variables = record["hooks"]
    assert broken_entry["status"] == "failed"
    assert broken_entry["error"] == "ValueError: the results table is empty"
    assert broken_entry["files"] == [{"path": "broken/half.txt", "bytes": 4}]
    assert variables["status"] == "done"
    with pytest.warns(UserWarning, match="hook 'broken' failed at the checkpoint: ValueError"):
        saved = checkpoint.restore()
    assert saved == {"broken": target / "broken", "x": 42}  # what it wrote before raising
    assert saved.errors == [
        "hook 'broken' failed at the checkpoint: ValueError: the results table is empty"
    ]


def test_a_hook_interrupted_by_the_server_stays_running(isolated):
    checkpoint.save_variables("x", namespace={"x": 1})

    @checkpoint.register
    def hangs(directory):
        raise KeyboardInterrupt  # what the server's interrupt does to a hook past its timeout

    target = kernel_dir(isolated, "20260101T000000Z")
    with pytest.raises(KeyboardInterrupt):
        checkpoint._run_hooks(str(target), "gpu-idle")
    record = read_hooks(target)
    assert [h["status"] for h in record["hooks"]] == ["done", "running"]
    assert record["completed_at"] is None
    with pytest.warns(UserWarning, match="hook 'hangs' did not finish at the checkpoint"):
        assert checkpoint.restore() == {"x": 1, "hangs": target / "hangs"}


def test_a_full_disk_is_recorded_with_its_message(isolated, monkeypatch):
    @checkpoint.register
    def weights(directory):
        raise OSError(errno.ENOSPC, "No space left on device")

    checkpoint.save_variables("x", namespace={"x": 1})

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint.pickle, "dump", disk_full)
    target = kernel_dir(isolated, "20260101T000000Z")
    record = checkpoint._run_hooks(str(target), "gpu-idle")

    weights_entry, variables = record["hooks"]
    assert weights_entry["error"] == "OSError: [Errno 28] No space left on device"
    assert variables["status"] == "failed"
    assert variables["error"] == "OSError: [Errno 28] No space left on device"
    # The interrupted write leaves no half file behind.
    assert variables["files"] == [] and not any((target / "variables").iterdir())
    line = checkpoint._hook_error_line(weights_entry, "k1", NOTEBOOK)
    assert line.startswith(
        "full disk: hook 'weights' failed (kernel k1, notebook work/train.ipynb)"
    )


def test_a_variable_that_cannot_be_pickled_is_named(isolated):
    ns = {"lock": threading.Lock(), "ok": "kept"}
    checkpoint.save_variables("lock", "ok", namespace=ns)
    target = kernel_dir(isolated, "20260101T000000Z")
    (entry,) = checkpoint._run_hooks(str(target), "gpu-idle")["hooks"]

    assert entry["status"] == "failed"
    assert entry["error"].startswith("PicklingError: variable 'lock' cannot be pickled (TypeError")
    assert [f["path"] for f in entry["files"]] == ["variables/ok.pkl"]  # the others are saved
    with pytest.warns(UserWarning, match="variable 'lock' cannot be pickled"):
        assert checkpoint.restore() == {"ok": "kept"}

    del ns["ok"]  # deleted since registering: named too
    (entry,) = checkpoint._run_hooks(str(target), "gpu-idle")["hooks"]
    assert "variable 'ok' is not defined in the notebook" in entry["error"]


def save_in(root: Path, ckpt_id: str, notebook: str | None, monkeypatch, **values) -> Path:
    """A checkpoint of `notebook`'s kernel holding `values` as variables."""
    if notebook is None:
        monkeypatch.delenv("JPY_SESSION_NAME")
    else:
        monkeypatch.setenv("JPY_SESSION_NAME", notebook)
    monkeypatch.setattr(checkpoint, "_HOOKS", {})
    checkpoint.save_variables(*values, namespace=dict(values))
    target = kernel_dir(root, ckpt_id)
    checkpoint._run_hooks(str(target), "gpu-idle")
    return target


def test_restore_picks_this_notebooks_checkpoint_over_a_newer_one(isolated, monkeypatch):
    save_in(isolated, "20260101T100000Z", NOTEBOOK, monkeypatch, x="mine")
    save_in(isolated, "20260101T110000Z", "other.ipynb", monkeypatch, x="other")
    (isolated / "20260101T120000Z" / "kernels").mkdir(parents=True)  # a kernel-less checkpoint

    monkeypatch.setenv("JPY_SESSION_NAME", NOTEBOOK)
    saved = checkpoint.restore()
    assert saved == {"x": "mine"}
    assert saved.id == "20260101T100000Z" and saved.path == isolated / "20260101T100000Z"
    assert saved.notebook == NOTEBOOK and saved.manifest is None and saved.errors == []
    assert "keys=['x']" in repr(saved)

    # A notebook with no checkpoint of its own gets the newest one that holds anything.
    monkeypatch.setenv("JPY_SESSION_NAME", "new.ipynb")
    assert checkpoint.restore() == {"x": "other"}
    monkeypatch.delenv("JPY_SESSION_NAME")
    assert checkpoint.restore() == {"x": "other"}
    # An id picks that one.
    assert checkpoint.restore("20260101T110000Z").id == "20260101T110000Z"
    with pytest.raises(FileNotFoundError, match=r"no checkpoint '2025' in .*newest: 20260101T12"):
        checkpoint.restore("2025")


def test_restore_into_a_namespace_and_hook_directories(isolated):
    ns = {"x": {"a": 1}, "y": 2.5}
    checkpoint.save_variables("x", "y", namespace=ns)

    @checkpoint.register
    def files(directory):
        (directory / "f.txt").write_text("f")

    target = kernel_dir(isolated, "20260101T000000Z")
    checkpoint._run_hooks(str(target), "gpu-idle")
    (target.parent.parent / "manifest.json").write_text(json.dumps({"id": "20260101T000000Z"}))

    into = {"y": "overwritten", "z": "untouched"}
    saved = checkpoint.restore(root=isolated, into=into)
    assert saved == {"x": {"a": 1}, "y": 2.5, "files": target / "files"}
    assert into == {"x": {"a": 1}, "y": 2.5, "z": "untouched"}  # variables only
    assert saved.manifest == {"id": "20260101T000000Z"}


class Tripwire:
    """Unpickling this runs code: it leaves a file behind (what a planted pickle would do)."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_restore_reads_only_hook_folders_of_the_checkpoint_and_follows_no_link(isolated, tmp_path):
    """Issue 18, item 10: hooks.json is a file in the user's folder; its hook names and links
    must not lead restore() to unpickle what lies elsewhere."""
    checkpoint.save_variables("x", namespace={"x": 42})
    target = kernel_dir(isolated, "20260101T000000Z")
    checkpoint._run_hooks(str(target), "gpu-idle")

    planted = tmp_path / "elsewhere"
    (planted / "evil").mkdir(parents=True)
    tripped = tmp_path / "tripped"
    (planted / "evil" / "payload.pkl").write_bytes(pickle.dumps(Tripwire(tripped)))
    (planted / "state.pt").write_bytes(pickle.dumps(Tripwire(tripped)))
    record = read_hooks(target)
    done = {"status": "done", "files": [], "bytes": 0, "error": None}
    record["hooks"] += [
        {**done, "name": "../../../../elsewhere/evil", "kind": "variables"},  # walks out
        {**done, "name": "linked", "kind": "variables"},  # its folder is a link out
        {**done, "name": "weights", "kind": "torch"},  # its state.pt is a link out
    ]
    (target / "hooks.json").write_text(json.dumps(record))
    (target / "linked").symlink_to(planted / "evil")
    (target / "weights").mkdir()
    (target / "weights" / "state.pt").symlink_to(planted / "state.pt")
    (target / "variables" / "y.pkl").symlink_to(planted / "evil" / "payload.pkl")

    with pytest.warns(UserWarning, match="was not read"):
        saved = checkpoint.restore()
    assert not tripped.exists()  # nothing planted was unpickled
    assert saved == {"x": 42}  # what the kernel saved still comes back
    assert sorted(saved.errors) == [
        "hook '../../../../elsewhere/evil' was not read: not a hook name",
        "hook 'linked' was not read: its folder is a link",
        "hook 'weights' was not read: state.pt is a link",
        "variable 'y' was not read: not a plain file",
    ]
    # A checkpoint folder that is a link is no checkpoint either.
    (isolated / "20270101T000000Z").symlink_to(target.parent.parent)
    assert checkpoint.restore().id == "20260101T000000Z"


def test_restore_with_nothing_to_restore_says_where_it_looked(isolated, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"checkpoints, which does not exist"):
        checkpoint.restore()
    (isolated / "20260101T000000Z").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"nothing to restore: .* in 1 checkpoint\(s\) in "):
        checkpoint.restore()


def test_checkpoint_ids_sort_by_time_then_suffix(tmp_path, monkeypatch):
    from jupyter_gpu_gov.core import clock

    monkeypatch.setattr(
        clock, "utcnow", lambda: clock.parse("2026-11-29T13:49:27Z").replace(microsecond=1)
    )
    made = [new_checkpoint_dir(tmp_path)[0] for _ in range(10)]
    assert made[:2] == ["20261129T134927Z", "20261129T134927Z-2"]
    (tmp_path / "20261129T134926Z").mkdir()
    (tmp_path / "notes").mkdir()
    names = [p.name for p in checkpoint._checkpoints(tmp_path)]
    assert names == [*reversed(made), "20261129T134926Z"]


def test_the_checkpoint_folder_it_makes_is_its_owners_alone(isolated, capsys):
    """Restoring unpickles what the folder holds: the folder the checkpoints make (the default
    in the user's home) and each checkpoint in it are 0700, whatever the umask, so no other
    user can plant a "newest" checkpoint in them (docs/security.md, "Checkpoint files")."""
    old = os.umask(0)  # mkdir's mode is what the umask leaves of it: leave it everything
    try:
        checkpoint.save_variables("x", namespace={"x": 1})
        checkpoint._gpu_checkpoint("now")
    finally:
        os.umask(old)
    (made,) = checkpoint._checkpoints(isolated)
    assert [oct(stat.S_IMODE(p.stat().st_mode)) for p in (isolated, made)] == ["0o700"] * 2


def test_magic_now_list_restore_and_help(isolated, capsys):
    ns = {"x": 7}
    checkpoint.save_variables("x", namespace=ns)
    checkpoint._gpu_checkpoint("now")
    out = capsys.readouterr().out
    (made,) = checkpoint._checkpoints(isolated)
    assert f"Checkpoint {made.name} saved to {made}" in out

    manifest = json.loads((made / "manifest.json").read_text())
    assert manifest["source"] == "user" and manifest["status"] == "done"
    assert manifest["id"] == made.name and manifest["errors"] == []
    (kernel,) = manifest["kernels"]
    assert kernel["notebook"] == NOTEBOOK and kernel["hooks"][0]["name"] == "variables"
    assert kernel["bytes"] == manifest["bytes"] > 0

    checkpoint._gpu_checkpoint("list")
    listing = capsys.readouterr().out
    assert f"* {made.name}  user" in listing and NOTEBOOK in listing

    checkpoint._gpu_checkpoint("help")
    assert "%gpu_checkpoint restore [ID]" in capsys.readouterr().out

    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="not understood"):
        checkpoint._gpu_checkpoint("sav x")
    with pytest.raises(UsageError, match=r"no checkpoint 'nope'"):
        checkpoint._gpu_checkpoint("restore nope")
    checkpoint.unregister("variables")
    with pytest.raises(UsageError, match="nothing to save: no hooks are registered"):
        checkpoint._gpu_checkpoint("now")


class FakeShell:
    def __init__(self, user_ns):
        self.user_ns = user_ns


def test_magic_torch_and_save_use_the_variables_as_they_are_at_checkpoint_time(
    isolated, monkeypatch, capsys
):
    torch = pytest.importorskip("torch", reason=NO_TORCH)
    ns = {"net": torch.nn.Linear(2, 1), "step": 1}
    ns["opt"] = torch.optim.SGD(ns["net"].parameters(), lr=0.1)
    monkeypatch.setattr(checkpoint, "_ipython", lambda: FakeShell(ns))
    checkpoint._gpu_checkpoint("torch net opt")
    checkpoint._gpu_checkpoint("save step")
    assert "state_dict of net and opt" in capsys.readouterr().out
    ns["net"], ns["step"] = torch.nn.Linear(2, 1), 2  # the cell re-run after registering

    checkpoint._run_hooks(str(kernel_dir(isolated, "20260101T000000Z")), "gpu-idle")
    del ns["step"]
    checkpoint._gpu_checkpoint("restore")
    assert ns["step"] == 2
    out = capsys.readouterr().out
    assert "torch: dict (model, optimizer)" in out and "step: int" in out
    assert "model.load_state_dict(saved['torch']['model'])" in out
    saved = checkpoint.restore()["torch"]
    assert torch.equal(saved["model"]["weight"], ns["net"].weight.detach())

    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match=r"'modle' not defined in the notebook namespace"):
        checkpoint._gpu_checkpoint("torch modle opt")


class Opaque:  # not a tensor: torch.load(weights_only=True) refuses it
    def __init__(self, n):
        self.n = n


def test_torch_extras_and_the_weights_only_fallback(isolated):
    torch = pytest.importorskip("torch", reason=NO_TORCH)
    model = torch.nn.Linear(2, 1)
    checkpoint.save_torch(model, epoch=3, opaque=Opaque(5), name="net")
    target = kernel_dir(isolated, "20260101T000000Z")
    (entry,) = checkpoint._run_hooks(str(target), "gpu-idle")["hooks"]
    assert entry["kind"] == "torch" and entry["files"][0]["path"] == "net/state.pt"

    saved = checkpoint.restore()["net"]
    assert set(saved) == {"model", "epoch", "opaque"}
    assert torch.equal(saved["model"]["weight"], model.weight.detach())
    assert saved["epoch"] == 3 and saved["opaque"].n == 5


# --- real kernels --------------------------------------------------------------------------------


class Kernel:
    """A python3 kernel of this venv, started like jupyter-server does (kernel-<id>.json)."""

    def __init__(self, tmp_path: Path, sockets: Path):
        from jupyter_client.manager import KernelManager

        self.id = str(uuid.uuid4())
        self.km = KernelManager(
            kernel_name="python3",
            kernel_id=self.id,
            connection_file=str(tmp_path / f"kernel-{self.id}.json"),
            # Unix sockets: TCP ports picked then bound race with other tests running at once.
            transport="ipc",
            ip=str(sockets / self.id[:8]),
        )
        self.cwd = tmp_path
        self.kc = None

    def start(self, env: dict[str, str]) -> Kernel:
        self.km.start_kernel(env=env, cwd=str(self.cwd))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        return self

    def run(self, code: str) -> str:
        """Execute like a notebook cell; fail the test with the kernel's traceback on error."""
        out: list[str] = []

        def collect(msg):
            content = msg["content"]
            if msg["msg_type"] == "stream":
                out.append(content["text"])
            elif msg["msg_type"] in ("execute_result", "display_data"):
                out.append(content["data"].get("text/plain", "") + "\n")
            elif msg["msg_type"] == "error":
                out.append("\n".join(content["traceback"]))

        reply = self.kc.execute_interactive(code, timeout=60, output_hook=collect)
        if reply["content"]["status"] != "ok":
            pytest.fail(f"kernel error in:\n{code}\n{''.join(out)}")
        return "".join(out)

    def run_hooks_like_the_server(self, directory: Path, reason: str) -> dict:
        """The server's silent execute request (contract: server side, step 2)."""
        code = (
            'import sys; m = sys.modules.get("jupyter_gpu_gov.checkpoint"); '
            f"m and m._run_hooks({str(directory)!r}, {reason!r})"
        )
        msg_id = self.kc.execute(code, silent=True, store_history=False)
        while True:
            reply = self.kc.get_shell_msg(timeout=60)
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply["content"]

    def shutdown(self) -> None:
        if self.kc is not None:
            self.kc.stop_channels()
        if self.km.has_kernel:
            self.km.shutdown_kernel(now=True)


@pytest.fixture
def start_kernel(tmp_path, isolated):
    """Start kernels in the environment the server gives them; all shut down at the end."""
    env = {**os.environ, checkpoint.ROOT_ENV: str(isolated), "JPY_SESSION_NAME": NOTEBOOK}
    # The kernels import the same jupyter_gpu_gov as this test.
    package_root = str(Path(checkpoint.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    kernels: list[Kernel] = []
    sockets = Path(tempfile.mkdtemp(prefix="gpugov-"))  # short: a socket path has ~100 bytes

    def start() -> Kernel:
        kernels.append(Kernel(tmp_path, sockets))  # before starting: shut down even if it hangs
        return kernels[-1].start(env)

    yield start
    for kernel in kernels:
        kernel.shutdown()
    shutil.rmtree(sockets, ignore_errors=True)


SETUP_VARIABLES = """
import numpy as np
arr = np.random.default_rng(0).standard_normal((3, 4))
cfg = {"lr": 0.01, "tags": ["a", "b"], "nested": {"k": (1, 2)}}
"""

SETUP_TORCH = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
model(torch.ones(3, 4)).pow(2).sum().backward()
opt.step()
"""

CKPT_ID = "20261129T134927Z"


def save_in_first_kernel(start_kernel, isolated: Path, setup: str, register: str) -> Path:
    """Kernel 1 registers hooks; the server runs them; kernel 1 goes away (the cull)."""
    first = start_kernel()
    first.run(setup + register)
    target = kernel_dir(isolated, CKPT_ID, first.id)
    reply = first.run_hooks_like_the_server(target, "gpu-idle")
    assert reply["status"] == "ok", reply
    first.shutdown()
    return target


def test_variables_come_back_in_a_new_kernel_and_with_the_magic(start_kernel, isolated):
    pytest.importorskip("numpy")
    target = save_in_first_kernel(
        start_kernel,
        isolated,
        SETUP_VARIABLES,
        "from jupyter_gpu_gov import checkpoint\n"
        "checkpoint.save_variables('arr')\n"
        "%gpu_checkpoint save cfg\n",  # the magic exists once the module is imported
    )
    record = read_hooks(target)
    assert record["notebook"] == NOTEBOOK and record["reason"] == "gpu-idle"
    (entry,) = record["hooks"]
    assert entry["status"] == "done"
    assert [f["path"] for f in entry["files"]] == ["variables/arr.pkl", "variables/cfg.pkl"]

    second = start_kernel()
    second.run(
        SETUP_VARIABLES
        + "import numpy.testing as npt\n"
        + "from jupyter_gpu_gov import checkpoint\n"
        + "saved = checkpoint.restore()\n"
        + f"assert saved.id == {CKPT_ID!r}, saved.id\n"
        + "npt.assert_array_equal(saved['arr'], arr)\n"
        + "assert saved['cfg'] == cfg, saved['cfg']\n"
        + "expected_arr, expected_cfg = arr, cfg\n"
        + "del arr, cfg\n"
    )
    out = second.run("%gpu_checkpoint restore")
    assert f"Restored from checkpoint {CKPT_ID} (notebook {NOTEBOOK})" in out
    assert "arr: ndarray (3, 4) float64" in out and "cfg: dict (lr, tags, nested)" in out
    second.run("npt.assert_array_equal(arr, expected_arr); assert cfg == expected_cfg")

    # A checkpoint by hand from the new kernel, found by the listing and by restore.
    out = second.run("%gpu_checkpoint save arr\n%gpu_checkpoint now\n%gpu_checkpoint list")
    (newest, _) = checkpoint._checkpoints(isolated)
    assert f"Checkpoint {newest.name} saved to {newest}" in out
    assert f"* {newest.name}  user" in out
    assert (newest / "kernels" / second.id / "hooks.json").is_file()


def test_torch_state_dicts_come_back_equal_in_a_new_kernel(start_kernel, isolated):
    pytest.importorskip("torch", reason=NO_TORCH)
    target = save_in_first_kernel(
        start_kernel,
        isolated,
        SETUP_TORCH,
        "from jupyter_gpu_gov import checkpoint\ncheckpoint.save_torch(model, opt, epoch=3)\n",
    )
    (entry,) = read_hooks(target)["hooks"]
    assert entry["kind"] == "torch" and entry["status"] == "done"
    assert entry["files"] == [{"path": "torch/state.pt", "bytes": entry["bytes"]}]

    second = start_kernel()
    # The same seed and step rebuild what kernel 1 had, to compare against.
    second.run(
        SETUP_TORCH
        + """
from jupyter_gpu_gov import checkpoint
got = checkpoint.restore()["torch"]
assert set(got) == {"model", "optimizer", "epoch"} and got["epoch"] == 3, got.keys()
for key, value in model.state_dict().items():
    assert torch.equal(got["model"][key], value), key
want = opt.state_dict()
assert got["optimizer"]["param_groups"] == want["param_groups"]
assert len(want["state"]) == 2 and got["optimizer"]["state"].keys() == want["state"].keys()
for index, state in want["state"].items():
    assert state.keys() == got["optimizer"]["state"][index].keys()
    for key, value in state.items():
        assert torch.equal(got["optimizer"]["state"][index][key], value), (index, key)
fresh = torch.nn.Linear(4, 2)
fresh.load_state_dict(got["model"])
torch.optim.Adam(fresh.parameters(), lr=0.01).load_state_dict(got["optimizer"])
"""
    )


def test_a_checkpoint_id_is_the_whole_text_in_ascii_digits():
    """The checkpoint page's id is read from its URL: a final newline ("$" matched before one) or
    another script's digits made a 404 of what is a 400, and a path of what is no id."""
    from jupyter_gpu_gov.checkpoint_layout import id_key, is_checkpoint_id

    assert is_checkpoint_id("20261201T000000Z") and is_checkpoint_id("20261201T000000Z-2")
    assert id_key("20261201T000000Z-10") > id_key("20261201T000000Z-9")
    for odd in (
        "20261201T000000Z\n",
        "20261201T000000Z-2\n",
        "\u0662\u0660\u0662\u06661201T000000Z",
    ):
        assert not is_checkpoint_id(odd), odd
        assert id_key(odd) == ("", 0)
