"""Report validation (a bad report names its field) and what a report says about the GPU."""

from __future__ import annotations

import copy

import pytest

from jupyter_gpu_gov.core.clock import isoformat, utcnow
from jupyter_gpu_gov.core.clock import parse as clock_parse
from jupyter_gpu_gov.core.report import ReportError, gpu_signal, validate

REPORT = {
    "schema": 1,
    "sampled_at": "2026-01-05T09:00:00.000Z",
    "backend": "nvml",
    "server": {
        "user": "alice",
        "name": "",
        "started": "2026-01-05T08:00:00Z",
        "gpu_allocated": True,
    },
    "devices": [
        {
            "uuid": "GPU-a",
            "name": "NVIDIA H100 80GB HBM3",
            "mig_profile": None,
            "memory_total_mb": 81559,
            "memory_used_mb": 20480,
            "activity": 0.0,
            "shared": False,
        }
    ],
    "targets": [
        {
            "kind": "kernel",
            "id": "3f5d0c55-0c1c-4a52-9c59-8e3f8f0bd1a1",
            "name": "python3",
            "execution_state": "idle",
            "connections": 1,
            "gpu": {
                "devices": ["GPU-a"],
                "memory_mb": 20480,
                "sm": 0.0,
                "holds_context": True,
                "confidence": "exact",
            },
        }
    ],
    "window": {"seconds": 60, "gpu_active_fraction": 0.0, "gpu_idle_since": "2026-01-05T08:30:00Z"},
}


def report(**changes) -> dict:
    r = copy.deepcopy(REPORT)
    for path, value in changes.items():
        node = r
        *parents, leaf = path.split("__")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(leaf) if leaf.isdigit() else leaf] = value
    return r


def test_a_good_report_validates():
    assert validate(report()) == REPORT
    # What the server's sampler sends of a target's window (server/sampler.py)
    for gpu in (
        {"active_fraction": 0.25, "pids": [4242, 4243], "history": [0.0, 0.5, None, 1, 1.0]},
        {"active_fraction": None, "pids": [], "history": []},
        {"pids": None, "history": None},
    ):
        changed = report(**{f"targets__0__gpu__{key}": value for key, value in gpu.items()})
        assert validate(changed) == changed
    # memory_activity (NVML's memory utilisation) is optional: 0..1 or null
    for value in (0.0, 0.42, 1.0, None):
        validate(report(devices__0__memory_activity=value))


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"schema": 2}, "schema"),
        ({"backend": "cuda"}, "backend"),
        ({"sampled_at": "yesterday"}, "sampled_at"),
        ({"server__user": ""}, "server.user"),
        ({"devices__0__activity": 1.5}, "devices[0].activity"),
        ({"devices__0__memory_activity": -0.1}, "devices[0].memory_activity"),
        ({"devices__0__memory_activity": "busy"}, "devices[0].memory_activity"),
        ({"devices__0__memory_used_mb": "lots"}, "devices[0].memory_used_mb"),
        ({"targets__0__kind": "gpu"}, "targets[0].kind"),
        ({"targets__0__gpu__sm": -0.1}, "targets[0].gpu.sm"),
        ({"targets__0__gpu__holds_context": "yes"}, "targets[0].gpu.holds_context"),
        ({"targets__0__gpu__confidence": "sure"}, "targets[0].gpu.confidence"),
        ({"window__seconds": None}, "window.seconds"),
        # Each kind of place a field is named from (validate writes the name only on an error)
        ({"devices": "GPU-a"}, "devices"),
        ({"devices__0": "GPU-a"}, "devices[0]"),
        ({"devices__0__shared": "no"}, "devices[0].shared"),
        ({"devices__0__health": {"status": "fine"}}, "devices[0].health"),
        ({"targets__0": 5}, "targets[0]"),
        ({"targets__0__connections": True}, "targets[0].connections"),
        ({"targets__0__gpu": []}, "targets[0].gpu"),
        ({"targets__0__gpu__devices": "GPU-a"}, "targets[0].gpu.devices"),
        ({"targets__0__gpu__memory_mb": 10**400}, "targets[0].gpu.memory_mb"),
        ({"targets__0__gpu__sm": float("nan")}, "targets[0].gpu.sm"),
        ({"targets__0__cpu": "busy"}, "targets[0].cpu"),
        ({"targets__0__cpu": {"cores": 1.0, "iowait": 2.0}}, "targets[0].cpu.iowait"),
        ({"error": "x" * 5000}, "error"),
        ({"server__name": 5}, "server.name"),
        ({"checkpoint": {"requested_at": "soon"}}, "checkpoint.requested_at"),
        ({"checkpoint": {"status": "done", "manifest": ["done"]}}, "checkpoint.manifest"),
        # Read by nothing the governor decides or shows, and refused all the same when they
        # are not what the wire says (they were kept as sent, any JSON).
        (
            {"targets__0__gpu__active_fraction": "<svg onload=alert(1)>"},
            "targets[0].gpu.active_fraction",
        ),
        ({"targets__0__gpu__active_fraction": 1.5}, "targets[0].gpu.active_fraction"),
        ({"targets__0__gpu__pids": ["1234"]}, "targets[0].gpu.pids"),
        ({"targets__0__gpu__pids": [{"pid": 1}]}, "targets[0].gpu.pids"),
        ({"targets__0__gpu__pids": [-1]}, "targets[0].gpu.pids"),
        ({"targets__0__gpu__pids": [True]}, "targets[0].gpu.pids"),
        ({"targets__0__gpu__pids": [10**300]}, "targets[0].gpu.pids"),
        ({"targets__0__gpu__pids": 1234}, "targets[0].gpu.pids"),
        ({"targets__0__gpu__history": [0.1, "<b>x</b>"]}, "targets[0].gpu.history"),
        ({"targets__0__gpu__history": [[[0.5]]]}, "targets[0].gpu.history"),
        ({"targets__0__gpu__history": [1e308]}, "targets[0].gpu.history"),
        ({"targets__0__gpu__history": [float("nan")]}, "targets[0].gpu.history"),
        ({"targets__0__gpu__history": {"0": 0.5}}, "targets[0].gpu.history"),
    ],
)
def test_bad_reports_name_the_field(changes, field):
    with pytest.raises(ReportError) as info:
        validate(report(**changes))
    assert info.value.field == field and str(info.value).startswith(f"{field}: ")


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        # A far-future time once made every pass of the governor overflow (issue 18, item 4).
        ({"targets__0__busy_since": "9999-12-31T23:59:59Z"}, "targets[0].busy_since", "future"),
        ({"server__last_activity": "9999-12-31T23:59:59Z"}, "server.last_activity", "future"),
        ({"sampled_at": "2026-01-05T09:10:00Z"}, "sampled_at", "future"),
        ({"window__gpu_idle_since": "2026-01-05T07:00:00Z"}, "window.gpu_idle_since", "started"),
        (
            {"targets__0__gpu__idle_since": "0001-01-01T00:00:00Z"},
            "targets[0].gpu.idle_since",
            "started",
        ),
        ({"server__started": "10000-01-01T00:00:00Z"}, "server.started", "ISO 8601"),
        # Kernel ids are UUIDs: nothing else can ever be named in an action (issue 18, item 2).
        ({"targets__0__id": "../../../../hub/api/users/bob/server"}, "targets[0].id", "UUID"),
        ({"targets__0__name": "x" * 5000}, "targets[0].name", "more than 1024"),
        ({"devices__0__uuid": "GPU-" + "a" * 2000}, "devices[0].uuid", "more than 1024"),
        ({"targets__0__gpu__devices": ["GPU-a"] * 65}, "targets[0].gpu.devices", "UUIDs"),
    ],
)
def test_times_ids_and_sizes_are_bounded(changes, field, words):
    now = clock_parse("2026-01-05T09:00:00Z")
    with pytest.raises(ReportError) as info:
        validate(report(**changes), now=now)
    assert info.value.field == field and words in str(info.value)


def test_a_clock_a_little_ahead_is_accepted():
    now = clock_parse("2026-01-05T08:57:00Z")  # the server's clock runs 3 minutes ahead
    assert validate(report(), now=now)["sampled_at"] == REPORT["sampled_at"]
    assert validate(report(targets__0__kind="terminal", targets__0__id="1"), now=now)


def signal(r, cull_action="stop-server"):
    return gpu_signal(validate(r), idle_threshold=0.05, cull_action=cull_action)


def test_idle_holder_is_idle_since_the_window_says():
    s = signal(report())
    assert (s.holds_gpu, s.active) == (True, False)
    assert s.idle_since.isoformat().startswith("2026-01-05T08:30")


def test_recent_activity_in_the_window_counts_as_active():
    assert signal(report(window__gpu_active_fraction=0.2)).active is True


def test_unknown_per_process_activity_is_unknown_not_idle():
    s = signal(report(targets__0__gpu__sm=None, devices__0__activity=None))
    assert s.active is None and "kernel python3" in s.detail


def test_unavailable_backend_is_unknown():
    s = signal(report(backend="unavailable", error="GPU is lost"))
    assert s.active is None and "GPU is lost" in s.detail


def test_allocation_without_context_is_held_only_for_stop_server():
    no_context = report(targets=[])
    assert signal(no_context).holds_gpu is True
    assert signal(no_context, "shutdown-kernels").holds_gpu is False
    shared_machine = report(targets=[], server__gpu_allocated=False)
    assert signal(shared_machine).holds_gpu is False


def test_busy_kernel_reports_since_when():
    r = report(targets__0__execution_state="busy", targets__0__busy_since="2026-01-05T08:55:00Z")
    assert signal(r).kernel_busy_since.isoformat().startswith("2026-01-05T08:55")


def test_a_running_cell_whose_kernel_does_nothing_is_quiet_from_its_cpu_figures():
    busy = {"targets__0__execution_state": "busy"}

    def cpu(cores, iowait=0.0, read=0.0):
        return {"cores": cores, "iowait": iowait, "read_mb_s": read, "seconds": 60}

    assert signal(report(**busy, targets__0__cpu=cpu(0.003))).cell_quiet is True
    assert signal(report(**busy, targets__0__cpu=cpu(1.5))).cell_quiet is False
    assert signal(report(**busy, targets__0__cpu=cpu(0.01, read=50.0))).cell_quiet is False
    # No CPU section (an older server, the first sample): not known, so never quiet.
    assert signal(report(**busy)).cell_quiet is None
    # No cell running: the question does not arise.
    assert signal(report(targets__0__cpu=cpu(0.003))).cell_quiet is None


def test_an_allocated_cards_own_activity_is_the_servers_with_no_process_listed():
    """The server's own allocation, no one else's process seen on it, runs at 90 % while
    NVML lists no process on it (WSL2, a driver hiding the list): its activity is the
    server's. It read idle, and a working card was culled under stop-server."""
    working = report(targets=[], devices__0__activity=0.9)
    assert (signal(working).holds_gpu, signal(working).active) == (True, True)
    # No kernel to shut down under shutdown-kernels; a card others use says nothing about us.
    assert signal(working, "shutdown-kernels").holds_gpu is False
    assert signal(report(targets=[], devices__0__activity=0.0)).active is False
    others = report(targets=[], devices__0__activity=0.9, devices__0__shared=True)
    assert signal(others).active is False


def test_a_shared_cards_own_activity_says_nothing_about_us():
    r = report(devices__0__activity=0.9, devices__0__shared=True)
    assert signal(r).active is False


def test_device_health_is_validated():
    ok = {"status": "unhealthy", "reasons": ["XID 79: the GPU fell off the bus"], "action": "reset"}
    assert validate(report(devices__0__health=ok))["devices"][0]["health"] == ok
    assert validate(report(devices__0__health=None))  # an older server sends none
    with pytest.raises(ReportError, match=r"devices\[0\]\.health: status must be one of"):
        validate(report(devices__0__health={"status": "broken"}))
    with pytest.raises(ReportError, match=r"devices\[0\]\.health: reasons must hold strings"):
        validate(report(devices__0__health={"status": "ok", "reasons": ["x" * 5000]}))


def test_a_notebook_deep_in_folders_is_reported_in_a_report_the_governor_takes():
    """A session path is as long as the folders make it (Linux allows 4,096 bytes); the
    governor takes at most 1,024 characters. A notebook 1,100 characters deep once made each
    of its server's reports a 400: no verdict, no warning, no checkpoint before a cull."""
    from jupyter_gpu_gov.core.models import GpuSnapshot
    from jupyter_gpu_gov.core.wire import MAX_TEXT
    from jupyter_gpu_gov.gpu.attribution import TargetRoot
    from jupyter_gpu_gov.server.sampler import Sampler, TargetInfo

    class NoGpus:
        name = "none"

        def sample(self):
            return GpuSnapshot("none", utcnow())

        def close(self):
            pass

    path = "/".join(["experiments-2026-with-a-long-name"] * 32) + "/train.ipynb"
    kernel = REPORT["targets"][0]["id"]
    sampler = Sampler(NoGpus)
    try:
        report = sampler.measure(
            [TargetInfo(TargetRoot("kernel", kernel, None), "python3", path=path)],
            {"user": "alice", "name": "", "started": isoformat(utcnow())},
        ).report
    finally:
        sampler.close()
    assert len(path) > MAX_TEXT
    validate(report)
    (target,) = report["targets"]
    assert len(target["path"]) <= MAX_TEXT and target["path"].endswith("/train.ipynb")
