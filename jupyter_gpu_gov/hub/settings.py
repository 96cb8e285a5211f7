"""The governor's settings (``c.GpuGovernor.*``): every trait, its help, unit and bounds, in
one class that ``GpuGovernor`` (``hub/app.py``) runs. A bad value stops start-up with a
message naming the setting."""

from __future__ import annotations

import json
import os
from urllib.parse import urlparse

from traitlets import (
    Bool,
    Dict,
    HasTraits,
    List,
    TraitError,
    Unicode,
    default,
    validate,
)

from ..core.durations import MAX_SECONDS
from ..core.grant import MAX_WEIGHT
from ..core.text import quoted
from ..core.traits import BoundedInt, FiniteFloat, NumberDict
from .event_loop import EVENT_LOOPS
from .health import NODE_ACTIONS, SERVICE_ACCOUNT
from .hubconfig import TEAM_QUOTAS_ENV
from .protocol_server import MAX_CONNECTIONS

# The ranges of the settings in seconds: a pass, a read or a wait longer than a day (a year for
# what spans the life of a server) is a typo; durations a policy also takes, as policies do,
# up to 100 years (core.durations.MAX_SECONDS).
HOUR, DAY = 3600, 86_400
YEAR = 365 * DAY
MAX_PRICE = 1e6  # of a GPU-equivalent hour, in any currency
# GPU-equivalents: team_guarantees() passes a quota's devices (a million a tier at most) at
# their tier's weight (up to 1,000 a server)
MAX_TEAM_GUARANTEE = 1e9


class GovernorSettings(HasTraits):
    """The settings of ``GpuGovernor``, configured and documented under that name (a mixin of
    traits, not a configurable class of its own)."""

    config_file = Unicode("", help="A Python config file (``c.GpuGovernor.*``) to load.").tag(
        config=True
    )

    # -- jupyterhub-idle-culler's options ----------------------------------------------------
    timeout = BoundedInt(
        3600,
        min=1,
        max=MAX_SECONDS,
        unit="seconds",
        help="""Seconds of Hub inactivity after which a server that sends no GPU report, and
        whose pod DCGM does not see, is culled (jupyterhub-idle-culler's --timeout). Servers
        with GPU reports, or with DCGM's reading of their pod's GPUs, follow the policies.""",
    ).tag(config=True)
    cull_every = FiniteFloat(
        0,
        min=0,
        max=DAY,
        unit="seconds",
        help="Seconds between reconcile passes (0: timeout / 2, at most 60 s).",
    ).tag(config=True)
    max_age = BoundedInt(
        0,
        min=0,
        max=MAX_SECONDS,
        unit="seconds",
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
    concurrency = BoundedInt(
        10,
        min=1,
        max=1000,
        unit="requests",
        help="""Most Hub API requests in flight at once (jupyterhub-idle-culler's
        --concurrency). The governor sends none to users' servers: what it asks of them rides
        on their verdicts.""",
    ).tag(config=True)
    api_page_size = BoundedInt(
        0,
        min=0,
        max=100_000,
        unit="users",
        help="Users per page when listing (0: the Hub's default).",
    ).tag(config=True)
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
        on_busy_limit (interrupt|cull), after_interrupt (cull|warn), away_after, presence_limit, extension_step, max_extensions,
        extension_reason (optional|required), max_age, max_age_warning, checkpoint,
        checkpoint_timeout, on_checkpoint_failure (postpone|proceed), checkpoint_retries,
        checkpoint_max_delay, checkpoint_broken_after, cull_action (stop-server|shutdown-kernels), exempt, reclaim_grace,
        inactive_timeout, expected_duration_notice. Durations are seconds or strings like
        "90m", "2h".""",
    ).tag(config=True)
    policy_defaults = Dict(
        help="""Defaults for every policy key but ``name`` and ``match`` (each policy's own).
        ``inactive_timeout`` defaults to --timeout and ``max_age`` to --max-age.""",
    ).tag(config=True)
    dry_run = Bool(
        False, help="Record every decision and act on none (no checkpoint requests, no culls)."
    ).tag(config=True)
    db_url = Unicode(
        "sqlite:///jupyter_gpu_gov.sqlite",
        help="SQLAlchemy URL of the store, e.g. postgresql+psycopg://gov@db/gpu_gov.",
    ).tag(config=True)
    report_stale_after = FiniteFloat(
        300,
        min=0,
        max=MAX_SECONDS,
        unit="seconds",
        help="Seconds after which a server's last report no longer counts: its GPU is unknown.",
    ).tag(config=True)
    hub_activity_interval = FiniteFloat(
        0,
        min=0,
        max=YEAR,
        unit="seconds",
        help="""Seconds: the longer of the Hub's ``last_activity_interval`` (how often it
        gathers the proxy's activity) and the servers' ``JUPYTERHUB_ACTIVITY_INTERVAL`` (how
        often they post theirs), both 300 by default, or its ``activity_resolution`` (30) when
        longer. How late the Hub's activity may be follows from it (twice it and 5 minutes, at
        least 15 minutes): a warning is read as unread (its notice cut to that lag) only when
        the Hub has seen no activity for that long. Default
        $JUPYTER_GPU_GOV_HUB_ACTIVITY_INTERVAL, which ``add_governor`` sets from the Hub's
        configuration; 0 and neither set: not known, and no warning is judged unread
        (a Hub gathering activity less often would read someone there as gone).""",
    ).tag(config=True)
    hub_activity_lag = FiniteFloat(
        0,
        min=0,
        max=YEAR,
        unit="seconds",
        help="""Seconds: how late the Hub's activity of a server may be, where the admin knows
        it better than the default (twice ``hub_activity_interval`` and 5 minutes for clock
        skew, at least 15 minutes): a Hub that gathers activity every few seconds, its servers'
        clocks in sync. Never under twice ``hub_activity_interval`` (refused at start). It is
        the notice of a warning nobody can read (``away_after``), the silence ``zombie_idle``
        waits out, and how far the incremental listing reads back. 0: the default.""",
    ).tag(config=True)
    team_map = Dict(
        help="User name → team, for users whose server has no grant naming its team and who are "
        "in no Hub group with a team (a team in user_options is never believed)."
    ).tag(config=True)
    dcgm_prometheus_url = Unicode(
        "", help="Prometheus base URL to query dcgm-exporter series (e.g. http://prometheus:9090)."
    ).tag(config=True)
    dcgm_prometheus_selector = Unicode(
        "",
        help="PromQL label matchers only dcgm-exporter's series meet (e.g. "
        'job="nvidia-dcgm-exporter"): without them, a series of a DCGM name from any target '
        "of that Prometheus (a user's pod, a Pushgateway) is read as DCGM's word.",
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
    dcgm_timeout = FiniteFloat(
        5,
        min=0,
        max=HOUR,
        above=True,
        unit="seconds",
        help="Seconds a whole DCGM read may take (connecting, headers and body); then it fails.",
    ).tag(config=True)
    dcgm_max_bytes = BoundedInt(
        64 * 1024 * 1024,
        min=1,
        max=4 * 1024**3,
        unit="bytes",
        help="""Bytes a DCGM answer may have once decompressed (a 10,000-GPU fleet through
        Prometheus is about 40 MB); a larger one fails the read.""",
    ).tag(config=True)
    dcgm_max_age = FiniteFloat(
        0,
        min=0,
        max=DAY,
        unit="seconds",
        help="""Seconds after which DCGM evidence no longer counts (its GPUs are unknown, never
        idle): a read still under way, stuck or failing leaves no old "idle" behind. 0: three
        reconcile intervals, at least 60 s.""",
    ).tag(config=True)
    pcie_floor_bytes_per_s = FiniteFloat(
        1_000_000,
        min=0,
        max=1e12,
        unit="bytes a second",
        help="PCIe traffic (bytes/s) under which an idle-looking GPU counts as idle.",
    ).tag(config=True)
    cpu_stage_cores = FiniteFloat(
        0.5,
        min=0,
        max=1024,
        unit="cores",
        help="""Cores at or above which the container of a server that sends no GPU report is
        computing, as the kubelet measures it (metrics-server's PodMetrics, read through
        kubernetes_api_url: RBAC ``list`` on ``pods`` in ``metrics.k8s.io``), or on a
        workstation its process tree (/proc, under the pid LocalProcessSpawner's state names;
        read where no kubernetes_api_url is set and the Hub's API URL is loopback). Busy for
        cpu_stage_after while DCGM reads its GPU idle, it is in a CPU stage and decided as a
        running cell: not culled at busy_grace, a notice naming the cause, held to busy_limit,
        then warned and culled. An idle server reads about 0.01 of a core, a computing thread
        0.8-1.0. 0: off (such a server is culled at busy_grace, whether or not a cell runs).""",
    ).tag(config=True)
    cpu_stage_after = FiniteFloat(
        600,
        min=0,
        max=YEAR,
        unit="seconds",
        help="""Seconds a server's container CPU must stay at or above cpu_stage_cores, reading
        after reading, before it counts as a CPU stage (a person's burst lasts seconds).""",
    ).tag(config=True)
    diagnose = Bool(
        True,
        help="""Diagnose why GPUs are underused (docs/api.md, "Root causes"): each report is scored and the
        verdict carries ``root_cause``. It never changes a decision.""",
    ).tag(config=True)
    diagnose_train_every = FiniteFloat(
        6 * 3600,
        min=0,
        max=YEAR,
        above=True,
        unit="seconds",
        help="""Seconds between two trainings of the diagnosis model, in a worker thread (the
        service keeps answering). The first runs as soon as `diagnose_min_windows` windows
        exist; until then the threshold rules diagnose. Default 21600 (6 h).""",
    ).tag(config=True)
    diagnose_min_windows = BoundedInt(
        1000,
        min=1,
        max=10_000_000,
        unit="windows",
        help="""Windows (one per server per `diagnose_sample_every`) in the history before the
        first training, e.g. 1000: 20 servers for 50 minutes.""",
    ).tag(config=True)
    diagnose_sample_every = FiniteFloat(
        60,
        min=0,
        max=DAY,
        unit="seconds",
        help="""Seconds: at most one window per server this often goes into the training history
        (every report is still scored).""",
    ).tag(config=True)
    diagnose_history = FiniteFloat(
        7 * 86400,
        min=0,
        max=YEAR,
        above=True,
        unit="seconds",
        help="Seconds of history the model trains on (default 604800, 7 days).",
    ).tag(config=True)
    diagnose_max_windows = BoundedInt(
        250_000,
        min=1,
        max=10_000_000,
        unit="windows",
        help="""Most windows kept in memory for training (packed: about 36 MB at 250,000, which
        10,000 servers fill in 25 minutes); beyond it the oldest go first, whatever their
        age. The rebuilt model learns each node from its windows: at 600 nodes its accuracy
        still rises from 100,000 windows to 250,000 (docs/benchmarks-history.md, "Issue 26, wave
        14"), so keep about 400 a node.""",
    ).tag(config=True)
    diagnose_zombie_idle = FiniteFloat(
        0,
        min=0,
        max=YEAR,
        unit="seconds",
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
    tier_weights = NumberDict(
        min=0,
        max=MAX_WEIGHT,
        unit="GPU-equivalents",
        per="tier",
        help="""GPU-equivalents a server of each tier holds, for the usage ledger, e.g.
        ``{"h100": 1, "h100-3g": 0.5, "l4-shared": 0.25}``, each at most 1,000. A server's
        grant (``gpu-gov/weight``, written by the profile layer) wins; without either the
        ledger counts the devices the Hub's records give the server (the allocator's, DCGM's
        of its pod), else those it reports (a whole GPU 1, a MIG slice its compute share),
        else 1 for a server with a tier, else 0 (no GPU, nothing billed).""",
    ).tag(config=True)
    gpu_hour_cost = NumberDict(
        min=0,
        max=MAX_PRICE,
        per="tier",
        help="""Price of one GPU-equivalent hour per tier, in `currency`, for showback, e.g.
        ``{"h100": 2.5, "h100-1g": 0.4}``. Tiers not listed cost `gpu_hour_cost_default`.""",
    ).tag(config=True)
    gpu_hour_cost_default = FiniteFloat(
        0.0,
        min=0,
        max=MAX_PRICE,
        help="Price of one GPU-equivalent hour of a tier not in `gpu_hour_cost`.",
    ).tag(config=True)
    currency = Unicode("USD", help="The currency label shown with costs, e.g. EUR.").tag(
        config=True
    )
    team_quotas = NumberDict(
        min=0,
        max=MAX_TEAM_GUARANTEE,
        unit="GPU-equivalents",
        per="team",
        help="""GPU-equivalents each team is guaranteed, shown on each user's usage page next to
        what the team holds now, e.g. ``{"vision": 2, "nlp": 1.5}`` (display only: admission
        is the profile layer's). ``add_governor(c, team_quotas=team_guarantees(c))``
        (``jupyter_gpu_gov.profiles.hubconfig.team_guarantees``) passes the profile layer's
        ``c.GpuProfiles.quotas``; default $JUPYTER_GPU_GOV_TEAM_QUOTAS (JSON).""",
    ).tag(config=True)

    @default("team_quotas")
    def _team_quotas_default(self):
        passed = os.environ.get(TEAM_QUOTAS_ENV)
        if not passed:
            return {}
        try:
            quotas = json.loads(passed)
        except ValueError as error:
            raise TraitError(f"${TEAM_QUOTAS_ENV} is not JSON: {error}") from None
        if not isinstance(quotas, dict):
            raise TraitError(f"${TEAM_QUOTAS_ENV}: expected a dict of team: GPU-equivalents")
        trait = self.traits()["team_quotas"]
        for team, amount in quotas.items():  # (a default is not validated)
            trait.check_entry(f"${TEAM_QUOTAS_ENV}[{quoted(team)}]", amount)
        return quotas

    usage_max_gap = FiniteFloat(
        0,
        min=0,
        max=YEAR,
        unit="seconds",
        help="""Seconds: the longest gap between two looks at a server that the usage ledger
        still bills (as the state seen at the first look). A longer gap (the service was down)
        is counted as unobserved, never as idle or active. 0: three reconcile intervals, at
        least 60 s.""",
    ).tag(config=True)

    usage_write_every = FiniteFloat(
        300,
        min=0,
        max=DAY,
        unit="seconds",
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

    right_size_after = FiniteFloat(
        3600,
        min=0,
        max=YEAR,
        unit="seconds",
        help="""Seconds of reports with the GPU held before a right-sizing hint: the peak of a
        shorter stretch says too little (default 3600).""",
    ).tag(config=True)

    # -- the pass ----------------------------------------------------------------------------
    lease_duration = FiniteFloat(
        30,
        min=3,
        max=600,  # a crashed holder keeps every governor from acting for as long
        unit="seconds",
        help="""Seconds of the store's lease (hub/lease.py): only the governor holding it acts,
        renewing it every quarter of this; one that stops renewing (a crash, a pause) acts on
        nothing from three quarters on, and another takes over after the whole of it, counted on
        its own clock. A clean stop hands it over at once.""",
    ).tag(config=True)
    full_pass_every = BoundedInt(
        10,
        min=1,
        max=10_000,
        unit="passes",
        help="""Decide every server at one reconcile pass in this many (default 10: every 10
        minutes at cull_every=60); between them, only the servers whose inputs changed (Hub
        model, report, DCGM evidence, record) or whose deadline fell due
        (docs/benchmarks-history.md, "Scale"). 1: every server at every pass.""",
    ).tag(config=True)

    queue_retry_after = FiniteFloat(
        60,
        min=1,
        max=DAY,
        unit="seconds",
        help="""Seconds before a start from the spawn queue's line is tried again after the Hub
        refused it, or after it failed once the Hub took it (its pod never created: the request
        keeps its place): not at every pass while the cause lasts.""",
    ).tag(config=True)

    left_pod_retry = FiniteFloat(
        15,
        min=1,
        max=DAY,
        unit="seconds",
        help="""Seconds before the delete of a pod a stop left running (which the profile
        layer's sweep names) is asked of the hub again, and audited again, while the Kubernetes
        API fails it.""",
    ).tag(config=True)

    stopped_kept_per_user = BoundedInt(
        100,
        min=1,
        max=1_000_000,
        unit="rows",
        help="""Rows of one user's stopped servers the governor keeps (in memory and the store;
        the admin's ``api/servers?all=1`` lists them), those stopped most lately; older ones
        are forgotten as the user's servers stop, said in the log. A server's name is its
        owner's choice: without a bound, one starting a server of a new name each pass left a
        row each for good (about 0.6 kB in memory, read through by every owner's page, the
        admin's listing and the diagnosis: 10-24 ms at 100,000 rows). Raise it where people
        keep more named servers than this and want the stopped ones listed.""",
    ).tag(config=True)
    distrust_said_per_hour = BoundedInt(
        6,
        min=1,
        max=3600,
        unit="times an hour",
        help="""Times an hour a server's report that contradicts the Hub's records of its GPUs
        is put on record (a ``report-distrusted`` audit row and a WARNING line, up to 2,000
        characters each), at each change of what it names; the next one says how many went
        unsaid. Not believed either way: this bounds only what is written.""",
    ).tag(config=True)

    # -- history and what-if (hub/history.py, docs/api.md "History and what-if") ---------------
    history_retention = FiniteFloat(
        14 * 86400,
        min=0,
        max=MAX_SECONDS,
        unit="seconds",
        help="""Seconds of the governor's own history kept for ``export-trace`` and the policy
        page's what-if (about 52 bytes a kept row: an idle server keeps four rows an hour, a
        working one a row a pass). 0: none is recorded.""",
    ).tag(config=True)
    history_max_rows = BoundedInt(
        60_000_000,
        min=0,
        max=10**10,
        unit="rows",
        help="""Most history rows kept (about 3 GB in SQLite: 10,000 servers for 14 days at a
        pass a minute), the oldest deleted first, whatever history_retention says. 0: none is
        recorded.""",
    ).tag(config=True)

    # -- GPU health (docs/health.md) -----------------------------------------------------------
    gpu_unknown_alert_after = FiniteFloat(
        1800,
        min=0,
        max=YEAR,
        unit="seconds",
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
            raise TraitError(
                f"GpuGovernor.unhealthy_node_action must be one of {', '.join(NODE_ACTIONS)}, "
                f"got {proposal['value']!r}"
            )
        return proposal["value"]

    report_budget = FiniteFloat(
        5.0,
        min=0,
        max=1e6,
        unit="reports a second",
        help="""Reports a second one caller (a Hub user or service, all its tokens together) may
        send on average; past it and ``report_burst``, a report is answered 429 with
        ``Retry-After`` and not taken (the server's verdict stays as it was). A report counts one
        more per 16 KiB (the largest taken, 256 KiB: 17), as its parse costs that much more. A
        server sends one every ``report_interval`` and at a change of its kernels' GPU state (at
        most one a ``sample_interval``, 5 s by default): 5 a second is 25 such servers of one
        user at once. 0: no budget.""",
    ).tag(config=True)
    report_burst = FiniteFloat(
        60.0,
        min=1,
        max=1e6,
        unit="reports",
        help="""Reports (as counted for ``report_budget``) one caller may send at once before
        ``report_budget`` applies: every server of one user reporting after a restart.""",
    ).tag(config=True)
    refused_budget = FiniteFloat(
        1.0,
        min=0,
        max=1e6,
        unit="requests a second",
        help="""Requests a second from one address that no known caller sent (no token, or one the
        Hub refuses) the service refuses (reports, the API and the pages together) before it
        answers that address's next such request 429 with ``Retry-After``, without asking the
        Hub: a flood of bogus tokens costs neither Hub checks nor log lines. A caller whose token
        is cached, a browser's login, and a page's redirect to the login are never held back by
        it. 0: no budget.""",
    ).tag(config=True)
    refused_burst = FiniteFloat(
        30.0,
        min=1,
        max=1e6,
        unit="requests",
        help="Refused requests one address may have at once before ``refused_budget`` applies.",
    ).tag(config=True)
    api_budget = FiniteFloat(
        10.0,
        min=0,
        max=1e6,
        unit="units a second",
        help="""Units a second one caller (a Hub user or service, all its tokens and its login
        together; admins too) may spend on the API and the pages on average; past it and
        ``api_burst``, a request is answered 429 with ``Retry-After`` before it does anything.
        A request costs its route's class: a read 1 (about 1 ms of the service), a listing of
        every server 5 (an admin's ``api/servers``, the dashboard), an export or a replay 10
        (``api/usage``, the trace, a what-if, showback: seconds of a worker). A person
        clicking, the JupyterLab panel (Extend and Stop, a click each) and a Prometheus scrape
        spend a unit now and then. 0: no budget.""",
    ).tag(config=True)
    api_burst = FiniteFloat(
        100.0,
        min=1,
        max=1e6,
        unit="units",
        help="""Units (a read 1, a listing 5, an export 10) one caller may spend on the API
        and the pages at once before ``api_budget`` applies: a script's burst (an admin
        deciding a batch of extensions).""",
    ).tag(config=True)
    max_connections_per_address = BoundedInt(
        512,
        min=0,
        max=MAX_CONNECTIONS,
        unit="connections",
        help="""Connections kept open from one address (its socket's); past it, that
        address's connection idle the longest is let go (a server sends its report again on a
        new one). A pod is one address and keeps one connection: 512 leaves room for a
        workstation's or a proxy's servers. Where every server reaches the service from one
        address (a service mesh's sidecar, which proxies from 127.0.0.1; SNAT on a node),
        raise it to about the number of servers, or 0: only the cap on all connections
        (20,000, below the open-file limit) holds.""",
    ).tag(config=True)
    hub_checks_per_address = BoundedInt(
        8,
        min=1,
        max=1000,
        unit="tokens",
        help="""Tokens not yet known (and logins' codes) from one address the Hub is asked
        about at a time; the others from that address wait their turn, so a flood of bogus
        tokens waits behind itself, not in front of other servers' checks. Behind a service
        mesh's sidecar or SNAT, every server's first check after a restart comes from one
        address: raise it (e.g. 100, as many as the service asks the Hub at once).""",
    ).tag(config=True)
    accept_interval = FiniteFloat(
        0.02,
        min=0,
        max=1,
        unit="seconds",
        help="""Seconds the service leaves new requests waiting once it has handled one, to
        handle all that came meanwhile together (a report, an API call or a dashboard page then
        waits at most this much longer). Each server reports on a new connection; answered a
        few at a time, reports cost the service less CPU than one by one at 10,000 servers
        (docs/benchmarks-history.md, "Issue 26, wave 16" and "wave 17"). Only while requests come at
        2 / accept_interval a second or more (at 0.02: 100 a second, 6,000 servers reporting
        every minute); slower, each is handled at once. 0: never wait.""",
    ).tag(config=True)

    event_loop = Unicode(
        "auto",
        help="""The service's event loop: ``auto`` (uvloop when it can be imported, else
        asyncio), ``uvloop`` (libuv's; the ``hub`` extra installs it on Linux and macOS), or
        ``asyncio`` (the standard library's). On uvloop a report costs the service 10-20 % less
        CPU at 10,000 servers, and the p99 with passes was 26-36 ms against 35-49 ms on asyncio
        (docs/benchmarks-history.md, "Issue 26, wave 18"). The governor decides the same either
        way.""",
    ).tag(config=True)

    @validate("event_loop")
    def _check_event_loop(self, proposal):
        value = proposal["value"].strip().lower()
        if value not in EVENT_LOOPS:
            raise TraitError(
                f"GpuGovernor.event_loop must be one of {', '.join(EVENT_LOOPS)}, "
                f"got {proposal['value']!r}"
            )
        return value

    port = BoundedInt(
        min=0,
        max=65_535,
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
