"""A GPU lost mid-run, end to end: a real JupyterHub with the workstation allocator
(GpuSimpleLocalProcessSpawner) and the governor, real single-user servers and kernels on two
simulated H100s; the fault is injected from the kernel, as the driver would report it.

The owner's server says so (its status: the device's health, the verdict's honest message), a
checkpoint is taken, the admin sees the GPU and the server (API and dashboard), nothing is culled
as idle, and the allocator never hands the broken card out again: the owner's restart gets the
other GPU, and nobody else gets the broken one.
"""

from __future__ import annotations

import html
import re
import time

import pytest
from governor_harness import Gov, governed_hub, server_running, wait
from test_profiles_hub import H100, _hub_config, _singleuser_config, api_spawn, held
from test_report import REPORT

from jupyter_gpu_gov.gpu.simulated import leaf_devices

pytestmark = pytest.mark.timeout(300)

DEVICES = [H100, H100]
UUIDS = [leaf["uuid"] for leaf in leaf_devices(DEVICES)]
TIERS = [{"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"}]
QUOTAS = {"lab": {"guaranteed": {"h100": 2}}}
TEAM_MAP = {"alice": "lab", "bob": "lab", "carol": "lab"}
FAILED = (
    "Your GPU failed (XID 79: the GPU fell off the bus); your work was checkpointed; "
    "restart your server to get another GPU"
)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with governed_hub(
        tmp_path_factory.mktemp("health"),
        governor_config="c.GpuGovernor.gpu_unknown_alert_after = 4\n",
        hub_config=_hub_config(DEVICES, TIERS, QUOTAS, TEAM_MAP),
        singleuser_config=_singleuser_config(DEVICES),
        users=["alice", "bob"],
    ) as hub:
        hub.create_user("govadmin")
        Gov(hub).wait_up()
        yield hub


def test_a_gpu_lost_mid_run(hub):
    gov = Gov(hub)
    assert api_spawn(hub, "alice", {"profile": "h100"}).status_code in (201, 202)
    hub.wait_for_server("alice")
    assert held(hub)["alice/"] == [UUIDS[0]]
    kernel = hub.start_kernel("alice")
    hub.execute(
        "alice",
        kernel,
        "from jupyter_gpu_gov import checkpoint, simulate\n"
        "results = {'epoch': 3}\n"
        "checkpoint.save_variables('results')\n"
        "simulate.hold(8192)\n"
        "simulate.load(0.9)  # a training run on its GPU",
    )
    status = hub.user_url("alice", "jupyter-gpu-gov/status")

    def report() -> dict:
        return hub.get(status, token=hub.token("alice")).json()

    wait(lambda: report()["devices"][0]["memory_used_mb"] == 8192, 60, "alice's kernel on its GPU")
    hub.execute("alice", kernel, "simulate.fail(xid=79)")  # the card falls off the bus
    failed_at = time.monotonic()

    # The owner's own server says so (what JupyterLab shows comes from this status).
    seen = wait(
        lambda: (r := report()) and (r.get("verdict") or {}).get("reason") == FAILED and r,
        60,
        "alice's verdict to say her GPU failed and her work was checkpointed",
    )
    device = seen["devices"][0]
    assert device["uuid"] == UUIDS[0] and device["activity"] is None
    assert device["health"]["status"] == "unhealthy" and device["health"]["action"] == "reset"
    assert seen["verdict"]["state"] == "gpu-failed" and seen["verdict"]["cull_at"] is None
    (target,) = [t for t in seen["targets"] if t["kind"] == "kernel"]
    assert target["gpu"]["holds_context"] and target["gpu"]["sm"] is None  # unknown, not idle
    manifest = seen["checkpoint"]["manifest"]
    assert seen["checkpoint"]["status"] == "done" and manifest["kernels"][0]["id"] == kernel
    assert "results" in str(manifest["kernels"][0])

    # The admin sees the GPU, who holds it and why; and, once it has lasted, the flag.
    def flagged():
        view = gov.admin("GET", "health").json()
        return view["flagged"] and view

    view = wait(flagged, 60, "alice's server to be flagged: GPU state unknown too long")
    (gpu,) = view["gpus"]
    assert (gpu["uuid"], gpu["server"], gpu["source"]) == (UUIDS[0], "alice/", "report")
    assert gpu["reasons"][0] == "XID 79: the GPU fell off the bus"
    assert [f["server"] for f in view["flagged"]] == ["alice/"]
    page = hub.get(f"{hub.url}/services/gpu-gov/", token=hub.token("govadmin"))
    assert page.status_code == 200
    assert (
        f'data-uuid="{UUIDS[0]}"' in page.text and "XID 79: the GPU fell off the bus" in page.text
    )
    (server,) = gov.admin("GET", "servers").json()["servers"]
    assert server["state"] == "gpu-failed"
    assert server["gpu"]["devices"][0]["health"]["action"] == "reset"

    # Nothing is culled as idle: judged on a report made well past the policy's 7 s to cull
    # (a sleep gave a loaded machine's governor no pass over one), still running, and not
    # warned since the failure (the allocated GPU may have been warned idle before its kernel
    # started: that is the policy at work).
    gov.judged_after("alice", max(0.0, 12 - (time.monotonic() - failed_at)))
    assert server_running(hub, "alice")
    audit = gov.audit("alice/")
    failed = next(i for i, a in enumerate(audit) if a["reason"].startswith("Your GPU failed"))
    since = [a["action"] for a in audit[failed:] if a["action"] != "state"]
    assert since[:1] == ["checkpoint"] and "checkpoint-done" in since and "gpu-unknown" in since
    assert not {"warn", "cull"} & set(since), since
    assert "cull" not in gov.actions("alice/")

    # The claim cannot be dismissed while alice's server is on the card: its state rests on it.
    held_card = gov.admin("POST", f"health/{UUIDS[0]}/dismiss", json={"reason": "checked"})
    assert held_card.status_code == 409 and "held by the running server alice/" in held_card.text

    # Restart to get another GPU: the broken one is free, and never handed out again.
    hub.stop_server("alice")
    assert api_spawn(hub, "alice", {"profile": "h100"}).status_code in (201, 202)
    hub.wait_for_server("alice")
    assert held(hub)["alice/"] == [UUIDS[1]]
    refused = api_spawn(hub, "bob", {"profile": "h100"})
    # the broken card is not counted: one card left, and it is alice's
    assert refused.status_code == 403 and "The only H100 80 GB card is in use" in refused.text
    assert "bob/" not in held(hub)


def test_an_admin_dismisses_the_claim_on_a_card_nobody_holds(hub):
    """Alice's broken card, free since her restart, stays listed on her word: the admin checked
    it and dismisses the claim from the dashboard's GPU health panel, on record before it goes.
    (Runs after test_a_gpu_lost_mid_run, on its hub.)"""
    gov = Gov(hub)
    wait(
        lambda: [g["uuid"] for g in gov.admin("GET", "health").json()["gpus"]] == [UUIDS[0]],
        60,
        "alice's broken card to be listed, no server on it",
    )
    # Wrong asks change nothing and say what is wrong.
    r = gov.admin("POST", "health/not-a-uuid/dismiss", json={"reason": "checked"})
    assert r.status_code == 400 and "is not a GPU UUID" in r.text
    r = gov.admin("POST", f"health/{UUIDS[0]}/dismiss", json={})
    assert r.status_code == 400 and "'reason' is required" in r.text
    r = gov.admin("POST", "health/GPU-00000000-dead-beef/dismiss", json={"reason": "checked"})
    assert r.status_code == 404 and "no GPU GPU-00000000-dead-beef is known" in r.text
    r = gov.call("POST", f"health/{UUIDS[0]}/dismiss", hub.token("bob"), json={"reason": "x"})
    assert r.status_code == 403

    # The dashboard's Dismiss button (a form with the XSRF token, as a browser posts it).
    admin = hub.login("govadmin", fresh=True)
    page = admin.get(f"{hub.url}/services/gpu-gov/", timeout=30)
    assert page.status_code == 200 and 'value="dismiss-gpu"' in page.text
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
    r = admin.post(
        f"{hub.url}/services/gpu-gov/actions",
        data={
            "_xsrf": html.unescape(xsrf[1]),
            "gpu": UUIDS[0],
            "reason": "reset with nvidia-smi -r, dcgmi diag passes",
            "action": "dismiss-gpu",
        },
        timeout=30,
    )
    assert r.status_code == 200 and f"health claim on GPU {UUIDS[0]} dismissed" in r.text
    assert f'data-uuid="{UUIDS[0]}"' not in r.text and "No GPU reports a fault." in r.text

    assert gov.admin("GET", "health").json()["gpus"] == []
    rows = gov.admin("GET", "audit", params={"limit": 500}).json()["audit"]
    (dismissal,) = [a for a in rows if a["action"] == "gpu-dismiss"]
    assert dismissal["actor"] == "user:govadmin" and dismissal["details"]["uuid"] == UUIDS[0]
    assert "XID 79: the GPU fell off the bus" in dismissal["reason"]
    assert dismissal["reason"].endswith("reason: reset with nvidia-smi -r, dcgmi diag passes")
    again = gov.admin("POST", f"health/{UUIDS[0]}/dismiss", json={"reason": "again"})
    assert again.status_code == 404 and "no health claim to dismiss" in again.text


def test_a_failed_driver_flags_gpu_servers_not_a_cpu_only_one(hub):
    """The whole driver fails: alice's GPU server is flagged (its GPU state unknown), bob's
    CPU-only server, which the profile layer admitted with no GPU, is not (it was, a false alert
    that also kept it from the idle-culler rule). (After test_a_gpu_lost_mid_run, on its hub.)"""
    gov = Gov(hub)
    if not server_running(hub, "alice"):  # culled idle since, or run alone
        assert api_spawn(hub, "alice", {"profile": "h100"}).status_code in (201, 202)
        hub.wait_for_server("alice")
    working = "from jupyter_gpu_gov import simulate\nsimulate.hold(4096)\nsimulate.load(0.9)"
    hub.execute("alice", hub.start_kernel("alice"), working)  # not culled as idle meanwhile
    assert api_spawn(hub, "bob", {"profile": "no-gpu"}).status_code in (201, 202)
    hub.wait_for_server("bob")
    kernel = hub.start_kernel("bob")
    hub.execute("bob", kernel, "from jupyter_gpu_gov import simulate\nsimulate.fail('driver down')")

    def flagged() -> list[str]:
        r = gov.admin("GET", "health")
        assert r.status_code == 200, r.text
        return [f["server"] for f in r.json()["flagged"]]

    try:
        wait(lambda: "alice/" in flagged(), 60, "alice's GPU server to be flagged: unknown")
        gov.judged_after("bob", 5)  # past gpu_unknown_alert_after (4 s) with the driver down
        backend = hub.get(hub.user_url("bob", "jupyter-gpu-gov/status"), token=hub.token("bob"))
        assert backend.json()["backend"] == "unavailable"
        assert "bob/" not in flagged()
        server = gov.admin("GET", "users/bob/server").json()
        assert server["state"] == "active" and "holds no GPU" in server["reason"], server
        assert "gpu-unknown" not in gov.actions("bob/")
    finally:
        hub.execute("bob", kernel, "simulate.recover()")
        hub.stop_server("bob")


def test_a_cpu_servers_report_of_a_failed_gpu_is_not_flagged(hub):
    """carol's server, which the profile layer admitted with no GPU, reports (her own word:
    the harness silenced her server, she posts with her token) that a GPU failed. The Hub's
    records give her none: it is not the governor's to flag. Her claim was listed on the GPU
    health panel naming her server, which went ``gpu-failed`` (never idle, never inactive)
    and was flagged for an admin as if its GPU state were unknown. (Last on its hub.)"""
    gov = Gov(hub)
    hub.create_user("carol")
    assert api_spawn(hub, "carol", {"profile": "no-gpu"}).status_code in (201, 202)
    hub.wait_for_server("carol")
    claimed = "GPU-00000000-0000-0000-0000-00000000cafe"
    failed = {"status": "unhealthy", "reasons": ["XID 79"], "action": "reset", "warnings": []}
    device = {**REPORT["devices"][0], "uuid": claimed, "health": failed}
    token = hub.token("carol")

    def claim() -> None:
        status = hub.get(hub.user_url("carol", "jupyter-gpu-gov/status"), token=token).json()
        status.pop("verdict", None)
        r = gov.call("POST", "reports", token, json={**status, "devices": [device]})
        assert r.status_code == 200, r.text

    try:
        claim()
        # Claimed for twice gpu_unknown_alert_after (4 s) from the first claim the governor
        # took (counted from its answer, not from before the status read and the post that
        # made it: on a loaded machine they took most of the alert time).
        until = time.monotonic() + 8
        while time.monotonic() < until:
            claim()
            time.sleep(0.5)
        first = gov.passes()
        while gov.passes() < first + 3:  # the claim was the last word for some passes
            claim()
            time.sleep(0.3)
        view = gov.admin("GET", "health").json()
        assert claimed not in [g["uuid"] for g in view["gpus"]], view["gpus"]
        assert "carol/" not in [f["server"] for f in view["flagged"]], view["flagged"]
        verdict = gov.verdict("carol")  # governed on what else she reports, as before
        assert verdict["state"] != "gpu-failed" and "XID" not in verdict["reason"], verdict
        assert "gpu-unknown" not in gov.actions("carol/")
    finally:
        hub.stop_server("carol")
