"""Reports in: a validated report kept (its arrival on the governor's clock), measured for
right-sizing, fed to the diagnosis, its finished checkpoint taken; the server's verdict
answered. Reports are accepted only for servers the Hub runs, and forgotten once stale."""

from __future__ import annotations

import dataclasses
import logging
import marshal
import time
import typing
from collections.abc import Iterator, Mapping
from math import copysign
from operator import attrgetter
from typing import Any

from ..core import browser_json, clock
from ..core.vocabulary import server_key
from ..core.wire import CheckpointState, Report, TargetCpu, TargetGpu, Wire, report_words
from .checkpoints import reported_checkpoint
from .diagnosis_windows import trusted_node
from .evidence import Received
from .hubapi import HubApiError
from .tables import record_of
from .usage import _Use

log = logging.getLogger("jupyter_gpu_gov.hub")

# How often a report for a server the last pass did not see may ask the Hub about its user.
HUB_LOOKUP_EVERY = 10.0


# How deep a report's free-form objects (a device's health, a checkpoint's manifest, which may
# nest deeper) are compacted, counting from the report: below 4 they are kept as they came.
SHARED_DEPTH = 4


class _Absent:
    """A field the report did not send: ``in``, ``get`` and ``[]`` read it as the JSON object
    did (absent is not ``null``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<absent>"


ABSENT = _Absent()


class Section(Mapping):
    """One object of a kept report (the report, its server, a device, a target and its ``gpu``
    and ``cpu``, the window, the checkpoint), read as the validated JSON object it was
    (``section["kind"]``, ``get``, ``in``, iterating the fields it sent), with one slot per
    field of its ``core.wire`` dataclass instead of a dict: a target's is 112 bytes, its dict
    272 (docs/benchmarks-history.md, "Issue 26, wave 14"). Read-only. What the wire does not define
    is not kept (nothing reads it); lists are tuples; sections compare equal field by field."""

    __slots__ = ()
    FIELDS: frozenset[str] = frozenset()
    _names: tuple[str, ...] = ()  # the wire's fields, in its order
    # How each field is kept: (name, its section's class where it is an object, the class of
    # its items' sections, or ``tuple``, where it is a list).
    _layout: tuple[tuple[str, type | None, type | None], ...] = ()

    def __getitem__(self, key: str) -> Any:
        if key in self.FIELDS:  # only fields: never a method's name
            value = getattr(self, key)
            if value is not ABSENT:
                return value
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.FIELDS:
            value = getattr(self, key)
            if value is not ABSENT:
                return value
        return default

    def __contains__(self, key: object) -> bool:
        return key in self.FIELDS and getattr(self, key) is not ABSENT

    def __iter__(self) -> Iterator[str]:
        return (name for name in self._names if getattr(self, name) is not ABSENT)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __eq__(self, other: object) -> bool:
        if type(other) is type(self):
            return self._values(self) == self._values(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self)!r})"

    def to_json(self) -> dict:
        """The JSON object it was (tuples as lists)."""
        return {name: _to_json(value) for name, value in self.items()}


def _to_json(value: Any) -> Any:
    if isinstance(value, Section):
        return value.to_json()
    if type(value) is tuple:
        return [_to_json(v) for v in value]
    return value


def _section_classes() -> dict[type, type[Section]]:
    """A ``Section`` class for each object of the report, from its ``core.wire`` dataclass."""
    classes: dict[type, type[Section]] = {}

    def section_of(wire: type) -> type[Section]:
        if wire not in classes:
            names = tuple(f.name for f in dataclasses.fields(wire))
            # A dataclass for its ``__init__`` (one assignment a slot: fast, each report makes
            # ~16 of these); equality, hash and repr are ``Section``'s.
            kept = classes[wire] = dataclasses.make_dataclass(
                wire.__name__,
                [(name, Any) for name in names],
                bases=(Section,),
                namespace={
                    "__module__": __name__,
                    "__doc__": f"``core.wire.{wire.__name__}`` as the governor keeps it.",
                    "FIELDS": frozenset(names),
                    "_names": names,
                    "_values": attrgetter(*names),
                },
                slots=True,
                eq=False,
                repr=False,
                match_args=False,
            )
            hints = typing.get_type_hints(wire)
            kept._layout = tuple((name, *how(hints[name])) for name in names)
        return classes[wire]

    def how(hint: Any) -> tuple[type | None, type | None]:
        for part in (hint, *typing.get_args(hint)):  # X, X | None, tuple[X, ...]
            if isinstance(part, type) and issubclass(part, Wire):
                return section_of(part), None
            if typing.get_origin(part) is tuple:
                item = typing.get_args(part)[0]
                nested = isinstance(item, type) and issubclass(item, Wire)
                return None, section_of(item) if nested else tuple
        return None, None

    section_of(Report)
    return classes


SECTIONS = _section_classes()
KeptReport = SECTIONS[Report]


def compact_report(report: Mapping, held: Mapping[str, str] | None = None) -> Section:
    """A validated report as the governor keeps it (``KeptReport``), equal to it in every field
    the wire defines, read as it is: its objects as ``Section``s, its names and enumerated
    values (``core.wire.report_words``) as the one string each, and any other string or
    number that occurs more than once in it (a time in three fields, a GPU's UUID in its
    device and its kernels, an idle kernel's twelve 0.0 samples) as one object, and the names
    that most servers send alike (a GPU's model, a kernel's, the namespace: ``FLEET_FIELDS``)
    as one string across reports: JSON decoding makes a copy of each, and the governor keeps
    every server's last report (docs/benchmarks-history.md, "Issue 26, wave 6", "wave 8" and
    "wave 14"). ``held``: texts the governor already holds for as long (a GPU's UUID as DCGM's
    read has it, the pod's, the user's name as the server's row has it), by value: the report
    keeps those objects, not its own equal copies."""
    return _keep(KeptReport, report, dict(held) if held else {}, 0)


def _keep(kind: type[Section], obj: Mapping, seen: dict, depth: int) -> Section:
    text = None
    if kind in _FLEET_KINDS:
        # An object sent byte for byte as one that was kept shared is that shared section, not
        # walked again: most targets send a ``cpu`` and a ``gpu`` many others send (these
        # kinds were ~45 % of compact_report's time: docs/benchmarks-history.md, "Issue 26,
        # wave 46: a report's shared sections"). ``marshal`` writes each value with
        # its type (0, 0.0 and false apart; -0.0 and NaN apart from 0.0 and null); its version
        # 2 writes no references, which would depend on what else holds an object. (Such a
        # section's numbers are then not this report's ``seen``: an equal one later in the
        # report keeps its own object, as many objects as before.)
        try:
            text = (kind, marshal.dumps(obj, 2))
        except ValueError:  # nested deeper than marshal writes: walked
            pass
        else:
            shared = _FLEET_TEXTS.get(text)
            if shared is not None:
                return shared
    words, fleet_words = _WORDS, _FLEET_WORDS
    values = []
    for name, one, many in kind._layout:
        value = obj.get(name, ABSENT)
        type_ = type(value)
        if type_ is str:
            value = words.get(value) or (
                (fleet_words.get(value) or _fleet_word(value))
                if name in FLEET_FIELDS
                else seen.setdefault(value, value)
            )
        elif type_ is float:
            if value:
                value = seen.setdefault(value, value)
            elif copysign(1.0, value) > 0:
                value = _ZERO
        elif type_ is dict:
            value = (
                _keep(one, value, seen, depth + 1)
                if one is not None
                else _compact(value, seen, depth + 1)
            )
        elif type_ is list:
            if not value and many is not None:
                value = ()  # an idle kernel's devices and history: the one empty tuple
            elif many is tuple:
                value = _fleet_tuple(_compact_list(value, seen, depth + 1))
            elif many is not None:  # validated: objects
                value = tuple([_keep(many, item, seen, depth + 1) for item in value])
            else:
                value = _compact_list(value, seen, depth + 1)
        values.append(value)
    if text is not None:
        return _fleet_section(kind, values, text)
    if kind in _FLEET_KINDS:
        return _fleet_section(kind, values)
    return kind(*values)


def _compact(obj: dict, seen: dict, depth: int) -> dict:
    """A free-form object of a report, its strings and numbers shared. ``seen``: this report's
    strings and floats (never equal to one another), by value; zeros apart, as -0.0 == 0.0 but
    is not the same number."""
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


def _fleet_section(kind: type[Section], values: list, text: tuple | None = None) -> Section:
    """The one section of ``kind`` with these values across reports (a kernel without a GPU
    context sends the same ``gpu`` object as every other, an idle one often the same ``cpu``,
    most servers the same empty ``checkpoint``), where each value is one a JSON object could
    hold equal to another's only if the same: ``None``, a boolean, a number but ``-0.0`` and
    NaN (the key holds the values' types, so 0, 0.0 and ``false`` differ), an empty list, a
    word of the wire's (``core.wire.report_words``: a state, a confidence). A section with a
    time, a UUID, a list or a free-form object is the report's own. Sections are read-only,
    so sharing one is reading it; the first ``FLEET_SECTIONS_KEPT`` kept, then forgotten all
    at once and learnt again, as ``_fleet_word``'s. ``text``: the object's own (``_keep``),
    by which the section is found again."""
    if not _alike(values):
        return kind(*values)
    key = (kind, *values, *map(type, values))
    shared = _FLEET_SECTIONS.get(key)
    if shared is None:
        if len(_FLEET_SECTIONS) >= FLEET_SECTIONS_KEPT:
            _forget_fleet()  # bounded, whatever servers send
        shared = _FLEET_SECTIONS[key] = kind(*values)
    if text is not None:
        if len(_FLEET_TEXTS) >= FLEET_SECTIONS_KEPT:
            _FLEET_TEXTS.clear()  # bounded likewise
        _FLEET_TEXTS[text] = shared
    return shared


def _forget_fleet() -> None:
    """The shared sections and tuples forgotten, and the texts that found them (a text finds
    only a section the table holds: what the walk would find)."""
    _FLEET_SECTIONS.clear()
    _FLEET_TEXTS.clear()


def _fleet_tuple(items: list) -> tuple:
    """A report's list of numbers or words (a kernel's ``history``, its ``pids``) as the one
    tuple with these items across reports where each is one ``_fleet_section`` shares (an idle
    kernel's twelve 0.0 samples: 152 bytes a server); kept in
    ``_FLEET_SECTIONS``, keyed apart from sections by ``tuple``; a longer list than
    ``FLEET_TUPLE_ITEMS`` is the report's own (what the table may hold stays a section's size)."""
    if not items or len(items) > FLEET_TUPLE_ITEMS or not _alike(items):
        return tuple(items)
    key = (tuple, *items, *map(type, items))
    shared = _FLEET_SECTIONS.get(key)
    if shared is None:
        if len(_FLEET_SECTIONS) >= FLEET_SECTIONS_KEPT:
            _forget_fleet()  # bounded, whatever servers send
        shared = _FLEET_SECTIONS[key] = tuple(items)
    return shared


def _alike(values: list) -> bool:
    """Whether every value is one a JSON object could hold equal to another's only if the same
    (``_fleet_section``)."""
    for value in values:
        kind_of = type(value)
        if kind_of is float:
            if value != value or (not value and value is not _ZERO):  # NaN, -0.0
                return False
        elif kind_of is str:
            if _WORDS.get(value) is not value:  # a time, a UUID: this server's own
                return False
        elif kind_of is tuple:
            if value:
                return False
        elif kind_of not in _PLAIN:
            return False
    return True


# Fields whose values most servers share: a device's and a target's name (the GPU's model,
# "python3"), a MIG profile, the namespace; their values, one string each, the first
# FLEET_WORDS_KEPT of them (then forgotten all at once and learnt again).
FLEET_FIELDS = frozenset(("name", "mig_profile", "namespace"))
FLEET_WORDS_KEPT = 4096
_FLEET_WORDS: dict[str, str] = {}


_ZERO = 0.0
_WORDS = report_words()

# The sections many reports send alike, one object each across reports (``_fleet_section``).
_FLEET_KINDS = frozenset(SECTIONS[wire] for wire in (TargetGpu, TargetCpu, CheckpointState))
_PLAIN = frozenset((type(None), bool, int, _Absent))
FLEET_SECTIONS_KEPT = 4096
FLEET_TUPLE_ITEMS = 16  # a sampler's window is 12 samples
_FLEET_SECTIONS: dict[tuple, Section] = {}
# The objects' texts (``marshal``'s) that made a shared section, by kind: at most as many.
_FLEET_TEXTS: dict[tuple[type, bytes], Section] = {}


def _holds_gpu(report: Mapping) -> bool:
    """Whether a report shows its server holding a GPU: a context, or GPUs allocated to it."""
    if any(t["gpu"]["holds_context"] for t in report["targets"]):
        return True
    return bool(report["devices"]) and bool(report["server"].get("gpu_allocated"))


class Ingest:
    """Reports in (a part of ``Governor``)."""

    def ingest(self, report: dict) -> dict:
        """Keep a validated, authorised report; answer the server's current verdict."""
        key = self._keep_report(report)
        return self._not_assessed(key) if self._last_session(key) else self.verdict(key)

    def ingest_answer(self, report: dict) -> bytes:
        """``ingest``, answered as the report route sends it (``Views.answer``)."""
        key = self._keep_report(report)
        if self._last_session(key):
            return browser_json.dumps({"verdict": self._not_assessed(key)}).encode()
        return self.answer(key)

    def _last_session(self, key: str) -> bool:
        """Whether the server's row is a stopped session's: a report of a server started again
        comes before the pass that sees it, and the old session's verdict (warned, its cull
        due) would be shown on the fresh server until its next report."""
        row = self.row(key)
        return row is not None and not row.running

    def _keep_report(self, report: dict) -> str:
        """Keep a validated, authorised report; its server's key."""
        # What is kept is the compact form; what only reads the report now (the use meter,
        # DCGM's evidence, the diagnosis: each keeps numbers, not the report) reads the
        # decoded JSON, whose ``get`` is C's, not a section's (docs/benchmarks-history.md, "Issue
        # 26, wave 14: the kept reports").
        decoded, report = report, compact_report(report, self._held_texts(report))
        key = server_key(report["server"]["user"], report["server"].get("name", ""))
        now = clock.utcnow()
        session = report["server"].get("started")
        before = self.reports.get(key)
        if before is not None and before.report["server"].get("started") == session:
            gpu_since = before.gpu_since or (now if _holds_gpu(decoded) else None)
        else:  # this process's first report here (or the governor's first since it started)
            gpu_since = now if _holds_gpu(decoded) else None
        self.reports[key] = Received(report, now, gpu_since)
        use = self.use.get(key)
        if use is None or use.session != session:
            use = self.use[key] = _Use(session)
        use.add(decoded, now)
        context = self._context
        row = self.row(key)
        billed = self.ledger.open.get(key)
        hub_server = self._servers.get(key)
        # The node a window teaches, from the Hub's records, never from the report.
        node = None
        if hub_server is not None:
            profile = row.profile if row is not None else None
            node = trusted_node(hub_server.spawner_state, profile, context.by_uuid, context.by_pod)
        self.diagnosis.observe(
            key,
            decoded,
            self._report_evidence(decoded, hub_server),
            now,
            team=(row.team or "") if row is not None else None,
            gpus=billed.gpus if billed is not None else None,
            # A report that contradicts the Hub's records may name another node's GPU, and
            # one nothing but the report places names what it likes: either would teach
            # that node's reference what its neighbours are read against.
            learn=key not in self._distrusted and node is not None,
            node=node,
            believed=key not in self._distrusted,
        )
        result = reported_checkpoint(report.get("checkpoint"))
        if result is not None and row is not None and result.answers(record_of(row)):
            self._checkpoints[key] = result  # a stale one never replaces the answer
        self._note_report(key)  # compared once, here: the pass looks only at what moved
        return key

    def _held_texts(self, report: Mapping) -> dict[str, str]:
        """The texts of a validated report the governor already holds, as it holds them: its
        GPUs' UUIDs and its pod as the last DCGM read has them (interned there, one string from
        read to read), its user's name as the server's row has it. A copy of each a server was
        ~250 bytes (docs/benchmarks-history.md, "Issue 26, wave 43: the service's
        memory")."""
        held = {}
        server = report["server"]
        user = server["user"]
        row = self.rows.get(server_key(user, server.get("name", "")))
        if row is not None and row.user == user:
            held[user] = row.user
        context = self._context
        by_uuid = context.by_uuid
        if by_uuid:
            for device in report["devices"]:
                for field in ("uuid", "parent_uuid"):
                    records = by_uuid.get(device.get(field))
                    if records:
                        held[records[0].uuid] = records[0].uuid
        pod = server.get("pod")
        if pod is not None and context.by_pod:
            records = context.by_pod.get((server.get("namespace"), pod))
            if records:
                held[pod] = records[0].pod
        return held

    def hub_ran(self, key: str) -> bool:
        """Whether the last pass saw the Hub run this server (``hub_runs`` without asking)."""
        return key in self._servers

    async def hub_runs(self, key: str, names: tuple[str, str] | None = None) -> bool:
        """Whether the Hub runs (or is starting) this server: reports for any other are refused,
        so no token can fill the governor's memory with servers that do not exist. Servers the
        last pass saw answer at once; others from the Hub, asked at most every
        ``HUB_LOOKUP_EVERY`` per user. ``names``: the user's and the server's names as the Hub
        gives them (a report's), where ``key`` holds a kept form (``core.text.stored_name``):
        the Hub knows no user by that, and the server's reports were refused until a pass
        listed it."""
        if key in self._servers:
            return True
        if not self.acting:  # on standby: the holder's word, from the store (its last listing)
            row = self.row(key)
            if row is not None and row.running:
                return True
        user, name = names or key.split("/", 1)
        now = time.monotonic()
        asked = self._hub_lookups.get(user)
        if asked is None or now - asked[0] > HUB_LOOKUP_EVERY:
            try:
                model = await self.hub.get_user(user)
            except HubApiError as error:
                log.warning("gpu-gov: cannot ask the Hub about %.80r: %s", key, error)
                return False
            if len(self._hub_lookups) > 10_000:
                self._hub_lookups.clear()
            asked = self._hub_lookups[user] = (now, frozenset((model or {}).get("servers") or ()))
        return name in asked[1]
