"""Which GPUs a server holds, from records its user cannot write, and whether its report agrees.

A report comes from a process its user controls: it may name no device, another user's busy
GPU, or an "unavailable" backend, to keep an idle GPU alive. The Hub keeps records the user
cannot write (``core.grant``): KubeSpawner's state names the pod (and DCGM attributes GPUs to
pods), the workstation allocator's state names the devices it pinned. The governor asks DCGM
about those GPUs whatever the report says; a report that contradicts them is not believed
(``contradictions``) and the governor says so in the audit trail.

Without such a record the report alone names the GPUs: DCGM's word on them can then prove the
server idle (a report claiming work on an idle GPU), never busy (a report naming someone
else's busy GPU).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core import grant
from ..core.grant import GrantedDevice
from .dcgm import GpuEvidence


@dataclass(frozen=True)
class Granted:
    """What the Hub's records say a server holds."""

    pod: tuple[str | None, str] | None = None  # KubeSpawner's (namespace, pod)
    devices: tuple[GrantedDevice, ...] = ()  # the workstation allocator's

    @classmethod
    def of(cls, spawner_state: Mapping[str, Any] | None) -> Granted | None:
        """None when the Hub has no record (another spawner, or no ``admin:server_state``)."""
        pod, devices = grant.pod(spawner_state), grant.devices(spawner_state)
        return cls(pod, devices) if pod or devices else None

    def evidence(self, by_uuid: Mapping, by_pod: Mapping) -> list[GpuEvidence]:
        """DCGM's records of these GPUs: the pod's (with or without its namespace in DCGM's
        labels), and each allocated device's (a MIG instance by its GPU and profile)."""
        found: list[GpuEvidence] = []
        if self.pod is not None:
            found += by_pod.get(self.pod) or by_pod.get((None, self.pod[1])) or []
        for device in self.devices:
            found += device_evidence(by_uuid, device.parent_uuid or device.uuid, device.mig_profile)
        return found

    def unseen(self, by_uuid: Mapping) -> bool:
        """Whether DCGM has no record of an allocated device: what it does is unknown, so the
        others' records cannot prove the server idle."""
        return any(
            not device_evidence(by_uuid, d.parent_uuid or d.uuid, d.mig_profile)
            for d in self.devices
        )


def dcgm_keys(granted: Granted | None, report: Mapping | None) -> tuple[str, ...]:
    """What a server's decision looks DCGM's records up by (``Granted.evidence``,
    ``Evidence._evidence``): the pod the Hub's records (``granted``) or its report name (by
    name, whatever the namespace) and the physical GPUs the allocator's records or its report
    name. A record that moved under none of these is not one the decision reads
    (``dcgm.moved_gpus``)."""
    keys = []
    if granted is not None:
        if granted.pod is not None:
            keys.append(granted.pod[1])
        keys += (d.parent_uuid or d.uuid for d in granted.devices)
    if report is not None:
        named = report["server"].get("pod")
        if named:
            keys.append(named)
        keys += (d.get("parent_uuid") or d["uuid"] for d in report["devices"])
    return tuple(dict.fromkeys(keys))


def device_evidence(by_uuid: Mapping, uuid: str, mig_profile: str | None) -> list[GpuEvidence]:
    """DCGM's records of a leaf GPU: a whole GPU's, or the instances of a MIG profile on its
    physical GPU (which instance DCGM cannot tell us by UUID: all of that profile)."""
    return [e for e in by_uuid.get(uuid, ()) if e.mig_profile == mig_profile]


def contradictions(report: Mapping, granted: Granted, evidence: Sequence[GpuEvidence]) -> list[str]:
    """How a (validated) report contradicts the Hub's records of the server's GPUs (empty: it
    agrees, or nothing can be checked). ``evidence``: DCGM's records of the granted GPUs."""
    found = []
    server = report["server"]
    if granted.pod is not None and server.get("pod") not in (None, granted.pod[1]):
        found.append(f"it reports for pod {server['pod']!r}, KubeSpawner runs {granted.pod[1]!r}")
    # The allocator's leaves (a whole GPU or a MIG instance), else the physical GPUs DCGM
    # attributes to the pod.
    held = {d.uuid for d in granted.devices} if granted.devices else {e.uuid for e in evidence}
    if not held:
        return found
    named = report["devices"]
    if report["backend"] == "none" or (report["backend"] != "unavailable" and not named):
        found.append(f"it reports no GPU; the Hub's records give it {len(held)}")
    for device in named:
        if device["uuid"] not in held and (device.get("parent_uuid") or "") not in held:
            found.append(f"it reports GPU {device['uuid']!r:.80}, which is not its own")
    return found
