"""The governor's settings and the frozen ``Options`` its parts read (docs/architecture.md,
"Configuration"): a setting nothing reads, an option nothing sets or reads, or defaults that
disagree between the two fail here — the drift that once left ``concurrency`` set and unread."""

from __future__ import annotations

import ast
import dataclasses
import re
from datetime import timedelta
from pathlib import Path

import pytest
from python_source import parse
from traitlets import Float, Int, TraitError
from traitlets.config import Config

from jupyter_gpu_gov.hub.app import GpuGovernor
from jupyter_gpu_gov.hub.diagnosis import DiagnosisOptions
from jupyter_gpu_gov.hub.health import HealthOptions
from jupyter_gpu_gov.hub.hubconfig import ACTIVITY_INTERVAL_ENV, TEAM_QUOTAS_ENV, add_governor
from jupyter_gpu_gov.hub.options import Options
from jupyter_gpu_gov.hub.settings import GovernorSettings

HUB = Path(__file__).resolve().parents[1] / "jupyter_gpu_gov" / "hub"


def test_every_setting_is_read_by_the_service():
    """Each ``c.GpuGovernor.*`` setting is read where the service builds its parts."""
    source = (HUB / "app.py").read_text(encoding="utf-8")
    unread = [
        name
        for name in GovernorSettings.class_trait_names(config=True)
        if not re.search(rf"\bself\.{name}\b", source)
    ]
    assert not unread, f"settings hub/app.py never reads: {unread}"


def _keywords(call_name: str) -> set[str]:
    """The keywords ``make_options`` passes to ``call_name(...)``."""
    tree = parse(HUB / "app.py")
    (method,) = [n for n in ast.walk(tree) if getattr(n, "name", None) == "make_options"]
    calls = [
        n
        for n in ast.walk(method)
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == call_name
    ]
    return {k.arg for call in calls for k in call.keywords}


def test_every_option_is_set_from_a_setting_and_read_by_a_part():
    """No option is left to its dataclass default by ``make_options`` (a setting forgotten),
    and every option is read by some part of the governor (none set and never read)."""
    sources = {
        path.name: path.read_text(encoding="utf-8")
        for path in HUB.glob("*.py")
        if path.name not in ("app.py", "settings.py")
    }
    for cls in (Options, DiagnosisOptions, HealthOptions):
        fields = {f.name for f in dataclasses.fields(cls)}
        assert fields == _keywords(cls.__name__), cls.__name__
        unread = [
            name
            for name in fields
            if not any(re.search(rf"\.{name}\b", text) for text in sources.values())
        ]
        assert not unread, f"{cls.__name__} fields no part reads: {unread}"


def test_the_options_defaults_are_the_settings_defaults(monkeypatch):
    """A governor built with no configuration gets the options tests build with ``Options()``:
    the two sets of defaults never tell different stories."""
    for name in (
        "JUPYTER_GPU_GOV_TIERS",
        "KUBERNETES_SERVICE_HOST",
        ACTIVITY_INTERVAL_ENV,
        TEAM_QUOTAS_ENV,
    ):
        monkeypatch.delenv(name, raising=False)
    app = GpuGovernor()
    app.initialize([])
    assert app.make_options() == Options()


def test_the_bounds_of_what_one_user_leaves_are_settings(monkeypatch):
    """``stopped_kept_per_user`` and ``distrust_said_per_hour`` were module constants
    (hostile34's): an admin of a hub whose people keep many named servers could not list more
    than 100 stopped ones a user. Settings now, each at least 1: below, refused naming it."""
    monkeypatch.delenv("JUPYTER_GPU_GOV_TIERS", raising=False)
    app = GpuGovernor()
    app.initialize(
        ["--GpuGovernor.stopped_kept_per_user=500", "--GpuGovernor.distrust_said_per_hour=2"]
    )
    options = app.make_options()
    assert (options.stopped_kept_per_user, options.distrust_said_per_hour) == (500, 2)
    assert (Options().stopped_kept_per_user, Options().distrust_said_per_hour) == (100, 6)
    for name in ("stopped_kept_per_user", "distrust_said_per_hour"):
        with pytest.raises(TraitError, match=name):
            GpuGovernor(**{name: 0})


def test_the_hubs_activity_interval_reaches_the_governor(monkeypatch):
    """How late the Hub's activity may be is read from the Hub's configuration: add_governor
    passes the longer of ``last_activity_interval`` and the servers' posting interval, and the
    governor's lag follows (twice it and 5 minutes, at least 15). Not known (a governor run
    without it, or a value it cannot read): None, and no warning is judged unread."""

    def passed(**hub) -> str | None:
        c = Config()
        for key, value in hub.items():
            section, _, trait = key.partition("__")
            setattr(c[section], trait, value)
        add_governor(c)
        (service,) = c.JupyterHub.services.get_value([])
        return service["environment"].get(ACTIVITY_INTERVAL_ENV)

    assert passed() == "300"  # JupyterHub's defaults
    assert passed(JupyterHub__last_activity_interval=1800) == "1800"
    # The Hub ignores an activity less than activity_resolution newer than the one it has.
    assert passed(JupyterHub__activity_resolution=3600) == "3600"
    assert passed(JupyterHub__activity_resolution=60) == "300"
    env = {"JUPYTERHUB_ACTIVITY_INTERVAL": "3600"}
    assert passed(Spawner__environment=env) == "3600"
    assert passed(Spawner__environment={"JUPYTERHUB_ACTIVITY_INTERVAL": lambda s: "60"}) is None

    def lag(value: str | None, **config):
        if value is None:
            monkeypatch.delenv(ACTIVITY_INTERVAL_ENV, raising=False)
        else:
            monkeypatch.setenv(ACTIVITY_INTERVAL_ENV, value)
        app = GpuGovernor(**config)
        app.initialize([])
        return app.make_options().hub_activity_lag

    assert lag("300") == timedelta(minutes=15)
    assert lag("1800") == timedelta(minutes=65)
    assert lag(None) is None
    assert lag(None, hub_activity_interval=600) == timedelta(minutes=25)
    with pytest.raises(SystemExit, match="is not a number of seconds"):
        lag("soon")
    # An admin who knows it better says it (a Hub gathering every 5 s, clocks in sync)...
    assert lag("5", hub_activity_lag=20) == timedelta(seconds=20)
    assert lag(None, hub_activity_lag=20) == timedelta(seconds=20)
    # ...but never under what the Hub's own interval makes it.
    with pytest.raises(SystemExit, match="shorter than twice the Hub's activity interval"):
        lag("300", hub_activity_lag=60)


def test_the_profile_layers_guarantees_reach_my_gpu_usage(monkeypatch):
    """An admin who set only ``c.GpuProfiles.quotas`` read "guaranteed —" on My GPU usage: the
    governor, a service, reads ``c.GpuGovernor.team_quotas``, not the Hub's configuration.
    ``add_governor(c, team_quotas=team_guarantees(c))`` passes the profile layer's guarantees,
    in GPU-equivalents (a pair 2, a 3g.40gb slice of an H100 0.5, a quarter of an L4 0.25); the
    governor's own setting, where given, wins."""
    from jupyter_gpu_gov.profiles.hubconfig import team_guarantees

    c = Config()
    c.GpuProfiles.tiers = [
        {"name": "h100", "gpu": "H100-80GB"},
        {"name": "h100x2", "gpu": "H100-80GB", "count": 2},
        {"name": "h100-3g", "gpu": "H100-80GB", "mig": "3g.40gb"},
        {"name": "l4-shared", "gpu": "L4-24GB", "replicas": 4},
    ]
    c.GpuProfiles.quotas = {
        "vision": {"guaranteed": {"h100": 2, "h100x2": 2}},
        "nlp": {"guaranteed": {"h100-3g": 1, "l4-shared": 2}},
        "guests": {"borrowing_limit": {"h100": 1}},
    }
    add_governor(c, team_quotas=team_guarantees(c))
    (service,) = c.JupyterHub.services.get_value([])
    monkeypatch.setenv(TEAM_QUOTAS_ENV, service["environment"][TEAM_QUOTAS_ENV])

    def shown(config: Config | None = None) -> dict:
        app = GpuGovernor(config=config or Config())
        app.initialize([])
        return app.make_options().team_quotas

    assert shown() == {"vision": 4.0, "nlp": 1.0, "guests": 0.0}
    own = Config()
    own.GpuGovernor.team_quotas = {"vision": 1}
    assert shown(own) == {"vision": 1}
    monkeypatch.setenv(TEAM_QUOTAS_ENV, '{"vision": -1}')
    with pytest.raises(TraitError, match=re.escape("QUOTAS['vision'] must be a number of GPU")):
        shown()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize(
    "setting",
    [
        {"gpu_hour_cost_default": "bad"},  # showback's price of every tier not listed
        {"gpu_hour_cost": {"h100": "bad"}},
        {"tier_weights": {"h100": "bad"}},  # what the ledger bills a server of the tier
        {"team_quotas": {"vision": "bad"}},
        {"dcgm_timeout": "bad"},  # "> 0": NaN passed it
        {"cull_every": "bad"},
        {"lease_duration": "bad"},
        {"api_budget": "bad"},
    ],
)
def test_a_setting_that_is_not_a_finite_number_is_refused_naming_it(setting, bad):
    """A number an admin types is read as a float: ``nan`` and ``inf`` (YAML's ``.nan``, a
    ``float("inf")`` meant as "never") passed every bound, since no comparison with NaN holds:
    showback billed NaN, a pass waited NaN seconds. Refused, naming the setting."""
    ((name, value),) = setting.items()
    value = {k: bad for k in value} if isinstance(value, dict) else bad
    with pytest.raises(TraitError, match=name):
        GpuGovernor(**{name: value})


def test_a_tier_weight_past_any_servers_is_refused_naming_it():
    """A tier's configured weight of 1e300 GPU-equivalents passed (finite, >= 0): a minute of a
    server billed 6e301 GPU-seconds, a team's showback beyond reading, two such servers inf.
    At most a tier's bound in the profile layer (1,000), as a grant's recorded weight."""
    GpuGovernor(tier_weights={"h100": 1000})
    with pytest.raises(TraitError, match=r"tier_weights\['h100'\] must be a number of GPU-eq"):
        GpuGovernor(tier_weights={"h100": 1e300})


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), -1.0])
@pytest.mark.parametrize(
    ("owner", "setting"),
    [
        # the profile layer's: NaN seconds read the cluster at every spawn (min(NaN, 120)
        # is NaN, and no age is < NaN); a NaN grace deleted a left pod at once (no `<`
        # holds), a negative one too
        ("ClusterGpus", "refresh_every"),
        ("ClusterGpus", "left_pod_grace"),
        # the server extension's: NaN and inf passed its "> 0 seconds" (inf: a sampler or
        # a reporter that waits for ever), a negative grace was taken
        ("GpuGovApp", "sample_interval"),
        ("GpuGovApp", "report_interval"),
        ("GpuGovApp", "window_seconds"),
        ("GpuGovApp", "frontend_checkpoint_grace"),
        ("GpuGovApp", "checkpoint_hook_timeout"),
    ],
)
def test_every_layer_refuses_a_number_setting_not_finite_or_negative(owner, setting, bad):
    """The governor's settings refused NaN and inf; the profile layer's and the server
    extension's took them (and negative seconds), each a class of its own. One trait
    (``core/traits.py``) now refuses them in all three, naming the class and the setting."""
    from jupyter_gpu_gov.profiles.cluster import ClusterGpus
    from jupyter_gpu_gov.server.app import GpuGovApp

    cls = {"ClusterGpus": ClusterGpus, "GpuGovApp": GpuGovApp}[owner]
    with pytest.raises((TraitError, ValueError), match=rf"{owner}\.{setting}|{setting}"):
        cls(**{setting: bad})
    assert getattr(cls(**{setting: 1.0}), setting) == 1.0


def _number_settings():
    """Every number setting of every layer: (class, its name, the trait)."""
    from jupyter_gpu_gov.profiles.cluster import ClusterGpus
    from jupyter_gpu_gov.profiles.config import GpuProfiles
    from jupyter_gpu_gov.profiles.local import LocalGpus
    from jupyter_gpu_gov.server.app import GpuGovApp

    return [
        (cls, name, trait)
        for cls in (GpuGovernor, GpuProfiles, ClusterGpus, LocalGpus, GpuGovApp)
        for name, trait in sorted(cls.class_traits(config=True).items())
        if isinstance(trait, Int | Float)
        and trait.this_class.__module__.startswith("jupyter_gpu_gov")
    ]


def _number_dict_settings():
    """Every setting that maps names (tiers, teams) to numbers: (class, its name, the trait)."""
    from jupyter_gpu_gov.core.traits import NumberDict
    from jupyter_gpu_gov.profiles.cluster import ClusterGpus
    from jupyter_gpu_gov.profiles.config import GpuProfiles
    from jupyter_gpu_gov.server.app import GpuGovApp

    return [
        (cls, name, trait)
        for cls in (GpuGovernor, GpuProfiles, ClusterGpus, GpuGovApp)
        for name, trait in sorted(cls.class_traits(config=True).items())
        if isinstance(trait, NumberDict)
    ]


@pytest.mark.parametrize(
    ("owner", "value", "words"),
    [
        (
            "GpuProfiles",
            {"capacity": {"h100": 10**20}},
            "GpuProfiles.capacity['h100'] must be a whole number of devices from 0 to "
            "1,000,000, got 100000000000000000000",
        ),
        (
            "GpuProfiles",
            {"capacity": {"h100": 10**5000}},
            "GpuProfiles.capacity['h100'] must be a whole number of devices from 0 to "
            "1,000,000, got a whole number of 16610 bits",
        ),
        (
            "GpuProfiles",
            {"node_pool_max": {"h100": 10**7}},
            "GpuProfiles.node_pool_max['h100'] must be a whole number of devices from 0 to "
            "1,000,000, got 10000000",
        ),
        (
            "GpuProfiles",
            {"node_pool_max": {"h100": {"nodes": 10**9, "devices_per_node": 8}}},
            "GpuProfiles.node_pool_max['h100']['nodes'] must be a whole number of nodes from 0 "
            "to 100,000, got 1000000000",
        ),
        (
            "GpuProfiles",
            {"node_pool_max": {"h100": {"nodes": 2, "devices_per_node": 10**6}}},
            "GpuProfiles.node_pool_max['h100']['devices_per_node'] must be a whole number of "
            "devices a node from 1 to 4,096, got 1000000",
        ),
        (
            "GpuGovernor",
            {"gpu_hour_cost": {"h100": 1e300}},
            "GpuGovernor.gpu_hour_cost['h100'] must be a number from 0 to 1,000,000, got 1e+300",
        ),
        (
            "GpuGovernor",
            {"gpu_hour_cost": {"h100": 10**5000}},
            "GpuGovernor.gpu_hour_cost['h100'] must be a number from 0 to 1,000,000, "
            "got a whole number of 16610 bits",
        ),
        (
            "GpuGovernor",
            {"team_quotas": {"vision": 1e300}},
            "GpuGovernor.team_quotas['vision'] must be a number of GPU-equivalents from 0 to "
            "1,000,000,000, got 1e+300",
        ),
    ],
)
def test_a_number_past_its_range_in_a_per_tier_or_team_dict_is_refused_naming_it(
    owner, value, words
):
    """A tier's capacity, its pool's size and price, a team's guarantee had no upper bound:
    10**20 devices, a price of 1e300 an hour (showback past reading) were taken, and 10**5000
    crashed building its own message (a ValueError naming nothing). Refused at start-up with
    one line naming the setting, its key, the range and the value."""
    from jupyter_gpu_gov.profiles.config import GpuProfiles

    cls = {"GpuProfiles": GpuProfiles, "GpuGovernor": GpuGovernor}[owner]
    if cls is GpuProfiles:
        GpuProfiles.clear_instance()
    with pytest.raises(TraitError) as info:
        cls(**value)
    assert str(info.value) == words


def test_every_per_tier_or_team_number_dict_refuses_an_entry_past_its_range():
    """Each such dict (found by introspection) refuses an entry past either end, naming it,
    and takes both ends."""
    from jupyter_gpu_gov.profiles.config import GpuProfiles

    settings = _number_dict_settings()
    found = {f"{c.__name__}.{n}" for c, n, _ in settings}
    assert found >= {
        "GpuProfiles.capacity",
        "GpuProfiles.node_pool_max",
        "GpuGovernor.gpu_hour_cost",
        "GpuGovernor.tier_weights",
        "GpuGovernor.team_quotas",
    }
    for cls, name, trait in settings:
        entries = [(trait.low, trait.high, not trait.whole)]
        entries += [(low, high, False) for low, high, _ in trait.parts.values()]
        for part, (low, high, fractional) in zip([None, *trait.parts], entries, strict=True):

            def entry(number, part=part, parts=trait.parts):
                if part is None:
                    return number
                return {p: (number if p == part else lo) for p, (lo, _, _) in parts.items()}

            for bad in (10 * high + (0.5 if fractional else 1), low - 1):
                GpuProfiles.clear_instance()
                with pytest.raises(TraitError) as info:
                    cls(**{name: {"k": entry(bad)}})
                said = str(info.value)
                assert said.startswith(f"{cls.__name__}.{name}['k']"), said
                assert f" to {int(high):,}, got {bad!r}" in said, said
            for good in (low, high):
                GpuProfiles.clear_instance()
                assert getattr(cls(**{name: {"k": entry(good)}}), name) == {"k": entry(good)}
    GpuProfiles.clear_instance()


def test_every_number_setting_of_every_layer_has_a_range_it_refuses_past_naming_it():
    """The governor's whole-number settings had no upper bound (``timeout=10**20`` crashed
    with an OverflowError naming no setting) and some no lower one (a negative ``max_age``,
    ``cull_every``); the profile layer's ``recount_every`` and the server extension's
    checkpoint limits neither. Each now has a range (``core/traits.py``): a value past either
    end is refused naming the class, the setting, the range and the value."""
    settings = _number_settings()
    assert len(settings) >= 50  # the governor's and the other layers' all found
    unbounded = [f"{c.__name__}.{n}" for c, n, t in settings if getattr(t, "high", None) is None]
    assert not unbounded, f"number settings without a range: {unbounded}"
    for cls, name, trait in settings:
        high = float(trait.high)
        shown = f"{int(high):,}" if high.is_integer() else f"{high:g}"
        too_big = 10 * trait.high + (1 if isinstance(trait, Int) else 0.5)
        too_small = trait.low if trait.above else trait.low - 1
        for bad in (too_big, too_small):
            with pytest.raises(TraitError) as info:
                cls(**{name: bad})
            said = str(info.value)
            assert said.startswith(f"{cls.__name__}.{name} must be "), said
            assert said.endswith(f" to {shown}, got {bad!r}"), said
        assert getattr(cls(**{name: trait.high}), name) == trait.high  # both ends taken


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        # jupyterhub-idle-culler's command line, as the drop-in takes it
        (
            ["--timeout=100000000000000000000"],
            "GpuGovernor.timeout must be a whole number of "
            "seconds from 1 to 3,153,600,000, got 100000000000000000000",
        ),
        (
            ["--max-age=-5"],
            "GpuGovernor.max_age must be a whole number of seconds from 0 to 3,153,600,000, got -5",
        ),
        (
            ["--cull-every=-60"],
            "GpuGovernor.cull_every must be a number of seconds from 0 to 86,400, got -60.0",
        ),
        (
            ["--concurrency=100000"],
            "GpuGovernor.concurrency must be a whole number of requests from 1 to 1,000, got 100000",
        ),
        (
            ["--GpuGovernor.report_stale_after=1e12"],
            "GpuGovernor.report_stale_after must be a "
            "number of seconds from 0 to 3,153,600,000, got 1000000000000.0",
        ),
    ],
)
def test_a_number_past_its_range_on_the_command_line_stops_start_up_naming_it(argv, words, capsys):
    """On the base: 10**20 seconds started (then an OverflowError naming nothing, or "bad
    policy configuration: defaults: 'inactive_timeout' ... longer than 100 years"), a
    negative --cull-every was taken (a pass every -60 s), --max-age=-5 was "defaults:
    'max_age': -5 is negative"; 1e12 s stale was "duration: ... longer than 100 years"."""
    with pytest.raises(SystemExit):
        GpuGovernor().initialize(argv)
    assert words in capsys.readouterr().err


def test_a_number_past_its_range_in_a_python_config_names_it_without_overflowing():
    """A value from a Python config file is any int: past 4,300 digits it has no repr, and
    ``make_options`` turned 10**20 seconds into an OverflowError naming no setting."""
    with pytest.raises(TraitError, match=r"^GpuGovernor.timeout must be .* got 10{20}$"):
        GpuGovernor(timeout=10**20)
    with pytest.raises(TraitError, match=r"history_max_rows .* got a whole number of 16610 bits"):
        GpuGovernor(history_max_rows=10**5000)
