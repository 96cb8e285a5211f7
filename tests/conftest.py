import contextlib
import os
import signal
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from hub_harness import RUN_MARKER, processes_with

pytest_plugins = ["pytest_jupyter.jupyter_server"]

# Every process this test run starts carries RUN_MARKER in its environment (inherited, and
# passed on by the hub harness to single-user servers and their kernels): at the end, none may
# be left. Grace for a process that is on its way out when the last test returns.
LEFTOVER_GRACE_S = 10.0


def pytest_configure(config):
    os.environ.setdefault(RUN_MARKER, f"{os.getpid()}-{uuid.uuid4().hex}")
    # pytest-xdist hands out `--dist loadfile`'s files by their number of tests, most first,
    # unless told not to (--no-loadscope-reorder): the real-hub files, a few long tests each,
    # then ran last, and one worker ran the longest (9 minutes) alone at the end. The order
    # pytest_collection_modifyitems gives (LONGEST_FILES first) is kept instead.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.fixture(autouse=True)
def _isolated_sim_state(tmp_path, monkeypatch):
    """Every test gets its own simulated-GPU state file, never the user's runtime dir."""
    monkeypatch.setenv("JUPYTER_GPU_GOV_SIM_STATE", str(tmp_path / "sim-gpus.json"))


@pytest.fixture(autouse=True)
def _fresh_service_login():
    """The service's HubAuth is one a process (a traitlets singleton, as in a real service): a
    test that serves the web app against its own Hub must not find the previous test's."""
    yield
    prepared = sys.modules.get("jupyter_gpu_gov.hub.prepared_auth")
    if prepared is not None:
        prepared.PreparedHubOAuth.clear_instance()


@pytest.fixture
def restore_clock():
    """For tests that move the governor's clock (core.clock.advance): back to real time."""
    from jupyter_gpu_gov.core import clock

    yield
    clock.reset()


@pytest.fixture
def frozen_clock(monkeypatch):
    """The governor's clock stands still but for ``clock.advance``, for a test whose governor
    runs in its own process: figures read from it a moment apart (two servers' GPU-seconds in
    one pass, a span against the test's own reading) are then equal, not apart by what a loaded
    machine's scheduling adds (CI once saw 0.5 ms). Yields the reading, a one-item list."""
    from jupyter_gpu_gov.core import clock

    # On a whole second: the Hub keeps times to the millisecond, the history to the second.
    now = [clock.utcnow().replace(microsecond=0)]
    advance = clock.advance

    def moved(seconds: float) -> None:
        advance(seconds)  # what reads the clock by another name (core.report) moves as well
        now[0] += timedelta(seconds=seconds)

    monkeypatch.setattr(clock, "utcnow", lambda: now[0])
    monkeypatch.setattr(clock, "advance", moved)
    yield now
    clock.reset()


@pytest.fixture(autouse=True)
def _hub_clients_closed(monkeypatch):
    """A test's Hub clients are closed when it ends, as the service closes its own: a libcurl
    client left behind fires a timer on a closed event loop when it is collected, and pytest
    names whichever test happens to run then."""
    hubapi = sys.modules.get("jupyter_gpu_gov.hub.hubapi")
    if hubapi is None:  # no test module imported it: nothing to close
        yield
        return
    made = []
    original = hubapi.HubApi.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(hubapi.HubApi, "__init__", init)
    yield
    for api in made:
        api.close()


# This interpreter's own helpers: multiprocessing's (the resource tracker, a reusable pool's
# workers, e.g. scikit-learn's loky), which watch this process and end with it, and
# pytest-xdist's workers (execnet's bootstrap command), which end as the run does.
_OWN_HELPERS = (
    "from multiprocessing.",
    "--multiprocessing-fork",
    "exec(eval(sys.stdin.readline()))",
)


def _leftovers() -> list[int]:
    me = os.getpid()
    return [
        pid
        for pid in processes_with(RUN_MARKER, os.environ[RUN_MARKER])
        if pid != me and not (_parent(pid) == me and any(h in _command(pid) for h in _OWN_HELPERS))
    ]


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200]


# The test files that take longest, longest first (seconds summed over their tests' phases, as
# CI's log lists them: 2-core CI, `make test`, f64b8ac), started first so that pytest-xdist's
# workers (`make test`: a file each at a time) end together rather than one finishing a long
# file alone. A file not listed (under 8 s there) runs after these, in its usual order. Re-rank
# from CI's own figures (its log's "longest test files"): a loaded shared machine stretches the
# files that compute 3-10 times and those that wait on a hub 1.5 times, so its order is not CI's.
LONGEST_FILES = (
    "test_labextension_browser.py",  # 124
    "test_governor_hub.py",  # 124
    "test_kubernetes_hub.py",  # 124
    "test_cause_hub.py",  # 122
    "test_kubernetes_left_pods_hub.py",  # 114
    "test_unread_warning_hub.py",  # 77
    "test_quickstart_browser.py",  # 74
    "test_profiles_hub.py",  # 72
    "test_kubernetes_faults_hub.py",  # 68
    "test_health_hub.py",  # 66
    "test_queue_hub.py",  # 61
    "test_security_hub.py",  # 57
    "test_security_store_hub.py",  # 55
    "test_profiles_kubespawner.py",  # 52
    "test_demo_queue_hub.py",  # 51
    "test_checkpoint_cycle_hub.py",  # 49
    "test_hubapi.py",  # 49
    "test_server_extension.py",  # 46
    "test_checkpoint_server.py",  # 46
    "test_bench_ingest.py",  # 46
    "test_security_gpus_hub.py",  # 42
    "test_reclaim_hub.py",  # 41
    "test_security_clock_hub.py",  # 41
    "test_idle_culler_dropin.py",  # 38
    "test_cpu_stage_hub.py",  # 38
    "test_security_names_hub.py",  # 38
    "test_lease.py",  # 38
    "test_workstation_hub.py",  # 37
    "test_dashboard_browser.py",  # 33
    "test_hung_driver_hub.py",  # 32
    "test_fuzz_api.py",  # 27
    "test_policy_page_browser.py",  # 26
    "test_security_numbers_hub.py",  # 24
    "test_security_asks_hub.py",  # 24
    "test_demo_hub.py",  # 20
    "test_cli_streams.py",  # 20
    "test_security_service.py",  # 20
    "test_cull_races.py",  # 20
    "test_governor_incremental.py",  # 19
    "test_replay_benchmark.py",  # 19
    "test_hubconfig_order_hub.py",  # 19
    "test_queue_limits_hub.py",  # 18
    "test_security_shared_hub.py",  # 17
    "test_grant_count_hub.py",  # 16
    "test_protocol_server.py",  # 16
    "test_bench_reconcile.py",  # 14
    "test_spawn_order_hub.py",  # 13
    "test_spawn_form_browser.py",  # 13
    "test_whatif.py",  # 13
    "test_hub_harness.py",  # 13
    "test_security_partial_report_hub.py",  # 13
    "test_store_postgresql.py",  # 12
    "test_hung_driver_server.py",  # 12
    "test_checkpoint_kernel.py",  # 11
    "test_showback_period_browser.py",  # 11
    "test_prepared_auth.py",  # 9
    "test_proc_cpu.py",  # 9
    "test_governor.py",  # 9
    "test_bidi_names_browser.py",  # 8
    "test_showback_readers_hub.py",  # 8
)


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's order kept


def _xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


def _end_dcgm_worker() -> None:
    """The DCGM reads' worker process (hub/dcgm_source.py: one a process, started by the first
    read in this one), ended while this process can wait for it. pytest-xdist kills a worker
    that takes over 10 s to exit (a loaded machine): the killed worker's pool process, and
    multiprocessing's resource tracker it holds open, lived on and failed the run below."""
    source = sys.modules.get("jupyter_gpu_gov.hub.dcgm_source")
    if source is not None and source._pool is not None:
        source._pool.shutdown(wait=True, cancel_futures=True)
        source._pool = None


def pytest_sessionfinish(session, exitstatus):
    """A test run leaves no process behind: name any that survived, end them, fail the run.
    Under pytest-xdist the run's one check is the controller's, once every worker is done (a
    worker done early would take the other's hubs for leftovers)."""
    _end_dcgm_worker()
    if _xdist_worker(session.config):
        return
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    pids = _leftovers()
    while pids and time.monotonic() < deadline:
        time.sleep(0.2)
        pids = _leftovers()
    if not pids:
        return
    session.config.stash[_LEFT] = [f"pid {pid}: {_command(pid)}" for pid in pids]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


_LEFT = pytest.StashKey[list]()

# Seconds per test file (its tests' setup, call and teardown), summed where the reports arrive
# (the controller, under pytest-xdist): `make test`'s log lists the longest, the figures
# LONGEST_FILES is kept by. A loaded machine's are no substitute: it stretches the files that
# compute (a fuzz or a benchmark file 3-8 times) far more than those that wait on a hub.
_FILE_SECONDS: dict[str, float] = {}
FILES_LISTED = 60


def pytest_runtest_logreport(report):
    name = report.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    _FILE_SECONDS[name] = _FILE_SECONDS.get(name, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if config.option.durations is not None and _FILE_SECONDS:
        longest = sorted(_FILE_SECONDS.items(), key=lambda item: -item[1])[:FILES_LISTED]
        terminalreporter.section(f"{len(longest)} longest test files (seconds, all phases)")
        for name, seconds in longest:
            terminalreporter.write_line(f"{seconds:8.1f}  {name}")
    left = config.stash.get(_LEFT, None)
    if left:
        terminalreporter.section("processes the test run left behind (now killed)", red=True)
        for line in left:
            terminalreporter.write_line(line, red=True)
        terminalreporter.write_line(
            "A test started them and did not end them: the run fails until it does.", red=True
        )
