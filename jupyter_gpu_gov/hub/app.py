"""``GpuGovernor``: the JupyterHub managed service (``python -m jupyter_gpu_gov.hub``).

It accepts every jupyterhub-idle-culler option with the same meaning for servers that send no
GPU report, so a hub can replace that culler with this service.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import sys
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from functools import partial

from sqlalchemy.exc import DBAPIError
from tornado import web
from tornado.log import access_log
from tornado.netutil import bind_sockets
from traitlets import default
from traitlets.config import Application

from .. import __version__
from ..core import clock
from ..core.durations import parse_duration
from ..core.policy import PolicyError, hub_activity_lag, load_policies
from ..core.rightsize import TierSizeError, load_tier_sizes
from . import heap, metrics, routes
from .applied_policy import start as start_policies
from .budget import Budget, RefusalLog
from .dcgm import DcgmConfig
from .dcgm_source import DcgmSource
from .diagnosis import DiagnosisOptions
from .event_loop import EventLoopUnavailable, loop_factory, running_loop_name
from .health import HealthOptions
from .history import HistoryOptions
from .hub_auth import HubOAuth, HubOAuthCallbackHandler
from .hubapi import HubApi
from .hubconfig import ACTIVITY_INTERVAL_ENV
from .idle_culler_args import IDLE_CULLER_OPTIONS, normalise_argv
from .lease import RENEW_SHARE, Lease
from .logs import EscapingFormatter, StderrHandler
from .options import Options
from .pages import page_handlers
from .pod_cpu import PodCpuOptions
from .policy_api import policy_handlers
from .policy_page import policy_page_handlers
from .prepared_auth import ASKING, PreparedHubOAuth
from .proc_cpu import ProcCpuOptions, same_host
from .protocol_server import LISTEN_BACKLOG, ProtocolHTTPServer
from .reconcile import Governor
from .routes import MAX_BODY_BYTES, handlers, report_route
from .settings import GovernorSettings
from .store import Store, StoreTooNew, StoreUnavailable, safe_url

# A pass still going this long (or two intervals, if longer) is logged with where it waits: the
# passes run one at a time, so one that never ends governs nothing from then on.
PASS_OVERDUE_S = 60.0

# Query parameters that carry a credential: tornado's access log wrote the whole URL, so a
# token a client put in it (?token=, which HubAuth reads in some cases) was in the service's log.
_SECRET_PARAMETERS = frozenset({"token", "access_token", "_xsrf", "code", "state"})


def scrubbed(uri: str) -> str:
    """A request's URI with the values of its credential parameters left out."""
    path, _, query = uri.partition("?")
    if not query:
        return uri
    parts = urllib.parse.parse_qsl(query, keep_blank_values=True)
    if not any(name.lower() in _SECRET_PARAMETERS for name, _ in parts):
        return uri
    kept = [(n, "[secret]" if n.lower() in _SECRET_PARAMETERS else v) for n, v in parts]
    return f"{path}?{urllib.parse.urlencode(kept, safe='[]')}"


def log_request(handler: web.RequestHandler) -> None:
    """tornado's access log line, without the credentials a URL may carry. A request refused
    for a budget has its line from the handler; one refused naming no caller the Hub knows
    (no token, a bogus one, a path that is no route) has it as its address's first in a
    minute, then a count (``RefusalLog``), and one of a caller without the service's access
    scope as that caller's: a flood of them does not rotate the log away."""
    if getattr(handler, "throttled", False):
        return
    status, request = handler.get_status(), handler.request
    if status < 400:
        write = access_log.info
    elif status < 500 and getattr(handler, "_cached_hub_user", None) is None:
        peer = getattr(request.connection, "peer", "")
        write = partial(handler.settings["gpu_gov_access_refusals"].warning, peer)
    elif status < 500 and getattr(handler, "refused_caller", None):  # without the scope
        write = partial(handler.settings["gpu_gov_access_refusals"].warning, handler.refused_caller)
    else:
        write = access_log.warning if status < 500 else access_log.error
    took = 1000.0 * request.request_time()
    write(
        "%d %s %s (%s) %.2fms",
        status,
        request.method,
        scrubbed(request.uri),
        request.remote_ip,
        took,
    )


class OAuthCallbackHandler(HubOAuthCallbackHandler):
    """HubOAuth's login callback. The Hub's check of its code takes its turn among its
    address's (``prepared_auth.ASKING``): a state cookie replays for weeks, each time with a
    check, and a flood of them held up every server's first token check. A login that fails
    counts against its address in ``refused_budget`` (the requests refused for naming no
    caller, ``api_handler``'s and the reports'); past it, 429 with ``Retry-After`` before
    the Hub is asked."""

    throttled = False  # answered 429 (its log line: ``RefusalLog``)

    def prepare(self):
        peer = getattr(self.request.connection, "peer", "")
        ASKING.set(peer)
        refused = self.settings.get("gpu_gov_refused")
        wait = refused.short(peer) if refused is not None else 0.0
        if wait:
            seconds = max(1, math.ceil(wait))
            message = f"too many requests refused from this address: send again in {seconds} s"
            self.settings["gpu_gov_refusals"].warning(
                peer,
                "gpu-gov: %s %.200s refused (429): %s",
                self.request.method,
                self.request.path,
                message,
            )
            self.throttled = True
            self.set_status(429)
            self.set_header("Retry-After", str(seconds))
            self.finish(message)

    def on_finish(self) -> None:
        if self.get_status() >= 400 and not self.throttled:
            refused = self.settings.get("gpu_gov_refused")
            if refused is not None:
                refused.take(getattr(self.request.connection, "peer", ""))


class GpuGovernor(GovernorSettings, Application):
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

    _log_formatter_cls = EscapingFormatter  # names from outside escaped (hub/logs.py)

    def get_default_logging_config(self):
        """traitlets' console handler, writing to ``sys.stderr`` as it is now."""
        config = super().get_default_logging_config()
        console = config.get("handlers", {}).get("console")
        if console is not None:  # (traitlets sets up none under pythonw)
            console.pop("stream", None)
            console["class"] = f"{StderrHandler.__module__}.{StderrHandler.__name__}"
        return config

    def _configure_logging(self) -> None:
        """traitlets' console handler on the root logger too, where every logger but
        traitlets' own propagates: the package's, tornado's and any library's (SQLAlchemy's,
        ``concurrent.futures``'), which had only Python's last-resort handler, which wrote a
        name's newline as it is. Added beside the root's other handlers (a ``root`` entry in
        the logging config would remove them); levels are left as they were."""
        super()._configure_logging()
        console = next((h for h in self.log.handlers if isinstance(h, StderrHandler)), None)
        if console is None:  # an admin's logging_config replaced it, or pythonw
            return
        root = logging.getLogger()
        for old in [h for h in root.handlers if isinstance(h, StderrHandler)]:
            root.removeHandler(old)  # an earlier configuration's (a changed log level)
        root.addHandler(console)

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

    def activity_interval(self) -> timedelta | None:
        """The Hub's activity interval (``hub_activity_interval``), None when not known."""
        seconds = self.hub_activity_interval
        if not seconds and os.environ.get(ACTIVITY_INTERVAL_ENV):
            try:
                seconds = float(os.environ[ACTIVITY_INTERVAL_ENV])
            except ValueError:
                seconds = -1
            if not 0 < seconds < 86_400 * 365:
                raise SystemExit(
                    f"jupyter-gpu-gov: ${ACTIVITY_INTERVAL_ENV} is not a number of seconds: "
                    f"{os.environ[ACTIVITY_INTERVAL_ENV]!r:.60}"
                )
        return timedelta(seconds=seconds) if seconds else None

    def activity_lag(self) -> timedelta | None:
        """How late the Hub's activity may be: ``hub_activity_lag`` where set, else what the
        Hub's activity interval gives (``core.policy.hub_activity_lag``); None when not known."""
        interval = self.activity_interval()
        if not self.hub_activity_lag:
            return hub_activity_lag(interval)
        lag = timedelta(seconds=self.hub_activity_lag)
        if interval is not None and lag < 2 * interval:
            raise SystemExit(
                f"jupyter-gpu-gov: hub_activity_lag ({self.hub_activity_lag:g} s) is shorter than"
                f" twice the Hub's activity interval ({interval.total_seconds():g} s): the Hub's"
                " activity can be that late"
            )
        return lag

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

    def make_governor(self, store: Store | None = None) -> Governor:
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
            try:
                config = DcgmConfig(prometheus_selector=self.dcgm_prometheus_selector)
                config = config.with_metrics(self.dcgm_metric_names)
            except ValueError as error:
                raise SystemExit(f"jupyter-gpu-gov: {error}") from None
            if self.dcgm_prometheus_url and not self.dcgm_prometheus_selector:
                self.log.warning(
                    "gpu-gov: dcgm_prometheus_selector is not set: a series of DCGM's names from "
                    "any target of %s (a user's pod, a Pushgateway) is read as DCGM's word; set "
                    'it to the exporter\'s labels, e.g. job="nvidia-dcgm-exporter"',
                    self.dcgm_prometheus_url,
                )
            dcgm = DcgmSource(
                prometheus_url=self.dcgm_prometheus_url or None,
                exporter_urls=self.dcgm_exporter_urls,
                config=config,
                bearer_token=self.dcgm_bearer_token or None,
                timeout_s=self.dcgm_timeout,
                max_bytes=self.dcgm_max_bytes,
            )
        options = self.make_options()
        store = store or open_store(self.db_url)
        governor = Governor(store, hub, self.policy_list, options, dcgm)
        hub.may_act = lambda: governor.acting
        hub.why_not_acting = governor.why_not_acting
        self.start_policies(governor)
        return governor

    def start_policies(self, governor: Governor) -> None:
        """The config file's policies, then the applied one (applied_policy.py): at start, and
        again at a takeover of the lease (another governor may have applied one meanwhile)."""
        source = {"policies": list(self.policies), "policy_defaults": dict(self.policy_defaults)}
        start_policies(governor, source, self.log)

    def make_options(self) -> Options:
        """The settings the governor's parts read, as one frozen value (docs/architecture.md,
        "Configuration": read once, at start; tests build the parts from it without traitlets)."""
        return Options(
            dry_run=self.dry_run,
            report_stale_after=parse_duration(self.report_stale_after),
            hub_activity_lag=self.activity_lag(),
            cull_default_servers=self.cull_default_servers,
            cull_named_servers=self.cull_named_servers,
            cull_admin_users=self.cull_admin_users,
            cull_users=self.cull_users,
            timeout=timedelta(seconds=self.timeout),
            max_age=timedelta(seconds=self.max_age) if self.max_age else None,
            remove_named_servers=self.remove_named_servers,
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
            pod_cpu=PodCpuOptions(
                kubernetes_api_url=self.kubernetes_api_url,
                kubernetes_token_file=self.kubernetes_token_file,
                kubernetes_ca_file=self.kubernetes_ca_file,
                cores=self.cpu_stage_cores,
                after=timedelta(seconds=self.cpu_stage_after),
                # Stale past three passes, or metrics-server's slowest resolution (60 s) thrice.
                max_age=timedelta(seconds=max(3 * self.reconcile_interval, 180)),
            ),
            proc_cpu=ProcCpuOptions(
                same_host=not self.kubernetes_api_url and same_host(self.url),
                cores=self.cpu_stage_cores,
                after=timedelta(seconds=self.cpu_stage_after),
                max_age=timedelta(seconds=max(3 * self.reconcile_interval, 180)),
            ),
            health=HealthOptions(
                unknown_alert_after=timedelta(seconds=self.gpu_unknown_alert_after),
                node_action=self.unhealthy_node_action,
                kubernetes_api_url=self.kubernetes_api_url,
                kubernetes_token_file=self.kubernetes_token_file,
                kubernetes_ca_file=self.kubernetes_ca_file,
            ),
            tier_sizes=self.tier_sizes,
            right_size_after=timedelta(seconds=self.right_size_after),
            full_pass_every=self.full_pass_every,
            queue_retry_after=timedelta(seconds=self.queue_retry_after),
            left_pod_retry=timedelta(seconds=self.left_pod_retry),
            stopped_kept_per_user=self.stopped_kept_per_user,
            distrust_said_per_hour=self.distrust_said_per_hour,
            history=HistoryOptions(
                timedelta(seconds=self.history_retention), self.history_max_rows
            ),
        )

    def make_server(self, governor: Governor) -> ProtocolHTTPServer:
        """The service's HTTP server: the web app, and servers' reports as a direct route."""
        reports = f"{self.service_prefix.rstrip('/')}/api/reports"
        hub_auth = PreparedHubOAuth.instance()  # the handlers' and the login callback's too
        hub_auth.checks_per_address = self.hub_checks_per_address
        # An address's requests refused for naming no caller: one budget for every route.
        refused = Budget(self.refused_budget, self.refused_burst)
        return ProtocolHTTPServer(
            self.make_web_app(governor, refused),
            max_body_size=MAX_BODY_BYTES,
            xheaders=True,
            accept_interval=self.accept_interval,
            max_connections_per_peer=self.max_connections_per_address,
            direct={
                ("POST", reports): report_route(
                    governor,
                    hub_auth,
                    Budget(self.report_budget, self.report_burst),
                    refused,
                )
            },
        )

    @property
    def service_prefix(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpu-gov/")

    def make_web_app(self, governor: Governor, refused: Budget | None = None) -> web.Application:
        prefix = self.service_prefix
        return web.Application(
            [
                *handlers(prefix, governor),  # the reports' route first (hub/routes.py)
                *page_handlers(prefix, governor),
                *policy_handlers(prefix, governor),
                *policy_page_handlers(prefix, governor),
                (rf"{prefix.rstrip('/')}/oauth_callback", OAuthCallbackHandler),
            ],
            cookie_secret=os.urandom(32),
            log_function=log_request,
            gpu_gov_prefix=prefix.rstrip("/") + "/",
            gpu_gov_budget=Budget(self.api_budget, self.api_burst),  # api_handler's prepare
            gpu_gov_refused=refused,  # the report route's too
            gpu_gov_refusals=RefusalLog(routes.log, routes.REFUSAL_LINES_EVERY_S),
            gpu_gov_access_refusals=RefusalLog(access_log, routes.REFUSAL_LINES_EVERY_S),
            hub_auth=HubOAuth(),
            xsrf_cookies=False,  # API handlers check XSRF for cookie-authenticated writes
        )

    async def run(self) -> None:
        store = open_store(self.db_url)
        self.lease = Lease(store.engine, self.lease_duration)
        # A database in memory is this process's alone (and one per thread: the lease's would
        # be another): nothing to share, no lease to hold.
        store.lease = None if store.in_memory else self.lease
        leasing = ThreadPoolExecutor(1, "gpu-gov-lease")  # its steps in order, release last
        loop = asyncio.get_running_loop()
        # Taken (when free) before the governor is built: one alone governs from its first pass.
        if store.lease is not None:
            await loop.run_in_executor(leasing, self.lease.step)
        self.lease.taking = False  # (nothing read yet to read again)
        self.governor = self.make_governor(store)
        server = self.make_server(self.governor)
        holder = self.lease.holder
        self.log.info(
            "jupyter-gpu-gov %s governing (reconcile every %ss, %d policies, %s event loop%s)%s",
            __version__,
            self.reconcile_interval,
            len(self.governor.policies),
            running_loop_name(),
            ", DRY RUN" if self.dry_run else "",
            ""
            if self.governor.acting
            else f", on standby: {holder.host if holder else '?'} pid {holder.pid if holder else '?'}"
            " holds the store's lease",
        )
        collections = heap.start()  # no full garbage collection stalls the reports at random
        # On the monotonic clock: a step of the wall clock neither stalls nor hurries a pass.
        passes = asyncio.ensure_future(
            clock.every(
                self.reconcile_interval,
                self._reconcile,
                overdue_after=max(PASS_OVERDUE_S, 2 * self.reconcile_interval),
                name="a governor pass",
            )
        )
        listening = asyncio.ensure_future(self._listen(server))
        stop = asyncio.Event()
        metrics.LEADER.set_function(lambda: 1.0 if self.governor.acting else 0.0)
        lease = asyncio.ensure_future(
            self._keep_lease(leasing, stop) if store.lease else asyncio.sleep(0)
        )
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        passes.cancel()
        listening.cancel()
        lease.cancel()
        heap.stop(collections)
        # Each one ended (a pass stopped where it was) before the server and the store close.
        await asyncio.wait((passes, listening, collections, lease))
        server.stop()
        await self.governor.close()
        # After the last write (the ledger's): the next governor takes over at once.
        await loop.run_in_executor(leasing, self.lease.release)
        leasing.shutdown()
        if self.lease.lost:
            raise SystemExit(
                "jupyter-gpu-gov: another governor took the store's lease (this one could not "
                "renew it in time): stopped, to start again on standby"
            )

    async def _keep_lease(self, leasing: ThreadPoolExecutor, stop: asyncio.Event) -> None:
        """Renew the lease, or watch it and take it over once free or expired (hub/lease.py).
        One that lost it stops: started again, it waits on standby with nothing kept from its
        time as the holder."""
        lease, loop = self.lease, asyncio.get_running_loop()
        while True:
            await asyncio.sleep(RENEW_SHARE * lease.duration)
            await loop.run_in_executor(leasing, lease.step)
            if lease.lost:
                stop.set()
                return
            if lease.taking:  # from another, which wrote meanwhile: read again, then act
                try:
                    self.governor.take_over()
                    self.governor.policies = list(self.policy_list)  # then the applied one
                    lease.taking = False
                    self.start_policies(self.governor)
                except Exception:  # (the store): held, not acting; read again at the next step
                    lease.taking = True
                    self.log.exception("gpu-gov: the store could not be read to take over")
                    continue
                self.log.info("gpu-gov: took the store's lease (%s): governing", lease.why)

    async def _listen(self, server: ProtocolHTTPServer, retry_every: float = 30) -> None:
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
                await server.add_sockets(bind_sockets(self.port, self.ip, backlog=LISTEN_BACKLOG))
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
        if not self.governor.acting:  # on standby: nothing, not even the spawn queue's starts
            await self.governor.reconcile()  # (it says so in its result, and counts the pass)
            return
        try:
            result = await self.governor.reconcile()
            if result.actions:
                self.log.info("gpu-gov: reconciled %d servers: %s", result.servers, result.actions)
            metrics.DCGM_ERRORS.inc(len(result.dcgm_errors))
            for error in result.dcgm_errors:
                self.log.warning("gpu-gov: DCGM: %s", error)
        except Exception:
            self.log.exception("gpu-gov: reconcile failed; trying again next cycle")
        try:  # after the pass: its planned culls are the queue's estimates
            await self.governor.spawn_queue.sync()
        except Exception:
            self.log.exception("gpu-gov: spawn queue sync failed; trying again next cycle")
        heap.after_pass()  # the pass's burst of memory back to the system

    @default("log_level")
    def _log_level(self):
        return logging.INFO

    def start(self):
        try:
            factory = loop_factory(self.event_loop)
        except EventLoopUnavailable as error:
            raise SystemExit(f"jupyter-gpu-gov: {error}") from None
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(self.run())


def open_store(url: str) -> Store:
    """The store, or an exit that says what is wrong with it and how to recover (not a
    traceback, again at every restart)."""
    where = safe_url(url)
    try:
        return Store(url)
    except StoreTooNew as error:  # a service rolled back: the newer one's data stays whole
        raise SystemExit(f"jupyter-gpu-gov: cannot use its database {where}: {error}") from None
    except (StoreUnavailable, DBAPIError, OSError) as error:
        cause = getattr(error, "orig", None) or error
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
