"""``GpuGovApp``: the jupyter-server extension that reports per-kernel GPU activity."""

from __future__ import annotations

import asyncio
import getpass
import os
import socket
from pathlib import Path

from jupyter_server.extension.application import ExtensionApp
from tornado.ioloop import PeriodicCallback
from traitlets import Dict, Enum, Float, List, Unicode, default, validate

from .. import __version__
from ..core import clock
from ..events import GPU_STATE_SCHEMA, GPU_STATE_SCHEMA_ID
from ..gpu.attribution import TargetRoot
from ..gpu.backends import CHOICES, make_backend, parse_visible_devices, resolve_choice
from . import metrics, routes
from .sampler import Sampler, TargetInfo, TickResult

K8S_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


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

    sample_interval = Float(
        5.0, help="Seconds between two GPU samples (one NVML pass and one /proc scan)."
    ).tag(config=True)

    window_seconds = Float(
        60.0, help="Length in seconds of the rolling window behind `active_fraction`."
    ).tag(config=True)

    active_threshold = Float(
        0.05,
        help="""SM activity (0..1) at or above which a kernel counts as using its GPU.
        Idle CUDA contexts read 0; monitoring noise stays under a few percent.""",
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

    @validate("sample_interval", "window_seconds")
    def _check_positive(self, proposal):
        if proposal["value"] <= 0:
            raise ValueError(f"GpuGovApp.{proposal['trait'].name} must be > 0 seconds")
        return proposal["value"]

    @validate("active_threshold")
    def _check_threshold(self, proposal):
        if not 0 < proposal["value"] <= 1:
            raise ValueError("GpuGovApp.active_threshold must be in (0, 1]")
        return proposal["value"]

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
        self._timer: PeriodicCallback | None = None
        self._tick_lock = asyncio.Lock()
        self._server_identity = _server_identity()
        self.serverapp.event_logger.register_event_schema(GPU_STATE_SCHEMA)
        self.log.info(
            "jupyter-gpu-gov: GPU backend %s, sampling every %ss",
            self.backend_choice,
            self.sample_interval,
        )

    def initialize_handlers(self):
        self.handlers.extend(routes.handlers())

    def _make_backend(self):
        return make_backend(
            self.backend_choice,
            simulated_devices=self.simulated_devices,
            sim_state_path=self.sim_state_path or None,
        )

    async def _start_jupyter_server_extension(self, serverapp):
        self.ensure_sampling()

    def ensure_sampling(self) -> None:
        """Start the periodic sampler (idempotent; needs the running event loop)."""
        if self._timer is None:
            self._timer = PeriodicCallback(self.sample_now, self.sample_interval * 1000)
            self._timer.start()

    async def stop_extension(self):
        if self._timer is not None:
            self._timer.stop()
        await asyncio.get_running_loop().run_in_executor(None, self.sampler.close)

    # -- sampling ----------------------------------------------------------------------------

    async def latest_report(self, refresh: bool = False) -> dict:
        self.ensure_sampling()
        if refresh or self.report is None:
            await self.sample_now()
        assert self.report is not None
        return self.report

    async def sample_now(self) -> None:
        async with self._tick_lock:  # a refresh and the timer never measure at once
            try:
                result = await self.sampler.tick(await self._targets(), self._server_section())
            except Exception:
                self.log.exception("jupyter-gpu-gov: sampling failed")
                return
            self._publish(result)

    def _publish(self, result: TickResult) -> None:
        self.report = result.report
        if result.gpu_last_active is not None:
            # Any settings key ending in _last_activity counts as server activity, so GPU work
            # keeps the Hub's last_activity fresh even when nobody touches the notebook.
            self.serverapp.web_app.settings["gpu_last_activity"] = result.gpu_last_active
        metrics.update(result.report, clock.utcnow().timestamp(), result.cpu_seconds)
        for change in result.changes:
            self.serverapp.event_logger.emit(schema_id=GPU_STATE_SCHEMA_ID, data=change)

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
        for kernel_id in km.list_kernel_ids():
            kernel = km.get_kernel(kernel_id)
            targets.append(
                TargetInfo(
                    TargetRoot("kernel", kernel_id, getattr(kernel.provisioner, "pid", None)),
                    name=kernel.kernel_name,
                    execution_state=getattr(kernel, "execution_state", None),
                    last_activity=getattr(kernel, "last_activity", None),
                    connections=connections.get(kernel_id, 0),
                    path=paths.get(kernel_id),
                )
            )
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
            **self._server_identity,
            "started": clock.isoformat(self.serverapp.web_app.settings.get("started")),
            "last_activity": clock.isoformat(self._user_last_activity()),
        }

    def _user_last_activity(self):
        """The server's last activity *without* GPU work: what people and clients did.

        The governor must tell an open tab from GPU work, so this excludes our own
        ``gpu_last_activity`` that the Hub-facing ``last_activity`` includes.
        """
        settings = self.serverapp.web_app.settings
        sources = [settings.get("started"), settings["kernel_manager"].last_kernel_activity]
        sources += [
            value
            for key, value in settings.items()
            if key.endswith("_last_activity") and key != "gpu_last_activity"
        ]
        sources += settings.get("last_activity_times", {}).values()
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
