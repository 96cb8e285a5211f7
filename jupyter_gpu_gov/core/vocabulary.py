"""The words the parts of jupyter-gpu-gov share, each defined once.

The profile layer writes labels that the governor and the replay read; the governor names
states, actions and cull reasons that the server extension, the JupyterLab extension, the
metrics and the docs repeat. Every such word is defined here and imported where it is used
(``tests/test_architecture.py`` finds any copy).
"""

from __future__ import annotations

import re

from .text import STORED_LENGTH, stored_name

# A Kubernetes object's name (a pod's, a node's): a DNS subdomain.
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")

# -- labels ------------------------------------------------------------------------------------
# A server's grant: ``gpu-gov/<key>`` = a string, written by the profile layer where users
# cannot write it (``core.grant``) and read by the governor and the replay. The profile layer
# also puts them on user pods, under its configurable ``label_prefix``.
LABEL_PREFIX = "gpu-gov/"
TIER_LABEL = "gpu-gov/tier"  # the tier the spawn was admitted to
TEAM_LABEL = "gpu-gov/team"
PROJECT_LABEL = "gpu-gov/project"
USER_LABEL = "gpu-gov/user"  # the owner (pods; the governor adds it to a server's labels)
WEIGHT_LABEL = "gpu-gov/weight"  # the GPU-equivalents the usage ledger bills
BORROWED_LABEL = "gpu-gov/borrowed"  # "true": admitted beyond the team's guarantee
MAX_AGE_LABEL = "gpu-gov/max-age"  # the tier's maximum age, in seconds
# Set on a borrowed server when a team within its guarantee is refused for want of the cards
# borrowers hold: when it was asked (ISO 8601), and for which team; asked for a spawn waiting
# in line, for which server (withdrawn once it left the line and no waiting spawn needs it).
RECLAIM_LABEL = "gpu-gov/reclaim"
RECLAIM_FOR_LABEL = "gpu-gov/reclaim-for"
RECLAIM_BY_LABEL = "gpu-gov/reclaim-by"
EXEMPT_LABEL = "gpu-gov/exempt"  # "true": out of the idle policy's reach
# What the server is for (the profile's, or the owner's choice at spawn), matchable in
# policies, and how long its owner expects it to run (a duration, e.g. "6h").
TASK_TYPE_LABEL = "gpu-gov/task-type"
EXPECTED_DURATION_LABEL = "gpu-gov/expected-duration"
TASK_TYPES = ("interactive", "batch", "inference")
# A server the spawn queue started on its owner's behalf: since when it waited (ISO 8601), and
# the seconds within which its owner should open it (else it is given back: UNCLAIMED).
QUEUED_AT_LABEL = "gpu-gov/queued-at"
CLAIM_WITHIN_LABEL = "gpu-gov/claim-within"
# A Hub group whose properties carry this key names a team (``true``: the group's own name).
TEAM_PROPERTY = TEAM_LABEL
# On a Kubernetes node with a GPU DCGM finds unhealthy (``unhealthy_node_action``): "true",
# and which GPUs and why.
NODE_UNHEALTHY_LABEL = "gpu-gov/gpu-unhealthy"
NODE_UNHEALTHY_ANNOTATION = "gpu-gov/gpu-unhealthy-reasons"

# -- the states of a governed server (docs/architecture.md, "The state machine") ----------------
ACTIVE = "active"
IDLE = "idle"
BUSY = "busy"  # a cell runs while its GPU idles, past busy_grace
WARNED = "warned"
CHECKPOINTING = "checkpointing"
CULLED = "culled"
EXEMPT = "exempt"
UNKNOWN = "unknown"  # no data, or stale data: the idle clock pauses
GPU_FAILED = "gpu-failed"  # its GPU failed under it (core.health)
STATES = (ACTIVE, IDLE, BUSY, WARNED, CHECKPOINTING, CULLED, EXEMPT, UNKNOWN, GPU_FAILED)

# -- actions the policy decides (each audited under its own name before it is carried out) ------
WARN = "warn"
CHECKPOINT = "checkpoint"
CULL = "cull"
INTERRUPT = "interrupt"
# Warnings of a cull that GPU activity cannot put off.
MAX_AGE_WARN = "max-age-warn"
RECLAIM_WARN = "reclaim-warn"
ADMIN_WARN = "admin-warn"
# Notices that announce no cull: a cell running past busy_grace with its GPU idle, a server
# running past the duration its owner expected.
BUSY_NOTICE = "busy-notice"
OVERRUN_NOTICE = "overrun-notice"
WARNINGS = frozenset({WARN, MAX_AGE_WARN, RECLAIM_WARN, ADMIN_WARN})
# How a policy came in while servers ran (``Policy.in_force_by``, the verdict's
# ``policy_change``): an admin's apply or revert, or the config file's policy changed between
# two runs of the service.
POLICY_APPLIED = "applied"
POLICY_CONFIG_CHANGED = "config-changed"
POLICY_CHANGES = (POLICY_APPLIED, POLICY_CONFIG_CHANGED)
NOTICES = frozenset({BUSY_NOTICE, OVERRUN_NOTICE})

# What a cull does (a policy's ``cull_action``).
STOP_SERVER = "stop-server"
SHUTDOWN_KERNELS = "shutdown-kernels"
CULL_ACTIONS = (STOP_SERVER, SHUTDOWN_KERNELS)

# -- why a server was culled (a decision's ``cull_reason``; a checkpoint's too) -----------------
GPU_IDLE = "gpu-idle"
MAX_AGE = "max-age"
RECLAIM = "reclaim"
ADMIN = "admin"  # an admin's Cull now
BUSY_LIMIT = "busy-limit"
INACTIVE = "inactive"  # jupyterhub-idle-culler's rule, for servers without GPU data
UNCLAIMED = "unclaimed"  # started from the spawn queue, and nobody opened it
CULL_REASONS = (GPU_IDLE, MAX_AGE, RECLAIM, ADMIN, BUSY_LIMIT, INACTIVE, UNCLAIMED)
# The reason kept on a server its owner stopped (the Stop button): not a cull, and never the
# reason of a checkpoint.
OWNER_STOP = "owner"

# -- a checkpoint the governor asked for (``Record.checkpoint_status``) -------------------------
CHECKPOINT_REQUESTED = "requested"
CHECKPOINT_DONE = "done"
CHECKPOINT_FAILED = "failed"
CHECKPOINT_TIMEOUT = "timeout"  # no answer within the policy's checkpoint_timeout


# JupyterHub keeps a user's and a server's name in 255 characters each (``Unicode(255)``; a
# Hub on SQLite does not enforce it, and the store keeps a longer one as ``stored_name``
# writes it): a server's key takes up to 511.
NAME_LENGTH = STORED_LENGTH
KEY_LENGTH = 2 * NAME_LENGTH + 1


def pod_key(namespace: str, name: str) -> str:
    """A pod's one name across the cluster (``namespace/name``): a server's pod is known by
    it, not by its name alone, which a pod in another namespace may share."""
    return f"{namespace}/{name}"


def server_key(user: str, name: str = "") -> str:
    """A server's one name across the project: ``user/`` for the default server, ``user/name``
    for a named one (the store, the audit trail, the API, the replay trace format), each name
    as the store keeps it (``core.text.stored_name``: the name itself, but for one no store
    can hold as it is)."""
    if len(user) > NAME_LENGTH or len(name) > NAME_LENGTH:
        return f"{stored_name(user)}/{stored_name(name)}"
    key = f"{user}/{name}"
    shared = _KEYS.get(key)
    if shared is None:
        # (Shared only as itself: the key of names within NAME_LENGTH is itself whichever
        # two names joined make it, or never.)
        stored = f"{stored_name(user)}/{stored_name(name)}"
        if stored != key:
            return stored
        if len(_KEYS) >= KEYS_SHARED:
            _KEYS.clear()
        shared = _KEYS[key] = key
    return shared


def kept_keys(key: str) -> frozenset[str]:
    """What a reader's ``?server=user/name`` finds in the store (``core.text.kept_forms``): the
    key of the names as the Hub gives them, and ``key`` itself, a key the API showed."""
    user, _, name = key.partition("/")
    return frozenset((key, server_key(user, name)))


# Each key made is one string however often it is made again: a report and each pass make a
# server's key anew, and the governor keeps it in some ten maps (3 MB at 10,000 servers:
# docs/benchmarks-history.md, "Issue 26, wave 8"). Bounded: all forgotten at once past KEYS_SHARED.
KEYS_SHARED = 50_000
_KEYS: dict[str, str] = {}
