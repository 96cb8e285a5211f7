"""What the profile layer granted a server, as it records it in the spawner's *state*.

A user writes their server's ``user_options`` (the REST API takes any JSON at spawn); nobody but
the Hub writes a spawner's state (``get_state``: the Hub's REST API only reads it, with
``admin:server_state``). So the grant — tier, team, project, borrowed, weight, maximum age, task
type, expected duration, a reclaim request, when it waited in line, and on a workstation the
devices the allocator handed out — is recorded there, and that is the only place the governor
reads it. The profile layer writes, the governor reads: this module is the one definition of the
format (``core.queue`` defines the waiting request, kept in the same state).

State keys:

- ``gpu_gov_grant``: ``{"gpu-gov/tier": "h100", "gpu-gov/team": "vision", ...}`` (strings);
  ``{}``: admitted with no GPU (a CPU-only server, ``no_gpu``);
- ``gpu_gov_devices``: the leaf device UUIDs the workstation allocator pinned;
- ``gpu_gov_gpus``: the same devices with their physical GPU and MIG profile
  (``[{"uuid", "parent_uuid", "mig_profile"}]``), so DCGM's records (per physical GPU and GPU
  instance) can be found for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .vocabulary import LABEL_PREFIX, WEIGHT_LABEL

# The most GPU-equivalents one server may weigh (a tier's 'weight', a recorded one, a configured
# one): 16 cards, many times over. NaN passed every comparison (billed NaN GPU-hours; a quota's
# sums admitted anything), inf none.
MAX_WEIGHT = 1000.0

GRANT_STATE = "gpu_gov_grant"
DEVICES_STATE = "gpu_gov_devices"
GPUS_STATE = "gpu_gov_gpus"

# What a user may choose in ``user_options`` (the spawn form's fields, and KubeSpawner's own:
# its profile and the profile's options). Anything else a user sends is dropped at admission:
# the user's choices are listed, not the grants forbidden. A task type and an expected duration
# are choices too, checked against the tier at admission; the grant records what was allowed.
USER_CHOICES = frozenset({"profile", "team", "project", "task_type", "expected_duration"})
USER_CHOICE_PREFIXES = ("profile-option-",)


def user_may_choose(key: object) -> bool:
    return isinstance(key, str) and (key in USER_CHOICES or key.startswith(USER_CHOICE_PREFIXES))


# What is kept of a spawn's choices is in every listing of the Hub's users (the governor's, at
# each pass), so it is bounded: a choice's key and value at most MAX_CHOICE_CHARS characters
# (a KubeSpawner profile option's free-form value, an image name, fits), at most MAX_CHOICES
# of them. Kept whole, one user's 60 MB took the governor's passes from 0.02 s to 1.2 s. The
# profile layer refuses such a spawn at admission; add_governor's pre_spawn_hook on a hub
# without it.
MAX_CHOICE_CHARS = 1024
MAX_CHOICES = 64


def oversized(options: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """``options`` without the choices too large to keep, and why they are not (None: every
    one is kept)."""
    kept, why = {}, None
    for key, value in options.items():
        size = len(value) if isinstance(value, str) else len(repr(value))
        if len(key) > MAX_CHOICE_CHARS or size > MAX_CHOICE_CHARS:
            why = why or (
                f"The choice {key!r:.60} is {max(len(key), size):,} characters long: a choice "
                f"may be at most {MAX_CHOICE_CHARS:,}."
            )
        elif len(kept) >= MAX_CHOICES:
            why = (
                why
                or f"{len(options):,} choices were sent: a spawn may make at most {MAX_CHOICES}."
            )
        else:
            kept[key] = value
    return kept, why


@dataclass(frozen=True)
class GrantedDevice:
    uuid: str  # the leaf: a whole GPU's UUID, or a MIG instance's
    parent_uuid: str | None = None  # a MIG instance's physical GPU
    mig_profile: str | None = None


def labels(state: Mapping[str, Any] | None) -> dict[str, str]:
    """The grant's ``gpu-gov/*`` labels (empty: no grant recorded, or no state to read)."""
    grant = (state or {}).get(GRANT_STATE)
    if not isinstance(grant, Mapping):
        return {}
    return {
        key: value
        for key, value in grant.items()
        if isinstance(key, str) and key.startswith(LABEL_PREFIX) and isinstance(value, str)
    }


def weight(labels: Mapping[str, str]) -> float | None:
    """The GPU-equivalents a grant records (``gpu-gov/weight``); None where it records none, or
    none that is a share of 0 to ``MAX_WEIGHT`` (a hand edit's "inf" or "1e400" billed every
    second of the server at inf, a team's whole showback with it)."""
    recorded = labels.get(WEIGHT_LABEL)
    if recorded is None:
        return None
    try:
        value = float(recorded)
    except ValueError:
        return None
    return value if 0 <= value <= MAX_WEIGHT else None  # NaN too: no comparison holds


def devices(state: Mapping[str, Any] | None) -> tuple[GrantedDevice, ...]:
    """The devices the workstation allocator pinned for the server (empty: none recorded)."""
    state = state or {}
    described = state.get(GPUS_STATE)
    if isinstance(described, list):
        found = []
        for entry in described:
            if isinstance(entry, Mapping) and isinstance(entry.get("uuid"), str):
                parent, profile = entry.get("parent_uuid"), entry.get("mig_profile")
                found.append(
                    GrantedDevice(
                        entry["uuid"],
                        parent if isinstance(parent, str) else None,
                        profile if isinstance(profile, str) else None,
                    )
                )
        return tuple(found)
    uuids = state.get(DEVICES_STATE)
    if isinstance(uuids, list):
        return tuple(GrantedDevice(u) for u in uuids if isinstance(u, str))
    return ()


def no_gpu(state: Mapping[str, Any] | None) -> bool:
    """Whether the profile layer recorded that it admitted the server with no GPU: an empty
    grant and no device pinned. No record (another spawner, no ``admin:server_state``, a server
    started before the record was kept) says nothing: such a server is not taken as CPU-only."""
    state = state or {}
    recorded = state.get(GRANT_STATE)
    return isinstance(recorded, Mapping) and not recorded and not devices(state)


def pod(state: Mapping[str, Any] | None) -> tuple[str | None, str] | None:
    """(namespace, pod) as KubeSpawner keeps them in its state; None for other spawners."""
    state = state or {}
    name, namespace = state.get("pod_name"), state.get("namespace")
    if not isinstance(name, str) or not name:
        return None
    return (namespace if isinstance(namespace, str) else None), name
