"""``GpuGovApp``: the jupyter-server extension that reports per-kernel GPU activity."""

from __future__ import annotations

import asyncio
import getpass
import os
import socket
import time
from pathlib import Path

from jupyter_core.utils import ensure_async
from jupyter_server.extension.application import ExtensionApp
from traitlets import Dict, Enum, List, Unicode, default, validate

from .. import __version__
from ..checkpoint_layout import DEFAULT_ROOT, FAILED, ROOT_ENV, RUNNING, SOURCE_GOVERNOR
from ..core import clock
from ..core.traits import BoundedInt, FiniteFloat
from ..core.vocabulary import CHECKPOINT_REQUESTED, CULL_REASONS
from ..events import GPU_STATE_SCHEMA, GPU_STATE_SCHEMA_ID, VERDICT_SCHEMA, VERDICT_SCHEMA_ID
from ..gpu.attribution import TargetRoot
from ..gpu.backends import CHOICES, make_backend, parse_visible_devices, resolve_choice
from . import metrics, routes
from .checkpoint import for_report, take_checkpoint
from .frontend_first import FrontendFirst
from .own_activity import OwnActivity
from .person_activity import PersonActivity
from .reporter import GovernorError, Held, Reporter
from .sampler import NoSample, Sampler, TargetInfo, TickResult, unreadable

HOUR, DAY = 3600, 86_400  # the longest a sample, a window, a report or a hook waits

K8S_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
# jupyter_server calls extensions' start hook (`_start_jupyter_server_extension`, once the event
# loop runs) from 2.16; older servers never call it, so sampling and reports would never start.
_SERVER_CALLS_START_HOOKS = hasattr(ExtensionApp, "_start_jupyter_server_extension")
# A tick waits on the GPU driver, which can hang for minutes (a GPU lost from the bus, GSP
# timeouts). A checkpoint (wanted most then) or a status read waits this long at most for a
# fresh sample, then goes on with the last one; and while a tick has waited on the driver
# longer than STALE_AFTER_S, the last sample is shown as unavailable, never as the GPU now.
FRESH_SAMPLE_WAIT_S = 10.0
STALE_AFTER_S = 10.0
STOP_WAIT_S = 5.0  # at a stop, for the cancelled sampling and requests to end
DEVICE_ORDER_ENV = "CUDA_DEVICE_ORDER"


class GpuGovApp(ExtensionApp):
    """Samples the GPUs this server can see, ties each GPU process to the kernel, terminal or
    other process that owns it, and serves the result at ``/jupyter-gpu-gov/status``."""

    name = "jupyter_gpu_gov"
    version = __version__
    description = __doc__
    load_other_extensions = True

    backend = Unicode(
        "auto",
        help=f"""Where GPU data comes from: one of {", ".join(CHOICES)}.

        ``auto`` uses NVML when the driver loads and reports no GPUs otherwise; ``simulated``
        uses simulated GPUs (demos, laptops, tests; see ``jupyter_gpu_gov.simulate``); ``none``
        turns GPU sampling off. ``$JUPYTER_GPU_GOV_BACKEND`` overrides this, so a spawner can
        choose per server.""",
    ).tag(config=True)

    simulated_devices = List(
        Dict(),
        default_value=None,
        allow_none=True,
        help="""Simulated GPUs for ``backend = "simulated"``; default: one whole H100 80GB and one
        H100 in MIG mode. Example::

            c.GpuGovApp.simulated_devices = [
                {"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559},
                {"name": "NVIDIA A100-SXM4-40GB", "memory_mb": 40960,
                 "mig": ["3g.20gb", "2g.10gb", "1g.5gb"]},
            ]""",
    ).tag(config=True)

    sim_state_path = Unicode(
        "",
        help="""File shared by every process that uses the simulated GPUs (the kernels that call
        ``jupyter_gpu_gov.simulate`` and this sampler). Empty: ``$JUPYTER_GPU_GOV_SIM_STATE``,
        else ``jupyter-gpu-gov-sim.json`` in the Jupyter runtime directory.""",
    ).tag(config=True)

    sample_interval = FiniteFloat(
        5.0,
        min=0,
        max=HOUR,
        above=True,
        unit="seconds",
        help="Seconds between two GPU samples (one NVML pass and one /proc scan).",
    ).tag(config=True)

    window_seconds = FiniteFloat(
        60.0,
        min=0,
        max=DAY,
        above=True,
        unit="seconds",
        help="Length in seconds of the rolling window behind `active_fraction`.",
    ).tag(config=True)

    active_threshold = FiniteFloat(
        0.02,
        min=0,
        max=1,
        above=True,
        help="""SM activity (0..1) at or above which a kernel counts as using its GPU.
        Idle CUDA contexts read 0 and sampling noise about 1 %; a training loop starved by
        its data loader can read 2-5 % and is still work (the governor's default too).""",
    ).tag(config=True)

    visible_devices = List(
        Unicode(),
        default_value=None,
        allow_none=True,
        help="""The GPUs this server may use, as ``CUDA_VISIBLE_DEVICES`` names them (indices or
        UUIDs). Default: ``$CUDA_VISIBLE_DEVICES``, else every GPU NVML shows (in a Kubernetes
        pod that is just the pod's GPUs).""",
    ).tag(config=True)

    pid_namespace = Enum(
        ["auto", "host", "container"],
        "auto",
        help="""Whether NVML's process IDs are ours (``host``) or the host's (``container``).
        ``auto`` reads ``/proc/self/ns/pid``. In a container, host PIDs are never looked up
        locally; GPU holders are found through their open ``/dev/nvidia*`` files.""",
    ).tag(config=True)

    gpu_sharing = Enum(
        ["exclusive", "time-sliced"],
        "exclusive",
        help="""``time-sliced`` when other pods share these GPUs (the device plugin's
        time-slicing): device activity then proves nothing about this server, only an idle
        device proves it idle.""",
    ).tag(config=True)

    governor_url = Unicode(
        help="""The governor service's URL (e.g. ``http://127.0.0.1:10101/services/gpu-gov/``),
        where this server pushes its report every `report_interval`. Default:
        ``$JUPYTER_GPU_GOV_URL``; empty turns reporting off.""",
    ).tag(config=True)

    report_interval = FiniteFloat(
        60.0,
        min=0,
        max=DAY,
        above=True,
        unit="seconds",
        help="""Seconds between two reports to the governor. A change of a kernel's GPU state is
        reported at the next sample instead of waiting. Under 30 s the reports share one kept
        HTTP connection; at the default each report opens its own (a connection held open per
        server costs the governor more memory than it saves CPU).""",
    ).tag(config=True)

    frontend_checkpoint_grace = FiniteFloat(
        20.0,
        min=0,
        max=HOUR,
        unit="seconds",
        help="""Seconds a checkpoint requested by the governor waits for a connected JupyterLab
        to save its dirty documents first (0: never wait).""",
    ).tag(config=True)

    checkpoint_dir = Unicode(
        help=f"""Directory of the checkpoints taken before a cull (and on request): one
        sub-directory per checkpoint, ``<id>/manifest.json`` plus the kernels' hook files and
        terminal scrollback. Default: ``{DEFAULT_ROOT}``; ``~`` is expanded. Exported to
        kernels as ``${ROOT_ENV}`` (``checkpoint.restore()`` looks there). Example::

            c.GpuGovApp.checkpoint_dir = "/scratch/alice/gpu-checkpoints"
        """,
    ).tag(config=True)

    checkpoint_hook_timeout = FiniteFloat(
        120.0,
        min=0,
        max=DAY,
        above=True,
        unit="seconds",
        help="""Seconds each kernel on a GPU gets to run all its checkpoint hooks
        (``jupyter_gpu_gov.checkpoint``); kernels run theirs in parallel. Past it the kernel is
        interrupted (it stays usable) and the checkpoint records a timeout naming the hook.
        Keep it below the governor policy's ``checkpoint_timeout`` (default 5 min), minus
        `frontend_checkpoint_grace`. Example: ``c.GpuGovApp.checkpoint_hook_timeout = 300``.""",
    ).tag(config=True)

    checkpoint_keep = BoundedInt(
        10,
        min=1,  # the newest checkpoint is always kept
        max=10_000,
        unit="checkpoints",
        help="""How many checkpoints to keep in `checkpoint_dir` (at least 1): after each
        checkpoint the oldest beyond this count are deleted; the newest is always kept, and
        where it failed, the last one that ended done.""",
    ).tag(config=True)

    checkpoint_max_bytes = BoundedInt(
        20 * 1024**3,
        min=1,
        max=2**50,  # a pebibyte
        unit="bytes",
        help="""Bytes all kept checkpoints may take together (default 20 GiB); after each
        checkpoint the oldest are deleted until the rest fit. The newest is always kept, even
        alone above the limit, and where it failed, the last one that ended done. Example: ``c.GpuGovApp.checkpoint_max_bytes = 100 * 1024**3``
        (100 GiB).""",
    ).tag(config=True)

    @default("checkpoint_dir")
    def _checkpoint_dir_default(self):
        return os.path.abspath(os.path.expanduser(DEFAULT_ROOT))

    @validate("checkpoint_dir")
    def _check_checkpoint_dir(self, proposal):
        value = proposal["value"].strip()
        if not value:
            raise ValueError(
                f"GpuGovApp.checkpoint_dir must name a directory (e.g. {DEFAULT_ROOT!r})"
            )
        return os.path.abspath(os.path.expanduser(value))

    @default("governor_url")
    def _governor_url_default(self):
        return os.environ.get("JUPYTER_GPU_GOV_URL", "")

    @default("visible_devices")
    def _visible_from_env(self):
        return parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))

    @validate("backend")
    def _check_backend(self, proposal):
        value = proposal["value"].strip().lower()
        if value not in CHOICES:
            raise ValueError(
                f"GpuGovApp.backend={proposal['value']!r} is not one of {', '.join(CHOICES)}"
            )
        return value

    # -- lifecycle ---------------------------------------------------------------------------

    def initialize_settings(self):
        self.backend_choice = resolve_choice(self.backend)
        self.sampler = Sampler(
            self._make_backend,
            window_seconds=self.window_seconds,
            active_threshold=self.active_threshold,
            visible_devices=self.visible_devices,
            pid_namespace=self.pid_namespace,
            time_sliced=self.gpu_sharing == "time-sliced",
            log=self.log,
        )
        self.report: dict | None = None
        self._sampling_since: float | None = None  # time.monotonic() a tick began, while it runs
        self._refresh: asyncio.Future | None = None  # a sample asked for and not taken yet
        self._timer: asyncio.Future | None = None
        self._watch: asyncio.Future | None = None  # reports while a tick is stuck
        self._stopping = False  # stop_extension began: nothing new is sampled
        self._tick_lock = asyncio.Lock()
        self.server_identity = {**_server_identity(), "gpu_allocated": self._gpu_allocated()}
        self._busy_since: dict[str, object] = {}
        self._own_activity = OwnActivity()  # checkpoint hooks are not a person at work
        self._person_activity = PersonActivity(self._own_activity)
        self.verdict: dict | None = None
        self.checkpoint: dict = {"requested_at": None, "status": None, "manifest": None}
        self._frontend_first = FrontendFirst()
        # The governor's requests (in its verdicts) this server took up: kind -> requested_at.
        self._answered: dict[str, str] = {}
        self._request_tasks: set[asyncio.Task] = set()
        self._checkpoint_lock = asyncio.Lock()
        # Kernels inherit the server's environment: tell their checkpoint module where to write.
        self._previous_checkpoint_env = os.environ.get(ROOT_ENV)
        os.environ[ROOT_ENV] = self.checkpoint_dir
        self._set_device_order = self._pci_bus_order()
        self.reporter = None
        # time.monotonic() of the last report sent; -inf: the next sample reports (0.0 read as
        # "just now" on a machine up less than report_interval: its uptime is the clock).
        self._last_report_at = float("-inf")
        token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
        if self.governor_url and token:
            self.reporter = Reporter(
                self.governor_url, token, self.log, report_interval=self.report_interval
            )
        elif self.governor_url:
            self.log.warning(
                "jupyter-gpu-gov: no $JUPYTERHUB_API_TOKEN, not reporting to %s", self.governor_url
            )
        for schema in (GPU_STATE_SCHEMA, VERDICT_SCHEMA):
            self.serverapp.event_logger.register_event_schema(schema)
        if not _SERVER_CALLS_START_HOOKS:
            # What jupyter_server >= 2.16 does with the start hook, once its loop runs.
            self.serverapp.io_loop.add_callback(self.ensure_sampling)
        self.log.info(
            "jupyter-gpu-gov: GPU backend %s, sampling every %ss",
            self.backend_choice,
            self.sample_interval,
        )

    def _pci_bus_order(self) -> bool:
        """GPUs named by index count in NVML's order here (PCI bus order), and CUDA counts
        fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: on a machine with mixed cards,
        ``CUDA_VISIBLE_DEVICES=0`` was one card to the kernels and another to the sampler, which
        then read the card the kernels worked on as nobody's and theirs as idle. The kernels
        and terminals inherit the server's environment: they count as NVML does (as
        nvidia-smi does). Where the environment names another order, the extension does not
        guess CUDA's (NVIDIA documents FASTEST_FIRST only as "a simple heuristic"): with more
        than one GPU, the GPUs read unknown, never idle (``Sampler.index_order_unknown``).
        Whether it was set here (taken back at the stop)."""
        entries = self.visible_devices or ()
        if not any(e.isascii() and e.lstrip("-").isdigit() for e in entries):
            return False  # UUIDs (the workstation allocator's), or every GPU: no order to agree
        order = os.environ.get(DEVICE_ORDER_ENV)
        if order is None:
            os.environ[DEVICE_ORDER_ENV] = "PCI_BUS_ID"
            return True
        if order.strip() != "PCI_BUS_ID":
            why = (
                f"GPUs named by index ({','.join(entries)[:200]}) with "
                f"{DEVICE_ORDER_ENV}={order[:40]}: CUDA may count them in another order than "
                f"NVML, so which GPU the kernels use is unknown; name them by UUID, or set "
                f"{DEVICE_ORDER_ENV}=PCI_BUS_ID"
            )
            self.sampler.index_order_unknown = why
            self.log.warning(
                "jupyter-gpu-gov: %s. Until then this server's GPU use reads unknown (never "
                "idle) where the machine has more than one GPU",
                why,
            )
        return False

    def initialize_handlers(self):
        self.handlers.extend(routes.handlers())

    def _gpu_allocated(self) -> bool:
        """Whether the GPUs this server sees are its own allocation (a Kubernetes GPU request, or
        devices the workstation allocator handed out), rather than a machine's shared cards."""
        nvidia = os.environ.get("NVIDIA_VISIBLE_DEVICES", "").strip().lower()
        return (
            self.visible_devices is not None
            or "KUBERNETES_SERVICE_HOST" in os.environ
            or nvidia not in ("", "all", "none", "void")
        )

    def _make_backend(self):
        return make_backend(
            self.backend_choice,
            simulated_devices=self.simulated_devices,
            sim_state_path=self.sim_state_path or None,
            log=self.log,
        )

    async def _start_jupyter_server_extension(self, serverapp):
        self.ensure_sampling()

    def ensure_sampling(self) -> None:
        """Start the periodic sampler (idempotent; needs the running event loop)."""
        if self._timer is None and not self._stopping:
            # On the monotonic clock: a step of the wall clock never stalls sampling.
            self._timer = asyncio.ensure_future(clock.every(self.sample_interval, self.sample_now))
            self._watch = asyncio.ensure_future(
                clock.every(self.sample_interval, self._report_while_stuck)
            )

    async def stop_extension(self):
        # Sampling (the timer, the stuck-driver watch, a status refresh) and the governor's
        # requests end here, awaited: left pending they were closed with the event loop, and a
        # tick lock released then woke a waiter on a closed loop ("Event loop is closed").
        self._stopping = True
        tasks = [
            task
            for task in (self._timer, self._watch, self._refresh, *self._request_tasks)
            if task is not None and not task.done()
        ]
        for task in tasks:
            task.cancel()
        if tasks:  # a task awaiting the driver's thread ends at once (the thread is left)
            await asyncio.wait(tasks, timeout=STOP_WAIT_S)
        self._person_activity.close()
        if isinstance(self.reporter, Reporter):
            self.reporter.close()
        await asyncio.get_running_loop().run_in_executor(None, self.sampler.close)
        # Leave the process as we found it (servers started in-process, e.g. by tests).
        if self._set_device_order:
            os.environ.pop(DEVICE_ORDER_ENV, None)
        if os.environ.get(ROOT_ENV) == self.checkpoint_dir:
            if self._previous_checkpoint_env is None:
                os.environ.pop(ROOT_ENV, None)
            else:
                os.environ[ROOT_ENV] = self._previous_checkpoint_env

    # -- sampling ----------------------------------------------------------------------------

    async def latest_report(self, refresh: bool = False) -> dict:
        """The last report (sampled now with ``refresh``), as the GPU's state now only while
        it is fresh; ``NoSample`` when the driver never answered."""
        self.ensure_sampling()
        if refresh or self.report is None:
            await self._sample_within(FRESH_SAMPLE_WAIT_S)
        report = self.report
        if report is None:
            raise NoSample(
                f"no GPU sample yet: the GPU driver has not answered within {FRESH_SAMPLE_WAIT_S:g} s"
            )
        stuck = self._stuck()
        return report if stuck is None else stuck

    def _stuck(self) -> dict | None:
        """While a tick has waited on the driver over ``STALE_AFTER_S``, the last report as a
        failing backend's (every reading unknown), with this server's checkpoint and verdict
        now; else None. Only the tick counts: a report to a slow governor delays ticks too."""
        since, report = self._sampling_since, self.report
        waited = 0.0 if since is None else time.monotonic() - since
        if waited <= STALE_AFTER_S or report is None:
            return None
        error = (
            f"no GPU sample since {report.get('sampled_at')}: the GPU driver has not answered "
            f"for {waited:.0f} s"
        )
        stuck = unreadable(report, error, clock.utcnow())
        return {**stuck, "checkpoint": self.checkpoint, "verdict": self.verdict}

    async def _report_while_stuck(self) -> None:
        """Reports ride on ticks: while one is stuck in the driver, none would go out, so no
        verdict would come back, nor the checkpoint the governor asks for a failed GPU; and
        Prometheus would read the last tick's gauges, the backend up."""
        stuck = self._stuck()
        if stuck is None:
            return
        metrics.update(stuck, clock.utcnow().timestamp(), None)  # backend down, readings gone
        due = time.monotonic() - self._last_report_at >= self.report_interval
        if self.reporter is not None and due:
            self._last_report_at = time.monotonic()
            await self.send_report(stuck)

    async def _sample_within(self, seconds: float) -> None:
        """A sample now, waited for ``seconds`` at most (it goes on; one at a time)."""
        if self._stopping:  # a request during the stop: no new sample
            return
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.ensure_future(self.sample_now())
        try:
            await asyncio.wait_for(asyncio.shield(self._refresh), seconds)
        except asyncio.TimeoutError:
            self.log.warning(
                "jupyter-gpu-gov: no GPU sample within %g s (the GPU driver does not answer)",
                seconds,
            )

    async def sample_now(self) -> None:
        async with self._tick_lock:  # a refresh and the timer never measure at once
            self._sampling_since = time.monotonic()
            try:
                result = await self.sampler.tick(await self._targets(), self._server_section())
            except Exception:
                self.log.exception("jupyter-gpu-gov: sampling failed")
                return
            finally:
                self._sampling_since = None
            self._publish(result)
            report_now = self._report_due(result)
            if report_now:
                self._last_report_at = time.monotonic()
        if report_now:
            await self.send_report(result.report)

    def _publish(self, result: TickResult) -> None:
        result.report["checkpoint"] = self.checkpoint
        result.report["verdict"] = self.verdict
        self.report = result.report
        if result.gpu_last_active is not None:
            # Any settings key ending in _last_activity counts as server activity, so GPU work
            # keeps the Hub's last_activity fresh even when nobody touches the notebook.
            self.serverapp.web_app.settings["gpu_last_activity"] = result.gpu_last_active
        metrics.update(result.report, clock.utcnow().timestamp(), result.cpu_seconds)
        for change in result.changes:
            self.serverapp.event_logger.emit(schema_id=GPU_STATE_SCHEMA_ID, data=change)

    def _report_due(self, result: TickResult) -> bool:
        due = time.monotonic() - self._last_report_at >= self.report_interval
        return self.reporter is not None and (due or bool(result.changes))

    async def send_report(self, report: dict) -> None:
        """Push a report; keep the verdict (and tell the frontend when it changes)."""
        outgoing = {k: v for k, v in report.items() if k != "verdict"}
        outgoing["checkpoint"] = for_report(report.get("checkpoint"))  # within the report's size
        try:
            verdict = await self.reporter.send(outgoing)
        except GovernorError as error:
            if error.status == 429:  # too fast: the first sample past its Retry-After reports
                self._last_report_at = float("-inf")
            if not isinstance(error, Held):  # a held one was not sent: said when the 429 came
                self.log.warning("jupyter-gpu-gov: report not accepted: %s", error)
            return
        self.set_verdict(verdict)
        self._take_up_requests(verdict)

    def _take_up_requests(self, verdict: dict) -> None:
        """Do what the governor asks in its verdict, once per request: it never calls this
        server (its requests ride back on our reports, fetched with our own token). Requests
        that come together run in this order: running cells are interrupted before the
        checkpoint asked with them (its hooks wait behind a running cell)."""
        asked = verdict.get("requests") if isinstance(verdict, dict) else None
        asked = asked if isinstance(asked, dict) else {}
        work = []
        for kind in ("interrupt_kernels", "checkpoint", "shutdown_kernels"):
            request = asked.get(kind)  # a kind a newer governor asks, this server ignores
            when = request.get("requested_at") if isinstance(request, dict) else None
            if not isinstance(when, str) or self._answered.get(kind) == when:
                continue
            if kind == "interrupt_kernels":
                work.append(self._interrupt_kernels(request.get("kernels")))
            elif kind == "checkpoint":
                work.append(self._checkpoint_for_governor(request))
            else:
                work.append(self._shutdown_kernels(request.get("kernels")))
            self._answered[kind] = when
        if work:
            self._request_task(_one_after_another(work))

    def _request_task(self, coroutine) -> asyncio.Future:
        """``coroutine`` run as one of the requests' tasks, which the stop cancels and awaits."""
        task = asyncio.ensure_future(coroutine)
        self._request_tasks.add(task)
        task.add_done_callback(self._request_tasks.discard)
        return task

    async def checkpoint_on_request(
        self, reason: str, source: str, cull_reason: str | None = None
    ) -> dict:
        """A checkpoint asked through the API (its owner, or the frontend answering the
        governor's request), in a task the stop ends as it ends the governor's requests: left
        running, it held the checkpoint lock past the stop and was closed with the event loop.
        Raises ``routes.Stopping`` once the stop began."""
        if self._stopping:
            raise routes.Stopping
        task = self._request_task(self.run_checkpoint(reason, source, cull_reason))
        try:
            return await task
        except asyncio.CancelledError:
            if self._stopping and task.cancelled():
                raise routes.Stopping from None
            raise

    async def _checkpoint_for_governor(self, request: dict) -> None:
        cull_reason = request.get("cull_reason")
        reason = request.get("reason")
        try:
            await self.run_checkpoint(
                reason if isinstance(reason, str) and reason else "requested by the governor",
                SOURCE_GOVERNOR,
                cull_reason if cull_reason in CULL_REASONS else None,
                requested_at=request["requested_at"],
            )
        except Exception:
            self.log.exception("jupyter-gpu-gov: the governor's checkpoint failed")
        await self._report_now()

    async def _shutdown_kernels(self, kernel_ids) -> None:
        """Shut down the kernels the governor names (the shutdown-kernels cull)."""
        await self._on_own_kernels(kernel_ids, "shutting down", "shutdown_kernel")
        await self._report_now()

    async def _interrupt_kernels(self, kernel_ids) -> None:
        """Interrupt the cells of the kernels the governor names (the busy limit): the kernels
        and their state stay."""
        await self._on_own_kernels(kernel_ids, "interrupting", "interrupt_kernel")
        await self._report_now()

    async def _on_own_kernels(self, kernel_ids, doing: str, method: str) -> None:
        """Call the kernel manager's ``method`` on each named kernel among this server's own
        (no other id means anything here)."""
        manager = self.serverapp.kernel_manager
        ours = set(manager.list_kernel_ids())
        for kernel_id in kernel_ids if isinstance(kernel_ids, list) else ():
            if not isinstance(kernel_id, str) or kernel_id not in ours:
                continue  # a list or an object is unhashable: it would end the request here
            self.log.info("jupyter-gpu-gov: %s kernel %s (governor)", doing, kernel_id)
            try:
                await ensure_async(getattr(manager, method)(kernel_id))
            except Exception:
                self.log.exception("jupyter-gpu-gov: %s kernel %s failed", doing, kernel_id)

    async def _report_now(self) -> None:
        """Tell the governor at once (a new sample and report), not at the next interval."""
        self._last_report_at = float("-inf")
        await self.sample_now()

    def set_verdict(self, verdict: dict) -> None:
        previous, self.verdict = self.verdict, verdict
        if self.report is not None:
            self.report["verdict"] = verdict
        # The frontend polls at once on a change of these (the started servers: a tab on this
        # server tells the owner another one started from the line).
        watched = (
            "state",
            "warn_at",
            "cull_at",
            "checkpoint",
            "approval_pending",
            "started_from_line",
        )
        if previous is None or any(previous.get(k) != verdict.get(k) for k in watched):
            self._emit_verdict(verdict)

    def _emit_verdict(self, verdict: dict) -> None:
        # The event is validated against its schema when the frontend listens: a verdict it
        # refuses (a newer governor's state) must not stop the verdict's requests being done.
        keys = ("state", "reason", "warn_at", "cull_at", "extensions_left", "checkpoint", "policy")
        try:
            self.serverapp.event_logger.emit(
                schema_id=VERDICT_SCHEMA_ID, data={k: verdict.get(k) for k in keys}
            )
        except Exception as error:
            self.log.warning("jupyter-gpu-gov: verdict event not sent: %s", str(error)[:300])

    async def run_checkpoint(
        self,
        reason: str,
        source: str = "user",
        cull_reason: str | None = None,
        requested_at: str | None = None,
    ) -> dict:
        """Take a checkpoint (kernel hooks, notebooks, terminals); answer the manifest.

        When the governor asks and a browser is connected, the frontend goes first: it hears of
        the request (the verdict says ``checkpoint: requested``), saves its dirty documents, and
        then asks for the checkpoint itself; the governor's request gets that manifest (with the
        governor's ``cull_reason``). Without a frontend within ``frontend_checkpoint_grace`` the
        server checkpoints alone. ``requested_at``: the governor's time of its request, which
        the result carries so the governor knows it answers that request.
        """
        if cull_reason is not None and cull_reason not in CULL_REASONS:
            raise ValueError(f"cull_reason must be one of {', '.join(CULL_REASONS)}")
        if (
            source == SOURCE_GOVERNOR
            and self.frontend_checkpoint_grace > 0
            and self._browser_connected()
        ):
            manifest = await self._frontend_first.offer(
                cull_reason,
                requested_at,
                self.frontend_checkpoint_grace,
                announce=lambda: self.set_verdict(
                    {**(self.verdict or {}), "checkpoint": CHECKPOINT_REQUESTED}
                ),
            )
            if manifest is not None:
                return manifest
            self.log.info("jupyter-gpu-gov: no frontend saved first; checkpointing alone")
        claim = self._frontend_first.claim() if source != SOURCE_GOVERNOR else None
        if claim is not None:
            cull_reason = cull_reason or claim.cull_reason
            requested_at = requested_at or claim.requested_at
        try:
            async with self._checkpoint_lock:  # one checkpoint at a time
                self.checkpoint = {
                    "requested_at": requested_at or clock.isoformat(clock.utcnow()),
                    "status": RUNNING,
                    "manifest": None,
                }
                # Busy before: as last sampled, or as Jupyter Server shows it now.
                km = self.serverapp.kernel_manager
                self._own_activity.begin(
                    {*self._busy_since}
                    | {
                        k
                        for k in km.list_kernel_ids()
                        if getattr(km.get_kernel(k), "execution_state", None) == "busy"
                    }
                )
                try:
                    manifest = await take_checkpoint(
                        self.serverapp,
                        root=Path(self.checkpoint_dir),
                        reason=reason,
                        source=source,
                        cull_reason=cull_reason,
                        report=await self._fresh_report(),
                        hook_timeout=self.checkpoint_hook_timeout,
                        keep=self.checkpoint_keep,
                        max_bytes=self.checkpoint_max_bytes,
                        log=self.log,
                        own_request=self._own_activity.asked,
                    )
                except BaseException:
                    self.checkpoint = {**self.checkpoint, "status": FAILED}
                    raise
                finally:
                    self._own_activity.end()
                self.checkpoint = {
                    **self.checkpoint,
                    "status": manifest["status"],
                    "manifest": manifest,
                }
        except BaseException as error:
            if claim is not None:
                claim.settle(error=error)
            raise
        finally:
            self._frontend_first.release(claim)
        if claim is not None:
            claim.settle(manifest)
        return manifest

    async def _fresh_report(self) -> dict | None:
        """A sample taken now (which kernels hold a GPU this moment), else the last one."""
        try:
            await self._sample_within(FRESH_SAMPLE_WAIT_S)
        except Exception:
            self.log.warning("jupyter-gpu-gov: no fresh sample for the checkpoint", exc_info=True)
        return self.report

    def _browser_connected(self) -> bool:
        targets = (self.report or {}).get("targets", [])
        return any(t.get("connections") for t in targets if t.get("kind") == "kernel")

    async def _targets(self) -> list[TargetInfo]:
        km = self.serverapp.kernel_manager
        paths: dict[str, str] = {}
        try:
            for session in await self.serverapp.session_manager.list_sessions():
                if session.get("kernel"):
                    paths[session["kernel"]["id"]] = session.get("path")
        except Exception:
            self.log.debug("jupyter-gpu-gov: no session list", exc_info=True)

        targets = []
        connections = getattr(km, "_kernel_connections", {})
        now = clock.utcnow()
        busy = {}
        kernel_ids = km.list_kernel_ids()
        self._person_activity.watch(
            {kernel_id: km.get_kernel(kernel_id) for kernel_id in kernel_ids}
        )
        for kernel_id in kernel_ids:
            kernel = km.get_kernel(kernel_id)
            state = getattr(kernel, "execution_state", None)
            cell_since = self._person_activity.cells.get(kernel_id)
            if state == "busy" and self._own_activity.hides_busy(kernel_id, cell_since):
                state = "idle"  # running our checkpoint hooks, not a cell
            if state == "busy":
                busy[kernel_id] = self._busy_since.get(kernel_id, now)
            targets.append(
                TargetInfo(
                    TargetRoot("kernel", kernel_id, getattr(kernel.provisioner, "pid", None)),
                    name=kernel.kernel_name,
                    execution_state=state,
                    last_activity=getattr(kernel, "last_activity", None),
                    connections=connections.get(kernel_id, 0),
                    path=paths.get(kernel_id),
                    busy_since=busy.get(kernel_id),
                )
            )
        self._busy_since = busy
        terminal_manager = self.serverapp.web_app.settings.get("terminal_manager")
        for name, terminal in getattr(terminal_manager, "terminals", {}).items():
            targets.append(
                TargetInfo(
                    TargetRoot("terminal", name, terminal.ptyproc.pid),
                    name=f"terminal {name}",
                    last_activity=getattr(terminal, "last_activity", None),
                    connections=len(terminal.clients),
                )
            )
        return targets

    def _server_section(self) -> dict:
        return {
            **self.server_identity,
            "started": clock.isoformat(self.serverapp.web_app.settings.get("started")),
            "last_activity": clock.isoformat(self._user_last_activity()),
        }

    def _user_last_activity(self):
        """When people last interacted: their requests to kernels (running a cell, completing,
        inspecting, a widget) and terminal I/O. Neither a cell's output, GPU work (our
        ``gpu_last_activity``), API polling or reconnects by an open browser tab, nor our own
        checkpoint hooks count, so the governor can tell an open tab, a run left to itself or
        its own checkpoint from someone working."""
        settings = self.serverapp.web_app.settings
        sources = [self._person_activity.latest]
        terminals = settings.get("terminal_manager")
        sources += [
            getattr(t, "last_activity", None) for t in getattr(terminals, "terminals", {}).values()
        ]
        return max((s for s in sources if s is not None), default=None)


def _server_identity() -> dict:
    """Who this server is, as the Hub and Kubernetes name it."""
    in_k8s = "KUBERNETES_SERVICE_HOST" in os.environ
    namespace = os.environ.get("POD_NAMESPACE")
    if in_k8s and namespace is None and Path(K8S_NAMESPACE_FILE).exists():
        namespace = Path(K8S_NAMESPACE_FILE).read_text().strip()
    return {
        "user": os.environ.get("JUPYTERHUB_USER") or getpass.getuser(),
        "name": os.environ.get("JUPYTERHUB_SERVER_NAME", ""),
        "pod": (os.environ.get("HOSTNAME") or socket.gethostname()) if in_k8s else None,
        "namespace": namespace,
    }


async def _one_after_another(coroutines) -> None:
    pending = list(coroutines)
    try:
        while pending:
            await pending.pop(0)
    finally:
        for coroutine in pending:  # the stop cancelled one before them: never started
            coroutine.close()
