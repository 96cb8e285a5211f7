"""Checkpoints before a cull, server side (issue 6): a real jupyter-server, real ipykernel
kernels on simulated GPUs, the kernel hooks of ``jupyter_gpu_gov.checkpoint``, the manifest,
pruning, the REST routes, and a restore after a server restart."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_gpu_gov.server.checkpoint import RESTORE_HINT, plan_prune

pytestmark = pytest.mark.timeout(120)

ENV = "JUPYTER_GPU_GOV_CHECKPOINT_DIR"
ON_GPU = "from jupyter_gpu_gov import simulate; simulate.hold(1024)\n"


@pytest.fixture
def checkpoint_root(tmp_path) -> Path:
    return tmp_path / "checkpoints"


@pytest.fixture
def jp_server_config(checkpoint_root):
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpu_gov": True}},
        "GpuGovApp": {
            "backend": "simulated",
            "sample_interval": 60,  # the checkpoint samples itself
            "checkpoint_dir": str(checkpoint_root),
        },
    }


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("JUPYTER_GPU_GOV_BACKEND", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # The server exports the directory into os.environ; give the next test a clean slate.
    monkeypatch.delenv(ENV, raising=False)


def gov_app(serverapp):
    return next(iter(serverapp.extension_manager.extension_apps["jupyter_gpu_gov"]))


class Kernel:
    """A real ipykernel of a notebook session, driven through its channels."""

    def __init__(self, serverapp, kernel_id: str, notebook: str):
        self.id, self.notebook = kernel_id, notebook
        self.managed = serverapp.kernel_manager.get_kernel(kernel_id)
        self.client = self.managed.client()

    async def run(self, code: str, timeout: float = 60) -> str:
        outputs: list[str] = []

        def collect(msg):
            if msg["msg_type"] == "stream":
                outputs.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                outputs.append("\n".join(msg["content"]["traceback"]))

        reply = await self.client.execute_interactive(code, output_hook=collect, timeout=timeout)
        assert reply["content"]["status"] == "ok", "".join(outputs)
        # The reply can reach us before the cell's idle status reaches Jupyter Server: until it
        # does, the server still shows this finished cell busy (and would take the next cell's
        # busy for it).
        for _ in range(200):
            if self.managed.execution_state == "idle":
                break
            await asyncio.sleep(0.05)
        assert self.managed.execution_state == "idle"
        return "".join(outputs)


async def open_notebook(serverapp, create_session, root_dir: Path, notebook: str) -> Kernel:
    """Write ``notebook`` and start its kernel the way JupyterLab does (a session with a name,
    so the kernel's $JPY_SESSION_NAME is the notebook's file)."""
    import nbformat

    if not (root_dir / notebook).exists():
        nbformat.write(nbformat.v4.new_notebook(), root_dir / notebook)
    model = await create_session(
        {"path": notebook, "name": notebook, "type": "notebook", "kernel": {"name": "python3"}}
    )
    kernel = Kernel(serverapp, model["kernel"]["id"], notebook)
    kernel.client.start_channels()
    await kernel.client.wait_for_ready(timeout=60)
    return kernel


@pytest.fixture
def notebook_kernel(jp_fetch, jp_serverapp, jp_root_dir):
    started: list[Kernel] = []

    async def create_session(body: dict) -> dict:
        response = await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))
        return json.loads(response.body)

    async def _open(notebook: str) -> Kernel:
        kernel = await open_notebook(jp_serverapp, create_session, jp_root_dir, notebook)
        started.append(kernel)
        return kernel

    yield _open
    for kernel in started:
        kernel.client.stop_channels()


async def checkpoint(jp_fetch, **body) -> dict:
    response = await jp_fetch(
        "jupyter-gpu-gov", "checkpoint", method="POST", body=json.dumps(body), request_timeout=60
    )
    assert response.code == 200
    return json.loads(response.body)


def kernel_entry(manifest: dict, kernel: Kernel) -> dict:
    for entry in manifest["kernels"]:
        if entry["id"] == kernel.id:
            return entry
    raise AssertionError(f"kernel {kernel.id} not in {[k['id'] for k in manifest['kernels']]}")


# What a kernel prints about its state, to compare before and after the restart.
DIGEST = (
    "import json\n"
    "print(json.dumps({'arr': arr.tolist(), 'dtype': str(arr.dtype),\n"
    "    'model': {k: v.tolist() for k, v in model.state_dict().items()},\n"
    "    'optimizer': {str(k): {n: (t.tolist() if hasattr(t, 'tolist') else t)\n"
    "                           for n, t in s.items()}\n"
    "                  for k, s in opt.state_dict()['state'].items()},\n"
    "    'lr': opt.state_dict()['param_groups'][0]['lr']}, sort_keys=True))\n"
)


async def test_hooks_saved_then_restored_equal_after_a_server_restart(
    jp_fetch,
    jp_serverapp,
    jp_root_dir,
    jp_server_config,
    jp_configurable_serverapp,
    notebook_kernel,
    checkpoint_root,
):
    pytest.importorskip("numpy")
    pytest.importorskip("torch")
    kernel = await notebook_kernel("train.ipynb")
    await kernel.run(
        ON_GPU + "import numpy as np, torch\n"
        "from jupyter_gpu_gov import checkpoint\n"
        "arr = np.arange(12, dtype=np.float32).reshape(3, 4) / 7\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(4, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)\n"
        "model(torch.ones(3, 4)).sum().backward(); opt.step()  # momentum buffers exist\n"
        "checkpoint.save_variables('arr')\n"
        "checkpoint.save_torch(model, opt)\n"
    )
    before = await kernel.run(DIGEST)

    manifest = await checkpoint(
        jp_fetch, reason="GPU idle for 2 h", source="governor", cull_reason="gpu-idle"
    )

    assert manifest["status"] == "done", manifest["errors"]
    assert manifest["errors"] == [] and manifest["format"] == 1
    assert (manifest["cull_reason"], manifest["source"]) == ("gpu-idle", "governor")
    directory = checkpoint_root / manifest["id"]
    assert manifest["path"] == str(directory)
    on_disk = json.loads((directory / "manifest.json").read_text())
    assert on_disk == manifest
    assert [n["path"] for n in manifest["notebooks"]] == ["train.ipynb"]
    entry = kernel_entry(manifest, kernel)
    assert entry["status"] == "done" and entry["error"] is None
    assert entry["notebook"] == "train.ipynb" and entry["name"] == "python3"
    assert [(h["name"], h["kind"], h["status"]) for h in entry["hooks"]] == [
        ("variables", "variables", "done"),
        ("torch", "torch", "done"),
    ]
    files = {f["path"]: f["bytes"] for h in entry["hooks"] for f in h["files"]}
    assert set(files) == {"variables/arr.pkl", "torch/state.pt"}
    for relative, size in files.items():
        assert (directory / "kernels" / kernel.id / relative).stat().st_size == size > 0
    assert entry["bytes"] >= sum(files.values())
    assert manifest["bytes"] >= entry["bytes"]

    # A newer checkpoint, of another notebook only: restore() in train.ipynb must not pick it.
    other = await notebook_kernel("other.ipynb")
    await other.run(
        ON_GPU + "import numpy as np\n"
        "from jupyter_gpu_gov import checkpoint\n"
        "arr = np.zeros(2)\n"
        "checkpoint.save_variables('arr')\n"
    )
    await kernel.run("checkpoint.unregister('variables'); checkpoint.unregister('torch')")
    newer = await checkpoint(jp_fetch, reason="later")
    assert newer["id"] > manifest["id"]
    assert kernel_entry(newer, kernel)["status"] == "no-hooks"
    assert kernel_entry(newer, other)["status"] == "done"

    # A server restart: this server goes away, a new one starts on the same root and
    # checkpoint directory, and the notebook gets a new kernel.
    # Every client of ours goes first: they share the kernel manager's ZMQ context, and a
    # client still running when it is destroyed keeps a heartbeat thread on a dead context
    # (ZMQ errors, "Too many open files", on a later socket).
    for client in (kernel.client, other.client):
        client.stop_channels()
    await jp_serverapp._cleanup()
    jp_serverapp.kernel_manager.context.destroy()
    type(jp_serverapp).clear_instance()
    restarted = jp_configurable_serverapp(config=jp_server_config)
    assert restarted is not jp_serverapp
    assert gov_app(restarted).checkpoint_dir == str(checkpoint_root)

    async def create_session(body: dict) -> dict:
        model = await restarted.session_manager.create_session(
            path=body["path"], name=body["name"], type="notebook", kernel_name="python3"
        )
        return model

    again = await open_notebook(restarted, create_session, jp_root_dir, "train.ipynb")
    try:
        assert again.id != kernel.id
        await again.run(
            "import torch\n"
            "from jupyter_gpu_gov import checkpoint\n"
            "saved = checkpoint.restore()\n"
            "arr = saved['arr']\n"
            "model = torch.nn.Linear(4, 2)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)\n"
            "model.load_state_dict(saved['torch']['model'])\n"
            "opt.load_state_dict(saved['torch']['optimizer'])\n"
            f"assert saved.id == {manifest['id']!r}, saved.id\n"
            f"assert saved.manifest['id'] == {manifest['id']!r}\n"
        )
        assert await again.run(DIGEST) == before
    finally:
        again.client.stop_channels()


async def test_raising_and_full_disk_hooks_fail_the_checkpoint_and_the_next_hook_runs(
    jp_fetch, notebook_kernel
):
    kernel = await notebook_kernel("analysis.ipynb")
    await kernel.run(
        ON_GPU + "import errno, os\n"
        "from jupyter_gpu_gov import checkpoint\n"
        "@checkpoint.register\n"
        "def explode(directory):\n"
        "    raise ValueError('the tokenizer is gone')\n"
        "@checkpoint.register\n"
        "def big_file(directory):\n"
        "    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
        "results = {'loss': 0.25}\n"
        "checkpoint.save_variables('results')\n"
    )

    manifest = await checkpoint(jp_fetch, reason="test")

    assert manifest["status"] == "failed"
    entry = kernel_entry(manifest, kernel)
    assert entry["status"] == "failed"
    assert [(h["name"], h["status"]) for h in entry["hooks"]] == [
        ("explode", "failed"),
        ("big_file", "failed"),
        ("variables", "done"),
    ]
    raising = [e for e in manifest["errors"] if "'explode'" in e]
    assert len(raising) == 1, manifest["errors"]
    assert "analysis.ipynb" in raising[0] and "ValueError: the tokenizer is gone" in raising[0]
    assert kernel.id in raising[0]
    full = [e for e in manifest["errors"] if "'big_file'" in e]
    assert len(full) == 1 and "no space left on device" in full[0].lower(), manifest["errors"]
    assert "analysis.ipynb" in full[0]
    assert len(manifest["errors"]) == 2
    # The notebook checkpoint was still taken.
    assert [n["path"] for n in manifest["notebooks"]] == ["analysis.ipynb"]


async def test_hanging_hook_times_out_the_kernel_is_interrupted_and_usable(
    jp_fetch, jp_serverapp, notebook_kernel, tmp_path
):
    app = gov_app(jp_serverapp)
    app.checkpoint_hook_timeout = 3
    hanging, quick, busy = (
        await notebook_kernel("hangs.ipynb"),
        await notebook_kernel("quick.ipynb"),
        await notebook_kernel("busy.ipynb"),
    )
    await hanging.run(
        ON_GPU + "import time\n"
        "from jupyter_gpu_gov import checkpoint\n"
        "@checkpoint.register\n"
        "def slow(directory):\n"
        "    time.sleep(3600)\n"
    )
    await quick.run(
        ON_GPU + "from jupyter_gpu_gov import checkpoint\nx = 1\ncheckpoint.save_variables('x')\n"
    )
    await busy.run(
        ON_GPU + "from jupyter_gpu_gov import checkpoint\ny = 2\ncheckpoint.save_variables('y')\n"
    )
    # A training cell still runs in this one: the checkpoint request waits behind it. The
    # cell ends when the test says, so it outlasts the hook timeout however loaded the machine.
    release = tmp_path / "release"
    busy.client.execute(
        f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.05)\ny = 3"
    )
    km = jp_serverapp.kernel_manager
    for _ in range(600):
        if km.get_kernel(busy.id).execution_state == "busy":
            break
        await asyncio.sleep(0.05)
    assert km.get_kernel(busy.id).execution_state == "busy"

    manifest = await checkpoint(jp_fetch, reason="test")
    # Each kernel within its timeout: the checkpoint did not wait for the cell.
    assert km.get_kernel(busy.id).execution_state == "busy"
    release.touch()
    assert manifest["status"] == "failed"
    entry = kernel_entry(manifest, hanging)
    assert entry["status"] == "timeout" and entry["running_hook"] == "slow"
    assert [(h["name"], h["status"]) for h in entry["hooks"]] == [("slow", "running")]
    line = next(e for e in manifest["errors"] if hanging.id in e)
    assert "timeout" in line and "'slow'" in line and "hangs.ipynb" in line
    assert "interrupted" in line
    assert kernel_entry(manifest, quick)["status"] == "done"
    waited = kernel_entry(manifest, busy)
    assert waited["status"] == "timeout" and waited["hooks"] == []
    line = next(e for e in manifest["errors"] if busy.id in e)
    assert "busy running a cell" in line and "busy.ipynb" in line
    assert len(manifest["errors"]) == 2

    # The interrupted kernel answers at once.
    assert (await hanging.run("print(6 * 7)", timeout=10)).strip() == "42"
    # The busy cell was not interrupted, and the queued request did nothing when its turn came.
    assert (await busy.run("print(y)", timeout=20)).strip() == "3"
    assert not (Path(manifest["path"]) / "kernels" / busy.id).exists()


async def test_a_cell_submitted_just_before_the_checkpoint_is_never_interrupted(
    jp_serverapp, notebook_kernel, tmp_path
):
    """The owner submits a cell a moment before the checkpoint's hooks request, so Jupyter
    Server does not show the kernel busy yet: the request waits behind the cell, and when the
    hook timeout falls the cell is left alone (it is not the checkpoint's to interrupt) and the
    checkpoint says its hooks did not run."""
    import logging

    from jupyter_client import BlockingKernelClient

    from jupyter_gpu_gov.server.checkpoint import GpuKernel, run_kernel_hooks

    kernel = await notebook_kernel("race.ipynb")
    await kernel.run(
        ON_GPU + "from jupyter_gpu_gov import checkpoint\ny = 2\ncheckpoint.save_variables('y')\n"
    )
    owner = BlockingKernelClient()
    owner.load_connection_info(kernel.managed.get_connection_info())
    owner.session.key = kernel.managed.session.key
    owner.start_channels()
    try:
        owner.wait_for_ready(timeout=60)
        cell = owner.execute("import time; time.sleep(6); y = 3")
        # Wait, holding this event loop, until the kernel runs the cell: Jupyter Server reads
        # the kernel's busy status on this loop, so it still shows the kernel idle — the
        # moment between a cell's submission and its busy status reaching the server.
        while True:
            msg = owner.get_iopub_msg(timeout=30)
            if (
                msg["parent_header"].get("msg_id") == cell
                and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "busy"
            ):
                break
        assert kernel.managed.execution_state == "idle"

        entry, errors = await run_kernel_hooks(
            jp_serverapp,
            GpuKernel(kernel.id, None, "race.ipynb"),
            tmp_path / "race",
            "race",
            2.0,
            logging.getLogger("test"),
        )

        assert entry["status"] == "timeout" and entry["hooks"] == []
        assert errors and "the cell was not interrupted" in errors[0]
        reply = owner.get_shell_msg(timeout=30)
        assert reply["parent_header"]["msg_id"] == cell
        assert reply["content"]["status"] == "ok"  # not a KeyboardInterrupt
    finally:
        owner.stop_channels()
    assert (await kernel.run("print(y)", timeout=20)).strip() == "3"


async def test_governor_waits_for_the_frontends_checkpoint_past_the_grace(
    jp_fetch, jp_serverapp, notebook_kernel, checkpoint_root, tmp_path
):
    app = gov_app(jp_serverapp)
    grace = app.frontend_checkpoint_grace = 3
    release = tmp_path / "release"  # the hook runs until the test lets it end
    kernel = await notebook_kernel("slow.ipynb")
    await kernel.run(
        ON_GPU + "import os, time\n"
        "from jupyter_gpu_gov import checkpoint\n"
        "@checkpoint.register\n"
        "def weights(directory):\n"
        f"    while not os.path.exists({str(release)!r}):\n"
        "        time.sleep(0.05)\n"
    )
    app.report = {"targets": [{"kind": "kernel", "connections": 1}]}  # a browser tab is open
    governor = asyncio.ensure_future(
        checkpoint(jp_fetch, reason="cull", source="governor", cull_reason="reclaim")
    )
    for _ in range(1500):
        if (app.verdict or {}).get("checkpoint") == "requested":
            break
        await asyncio.sleep(0.02)
    # The frontend asks within the grace; its checkpoint's hook runs until the grace is past
    # (counted from the offer, made before the ask).
    frontend = asyncio.ensure_future(checkpoint(jp_fetch, reason="cull", source="frontend"))
    await asyncio.sleep(grace + 0.5)
    assert not governor.done()
    release.touch()
    frontend = await frontend
    answer = await governor

    assert answer == frontend
    assert answer["saved_by_frontend_first"] is True and answer["cull_reason"] == "reclaim"
    assert kernel_entry(answer, kernel)["status"] == "done"
    assert [p.name for p in checkpoint_root.iterdir()] == [answer["id"]]  # one checkpoint


async def test_kernels_without_hooks_or_gpu(jp_fetch, notebook_kernel):
    never_imported = await notebook_kernel("plain.ipynb")
    await never_imported.run(
        ON_GPU + "import sys; assert 'jupyter_gpu_gov.checkpoint' not in sys.modules\n"
        "m, t, j = 'model', 'tokens', 'jobs'\n"
    )
    no_hooks = await notebook_kernel("imported.ipynb")
    await no_hooks.run(ON_GPU + "from jupyter_gpu_gov import checkpoint")
    cpu_only = await notebook_kernel("cpu.ipynb")
    await cpu_only.run(
        "from jupyter_gpu_gov import checkpoint\nz = 1\ncheckpoint.save_variables('z')\n"
    )

    manifest = await checkpoint(jp_fetch, reason="test")

    assert manifest["status"] == "done" and manifest["errors"] == []
    assert {k["id"] for k in manifest["kernels"]} == {never_imported.id, no_hooks.id}
    for kernel in (never_imported, no_hooks):
        entry = kernel_entry(manifest, kernel)
        assert (entry["status"], entry["hooks"], entry["error"]) == ("no-hooks", [], None)
    # The request binds no name in the user's namespace.
    assert (await never_imported.run("print(m, t, j, 'json' in dir())")).split() == [
        "model",
        "tokens",
        "jobs",
        "False",
    ]
    # The kernel on no GPU was not asked: its hooks did not run.
    assert not (Path(manifest["path"]) / "kernels" / cpu_only.id).exists()
    assert {n["path"] for n in manifest["notebooks"]} == {
        "plain.ipynb",
        "imported.ipynb",
        "cpu.ipynb",
    }

    # Each checkpoint opens a client per GPU kernel (sockets, a heartbeat thread) and closes it:
    # a server checkpointed again and again holds no more of them than after the first. The
    # sampler's /proc files are not counted: it keeps one per thread of each kernel, and a
    # kernel's threads come and go (a CI run under load once saw three more).
    def held() -> tuple[list[str], int]:
        beating = [t for t in threading.enumerate() if type(t).__name__ == "HBChannel"]
        return open_files(), len(beating)

    fds, heartbeats = held()
    assert heartbeats == 3  # this test's own clients
    for _ in range(6):
        assert (await checkpoint(jp_fetch, reason="again"))["status"] == "done"
    after, beating = held()
    assert len(after) <= len(fds) + 2 and beating == heartbeats, (sorted(after), sorted(fds))


def open_files() -> list[str]:
    """What this process's descriptors lead to, but the /proc files the sampler keeps open."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the descriptor listdir itself used, closed since
        if not link.startswith("/proc/"):
            links.append(link)
    return links


async def test_the_checkpoint_is_not_taken_for_the_owner_at_work(
    jp_fetch, jp_serverapp, notebook_kernel, tmp_path
):
    # The hooks run through the kernel; Jupyter Server sees kernel messages and a busy kernel.
    # The report must not: the governor would hold its own cull back for "recent user
    # activity" or "a kernel is executing a cell".
    kernel = await notebook_kernel("held.ipynb")
    release = tmp_path / "release"  # the hook runs until the test has looked
    await kernel.run(
        ON_GPU + "import os, time\nfrom jupyter_gpu_gov import checkpoint\n"
        "@checkpoint.register\n"
        "def slow(directory):\n"
        f"    while not os.path.exists({str(release)!r}):\n"
        "        time.sleep(0.05)\n"
    )
    app = gov_app(jp_serverapp)
    # On a loaded machine Jupyter Server may still show the cell's kernel busy (its idle status
    # comes on IOPub after the reply): a kernel busy before the checkpoint is the owner's.
    for _ in range(50):
        await app.sample_now()
        if {t["id"]: t for t in app.report["targets"]}[kernel.id]["execution_state"] == "idle":
            break
        await asyncio.sleep(0.1)
    person = app.report["server"]["last_activity"]
    await asyncio.sleep(0.5)

    running = asyncio.ensure_future(checkpoint(jp_fetch, reason="test"))
    try:
        for _ in range(600):  # the hooks run: Jupyter Server shows the kernel busy
            if jp_serverapp.kernel_manager.get_kernel(kernel.id).execution_state == "busy":
                break
            await asyncio.sleep(0.05)
        assert jp_serverapp.kernel_manager.get_kernel(kernel.id).execution_state == "busy"
        assert not running.done()
        await app.sample_now()
        during = {t["id"]: t for t in app.report["targets"]}[kernel.id]
    finally:
        release.touch()
    manifest = await running
    await app.sample_now()

    assert kernel_entry(manifest, kernel)["status"] == "done"
    assert (during["execution_state"], during.get("busy_since")) == ("idle", None)
    assert app.report["server"]["last_activity"] == person
    # The owner's own cell counts again (past the margin left for late messages of ours).
    await asyncio.sleep(2.5)
    await kernel.run("x = 1")
    # Jupyter Server counts the cell when its IOPub messages reach it, which on a loaded
    # machine can be a moment after the reply reached us.
    for _ in range(50):
        await app.sample_now()
        if app.report["server"]["last_activity"] > person:
            break
        await asyncio.sleep(0.1)
    assert app.report["server"]["last_activity"] > person


async def test_a_cell_a_person_starts_during_a_checkpoint_is_reported_running_and_theirs(
    jp_fetch, jp_serverapp, notebook_kernel, tmp_path
):
    """The checkpoint's own work in a kernel is not a person's, but a cell a person starts
    in another kernel while the hooks run is: reported running (the governor holds the cull
    and voids the checkpoint) and counted as their activity."""
    app = gov_app(jp_serverapp)
    km = jp_serverapp.kernel_manager
    release = tmp_path / "release"
    until_released = (
        f"import os, time\nwhile not os.path.exists({str(release)!r}):\n    time.sleep(0.05)\n"
    )
    hooks = await notebook_kernel("hooks.ipynb")
    await hooks.run(
        ON_GPU + "from jupyter_gpu_gov import checkpoint\n"
        "@checkpoint.register\n"
        "def wait(directory):\n" + "".join(f"    {line}\n" for line in until_released.splitlines())
    )
    work = await notebook_kernel("work.ipynb")
    for _ in range(50):  # Jupyter Server may still show the last cells busy (see above)
        await app.sample_now()
        states = {t["id"]: t["execution_state"] for t in app.report["targets"]}
        if states[hooks.id] == states[work.id] == "idle":
            break
        await asyncio.sleep(0.1)
    person = app.report["server"]["last_activity"]

    running = asyncio.ensure_future(checkpoint(jp_fetch, reason="test"))
    try:
        for _ in range(200):  # the hooks run
            if km.get_kernel(hooks.id).execution_state == "busy":
                break
            await asyncio.sleep(0.05)
        work.client.execute(until_released)
        for _ in range(200):
            if km.get_kernel(work.id).execution_state == "busy":
                break
            await asyncio.sleep(0.05)
        assert not running.done()  # the hooks still run: the checkpoint's window is open
        await app.sample_now()
        during = {t["id"]: t for t in app.report["targets"]}
        last_activity = app.report["server"]["last_activity"]
    finally:
        release.touch()
    manifest = await running

    assert kernel_entry(manifest, hooks)["status"] == "done"
    assert during[hooks.id]["execution_state"] == "idle"  # the checkpoint's own work
    assert during[work.id]["execution_state"] == "busy" and during[work.id]["busy_since"]
    assert last_activity > person


async def test_terminal_scrollback_is_saved(jp_fetch, jp_serverapp):
    manager = jp_serverapp.web_app.settings.get("terminal_manager")
    if manager is None:
        pytest.skip("terminals are not available (jupyter_server_terminals/terminado missing)")
    name = json.loads((await jp_fetch("api", "terminals", method="POST", body="{}")).body)["name"]
    try:
        terminal = manager.terminals[name]
        terminal.ptyproc.write("printf 'marker-%s\\n' $((6 * 7))\r")
        for _ in range(100):
            if "marker-42" in "".join(terminal.read_buffer):
                break
            await asyncio.sleep(0.05)

        manifest = await checkpoint(jp_fetch, reason="test")

        assert manifest["status"] == "done", manifest["errors"]
        (saved,) = [t for t in manifest["terminals"] if t["name"] == name]
        assert saved["path"] == f"terminals/{name}.txt"
        text = (Path(manifest["path"]) / saved["path"]).read_text()
        assert "marker-42" in text and "\x1b" not in text
        assert saved["bytes"] == len(text.encode())
    finally:
        await jp_fetch("api", "terminals", name, method="DELETE")


def fake_checkpoint(root: Path, checkpoint_id: str, size: int) -> None:
    directory = root / checkpoint_id
    (directory / "kernels" / "k" / "variables").mkdir(parents=True)
    (directory / "kernels" / "k" / "variables" / "x.pkl").write_bytes(b"x" * size)
    manifest = {"id": checkpoint_id, "status": "done", "reason": "old", "notebooks": []}
    (directory / "manifest.json").write_text(json.dumps(manifest))


async def test_pruning_by_count_and_by_size_keeps_the_newest(
    jp_fetch, jp_serverapp, checkpoint_root
):
    app = gov_app(jp_serverapp)
    fake_checkpoint(checkpoint_root, "20200101T000000Z", 400_000)
    fake_checkpoint(checkpoint_root, "20200102T000000Z", 400_000)
    fake_checkpoint(checkpoint_root, "20200103T000000Z", 400_000)

    # By size: the two newest old ones fit in 1 MB next to the new one; the oldest goes.
    app.checkpoint_max_bytes = 1_000_000
    first = await checkpoint(jp_fetch, reason="size")
    assert first["pruned"] == ["20200101T000000Z"]
    assert sorted(p.name for p in checkpoint_root.iterdir()) == [
        "20200102T000000Z",
        "20200103T000000Z",
        first["id"],
    ]

    # By count: two at most, the newest always among them.
    app.checkpoint_keep = 2
    second = await checkpoint(jp_fetch, reason="count")
    assert second["id"] != first["id"]
    assert second["pruned"] == ["20200103T000000Z", "20200102T000000Z"]
    assert sorted(p.name for p in checkpoint_root.iterdir()) == sorted([first["id"], second["id"]])


def test_prune_plan_never_drops_the_newest_nor_one_in_progress(tmp_path):
    for n in range(1, 4):
        fake_checkpoint(tmp_path, f"2020010{n}T000000Z", 1000)
    (tmp_path / "20200104T000000Z").mkdir()  # no manifest yet: another server's, in progress
    (tmp_path / "not-a-checkpoint").mkdir()
    # The newest alone is above the limit: it stays, every older one goes.
    doomed = plan_prune(tmp_path, "20200105T000000Z", 10_000, keep=10, max_bytes=5_000)
    assert doomed == ["20200103T000000Z", "20200102T000000Z", "20200101T000000Z"]
    assert plan_prune(tmp_path, "20200105T000000Z", 0, keep=3, max_bytes=10**9) == [
        "20200101T000000Z"
    ]


async def test_a_failed_checkpoint_never_prunes_the_last_whole_one(
    jp_fetch, jp_serverapp, notebook_kernel, checkpoint_root
):
    """A checkpoint whose hook failed (the disk filled mid-save, an exception) holds part of
    the state at best. Pruned to fit beside it, the last whole checkpoint was deleted: the
    owner, culled after it, had only the broken one left to restore."""
    app = gov_app(jp_serverapp)
    fake_checkpoint(checkpoint_root, "20200101T000000Z", 300_000)
    fake_checkpoint(checkpoint_root, "20200102T000000Z", 400_000)  # the last whole one
    app.checkpoint_max_bytes = 1_000_000
    kernel = await notebook_kernel("train.ipynb")
    await kernel.run(
        ON_GPU + "import errno, os\n"
        "from jupyter_gpu_gov import checkpoint\n"
        "@checkpoint.register\n"
        "def weights(directory):\n"
        "    (directory / 'part-1.bin').write_bytes(b'w' * 700_000)\n"
        "    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
    )

    failed = await checkpoint(jp_fetch, reason="before the cull")

    assert failed["status"] == "failed" and failed["bytes"] >= 700_000, failed["errors"]
    # 700 KB beside 400 KB is over the 1 MB: the whole one stays all the same, the one older
    # than it goes.
    assert failed["pruned"] == ["20200101T000000Z"]
    assert sorted(p.name for p in checkpoint_root.iterdir()) == ["20200102T000000Z", failed["id"]]

    # Failing again: the failed one before it is what goes, never the whole one.
    again = await checkpoint(jp_fetch, reason="before the cull")
    assert again["status"] == "failed"
    assert again["pruned"] == [failed["id"]]
    assert sorted(p.name for p in checkpoint_root.iterdir()) == ["20200102T000000Z", again["id"]]


def test_prune_plan_keeps_the_last_whole_checkpoint_beside_a_failed_one(tmp_path):
    fake_checkpoint(tmp_path, "20200101T000000Z", 1000)
    fake_checkpoint(tmp_path, "20200102T000000Z", 1000)
    (tmp_path / "20200102T000000Z" / "manifest.json").write_text('{"status": "failed"}')
    # The newest failed: the last whole one (01) stays past both limits; the failed one goes.
    doomed = plan_prune(tmp_path, "20200103T000000Z", 10_000, 10, 5_000, newest_failed=True)
    assert doomed == ["20200102T000000Z"]
    assert plan_prune(tmp_path, "20200103T000000Z", 0, 1, 10**9, newest_failed=True) == [
        "20200102T000000Z"
    ]
    # The newest whole: pruned as ever, by count and by size.
    assert plan_prune(tmp_path, "20200103T000000Z", 10_000, 10, 5_000) == [
        "20200102T000000Z",
        "20200101T000000Z",
    ]


async def test_checkpoint_routes(jp_fetch, jp_serverapp):
    first = await checkpoint(jp_fetch, reason="first", cull_reason="max-age", source="governor")
    second = await checkpoint(jp_fetch, reason="second")

    listing = json.loads((await jp_fetch("jupyter-gpu-gov", "checkpoints")).body)["checkpoints"]
    assert [c["id"] for c in listing] == [second["id"], first["id"]]
    assert listing[1] == {
        "id": first["id"],
        "reason": "first",
        "cull_reason": "max-age",
        "source": "governor",
        "status": "done",
        "completed_at": first["completed_at"],
        "notebooks": [],
        "bytes": first["bytes"],
        "errors": 0,
        "restore": RESTORE_HINT,
    }
    one = json.loads((await jp_fetch("jupyter-gpu-gov", "checkpoints", first["id"])).body)
    assert one == first

    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("jupyter-gpu-gov", "checkpoints", "20000101T000000Z")
    assert info.value.code == 404 and b"20000101T000000Z" in info.value.response.body
    for bad in ("..", "not-an-id", "20000101T000000Z%2F..%2F..%2Fetc"):
        with pytest.raises(HTTPClientError) as info:
            await jp_fetch("jupyter-gpu-gov", "checkpoints", bad)
        assert info.value.code == 400, bad
    with pytest.raises(HTTPClientError) as info:
        await checkpoint(jp_fetch, reason="x", cull_reason="bored")
    assert info.value.code == 400 and b"cull_reason" in info.value.response.body

    for parts in (("checkpoints",), ("checkpoints", first["id"])):
        with pytest.raises(HTTPClientError) as info:
            await jp_fetch("jupyter-gpu-gov", *parts, headers={"Authorization": ""})
        assert info.value.code == 403
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch(
            "jupyter-gpu-gov",
            "checkpoint",
            method="POST",
            body="{}",
            headers={"Authorization": "token not-the-token"},
        )
    assert info.value.code == 403


async def test_the_server_exports_the_directory_to_its_kernels(
    jp_serverapp, notebook_kernel, checkpoint_root
):
    import os

    assert os.environ[ENV] == str(checkpoint_root)
    kernel = await notebook_kernel("env.ipynb")
    assert (await kernel.run(f"import os; print(os.environ[{ENV!r}])")).strip() == str(
        checkpoint_root
    )


@pytest.mark.parametrize(
    ("trait", "value", "message"),
    [
        (
            "checkpoint_hook_timeout",
            0,
            "GpuGovApp.checkpoint_hook_timeout must be a number of seconds from 0 .exclusive.",
        ),
        (
            "checkpoint_keep",
            0,
            "GpuGovApp.checkpoint_keep must be a whole number of checkpoints from 1",
        ),
        ("checkpoint_max_bytes", -1, "GpuGovApp.checkpoint_max_bytes must be a whole number of"),
        ("checkpoint_dir", " ", "GpuGovApp.checkpoint_dir must name a directory"),
    ],
)
def test_bad_settings_name_the_trait(trait, value, message):
    from jupyter_gpu_gov.server.app import GpuGovApp

    with pytest.raises(ValueError, match=message):
        GpuGovApp(**{trait: value})


def test_checkpoint_dir_default_is_expanded(monkeypatch, tmp_path):
    from jupyter_gpu_gov.server.app import GpuGovApp

    monkeypatch.setenv("HOME", str(tmp_path))
    assert GpuGovApp().checkpoint_dir == str(tmp_path / ".jupyter-gpu-gov" / "checkpoints")
    assert GpuGovApp(checkpoint_dir="~/ckpt").checkpoint_dir == str(tmp_path / "ckpt")


def test_a_kernel_busy_with_the_checkpoints_hooks_is_not_a_cell_one_a_person_started_is(
    monkeypatch,
):
    """Jupyter Server shows a kernel busy while the hooks run and until their idle status
    reaches it, which can be after their reply: the report must not show that as a cell (the
    governor would take it for one changing the state just saved). A kernel busy before the
    checkpoint, one where a person started a cell meanwhile (it ran behind or before the
    hooks), or one busy past the margin for late messages, is running a cell."""
    from jupyter_gpu_gov.core import clock
    from jupyter_gpu_gov.server.own_activity import MARGIN, OwnActivity

    monkeypatch.setattr(clock, "_offset_s", clock._offset_s)  # restored after the test
    own = OwnActivity()
    before = clock.utcnow()
    own.begin({"training"})
    assert own.hides_busy("hooks", None) and not own.hides_busy("training", None)
    assert own.hides_busy("hooks", before)  # a person's cell that ended before
    clock.advance(0.5)
    person = clock.utcnow()
    assert not own.hides_busy("hooks", person)
    own.end()
    assert own.hides_busy("hooks", None) and not own.hides_busy("training", None)
    assert not own.hides_busy("hooks", person)
    clock.advance(MARGIN.total_seconds() + 0.5)
    assert not own.hides_busy("hooks", None)


class Capturing:
    """The governor as the server's reporter meets it: takes each report, answers a verdict."""

    def __init__(self):
        self.reports: list[dict] = []

    async def send(self, report: dict) -> dict:
        self.reports.append(json.loads(json.dumps(report)))  # what goes on the wire
        return {"state": "idle", "checkpoint": "none"}


async def test_a_checkpoint_of_many_files_or_long_errors_leaves_reports_the_governor_takes(
    jp_fetch, jp_serverapp, notebook_kernel
):
    """The report carries the last checkpoint's manifest, which lists every file of every
    hook. A hook that copies a folder of thousands of files (or fails with a long message) made
    it larger than the governor takes (256 KiB): every report after the checkpoint was refused
    (413), so the governor never heard that the checkpoint was saved (its request timed out as
    failed), nor anything else, and the owner saw no more verdicts or warnings."""
    from jupyter_gpu_gov.core.report import validate
    from jupyter_gpu_gov.hub.checkpoints import checkpoint_summary, reported_checkpoint
    from jupyter_gpu_gov.hub.routes import MAX_REPORT_BYTES

    app = gov_app(jp_serverapp)
    kernel = await notebook_kernel("samples.ipynb")
    await kernel.run(
        ON_GPU + "from jupyter_gpu_gov import checkpoint\n"
        "@checkpoint.register\n"
        "def samples(directory):\n"
        "    for i in range(8000):\n"
        "        (directory / f'generated-sample-{i:05d}.png').touch()\n"
        "@checkpoint.register\n"
        "def config(directory):\n"
        "    raise ValueError('bad config: ' + 'x' * 300_000)\n"
    )
    manifest = await checkpoint(jp_fetch, reason="before the weekend")
    assert manifest["status"] == "failed"  # the long error, told truthfully

    app.reporter = governor = Capturing()
    await app.send_report(await app.latest_report(refresh=True))

    sent = governor.reports[-1]
    assert len(json.dumps(sent).encode()) <= MAX_REPORT_BYTES
    validate(sent)  # the governor takes it
    result = reported_checkpoint(sent["checkpoint"])
    assert result.status == "failed"
    summary = checkpoint_summary(result.status, result.manifest)
    assert (
        summary.startswith("checkpoint failed: hook 'config' failed (kernel ") and "xxx" in summary
    )
    assert len(summary) < 3 * 4096
    assert result.manifest["id"] == manifest["id"] and result.manifest["path"] == manifest["path"]
    # The server's own status (JupyterLab's) still has the whole manifest.
    local = (await status_report(jp_fetch))["checkpoint"]["manifest"]
    assert local == manifest and len(kernel_entry(local, kernel)["hooks"][0]["files"]) == 8000


async def status_report(jp_fetch) -> dict:
    return json.loads((await jp_fetch("jupyter-gpu-gov", "status")).body)


async def test_a_checkpoint_the_stop_ended_is_never_listed_nor_read_as_one(
    jp_fetch, jp_serverapp, notebook_kernel, checkpoint_root
):
    """The server stops while a checkpoint waits on a kernel's hook: its folder stays, with the
    kernel's hooks.json (``running``) and no manifest. It is no checkpoint: not listed, not
    read by its id, and the last whole one is still the one listed. (The listing already read
    only folders with a manifest, written last and whole: this holds that down.)"""
    app = gov_app(jp_serverapp)
    app.checkpoint_hook_timeout = 600
    whole = await checkpoint(jp_fetch, reason="before")
    kernel = await notebook_kernel("hangs.ipynb")
    await kernel.run(
        ON_GPU + "import time\n"
        "from jupyter_gpu_gov import checkpoint\n"
        "@checkpoint.register\n"
        "def slow(directory):\n"
        "    time.sleep(3600)\n"
    )
    asked = asyncio.ensure_future(
        jp_fetch("jupyter-gpu-gov", "checkpoint", method="POST", body="{}", raise_error=False)
    )
    hooks = None
    for _ in range(600):  # until the kernel runs the hook
        hooks = next(checkpoint_root.glob("*/kernels/*/hooks.json"), None)
        if hooks is not None and '"running"' in hooks.read_text():
            break
        await asyncio.sleep(0.05)
    assert hooks is not None, "the hook never started"
    ended = hooks.parent.parent.parent

    await app.stop_extension()
    assert (await asyncio.wait_for(asked, 30)).code == 503
    assert ended.is_dir() and not (ended / "manifest.json").exists()  # what was written stays

    listing = json.loads((await jp_fetch("jupyter-gpu-gov", "checkpoints")).body)["checkpoints"]
    assert [c["id"] for c in listing] == [whole["id"]]
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("jupyter-gpu-gov", "checkpoints", ended.name)
    assert info.value.code == 404


async def test_a_manifest_edited_out_of_shape_leaves_the_others_listed(
    jp_fetch, checkpoint_root, capsys
):
    """A manifest is a file in the user's folder, which they (or a guest's terminal on a
    shared server, or a disk that filled mid-write) may leave out of shape: one whose
    ``notebooks`` is not a list of objects or whose ``errors`` is not a list made the whole
    listing a 500 (JupyterLab's list of checkpoints empty) and ``%gpu_checkpoint list`` a
    traceback. It is listed as far as it reads; the others as they are."""
    from jupyter_gpu_gov import checkpoint as kernel_side

    whole = await checkpoint(jp_fetch, reason="whole")
    odd = checkpoint_root / "20000101T000000Z"
    (odd / "kernels" / "k1").mkdir(parents=True)
    odd_manifest = {
        "status": "done",
        "notebooks": ["a.ipynb", 7, {"path": ["x"]}],
        "errors": 3,
        "bytes": "many",
        "path": "/etc",
    }
    (odd / "manifest.json").write_text(json.dumps(odd_manifest))
    hooks = {"hooks": [{"name": "v", "kind": "variables", "status": "done", "files": 1}]}
    (odd / "kernels" / "k1" / "hooks.json").write_text(json.dumps(hooks))
    listing = json.loads((await jp_fetch("jupyter-gpu-gov", "checkpoints")).body)["checkpoints"]
    assert [c["id"] for c in listing] == [whole["id"], odd.name]
    assert (listing[1]["notebooks"], listing[1]["errors"]) == ([], 0), listing[1]
    kernel_side._print_list(checkpoint_root)
    out = capsys.readouterr().out
    assert whole["id"] in out and odd.name in out, out


def strict_json(body: bytes):
    """An answer as a browser's ``JSON.parse`` reads it: ``NaN`` and ``Infinity`` refused."""

    def refuse(word):
        raise AssertionError(f"{word} in an answer: JSON.parse refuses the whole answer")

    return json.loads(body, parse_constant=refuse)


async def test_a_nan_in_a_manifest_or_a_verdict_still_answers_json_a_browser_parses(
    jp_fetch, jp_serverapp, checkpoint_root
):
    """A manifest is a file in the user's folder (a figure a kernel's hook wrote, a hand
    edit), and the verdict the governor's answer as ``json.loads`` read it (a proxy in its
    place may send NaN): ``json.dumps`` wrote them back as ``NaN``/``Infinity``, and
    JupyterLab's ``JSON.parse`` refused the whole answer (the manifest, the list of
    checkpoints, the panel's status). Each such number is now ``null``, the rest as it was."""
    checkpoint_id = "20260101T000000Z"
    (checkpoint_root / checkpoint_id).mkdir(parents=True)
    (checkpoint_root / checkpoint_id / "manifest.json").write_text(
        f'{{"id": "{checkpoint_id}", "status": "done", "completed_at": NaN, "bytes": 10,'
        ' "kernels": [{"id": "k", "hooks": [{"loss": Infinity, "step": 3}]}]}'
    )
    answer = await jp_fetch("jupyter-gpu-gov", "checkpoints", checkpoint_id)
    manifest = strict_json(answer.body)
    assert manifest["completed_at"] is None and manifest["status"] == "done"
    assert manifest["kernels"] == [{"id": "k", "hooks": [{"loss": None, "step": 3}]}]
    listed = strict_json((await jp_fetch("jupyter-gpu-gov", "checkpoints")).body)["checkpoints"]
    assert [(c["id"], c["completed_at"], c["bytes"]) for c in listed] == [(checkpoint_id, None, 10)]

    strict_json((await jp_fetch("jupyter-gpu-gov", "status")).body)  # a report to carry it
    gov_app(jp_serverapp).set_verdict(
        {"state": "warned", "active_fraction": float("nan"), "extensions_left": float("inf")}
    )
    verdict = strict_json((await jp_fetch("jupyter-gpu-gov", "status")).body)["verdict"]
    assert verdict == {"state": "warned", "active_fraction": None, "extensions_left": None}
