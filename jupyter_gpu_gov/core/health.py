"""GPU health: which faults make a GPU unfit to hand out, in one place (docs/health.md).

Pure. Every source reads the same facts into a ``Reading`` — the server extension from NVML
(``gpu/nvml.py``), the simulated backend from its fault injection, the governor from
dcgm-exporter's fields (``hub/dcgm.py``) — and ``assess`` turns it into a ``Health``:

- ``unhealthy`` with ``action="reset"``: the GPU failed. Its work is lost or cannot be trusted,
  and nobody gets it until an admin resets it (or reboots the machine).
- ``unhealthy`` with ``action="drain"``: it still runs, but needs a reset once its work is done
  (a memory row waits to be remapped, pages wait to be retired); nobody new gets it.
- ``unknown``: its health cannot be read right now (the driver is down).
- ``ok``, perhaps with ``warnings``: thermal or power slowdown is a warning, never "unhealthy":
  the work is slower, not wrong. Sustained throttling is the alert rule's business
  (``hub_config/prometheus/gpu-gov-alerts.yaml``), over minutes of DCGM's counters.

XIDs follow the immediate action of NVIDIA's XID catalogue
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html): RESET_GPU, RESTART_BM,
WORKFLOW_XID_48, the NVLink workflows and CHECK_MECHANICALS need a reset (or a reboot); 63, 92,
94 and 154 need one when the GPU's work is done; RESTART_APP and IGNORE are the program's
error, not the GPU's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

OK, UNHEALTHY, UNKNOWN = "ok", "unhealthy", "unknown"
STATUSES = (OK, UNHEALTHY, UNKNOWN)
RESET, DRAIN = "reset", "drain"
ACTIONS = (RESET, DRAIN)

# XID -> (what happened, in words a researcher reads; what the GPU needs).
XIDS: Mapping[int, tuple[str, str]] = {
    46: ("the GPU stopped processing", RESET),
    48: ("a double-bit ECC memory error", RESET),
    54: ("the GPU's auxiliary power is not connected", RESET),
    62: ("an internal micro-controller halted", RESET),
    63: ("a memory row was marked for remapping (a GPU reset activates it)", DRAIN),
    64: ("a failed memory row could not be remapped", RESET),
    74: ("an NVLink error", RESET),
    79: ("the GPU fell off the bus", RESET),
    92: ("a high rate of single-bit ECC errors", DRAIN),
    94: ("a contained ECC memory error", DRAIN),
    95: ("an uncontained ECC memory error", RESET),
    109: ("a context-switch timeout", RESET),
    110: ("a security fault", RESET),
    119: ("the GPU's system processor (GSP) stopped answering", RESET),
    120: ("the GPU's system processor (GSP) failed", RESET),
    136: ("link training failed", RESET),
    140: ("an unrecovered ECC memory error", RESET),
    143: ("GPU initialisation failed", RESET),
    **{xid: ("an NVLink error", RESET) for xid in range(144, 151)},
    154: ("the driver asks for a GPU recovery action", DRAIN),
    155: ("an NVLink error", RESET),
    156: ("a GPU resource was retired", RESET),
    158: ("a fatal GPU timeout", RESET),
    160: ("a GPU channel was retired", RESET),
}

# RESTART_APP / IGNORE in the catalogue: the program's error (a bad address, an exception);
# said to the owner as a warning, never held against the GPU.
APPLICATION_XIDS = frozenset(
    {8, 11, 13, 14, 25, 31, 32, 37, 38, 39, 40, 41, 43, 44, 45, 60, 66, 67, 68, 69, 70, 71, 72}
    | {75, 76, 77, 80, 82, 83, 84, 85, 86, 88, 89, 93, 96, 97, 98, 99, 100, 101, 102, 103}
    | {104, 105, 106, 107, 121, 137, 139, 141, 152, 153, 157, 161}
    | set(range(126, 136))
)

# NVML's clocks event (throttle) reasons, which DCGM's DCGM_FI_DEV_CLOCKS_EVENT_REASONS shares.
# A software power cap is how a busy GPU runs at its power limit, not a fault: not warned.
HW_SLOWDOWN = 0x08
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
_THROTTLE_WARNINGS = (
    (SW_THERMAL | HW_THERMAL, "thermal slowdown: the GPU is too hot and runs slower"),
    (HW_POWER_BRAKE, "power-brake slowdown: the power supply asked the GPU to slow down"),
    (HW_SLOWDOWN, "hardware slowdown: clocks cut by half or more (heat or power)"),
)

MAX_REASONS = 16  # per device, in a report; and their length
MAX_REASON_CHARS = 300


@dataclass(frozen=True)
class Reading:
    """What a source could read of one physical GPU's health; ``None`` where it cannot say."""

    xids: tuple[int, ...] = ()  # XIDs seen (NVML events since the reader started; DCGM's)
    ecc_dbe_volatile: int | None = None  # uncorrectable ECC errors since the last reset
    retired_pages_pending: bool | None = None  # pre-Ampere: pages retired at the next reset
    remapped_rows_pending: bool | None = None  # Ampere+: rows remapped at the next reset
    remap_failure: bool | None = None  # Ampere+: a row could not be remapped
    clock_events: int | None = None  # the clocks event (throttle) reasons bitmask
    lost: str | None = None  # the GPU cannot be reached: why (e.g. NVML's "GPU is lost")


@dataclass(frozen=True)
class Health:
    status: str = OK
    reasons: tuple[str, ...] = ()  # why it is unhealthy or unknown, most severe first
    action: str | None = None  # unhealthy: reset | drain
    warnings: tuple[str, ...] = ()  # worth knowing, not a fault (throttling, program errors)

    @property
    def failed(self) -> bool:
        """The GPU failed under its work (as opposed to needing maintenance afterwards)."""
        return self.status == UNHEALTHY and self.action == RESET

    def as_dict(self) -> dict:
        """The report's ``devices[].health`` (docs/api.md)."""
        return {
            "status": self.status,
            "reasons": list(self.reasons),
            "action": self.action,
            "warnings": list(self.warnings),
        }

    def __reduce__(self) -> tuple:
        # A healthy reading is rebuilt as ``HEALTHY`` itself: a DCGM read sent from its worker
        # (hub/dcgm_source.py) carries thousands, which ``hub/health.py`` then passes over by
        # identity instead of combining each GPU's records (issue 26).
        if self == HEALTHY:
            return _healthy, ()
        return Health, (self.status, self.reasons, self.action, self.warnings)


HEALTHY = Health()


def _healthy() -> Health:
    return HEALTHY


def unknown(why: str) -> Health:
    return Health(UNKNOWN, (why,))


def describe_xid(xid: int) -> str:
    known = XIDS.get(xid)
    if known is not None:
        return f"XID {xid}: {known[0]}"
    if xid in APPLICATION_XIDS:
        return f"XID {xid}: a program on the GPU failed (the GPU itself is fine)"
    return f"XID {xid} (see NVIDIA's XID catalogue)"


def assess(reading: Reading) -> Health:
    """The health of one GPU from what was read of it (see the module docstring)."""
    reset: list[str] = []
    drain: list[str] = []
    warnings: list[str] = []
    for xid in dict.fromkeys(reading.xids):  # once each, in the order seen
        known = XIDS.get(xid)
        if known is None:
            warnings.append(describe_xid(xid))
        else:
            (reset if known[1] == RESET else drain).append(describe_xid(xid))
    if reading.lost:
        reset.append(f"the GPU cannot be reached ({reading.lost}): it needs a reset or a reboot")
    if reading.ecc_dbe_volatile:
        count = reading.ecc_dbe_volatile
        plural = "s" if count != 1 else ""
        reset.append(f"{count} uncorrectable ECC memory error{plural} since the last reset")
    if reading.remap_failure:
        reset.append("memory row remapping has failed")
    if reading.remapped_rows_pending:
        drain.append("memory rows wait to be remapped at the next GPU reset")
    if reading.retired_pages_pending:
        drain.append("memory pages wait to be retired at the next GPU reset")
    events = reading.clock_events or 0
    warnings.extend(text for bits, text in _THROTTLE_WARNINGS if events & bits)
    if reset or drain:
        reasons = _at_most(reset + drain)
        return Health(UNHEALTHY, reasons, RESET if reset else DRAIN, _at_most(warnings))
    return Health(OK, warnings=_at_most(warnings)) if warnings else HEALTHY


def _at_most(texts: list[str]) -> tuple[str, ...]:
    """``MAX_REASONS`` of ``texts``, the last saying how many more: NVML's XIDs are kept for the
    server's life, and a seventeenth distinct one (a driver answering garbage, a program failing
    in many ways) made every later report one the governor refuses."""
    if len(texts) <= MAX_REASONS:
        return tuple(texts)
    kept = MAX_REASONS - 1
    return (*texts[:kept], f"and {len(texts) - kept} more")


def combine(healths: Iterable[Health]) -> Health:
    """Several readings of one GPU (its report and DCGM, a MIG instance and its GPU): the worst
    status and action, every reason and warning once."""
    items = list(healths)
    if not items:
        return HEALTHY
    if len(items) == 1:
        return items[0]
    rank = {OK: 0, UNKNOWN: 1, UNHEALTHY: 2}
    status = max((h.status for h in items), key=rank.__getitem__)
    actions = {h.action for h in items if h.status == UNHEALTHY}
    reasons = dict.fromkeys(r for h in items if h.status == status for r in h.reasons)
    warnings = dict.fromkeys(w for h in items for w in h.warnings)
    action = None if status != UNHEALTHY else RESET if RESET in actions else DRAIN
    return Health(status, tuple(reasons), action, tuple(warnings))


def evidence(claim: Health) -> frozenset[str]:
    """What a claim rests on, as an admin's dismissal of it records: its reasons (a claim that
    only warns: its warnings)."""
    return frozenset(claim.reasons if claim.status != OK else claim.warnings)


def still_dismissed(dismissed: frozenset[str], claim: Health) -> bool:
    """Whether an admin's dismissal (the evidence dismissed) still covers a GPU's claim now.
    Anything the dismissal did not see is new evidence and brings the claim back: another XID,
    a higher count of ECC errors (the count is in its reason), a GPU lost from the bus, a
    failed remap. DCGM's last-XID field keeps its value until the driver or the exporter
    restarts, so the same XID raised again on a card reads the same and stays dismissed."""
    return evidence(claim) <= dismissed


def from_dict(value: Mapping | None) -> Health | None:
    """A validated report's ``devices[].health`` back as a ``Health`` (``None``: not sent)."""
    if not isinstance(value, Mapping):
        return None
    return Health(
        value["status"],
        tuple(value.get("reasons") or ()),
        value.get("action"),
        tuple(value.get("warnings") or ()),
    )


def validate(value: object, field: str) -> str | None:
    """``None`` when ``value`` is a well-formed ``devices[].health`` (or absent), else what is
    wrong with it; the report's validation names ``field``."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        return "must be an object or null"
    if value.get("status") not in STATUSES:
        return f"status must be one of {', '.join(STATUSES)}"
    action = value.get("action")
    if action is not None and action not in ACTIONS:
        return f"action must be one of {', '.join(ACTIONS)} or null"
    if (value["status"] == UNHEALTHY) != (action is not None):
        return "action is required when the status is unhealthy, and only then"
    for key in ("reasons", "warnings"):
        items = value.get(key, [])
        if not isinstance(items, list) or len(items) > MAX_REASONS:
            return f"{key} must be a list of at most {MAX_REASONS} strings"
        if not all(isinstance(s, str) and len(s) <= MAX_REASON_CHARS for s in items):
            return f"{key} must hold strings of at most {MAX_REASON_CHARS} characters"
    return None
