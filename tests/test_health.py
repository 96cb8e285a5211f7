"""core.health: which faults make a GPU unhealthy, and how a report carries it."""

from __future__ import annotations

import pytest

from jupyter_gpu_gov.core import health
from jupyter_gpu_gov.core.health import Health, Reading, assess, combine


@pytest.mark.parametrize("xid", [48, 64, 74, 79, 95, 119, 120, 140, 144, 150])
def test_xids_that_need_a_reset_fail_the_gpu(xid):
    checked = assess(Reading(xids=(xid,)))
    assert (checked.status, checked.action, checked.failed) == ("unhealthy", "reset", True)
    assert checked.reasons[0].startswith(f"XID {xid}: ")


@pytest.mark.parametrize("xid", [63, 92, 94, 154])
def test_xids_that_need_a_reset_once_the_work_is_done_drain_the_gpu(xid):
    checked = assess(Reading(xids=(xid,)))
    assert (checked.status, checked.action, checked.failed) == ("unhealthy", "drain", False)


@pytest.mark.parametrize("xid", [13, 31, 43, 45])
def test_application_xids_are_the_programs_error(xid):
    checked = assess(Reading(xids=(xid,)))
    assert checked.status == "ok" and "a program on the GPU failed" in checked.warnings[0]


def test_an_xid_we_do_not_know_is_said_not_judged():
    checked = assess(Reading(xids=(999,)))
    assert checked.status == "ok" and checked.warnings == ("XID 999 (see NVIDIA's XID catalogue)",)


def test_reset_outranks_drain_and_xids_come_first():
    checked = assess(Reading(xids=(63, 63, 79), remapped_rows_pending=True, lost="NVML: gone"))
    assert checked.action == "reset"
    assert checked.reasons == (
        "XID 79: the GPU fell off the bus",
        "the GPU cannot be reached (NVML: gone): it needs a reset or a reboot",
        "XID 63: a memory row was marked for remapping (a GPU reset activates it)",
        "memory rows wait to be remapped at the next GPU reset",
    )


def test_unknown_readings_say_nothing():
    assert assess(Reading()) is health.HEALTHY
    assert assess(Reading(ecc_dbe_volatile=0, remap_failure=False, clock_events=0)).status == "ok"


@pytest.mark.parametrize(
    ("bits", "warned"),
    [
        (health.HW_THERMAL, "thermal"),
        (health.SW_THERMAL, "thermal"),
        (health.HW_POWER_BRAKE, "power-brake"),
        (health.HW_SLOWDOWN, "hardware slowdown"),
        (0x04 | 0x01, None),  # a software power cap and an idle GPU's clocks: normal
    ],
)
def test_throttling_warns_and_never_fails(bits, warned):
    checked = assess(Reading(clock_events=bits))
    assert checked.status == "ok"
    assert (warned in checked.warnings[0]) if warned else checked.warnings == ()


def test_combine_keeps_the_worst_and_every_reason_once():
    drain = assess(Reading(xids=(63,)))
    reset = assess(Reading(xids=(79,), clock_events=health.HW_THERMAL))
    both = combine([drain, reset, health.unknown("DCGM does not see it")])
    assert (both.status, both.action) == ("unhealthy", "reset")
    assert both.reasons == drain.reasons + reset.reasons
    assert "thermal" in both.warnings[0]
    assert combine([health.HEALTHY, health.unknown("x")]) == Health("unknown", ("x",))
    assert combine([]) is health.HEALTHY


def test_the_report_form_round_trips():
    checked = assess(Reading(xids=(79,), clock_events=health.HW_THERMAL))
    assert health.validate(checked.as_dict(), "devices[0].health") is None
    assert health.from_dict(checked.as_dict()) == checked
    assert health.from_dict(None) is None


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("ok", "an object"),
        ({"status": "sick"}, "status"),
        ({"status": "unhealthy", "reasons": ["x"]}, "action is required"),
        ({"status": "ok", "action": "reset"}, "action is required"),
        ({"status": "unhealthy", "action": "replace"}, "action must be"),
        ({"status": "ok", "reasons": "x"}, "reasons must be a list"),
        ({"status": "ok", "warnings": ["x"] * 17}, "at most 16"),
        ({"status": "ok", "reasons": [1]}, "strings"),
        ({"status": "ok", "reasons": ["x" * 301]}, "300 characters"),
    ],
)
def test_a_bad_health_is_named(value, words):
    assert words in health.validate(value, "devices[0].health")
