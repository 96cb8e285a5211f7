"""Reports in: a validated report kept (its arrival on the governor's clock), measured for
right-sizing, fed to the diagnosis, its finished checkpoint taken; the server's verdict
answered. Reports are accepted only for servers the Hub runs, and forgotten once stale."""

from __future__ import annotations

import logging
import time
from math import copysign

from ..core import clock
from ..core.vocabulary import server_key
from ..core.wire import report_words
from .checkpoints import reported_checkpoint
from .evidence import Received
from .hubapi import HubApiError
from .tables import record_of
from .usage import _Use

log = logging.getLogger("jupyter_gpu_gov.hub")

# How often a report for a server the last pass did not see may ask the Hub about its user.
HUB_LOOKUP_EVERY = 10.0


# How deep a report is compacted: its own objects lie at most 2 deep (targets[].gpu,
# devices[].health); a checkpoint's manifest may nest deeper, and below 4 is kept as it came.
SHARED_DEPTH = 4


def compact_report(report: dict) -> dict:
    """A validated report as the governor keeps it, equal to it in every field, with its names
    and enumerated values (``core.wire.report_words``) as the one string each, and any other
    string or number that occurs more than once in it (a time in three fields, a GPU's UUID in
    its device and its kernels, an idle kernel's twelve 0.0 samples) as one object, and the
    names that most servers send alike (a GPU's model, a kernel's, the namespace:
    ``FLEET_FIELDS``) as one string across reports: JSON decoding makes a copy of each, and the
    governor keeps every server's last report (docs/benchmarks.md, "Issue 26, wave 6" and
    "wave 8")."""
    return _compact(report, {}, 0)


def _compact(obj: dict, seen: dict, depth: int) -> dict:
    # ``seen``: this report's strings and floats (never equal to one another), by value;
    # zeros apart, as -0.0 == 0.0 but is not the same number.
    words = _WORDS
    out = {}
    for key, value in obj.items():
        kind = type(value)
        if kind is str:
            value = words.get(value) or (
                _fleet_word(value) if key in FLEET_FIELDS else seen.setdefault(value, value)
            )
        elif kind is float:
            if value:
                value = seen.setdefault(value, value)
            elif copysign(1.0, value) > 0:
                value = _ZERO
        elif depth < SHARED_DEPTH:
            if kind is dict:
                value = _compact(value, seen, depth + 1)
            elif kind is list:
                value = _compact_list(value, seen, depth + 1)
        out[words.get(key, key)] = value
    return out


def _compact_list(items: list, seen: dict, depth: int) -> list:
    words = _WORDS
    out = []
    for value in items:
        kind = type(value)
        if kind is dict:
            value = _compact(value, seen, depth)
        elif kind is str:
            value = words.get(value) or seen.setdefault(value, value)
        elif kind is float:
            if value:
                value = seen.setdefault(value, value)
            elif copysign(1.0, value) > 0:
                value = _ZERO
        out.append(value)
    return out


def _fleet_word(value: str) -> str:
    shared = _FLEET_WORDS.get(value)
    if shared is None:
        if len(_FLEET_WORDS) >= FLEET_WORDS_KEPT:
            _FLEET_WORDS.clear()  # bounded, whatever servers send
        shared = _FLEET_WORDS[value] = value
    return shared


# Fields whose values most servers share: a device's and a target's name (the GPU's model,
# "python3"), a MIG profile, the namespace; their values, one string each, the first
# FLEET_WORDS_KEPT of them (then forgotten all at once and learnt again).
FLEET_FIELDS = frozenset(("name", "mig_profile", "namespace"))
FLEET_WORDS_KEPT = 4096
_FLEET_WORDS: dict[str, str] = {}


_ZERO = 0.0
_WORDS = report_words()


class Ingest:
    """Reports in (a part of ``Governor``)."""

    def ingest(self, report: dict) -> dict:
        """Keep a validated, authorised report; answer the server's current verdict."""
        report = compact_report(report)
        key = server_key(report["server"]["user"], report["server"].get("name", ""))
        now = clock.utcnow()
        self.reports[key] = Received(report, now)
        session = report["server"].get("started")
        use = self.use.get(key)
        if use is None or use.session != session:
            use = self.use[key] = _Use(session)
        use.add(report, now)
        context = self._context
        row = self.row(key)
        billed = self.ledger.open.get(key)
        self.diagnosis.observe(
            key,
            report,
            self._evidence(report, context.by_uuid, context.by_pod),
            now,
            team=(row.team or "") if row is not None else None,
            gpus=billed.gpus if billed is not None else None,
        )
        result = reported_checkpoint(report.get("checkpoint"))
        if result is not None and row is not None and result.answers(record_of(row)):
            self._checkpoints[key] = result  # a stale one never replaces the answer
        self._note_report(key)  # compared once, here: the pass looks only at what moved
        return self.verdict(key)

    async def hub_runs(self, key: str) -> bool:
        """Whether the Hub runs (or is starting) this server: reports for any other are refused,
        so no token can fill the governor's memory with servers that do not exist. Servers the
        last pass saw answer at once; others from the Hub, asked at most every
        ``HUB_LOOKUP_EVERY`` per user."""
        if key in self._servers:
            return True
        user, name = key.split("/", 1)
        now = time.monotonic()
        asked = self._hub_lookups.get(user)
        if asked is None or now - asked[0] > HUB_LOOKUP_EVERY:
            try:
                model = await self.hub.get_user(user)
            except HubApiError as error:
                log.warning("gpu-gov: cannot ask the Hub about %s: %s", key, error)
                return False
            if len(self._hub_lookups) > 10_000:
                self._hub_lookups.clear()
            asked = self._hub_lookups[user] = (now, frozenset((model or {}).get("servers") or ()))
        return name in asked[1]
