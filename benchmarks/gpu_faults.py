"""Root-cause diagnosis on a real GPU: faults injected into a small PyTorch loop.

    python -m benchmarks.gpu_faults collect --out DIR [--window 3] [--windows 8]   # GPU host
    python -m benchmarks.gpu_faults score benchmarks/data/gpu-faults-h200-*.csv    # anywhere, 1 s

``collect`` runs one PyTorch workload per scenario (``SCENARIOS``), one after the other, each
in its own process as a kernel would run it, and measures it the way the server extension
does: the extension's own ``Sampler`` over NVML (per-process SM, memory, the process tree's
CPU, I/O wait and reads), its report turned into a diagnosis window by
``features.windows_from_report``. Each window is written twice:

- node ``<gpu>-nvml``: what a hub without DCGM sees (NVML only: time-based utilisation as
  ``sm_active``, NVML's memory utilisation as ``dram_active``);
- node ``<gpu>-gpm``: the same report with GPM's profiling metrics in DCGM's place (GPM is
  DCGM's profiling counters read through NVML on Hopper and later: ``SM_UTIL`` as
  ``sm_active``, ``GRAPHICS_UTIL`` as ``gr_active``, ``DRAM_BW_UTIL`` as ``dram_active``,
  ``ANY_TENSOR_UTIL`` as ``tensor_active``, PCIe TX + RX), where the GPU supports GPM.

It writes ``gpu-faults.csv`` (diagnosis windows, docs/architecture.md, plus ``truth`` and ``scenario``) and
``gpu-faults.json`` (the GPU, the driver, what could be measured). Nothing is simulated but the
owner: a person cannot sit at a lent GPU, so a scenario's ``server.last_activity`` says when
its owner last touched it (the zombie's two hours ago, the others' when the loop started).
The I/O wait needs delay accounting: ``collect`` turns it on (``kernel.task_delayacct=1``, as
docs/api.md tells admins) when it can, and says so.

``score`` scores the real windows of each node twice, the node never seen before: *online*
(each window as it came, the node learnt from its first windows on, as the service meets a
new node) and with the node's *history* (learnt from all of its windows first, unlabelled, as
the service once it has history, and as ``jupyter-gpu-gov diagnose FILE``). It prints accuracy
per scenario and overall (``uncertain`` counted as not right, and apart: over the windows
answered, with the share answered), against the rules.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import select
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

from jupyter_gpu_gov.diagnose.features import COLUMNS, windows_from_report
from jupyter_gpu_gov.diagnose.labels import (
    CPU_SERIAL,
    DATA_IO,
    HEALTHY,
    MEMORY_BANDWIDTH,
    SMALL_WORK,
    UNCERTAIN,
    UNKNOWN,
    ZOMBIE,
)

# How hard each fault bites. ``strong``: the GPU waits nearly all the time (the faults as the
# issue words them); ``moderate``: a bigger step, so the GPU is busy a third to a half of the time,
# one DataLoader worker, small tensors for the elementwise mix (launch gaps), a small zombie;
# ``mild``: faults that cost the GPU a quarter to a half of its time, two workers.
VARIANTS = {
    "strong": {
        "width": 4096, "host_s": 0.1, "zombie_gib": 20, "elements": 2**28,
        "small": (256, 16), "loader_batch": 4, "workers": 0,
    },
    "moderate": {
        "width": 8192, "host_s": 0.015, "zombie_gib": 2, "elements": 2**22,
        "small": (1024, 64), "loader_batch": 1, "workers": 1,
    },
    "mild": {
        "width": 8192, "host_s": 0.005, "zombie_gib": 8, "elements": 2**25,
        "small": (2048, 128), "loader_batch": 1, "workers": 2,
    },
    "fresh": {  # sizes no earlier run used, collected after the model's last change: held out
        "width": 6144, "host_s": 0.04, "zombie_gib": 4, "elements": 2**27,
        "small": (512, 32), "loader_batch": 2, "workers": 0,
    },
    # Collected after format 8 (2026-12-04), held out like "fresh": a wider model at a smaller
    # batch, a large zombie, two loader workers over batches of eight files; then a narrower
    # model at a large batch, a 1 GiB zombie, a small MLP at a large batch, three workers.
    "wide": {
        "width": 12288, "batch": 2048, "host_s": 0.03, "zombie_gib": 40, "elements": 2**26,
        "small": (384, 24), "loader_batch": 8, "workers": 2,
    },
    "batch": {
        "width": 4096, "batch": 16384, "host_s": 0.01, "zombie_gib": 1, "elements": 2**24,
        "small": (768, 512), "loader_batch": 3, "workers": 3,
    },
}  # fmt: skip
BATCH = 4096  # the healthy loop's batch where a variant names none

# name -> (truth, what the loop does). The five faults, a healthy loop to give the node
# its best state, and a CPU-bound loop: a ``time.sleep`` stands for host work in the issue, but
# a sleeping process computes nothing, so a loop that really computes on the CPU is here too.
SCENARIOS = {
    "healthy": (HEALTHY, "bf16 MLP (4 layers, `width` wide, batch `batch`), AdamW, data on "
                "the GPU"),
    "zombie": (ZOMBIE, "`zombie_gib` GiB allocated, then nothing; the owner left two hours ago"),
    "data_io": (
        DATA_IO,
        "the healthy loop fed by a DataLoader (`workers` workers) over files read past the page "
        "cache, 32 MiB per sample",
    ),
    "cpu_serial": (CPU_SERIAL, "the healthy loop with `host_s` s of pure-Python work per step"),
    "sleep": (CPU_SERIAL, "the healthy loop with time.sleep(`host_s`) per step (the issue's "
              "stand-in for host work)"),
    "memory_bound": (MEMORY_BANDWIDTH, "an unfused elementwise mix over `elements`-element fp32 "
                     "tensors"),
    "small_work": (SMALL_WORK, "a 3-layer fp32 MLP, (width, batch) = `small`, AdamW"),
}  # fmt: skip
AWAY_S = {"zombie": 7200.0}  # seconds since the owner last touched the server, at the start
GPM_METRICS = {  # window column -> NVML GPM metric id (nvml.h)
    "gr_active": 1,  # NVML_GPM_METRIC_GRAPHICS_UTIL
    "sm_active": 2,  # NVML_GPM_METRIC_SM_UTIL
    "tensor_active": 5,  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    "dram_active": 10,  # NVML_GPM_METRIC_DRAM_BW_UTIL
    "pcie_tx": 20,  # NVML_GPM_METRIC_PCIE_TX_PER_SEC (MiB/s)
    "pcie_rx": 21,  # NVML_GPM_METRIC_PCIE_RX_PER_SEC (MiB/s)
}


# -- the workloads (each in its own process) -----------------------------------------------------


def workload(name: str, data_dir: str, variant: str = "strong") -> None:
    """Set the loop up, say READY, and run it until killed."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"

    def mlp(width: int, depth: int, dtype) -> torch.nn.Module:
        layers = []
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers).to(device, dtype)

    def trainer(model, batch: int, width: int, dtype, foreach=None):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=foreach)
        x = torch.randn(batch, width, device=device, dtype=dtype)

        def step(extra=None) -> float:
            loss = model(x).float().pow(2).mean()
            if extra is not None:
                loss = loss + extra
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss.item()  # a loop that logs its loss synchronises every step

        return step

    v = {"batch": BATCH, **VARIANTS[variant]}
    width, batch = v["width"], v["batch"]
    if name == "zombie":
        held = torch.empty(v["zombie_gib"] * 2**30 // 4, device=device)
        held.fill_(1.0)
        ready()
        while True:
            time.sleep(3600)
    elif name in ("healthy", "cpu_serial", "sleep"):
        step = trainer(mlp(width, 4, torch.bfloat16), batch, width, torch.bfloat16)
        step()
        ready()
        while True:
            if name == "cpu_serial":
                busy_python(v["host_s"])
            elif name == "sleep":
                time.sleep(v["host_s"])
            step()
    elif name == "small_work":
        small_width, batch = v["small"]
        step = trainer(mlp(small_width, 3, torch.float32), batch, small_width, torch.float32, False)
        step()
        ready()
        while True:
            step()
    elif name == "memory_bound":
        a, b, c = (torch.rand(v["elements"], device=device) for _ in range(3))
        ready()
        while True:
            y = torch.sigmoid(a * b + c) * a - b
            c = (c + y * 1e-3).clamp_(0, 1)
            c.sum().item()
    elif name == "data_io":
        step = trainer(mlp(width, 4, torch.bfloat16), batch, width, torch.bfloat16)
        loader = torch.utils.data.DataLoader(
            UncachedFiles(data_dir),
            batch_size=v["loader_batch"],
            shuffle=True,
            num_workers=v["workers"],
        )
        step()
        ready()
        while True:
            for batch in loader:
                step(batch.to(device).float().mean() * 0.0)
    else:
        raise SystemExit(f"unknown workload {name!r}; choose from {', '.join(SCENARIOS)}")


def ready() -> None:
    print("READY", flush=True)


def busy_python(seconds: float) -> int:
    """Pure-Python work on one core for ``seconds`` (the kind a preprocessing loop does)."""
    end = time.perf_counter() + seconds
    total = 0
    while time.perf_counter() < end:
        total += sum(i * i for i in range(2000))
    return total


FILE_MB = 32
FILES = 16


class UncachedFiles:
    """A map-style dataset of files read past the page cache (``O_DIRECT``, else dropping the
    file from the cache first), so every read goes to the disk: slow storage, like a network
    file system's first read."""

    def __init__(self, folder: str):
        self.paths = sorted(Path(folder).glob("shard-*.bin"))
        if not self.paths:
            raise SystemExit(f"{folder}: no shard-*.bin files (collect writes them)")

    def __len__(self) -> int:
        return len(self.paths) * 4

    def __getitem__(self, index: int):
        import mmap

        import torch

        path = self.paths[index % len(self.paths)]
        buffer = mmap.mmap(-1, FILE_MB * 2**20)  # page-aligned, as O_DIRECT needs
        try:
            got = _read_uncached(path, buffer, getattr(os, "O_DIRECT", 0))
        except OSError:  # a file system without O_DIRECT (tmpfs): read it plainly, uncached
            got = _read_uncached(path, buffer, 0)
        return torch.frombuffer(bytearray(buffer[: min(got, 2**20)]), dtype=torch.uint8)


def _read_uncached(path: Path, buffer, flags: int) -> int:
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # drop what the page cache holds
        return os.preadv(fd, [buffer], 0)
    finally:
        os.close(fd)


def write_shards(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    chunk = os.urandom(2**20)
    for i in range(FILES):
        path = folder / f"shard-{i:03d}.bin"
        if not path.exists() or path.stat().st_size != FILE_MB * 2**20:
            with open(path, "wb") as f:
                for _ in range(FILE_MB):
                    f.write(chunk)
                os.fsync(f.fileno())


# -- collecting windows --------------------------------------------------------------------------


class Gpm:
    """GPM metrics between two ticks of one whole GPU (``None`` where GPM is unsupported)."""

    def __init__(self, index: int = 0):
        import pynvml as nv

        self.nv = nv
        nv.nvmlInit()
        self.handle = nv.nvmlDeviceGetHandleByIndex(index)
        self.previous = None
        try:
            self.supported = bool(nv.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice)
            self.error = None
        except Exception as error:  # older driver or bindings
            self.supported, self.error = False, repr(error)

    def read(self) -> dict | None:
        if not self.supported:
            return None
        try:
            return self._read()
        except Exception as error:  # say why in the metadata, and go on with NVML alone
            self.supported, self.error = False, repr(error)
            return None

    def _read(self) -> dict | None:
        nv = self.nv
        current = nv.nvmlGpmSampleAlloc()
        nv.nvmlGpmSampleGet(self.handle, current)
        previous, self.previous = self.previous, current
        if previous is None:
            return None
        try:
            request = nv.c_nvmlGpmMetricsGet_t()
            request.version = nv.NVML_GPM_METRICS_GET_VERSION
            request.sample1, request.sample2 = previous, current
            request.numMetrics = len(GPM_METRICS)
            for i, metric in enumerate(GPM_METRICS.values()):
                request.metrics[i].metricId = metric
            nv.nvmlGpmMetricsGet(request)
            got = {}
            for name, metric in zip(GPM_METRICS, request.metrics, strict=False):
                ok = metric.nvmlReturn == nv.NVML_SUCCESS
                got[name] = float(metric.value) if ok else None
        finally:
            nv.nvmlGpmSampleFree(previous)
        dcgm = {k: None if v is None else v / 100.0 for k, v in got.items() if "pcie" not in k}
        pcie = [got["pcie_tx"], got["pcie_rx"]]
        dcgm["pcie_mb_s"] = None if None in pcie else sum(pcie) * 1.048576  # MiB/s -> MB/s
        return dcgm


def enable_delay_accounting() -> dict:
    path = Path("/proc/sys/kernel/task_delayacct")
    before = path.read_text().strip() if path.exists() else None
    if before == "0":
        try:
            path.write_text("1\n")
        except OSError as error:
            return {"before": before, "after": before, "error": str(error)}
    return {"before": before, "after": path.read_text().strip() if path.exists() else None}


async def collect(args) -> None:
    from jupyter_gpu_gov.core import clock
    from jupyter_gpu_gov.gpu.attribution import TargetRoot
    from jupyter_gpu_gov.gpu.nvml import NvmlBackend, nvml_available
    from jupyter_gpu_gov.server.sampler import Sampler, TargetInfo

    if not nvml_available():
        raise SystemExit("collect needs an NVIDIA GPU and driver: NVML did not load here")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data_dir = Path(args.data)
    write_shards(data_dir)
    meta: dict = {"delay_accounting": enable_delay_accounting(), "scenarios": {}}
    gpm = Gpm()
    name = gpm.nv.nvmlDeviceGetName(gpm.handle)
    gpu = (name.decode() if isinstance(name, bytes) else name).replace("NVIDIA ", "")
    node = gpu.lower().replace(" ", "-")
    meta.update(
        gpu=gpu,
        driver=_optional(gpm.nv.nvmlSystemGetDriverVersion),
        gpm=gpm.supported,
        gpm_error=gpm.error,
        window_s=args.window,
        variant=args.variant,
    )
    sampler = Sampler(NvmlBackend, window_seconds=args.window)
    rows: list[dict] = []
    scenarios = args.scenarios or list(SCENARIOS)
    try:
        for scenario in scenarios:
            truth, what = SCENARIOS[scenario]
            for key, value in {"batch": BATCH, **VARIANTS[args.variant]}.items():
                what = what.replace(f"`{key}`", str(value))
            print(f"== {scenario}: {what}", flush=True)
            child = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.gpu_faults", "workload", scenario],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={
                    **os.environ,
                    "GPU_FAULTS_DATA": str(data_dir),
                    "GPU_FAULTS_VARIANT": args.variant,
                },
            )
            started = time.monotonic()
            ready_in, _, _ = select.select([child.stdout], [], [], 180)
            if not ready_in or child.stdout.readline().strip() != "READY":
                child.kill()
                meta["scenarios"][scenario] = {"error": child.communicate()[1][-2000:]}
                continue
            meta["scenarios"][scenario] = {"truth": truth, "what": what}
            meta["scenarios"][scenario]["ready_s"] = round(time.monotonic() - started, 1)
            now = clock.utcnow()
            target = TargetInfo(
                TargetRoot("kernel", scenario, child.pid),
                scenario,
                execution_state="idle" if scenario == "zombie" else "busy",
                last_activity=now,
                connections=1,
                busy_since=None if scenario == "zombie" else now,
            )
            server = {
                "user": scenario,
                "name": "",
                "last_activity": clock.isoformat(
                    now - timedelta(seconds=AWAY_S.get(scenario, 0.0))
                ),
                "gpu_allocated": True,
            }
            previous = (await sampler.tick([target], server)).report  # primes CPU and GPM deltas
            gpm.read()
            next_at = time.monotonic()
            for _ in range(args.windows):
                next_at += args.window
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                report = (await sampler.tick([target], server)).report
                dcgm = gpm.read()
                t = datetime.now(UTC)
                for w in windows_from_report(report, previous, t, node=f"{node}-nvml"):
                    rows.append(
                        {
                            **w.as_dict(),
                            "truth": truth,
                            "scenario": scenario,
                            "variant": args.variant,
                        }
                    )
                if dcgm is not None:
                    for w in windows_from_report(
                        report, previous, t, node=f"{node}-gpm", dcgm=dcgm
                    ):
                        rows.append(
                            {
                                **w.as_dict(),
                                "truth": truth,
                                "scenario": scenario,
                                "variant": args.variant,
                            }
                        )
                previous = report
                print(f"   {scenario}: {rows[-1] if rows else None}", flush=True)
            child.kill()
            child.wait(timeout=30)
            _write(out, rows, meta)  # after each scenario: a run cut short keeps what it measured
    finally:
        sampler.close()
    _write(out, rows, meta)
    print(f"{len(rows)} windows -> {out / 'gpu-faults.csv'}", flush=True)


def _write(out: Path, rows: list[dict], meta: dict) -> None:
    with open(out / "gpu-faults.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, [*COLUMNS, "truth", "scenario", "variant"])
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(row.get(k)) for k in writer.fieldnames})
    (out / "gpu-faults.json").write_text(json.dumps(meta, indent=2) + "\n")


def _optional(query):
    try:
        value = query()
    except Exception as error:
        return repr(error)
    return value.decode() if isinstance(value, bytes) else str(value)


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4f}".rstrip("0").rstrip(".")
    return str(value)


# -- scoring -------------------------------------------------------------------------------------


def score(args) -> dict:
    """``{file: {node: {method: figures}}}``."""
    return {Path(f).name: score_file(f, args) for f in args.files}


def score_file(path, args) -> dict:
    """Each node of the file scored three ways: ``online`` (windows as they came, the node
    learnt from its first ones, as the service meets a new node), ``history`` (the node learnt
    from all of the file's windows first, unlabelled, as the service once it has history, and
    as ``jupyter-gpu-gov diagnose FILE``) and the rules. ``uncertain`` counts as not right."""
    from jupyter_gpu_gov.diagnose import rules
    from jupyter_gpu_gov.diagnose.counterfactual import Diagnoser, Params
    from jupyter_gpu_gov.diagnose.features import read_windows

    from .diagnose import online

    with open(path) as f:
        extra = list(csv.DictReader(f))
    windows = read_windows(path)
    truths = [row["truth"] for row in extra]
    scenarios = [row["scenario"] for row in extra]

    figures: dict = {}
    for node in sorted({w.node for w in windows}):
        idx = [i for i, w in enumerate(windows) if w.node == node]
        ws = [windows[i] for i in idx]
        rows = [(w, truths[i]) for w, i in zip(ws, idx, strict=True)]
        model = Diagnoser(min_node_windows=args.min_node_windows).fit(ws)
        labels = {
            "online": [d.label for d in online(rows, Params(), args.min_node_windows)],
            "history": [d.label for d in model.diagnose_many(ws)],
            "rules": [rules.baseline(w).label for w in ws],
        }
        per: dict = {}
        for method, predicted in labels.items():
            scored = [(truths[i], scenarios[i], p) for i, p in zip(idx, predicted, strict=True)]
            scored = [s for s in scored if s[0] != UNKNOWN]
            by = {}
            for scenario in dict.fromkeys(s for _, s, _ in scored):
                mine = [(t, p) for t, s, p in scored if s == scenario]
                by[scenario] = {
                    "accuracy": sum(t == p for t, p in mine) / len(mine),
                    "labels": dict(Counter(p for _, p in mine).most_common()),
                }
            answered = [(t, p) for t, _, p in scored if p != UNCERTAIN]
            per[method] = {
                "overall": sum(t == p for t, _, p in scored) / max(1, len(scored)),
                "answered": sum(t == p for t, p in answered) / max(1, len(answered)),
                "coverage": len(answered) / max(1, len(scored)),
                "windows": len(scored),
                "by_scenario": by,
            }
        figures[node] = per
    return figures


def _print_scores(figures: dict) -> None:
    for name, nodes in figures.items():
        for node, per in nodes.items():
            _print_node(f"{name}, {node}", per)


def _print_node(title: str, per: dict) -> None:
    print(f"\n## {title}")
    methods = list(per)
    print(f"{'scenario':<14}" + "".join(f"{m:>26}" for m in methods))
    for scenario in next(iter(per.values()))["by_scenario"]:
        cells = []
        for m in methods:
            row = per[m]["by_scenario"][scenario]
            cells.append(f"{row['accuracy']:6.0%} ({next(iter(row['labels']))})")
        print(f"{scenario:<14}" + "".join(f"{c:>26}" for c in cells))
    print(f"{'overall':<14}" + "".join(f"{per[m]['overall']:>26.1%}" for m in methods))
    print(f"{'answered':<14}" + "".join(
        f"{per[m]['answered']:>18.1%} of {per[m]['coverage']:.0%}" for m in methods
    ))  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="run the faults on this host's GPU 0 and write windows")
    c.add_argument("--out", required=True)
    c.add_argument("--data", default=".gpu-faults-data", help="a folder on a real disk")
    c.add_argument("--window", type=float, default=3.0, help="seconds per window")
    c.add_argument("--windows", type=int, default=8, help="windows per scenario")
    c.add_argument("--scenarios", nargs="*", choices=list(SCENARIOS))
    c.add_argument("--variant", choices=list(VARIANTS), default="strong")
    s = sub.add_parser("score", help="score collected windows: model against the rules")
    s.add_argument("files", nargs="+", metavar="FILE")
    s.add_argument("--min-node-windows", type=int, default=10)
    s.add_argument("--json", action="store_true")
    w = sub.add_parser("workload", help=argparse.SUPPRESS)
    w.add_argument("name")
    args = parser.parse_args(argv)
    if args.command == "workload":
        data = os.environ.get("GPU_FAULTS_DATA", ".gpu-faults-data")
        workload(args.name, data, os.environ.get("GPU_FAULTS_VARIANT", "strong"))
    elif args.command == "collect":
        asyncio.run(collect(args))
    else:
        figures = score(args)
        print(json.dumps(figures, indent=2)) if args.json else _print_scores(figures)


if __name__ == "__main__":
    main()
