"""``GpuGovernor``: the JupyterHub managed service (``python -m jupyter_gpu_gov.hub``).

It accepts every jupyterhub-idle-culler option with the same meaning for servers that send no
GPU report, so a hub can replace that culler with this service.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from datetime import timedelta
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler
from sqlalchemy.exc import DBAPIError
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop
from tornado.netutil import bind_sockets
from traitlets import Bool, Dict, Float, Int, List, Unicode, default, validate
from traitlets.config import Application

from .. import __version__
from ..core import clock
from ..core.durations import parse_duration
from ..core.policy import PolicyError, load_policies
from ..core.rightsize import TierSizeError, load_tier_sizes
from . import metrics
from .dcgm import DcgmConfig
from .dcgm_source import DcgmSource
from .diagnosis import DiagnosisOptions
from .diagnosis import preload as preload_diagnosis
from .health import NODE_ACTIONS, SERVICE_ACCOUNT, HealthOptions
from .hubapi import HubApi
from .options import Options
from .pages import page_handlers
from .reconcile import Governor
from .routes import MAX_BODY_BYTES, handlers
from .store import Store, StoreUnavailable, safe_url

# jupyterhub-idle-culler's command line, mapped onto our traits.
IDLE_CULLER_OPTIONS = {
    "timeout": "GpuGovernor.timeout",
    "cull-every": "GpuGovernor.cull_every",
    "max-age": "GpuGovernor.max_age",
    "cull-users": "GpuGovernor.cull_users",
    "remove-named-servers": "GpuGovernor.remove_named_servers",
    "concurrency": "GpuGovernor.concurrency",
    "api-page-size": "GpuGovernor.api_page_size",
    "cull-default-servers": "GpuGovernor.cull_default_servers",
    "cull-named-servers": "GpuGovernor.cull_named_servers",
    "cull-admin-users": "GpuGovernor.cull_admin_users",
    "ssl-enabled": "GpuGovernor.ssl_enabled",
    "internal-certs-location": "GpuGovernor.internal_certs_location",
    "url": "GpuGovernor.url",
}
BOOL_OPTIONS = {
    "cull-users",
    "remove-named-servers",
    "cull-default-servers",
    "cull-named-servers",
    "cull-admin-users",
    "ssl-enabled",
    "dry-run",
}


def normalise_argv(argv: list[str]) -> list[str]:
    """Accept jupyterhub-idle-culler's spellings: ``--cull-users`` as well as
    ``--cull-users=true``, and ``--cull_every`` as well as ``--cull-every``."""
    out = []
    for arg in argv:
        if arg.startswith("--") and "." not in arg.split("=", 1)[0]:
            name, eq, value = arg[2:].partition("=")
            name = name.replace("_", "-")
            arg = f"--{name}=true" if name in BOOL_OPTIONS and not eq else f"--{name}{eq}{value}"
        out.append(arg)
    return out


class BatchingHTTPServer(HTTPServer):
    """An ``HTTPServer`` that accepts connections in batches: once it has accepted, it leaves
    new connections in the listen queue for ``accept_interval`` seconds, then takes all that
    came meanwhile at once.

    Why: at 10,000 servers a report arrives every 6 ms, each on its own connection, and a lone
    request costs the service about three times the CPU of one answered right after another
    (the interpreter's caches have gone cold in between; measured, docs/benchmarks.md). Taken
    a few at a time, the reports cost about a quarter less CPU, for at most ``accept_interval``
    more latency. It batches only while connections come fast enough for a pause to gather two
    or more (over the last second, at least ``2 / accept_interval`` a second); slower, each is
    accepted at once. Connections already accepted (keep-alive) are never held back, nor is
    anything the service itself sends (Hub API calls, checkpoint requests).
    """

    def initialize(self, *args, accept_interval: float = 0.0, **kwargs) -> None:
        super().initialize(*args, **kwargs)
        self.accept_interval = accept_interval
        self._batch_fds: list[int] = []
        self._batch_paused = False
        self._batch_stopped = False
        self._batch_rate = 0.0  # connections a second over the last window (>= 1 s)
        self._batch_count = 0
        self._batch_window = 0.0

    def add_sockets(self, sockets) -> None:
        sockets = list(sockets)
        super().add_sockets(sockets)
        self._batch_fds.extend(sock.fileno() for sock in sockets)

    def handle_stream(self, stream, address) -> None:
        super().handle_stream(stream, address)
        if self.accept_interval <= 0:
            return
        loop = IOLoop.current()
        now = loop.time()
        if now - self._batch_window >= 1.0:
            self._batch_rate = self._batch_count / (now - self._batch_window)
            self._batch_window, self._batch_count = now, 0
        self._batch_count += 1
        worth_it = self._batch_rate * self.accept_interval >= 2
        if worth_it and not self._batch_paused and not self._batch_stopped:
            # Stop watching the listening sockets (the connections already waiting are still
            # taken by the accept loop this one came from) until the interval is over.
            self._batch_paused = True
            for fd in self._batch_fds:
                loop.update_handler(fd, 0)
            loop.call_later(self.accept_interval, self._resume)

    def _resume(self) -> None:
        self._batch_paused = False
        if not self._batch_stopped:
            loop = IOLoop.current()
            for fd in self._batch_fds:
                loop.update_handler(fd, IOLoop.READ)

    def stop(self) -> None:
        self._batch_stopped = True
        super().stop()


class GpuGovernor(Application):
    """Correlates GPU reports, DCGM and ownership; warns, checkpoints and culls idle GPU
    servers under tiered policies."""

    name = "jupyter-gpu-gov-hub"
    description = __doc__
    version = __version__
    aliases = {
        **IDLE_CULLER_OPTIONS,
        "dry-run": "GpuGovernor.dry_run",
        "config": "GpuGovernor.config_file",
        "db-url": "GpuGovernor.db_url",
    }

    config_file = Unicode("", help="A Python config file (``c.GpuGovernor.*``) to load.").tag(
        config=True
    )

    # -- jupyterhub-idle-culler's options ----------------------------------------------------
    timeout = Int(
        3600,
        help="""Seconds of Hub inactivity after which a server that sends no GPU report, and
        whose pod DCGM does not see, is culled (jupyterhub-idle-culler's --timeout). Servers
        with GPU reports, or with DCGM's reading of their pod's GPUs, follow the policies.""",
    ).tag(config=True)
    cull_every = Float(
        0,
        help="Seconds between reconcile passes (0: timeout / 2, at most 60 s).",
    ).tag(config=True)
    max_age = Int(
        0,
        help="""Seconds after its start at which any server is culled regardless of activity
        (0: never), as jupyterhub-idle-culler's --max-age: excluded servers too; after a
        checkpoint when the server runs the extension (one retry at most).""",
    ).tag(config=True)
    cull_users = Bool(
        False,
        help="""Also delete users (as jupyterhub-idle-culler does): once none of their servers
        runs, when inactive for --timeout or created --max-age ago (admins only with
        --cull-admin-users). Needs admin:users (add_governor(cull_users=True)).""",
    ).tag(config=True)
    remove_named_servers = Bool(
        False, help="Remove culled named servers instead of just stopping them."
    ).tag(config=True)
    concurrency = Int(10, help="Most Hub API (and server) requests in flight at once.").tag(
        config=True
    )
    api_page_size = Int(0, help="Users per page when listing (0: the Hub's default).").tag(
        config=True
    )
    cull_default_servers = Bool(True, help="Govern users' default servers.").tag(config=True)
    cull_named_servers = Bool(True, help="Govern named servers.").tag(config=True)
    cull_admin_users = Bool(
        True,
        help="""With --cull-users, delete admin users too (as in jupyterhub-idle-culler, their
        servers are governed either way).""",
    ).tag(config=True)
    ssl_enabled = Bool(False, help="The Hub uses internal SSL (internal_ssl).").tag(config=True)
    internal_certs_location = Unicode(
        "internal-ssl", help="The Hub's internal_certs_location, for internal SSL."
    ).tag(config=True)
    url = Unicode(help="The Hub API URL (default $JUPYTERHUB_API_URL).").tag(config=True)

    @default("url")
    def _url_default(self):
        return os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")

    # -- the governor's own --------------------------------------------------------------------
    policies = List(
        Dict(),
        help="""Policies, first match wins; every key left out comes from policy_defaults.
        Example::

            c.GpuGovernor.policies = [
                {"name": "borrowed", "match": {"labels": {"gpu-gov/borrowed": "true"}},
                 "warn_after": "15m", "cull_after": "45m"},
                {"name": "mig", "match": {"tiers": ["mig-1g"]}, "cull_action": "shutdown-kernels"},
            ]

        Keys: match (profiles, tiers, teams, users, server_names, labels, task_types),
        idle_threshold, warn_after, cull_after, user_activity_grace, busy_grace, busy_limit,
        on_busy_limit (interrupt|cull), away_after, extension_step, max_extensions,
        extension_reason (optional|required), max_age, max_age_warning, checkpoint,
        checkpoint_timeout, on_checkpoint_failure (postpone|proceed), checkpoint_retries,
        checkpoint_max_delay, cull_action (stop-server|shutdown-kernels), exempt,
        inactive_timeout, expected_duration_notice. Durations are seconds or strings like
        "90m", "2h".""",
    ).tag(config=True)
    policy_defaults = Dict(
        help="""Defaults for every policy key (same keys as a policy). ``inactive_timeout``
        defaults to --timeout and ``max_age`` to --max-age.""",
    ).tag(config=True)
    dry_run = Bool(
        False, help="Record every decision and act on none (no checkpoint requests, no culls)."
    ).tag(config=True)
    db_url = Unicode(
        "sqlite:///jupyter_gpu_gov.sqlite",
        help="SQLAlchemy URL of the store, e.g. postgresql://gov@db/gpu_gov.",
    ).tag(config=True)
    report_stale_after = Float(
        300,
        help="Seconds after which a server's last report no longer counts: its GPU is unknown.",
    ).tag(config=True)
    team_map = Dict(
        help="User name → team, for users whose team is not in user_options or Hub groups."
    ).tag(config=True)
    dcgm_prometheus_url = Unicode(
        "", help="Prometheus base URL to query dcgm-exporter series (e.g. http://prometheus:9090)."
    ).tag(config=True)
    dcgm_exporter_urls = List(
        Unicode(), help="dcgm-exporter /metrics URLs to scrape directly (instead of Prometheus)."
    ).tag(config=True)
    dcgm_metric_names = Dict(
        help="Extra metric name → signal mappings for relabelled DCGM series."
    ).tag(config=True)
    dcgm_bearer_token = Unicode("", help="Bearer token for Prometheus or the exporters.").tag(
        config=True
    )
    dcgm_timeout = Float(
        5, help="Seconds a whole DCGM read may take (connecting, headers and body); then it fails."
    ).tag(config=True)
    dcgm_max_bytes = Int(
        64 * 1024 * 1024,
        help="""Bytes a DCGM answer may have once decompressed (a 10,000-GPU fleet through
        Prometheus is about 40 MB); a larger one fails the read.""",
    ).tag(config=True)
    dcgm_max_age = Float(
        0,
        help="""Seconds after which DCGM evidence no longer counts (its GPUs are unknown, never
        idle): a read still under way, stuck or failing leaves no old "idle" behind. 0: three
        reconcile intervals, at least 60 s.""",
    ).tag(config=True)
    pcie_floor_bytes_per_s = Float(
        1_000_000, help="PCIe traffic (bytes/s) under which an idle-looking GPU counts as idle."
    ).tag(config=True)
    diagnose = Bool(
        True,
        help="""Diagnose why GPUs are underused (docs/api.md, "Root causes"): each report is scored and the
        verdict carries ``root_cause``. It never changes a decision.""",
    ).tag(config=True)
    diagnose_train_every = Float(
        6 * 3600,
        help="""Seconds between two trainings of the diagnosis model, in a worker thread (the
        service keeps answering). The first runs as soon as `diagnose_min_windows` windows
        exist; until then the threshold rules diagnose. Default 21600 (6 h).""",
    ).tag(config=True)
    diagnose_min_windows = Int(
        1000,
        help="""Windows (one per server per `diagnose_sample_every`) in the history before the
        first training, e.g. 1000: 20 servers for 50 minutes.""",
    ).tag(config=True)
    diagnose_sample_every = Float(
        60,
        help="""Seconds: at most one window per server this often goes into the training history
        (every report is still scored).""",
    ).tag(config=True)
    diagnose_history = Float(
        7 * 86400,
        help="Seconds of history the model trains on (default 604800, 7 days).",
    ).tag(config=True)
    diagnose_max_windows = Int(
        250_000,
        help="""Most windows kept in memory for training (about 100 MB at 250,000); beyond it
        the oldest go first, whatever their age.""",
    ).tag(config=True)
    diagnose_zombie_idle = Float(
        0,
        help="""Seconds nobody has used a server before a kernel that holds GPU memory and does
        no GPU work is called a zombie (0: the diagnosis rules' 1800, 30 minutes). A demo hub
        with timers of minutes shortens it like them, e.g. 60.""",
    ).tag(config=True)
    diagnose_model_path = Unicode(
        "",
        help="""Where the trained model is saved after each training and loaded from at start
        (e.g. /srv/gpu-gov/diagnosis.pkl), so a restart keeps it. Empty: memory only. A pickle:
        a path only the service can write.""",
    ).tag(config=True)

    # -- usage ledger and showback -----------------------------------------------------------
    tier_weights = Dict(
        help="""GPU-equivalents a server of each tier holds, for the usage ledger, e.g.
        ``{"h100": 1, "h100-3g": 0.5, "l4-shared": 0.25}``. A server's grant
        (``gpu-gov/weight``, written by the profile layer) wins; without either the ledger
        counts the devices the server reports (a whole GPU 1, a MIG slice its compute share),
        else 1 for a server with a tier, else 0 (no GPU, nothing billed).""",
    ).tag(config=True)
    gpu_hour_cost = Dict(
        help="""Price of one GPU-equivalent hour per tier, in `currency`, for showback, e.g.
        ``{"h100": 2.5, "h100-1g": 0.4}``. Tiers not listed cost `gpu_hour_cost_default`.""",
    ).tag(config=True)
    gpu_hour_cost_default = Float(
        0.0, help="Price of one GPU-equivalent hour of a tier not in `gpu_hour_cost`."
    ).tag(config=True)
    currency = Unicode("USD", help="The currency label shown with costs, e.g. EUR.").tag(
        config=True
    )
    team_quotas = Dict(
        help="""GPU-equivalents each team is guaranteed, shown on each user's usage page next to
        what the team holds now, e.g. ``{"vision": 2, "nlp": 1.5}`` (display only: admission
        is the profile layer's).""",
    ).tag(config=True)
    usage_max_gap = Float(
        0,
        help="""Seconds: the longest gap between two looks at a server that the usage ledger
        still bills (as the state seen at the first look). A longer gap (the service was down)
        is counted as unobserved, never as idle or active. 0: three reconcile intervals, at
        least 60 s.""",
    ).tag(config=True)

    usage_write_every = Float(
        300,
        help="""Seconds: how often the usage ledger is written to the database (also whenever
        a page or the API reads it, and when the service stops). Each write updates a row per
        running server, so at 10,000 servers every pass would spend 0.2 s on it. If the service
        dies, what it had not written is counted as unobserved, like any outage, never as idle.
        0: every pass.""",
    ).tag(config=True)

    # -- right-sizing ----------------------------------------------------------------------------
    right_size_tiers = List(
        Dict(),
        help="""What one server of each tier gets, for right-sizing hints (a smaller tier a
        server's measured peak memory and activity fit, on the verdict, the dashboard and in
        showback): ``[{"name": "h100-1g", "label": "H100 MIG 1g.10gb", "memory_gb": 10,
        "weight": 0.1429}, ...]``. ``add_governor(c, tiers=tier_sizes(c.GpuProfiles.tiers))``
        (``jupyter_gpu_gov.profiles.estimate.tier_sizes``) passes the profile layer's tiers;
        default $JUPYTER_GPU_GOV_TIERS (JSON). Empty: no hints.""",
    ).tag(config=True)

    right_size_after = Float(
        3600,
        help="""Seconds of reports with the GPU held before a right-sizing hint: the peak of a
        shorter stretch says too little (default 3600).""",
    ).tag(config=True)

    @validate("gpu_hour_cost", "tier_weights", "team_quotas")
    def _numbers(self, proposal):
        for key, value in proposal["value"].items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(
                    f"GpuGovernor.{proposal['trait'].name}[{key!r}] must be a number >= 0, "
                    f"got {value!r}"
                )
        return proposal["value"]

    # -- GPU health (docs/health.md) -----------------------------------------------------------
    gpu_unknown_alert_after = Float(
        1800,
        help="""Seconds a server's GPU state may stay unknown (or failed) before the server is
        flagged for admins: audited once, listed by ``GET api/health`` and the dashboard,
        counted in ``jupyter_gpu_gov_servers_gpu_unknown_too_long`` (an alert rule fires on
        it). Such a server is never culled for it.""",
    ).tag(config=True)
    unhealthy_node_action = Unicode(
        "none",
        help="""What to do to the Kubernetes node of a GPU DCGM finds unhealthy: "none"; "label"
        (label ``gpu-gov/gpu-unhealthy=true``, annotate which GPUs and why, so schedulers and
        node affinities can avoid the node; removed when its GPUs are healthy again);
        "cordon" (the label, and ``spec.unschedulable`` for a GPU that failed; never undone:
        uncordon by hand after the repair). Needs RBAC: ``patch`` on ``nodes``
        (docs/health.md). Only DCGM's reading, never a server's report, marks a node.""",
    ).tag(config=True)
    kubernetes_api_url = Unicode(
        help="""The Kubernetes API for unhealthy_node_action (default: in-cluster,
        https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT).""",
    ).tag(config=True)
    kubernetes_token_file = Unicode(
        f"{SERVICE_ACCOUNT}/token", help="The service account token for the Kubernetes API."
    ).tag(config=True)
    kubernetes_ca_file = Unicode(
        f"{SERVICE_ACCOUNT}/ca.crt", help="The CA bundle that signs the Kubernetes API."
    ).tag(config=True)

    @default("kubernetes_api_url")
    def _kubernetes_api_url(self):
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        return f"https://{host}:{port}" if host else ""

    @validate("unhealthy_node_action")
    def _node_action(self, proposal):
        if proposal["value"] not in NODE_ACTIONS:
            raise ValueError(
                f"GpuGovernor.unhealthy_node_action must be one of {', '.join(NODE_ACTIONS)}, "
                f"got {proposal['value']!r}"
            )
        return proposal["value"]

    accept_interval = Float(
        0.04,
        help="""Seconds the service leaves new connections waiting once it has accepted one, to
        take all that came meanwhile together (a report, an API call or a dashboard page then
        waits at most this much longer). Each server reports on a new connection; answered a
        few at a time they cost the service about a quarter less CPU than one by one
        (docs/benchmarks.md, 10,000 servers). Only while connections come at 2 /
        accept_interval a second or more (at 0.04: 50 a second, 3,000 servers reporting
        every minute); slower, each is accepted at once. 0: never wait.""",
    ).tag(config=True)

    port = Int(
        help="""Port to listen on (default: from $JUPYTERHUB_SERVICE_URL, the URL of the
        service's entry). Without either it does not listen: a service entry without a URL (as
        jupyterhub-idle-culler's in zero-to-jupyterhub) runs it as a culler, with no reports,
        API or dashboard; servers are then governed by DCGM and the Hub's activity.""",
    ).tag(config=True)
    ip = Unicode(help="IP to listen on (default from $JUPYTERHUB_SERVICE_URL).").tag(config=True)

    @default("port")
    def _port_default(self):
        parts = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", ""))
        if not parts.hostname or parts.port == 0:
            return 0  # no URL (JupyterHub gives a service without one a URL with port 0)
        return parts.port or (443 if parts.scheme == "https" else 80)

    @default("ip")
    def _ip_default(self):
        return urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "")).hostname or "127.0.0.1"

    @validate(
        "timeout",
        "concurrency",
        "dcgm_timeout",
        "dcgm_max_bytes",
        "diagnose_train_every",
        "diagnose_min_windows",
        "diagnose_history",
        "diagnose_max_windows",
    )
    def _positive(self, proposal):
        if proposal["value"] <= 0:
            raise ValueError(f"GpuGovernor.{proposal['trait'].name} must be > 0")
        return proposal["value"]

    @validate(
        "usage_write_every",
        "usage_max_gap",
        "gpu_unknown_alert_after",
        "right_size_after",
        "dcgm_max_age",
    )
    def _not_negative(self, proposal):
        if proposal["value"] < 0:
            raise ValueError(
                f"GpuGovernor.{proposal['trait'].name} must be >= 0 seconds, "
                f"got {proposal['value']!r}"
            )
        return proposal["value"]

    @validate("accept_interval")
    def _accept_interval(self, proposal):
        if not 0 <= proposal["value"] <= 1:
            raise ValueError(
                f"GpuGovernor.accept_interval must be 0 to 1 seconds, got {proposal['value']!r}"
            )
        return proposal["value"]

    def parse_command_line(self, argv=None):
        return super().parse_command_line(
            normalise_argv(list(sys.argv[1:] if argv is None else argv))
        )

    def initialize(self, argv=None):
        self.parse_command_line(argv)
        if self.config_file:
            self.load_config_file(self.config_file)
            self.parse_command_line(argv)  # the command line wins over the file
        self.policy_list = self.build_policies()
        self.tier_sizes = self.build_tier_sizes()

    def build_policies(self):
        defaults = {"inactive_timeout": self.timeout}
        if self.max_age:
            defaults["max_age"] = self.max_age
        defaults.update(self.policy_defaults)
        try:
            return load_policies(self.policies, defaults)
        except PolicyError as error:
            raise SystemExit(f"jupyter-gpu-gov: bad policy configuration: {error}") from None

    def build_tier_sizes(self):
        entries = self.right_size_tiers
        if not entries and os.environ.get("JUPYTER_GPU_GOV_TIERS"):
            try:
                entries = json.loads(os.environ["JUPYTER_GPU_GOV_TIERS"])
            except ValueError as error:
                raise SystemExit(
                    f"jupyter-gpu-gov: $JUPYTER_GPU_GOV_TIERS is not JSON: {error}"
                ) from None
        try:
            if not isinstance(entries, list):
                raise TierSizeError(f"expected a list of tiers, got {type(entries).__name__}")
            return load_tier_sizes(entries)
        except TierSizeError as error:
            raise SystemExit(f"jupyter-gpu-gov: bad right_size_tiers: {error}") from None

    @property
    def reconcile_interval(self) -> float:
        return self.cull_every or min(self.timeout / 2, 60)

    def make_governor(self) -> Governor:
        if self.unhealthy_node_action != "none" and not self.kubernetes_api_url:
            raise SystemExit(
                f"jupyter-gpu-gov: unhealthy_node_action={self.unhealthy_node_action!r} needs the "
                "Kubernetes API: set GpuGovernor.kubernetes_api_url (or run in a pod)"
            )
        hub = HubApi(
            self.url,
            os.environ.get("JUPYTERHUB_API_TOKEN"),
            concurrency=self.concurrency,
            page_size=self.api_page_size,
            ssl_enabled=self.ssl_enabled,
            internal_certs_location=self.internal_certs_location if self.ssl_enabled else None,
        )
        dcgm = None
        if self.dcgm_prometheus_url or self.dcgm_exporter_urls:
            dcgm = DcgmSource(
                prometheus_url=self.dcgm_prometheus_url or None,
                exporter_urls=self.dcgm_exporter_urls,
                config=DcgmConfig().with_metrics(self.dcgm_metric_names),
                bearer_token=self.dcgm_bearer_token or None,
                timeout_s=self.dcgm_timeout,
                max_bytes=self.dcgm_max_bytes,
            )
        options = Options(
            dry_run=self.dry_run,
            report_stale_after=parse_duration(self.report_stale_after),
            cull_default_servers=self.cull_default_servers,
            cull_named_servers=self.cull_named_servers,
            cull_admin_users=self.cull_admin_users,
            cull_users=self.cull_users,
            timeout=timedelta(seconds=self.timeout),
            max_age=timedelta(seconds=self.max_age) if self.max_age else None,
            remove_named_servers=self.remove_named_servers,
            concurrency=self.concurrency,
            team_map=dict(self.team_map),
            pcie_floor_bytes_per_s=self.pcie_floor_bytes_per_s,
            dcgm_max_age=timedelta(
                seconds=self.dcgm_max_age or max(3 * self.reconcile_interval, 60)
            ),
            diagnosis=DiagnosisOptions(
                enabled=self.diagnose,
                train_every=timedelta(seconds=self.diagnose_train_every),
                min_windows=self.diagnose_min_windows,
                sample_every=timedelta(seconds=self.diagnose_sample_every),
                history=timedelta(seconds=self.diagnose_history),
                max_windows=self.diagnose_max_windows,
                model_path=os.path.expanduser(self.diagnose_model_path),
                zombie_idle=timedelta(seconds=self.diagnose_zombie_idle)
                if self.diagnose_zombie_idle > 0
                else None,
            ),
            tier_weights=dict(self.tier_weights),
            ledger_max_gap=timedelta(
                seconds=self.usage_max_gap or max(3 * self.reconcile_interval, 60)
            ),
            usage_write_every=timedelta(seconds=self.usage_write_every),
            gpu_hour_cost=dict(self.gpu_hour_cost),
            gpu_hour_cost_default=self.gpu_hour_cost_default,
            currency=self.currency,
            team_quotas=dict(self.team_quotas),
            health=HealthOptions(
                unknown_alert_after=timedelta(seconds=self.gpu_unknown_alert_after),
                node_action=self.unhealthy_node_action,
                kubernetes_api_url=self.kubernetes_api_url,
                kubernetes_token_file=self.kubernetes_token_file,
                kubernetes_ca_file=self.kubernetes_ca_file,
            ),
            tier_sizes=self.tier_sizes,
            right_size_after=timedelta(seconds=self.right_size_after),
        )
        return Governor(open_store(self.db_url), hub, self.policy_list, options, dcgm)

    def make_web_app(self, governor: Governor) -> web.Application:
        prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpu-gov/")
        return web.Application(
            [
                *page_handlers(prefix, governor),
                *handlers(prefix, governor),
                (rf"{prefix.rstrip('/')}/oauth_callback", HubOAuthCallbackHandler),
            ],
            cookie_secret=os.urandom(32),
            gpu_gov_prefix=prefix.rstrip("/") + "/",
            hub_auth=HubOAuth(),
            xsrf_cookies=False,  # API handlers check XSRF for cookie-authenticated writes
        )

    async def run(self) -> None:
        self.governor = self.make_governor()
        if self.diagnose and not preload_diagnosis():
            self.log.warning(
                "gpu-gov: scikit-learn is not installed: root causes come from the threshold "
                "rules only (pip install 'jupyter-gpu-gov[hub]')"
            )
        server = BatchingHTTPServer(
            self.make_web_app(self.governor),
            max_body_size=MAX_BODY_BYTES,
            xheaders=True,
            accept_interval=self.accept_interval,
        )
        self.log.info(
            "jupyter-gpu-gov %s governing (reconcile every %ss, %d policies%s)",
            __version__,
            self.reconcile_interval,
            len(self.policy_list),
            ", DRY RUN" if self.dry_run else "",
        )
        # On the monotonic clock: a step of the wall clock neither stalls nor hurries a pass.
        passes = asyncio.ensure_future(clock.every(self.reconcile_interval, self._reconcile))
        listening = asyncio.ensure_future(self._listen(server))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        passes.cancel()
        listening.cancel()
        server.stop()
        await self.governor.close()

    async def _listen(self, server: HTTPServer, retry_every: float = 30) -> None:
        """Serve reports, the API and the pages where the service entry says; governing never
        waits for it. A port in use is said and tried again, not a crash (a crash-looping
        service culls nothing)."""
        if not self.port:
            self.log.warning(
                "gpu-gov: its service entry has no URL ($JUPYTERHUB_SERVICE_URL is unset, and "
                "GpuGovernor.port is not set): not listening. Servers cannot report and there "
                "is no API or dashboard; they are governed by DCGM and the Hub's activity."
            )
            return
        while True:
            try:
                server.add_sockets(bind_sockets(self.port, self.ip))
            except OSError as error:
                self.log.error(
                    "gpu-gov: cannot listen on %s:%s (%s): no reports, API or dashboard until "
                    "it can; governing on, trying again in %ss",
                    self.ip,
                    self.port,
                    error.strerror or error,
                    retry_every,
                )
                await asyncio.sleep(retry_every)
                continue
            self.log.info("gpu-gov: listening on %s:%s", self.ip, self.port)
            return

    async def _reconcile(self) -> None:
        try:
            result = await self.governor.reconcile()
            if result.actions:
                self.log.info("gpu-gov: reconciled %d servers: %s", result.servers, result.actions)
            metrics.DCGM_ERRORS.inc(len(result.dcgm_errors))
            for error in result.dcgm_errors:
                self.log.warning("gpu-gov: DCGM: %s", error)
        except Exception:
            self.log.exception("gpu-gov: reconcile failed; trying again next cycle")

    @default("log_level")
    def _log_level(self):
        return logging.INFO

    def start(self):
        asyncio.run(self.run())


def open_store(url: str) -> Store:
    """The store, or an exit that says what is wrong with it and how to recover (not a
    traceback, again at every restart)."""
    try:
        return Store(url)
    except (StoreUnavailable, DBAPIError, OSError) as error:
        cause = getattr(error, "orig", None) or error
        where = safe_url(url)
        fix = (
            "If the file is damaged, move it aside (it keeps the audit trail and the usage "
            "ledger) and start the service again: it creates a new, empty database there. "
            "If it is locked or unreachable, fix that first. (--db-url / "
            "c.GpuGovernor.db_url chooses another.)"
        )
        raise SystemExit(
            f"jupyter-gpu-gov: cannot use its database {where}: {cause}. {fix}"
        ) from None


def main(argv=None) -> None:
    app = GpuGovernor()
    app.initialize(argv)
    app.start()
