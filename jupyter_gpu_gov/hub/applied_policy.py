"""Applied policies, kept where the service reads its policies at start-up: the governor's store
(docs/api.md, "Policy admin", says why the store and not a file).

Each apply, revert to the config file, and supersession by the config file is a row of
``applied_policies``; the newest says what governs after a restart. A row is written in the
same transaction as its audit row: there is never an applied policy the audit does not show,
nor an audit row of an apply that was not kept.

An apply carries the fingerprint of the config file's policies it was applied over. At start-up,
if the config file's policies are no longer those, the config file wins: a ``superseded`` row
says so and when, so the stale apply never comes back, even if the config file is later put
back as it was.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial

from sqlalchemy import (
    JSON,
    Column,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    insert,
    inspect,
    select,
    text,
)
from sqlalchemy.exc import DBAPIError

from ..core import clock
from ..core.policy import MAX_NAME, Match, Policy, canonical
from ..core.vocabulary import POLICY_APPLIED, POLICY_CONFIG_CHANGED
from .policy_admin import (
    APPLY,
    REVERT,
    SUPERSEDE,
    CandidateError,
    config_lines,
    diff,
    match_warnings,
    policy_admin,
    policy_names,
    start_dry_run,
    validate,
)
from .store import StoreUnavailable
from .tables import AuditRow, UtcDateTime

APPLIED, REVERTED, SUPERSEDED = "applied", "reverted", "superseded"  # kinds of kept rows
KEPT = (
    "kept: it governs after a restart too, unless the config file's policies change "
    "(then the config file wins, and says so)"
)

metadata = MetaData()
APPLIED_POLICIES = Table(
    "applied_policies",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", UtcDateTime(), nullable=False),
    Column("kind", String(16), nullable=False),  # applied | reverted | superseded
    Column("actor", String(255), nullable=False),
    Column("reason", Text, nullable=False),
    Column("candidate", JSON),  # an apply's {"policies": [...], "policy_defaults": {...}}
    Column("config_fingerprint", String(64), nullable=False),
    Column("of_id", Integer),  # a supersession's apply
    Column("audit_id", Integer),
)

# The policies in force as the service last had them (at start-up, each apply and revert):
# what a restart compares its policies with, so that one changed in the config file between two
# runs comes in as an applied one does (``in_force``), and an unchanged one keeps its time.
IN_FORCE = Table(
    "policies_in_force",
    metadata,
    Column("position", Integer, primary_key=True, autoincrement=False),
    Column("name", String(MAX_NAME), nullable=False),
    Column("digest", String(64), nullable=False),  # the policy, its in_force_since aside
    Column("match_digest", String(64), nullable=False),
    Column("since", UtcDateTime()),  # its in_force_since (None: since a start-up)
    # Its in_force_by: an admin's apply or revert, or the config file changed (NULL: kept by a
    # release before the column, which said "applied" of both).
    Column("origin", String(32)),
)


@dataclass(frozen=True)
class Stamp:
    """What ``in_force`` compares of a policy that was in force."""

    name: str
    digest: str
    match: str
    since: datetime | None
    by: str = POLICY_APPLIED  # how it came in at ``since``


def stamp(policy: Policy) -> Stamp:
    return Stamp(
        policy.name,
        _digest(policy),
        _digest(policy.match),
        policy.in_force_since,
        policy.in_force_by,
    )


def _digest(value: Policy | Match) -> str:
    """The policy's values that differ from the defaults (``core.policy.canonical``), hashed:
    a release adding a field with a default that keeps the old behaviour changes no digest,
    so no policy reads "changed" (and no server is warned again) at the upgrade's restart."""
    text = json.dumps(canonical(value), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


# ``Policy``'s fields in the releases that kept ``repr(Policy)``'s digest, in their order.
_REPR_FIELDS = (
    *("name", "match", "idle_threshold", "warn_after", "cull_after", "user_activity_grace"),
    *("away_after", "zombie_idle", "presence_limit", "busy_grace", "busy_limit"),
    *("on_busy_limit", "after_interrupt", "quiet_cell_limit", "extension_step"),
    *("max_extensions", "extension_reason", "max_age", "max_age_warning", "reclaim_grace"),
    *("checkpoint", "checkpoint_timeout", "on_checkpoint_failure", "checkpoint_retries"),
    *("checkpoint_max_delay", "checkpoint_broken_after", "cull_action", "exempt"),
    *("inactive_timeout", "expected_duration_notice", "in_force_since"),
)


def _repr_digest(value: Policy | Match) -> str:
    """The digest those releases kept: the dataclass ``repr`` of the policy as they had it
    (its ``in_force_since`` None), or of its match."""
    if isinstance(value, Policy):
        unstamped = replace(value, in_force_since=None)
        text = ", ".join(f"{name}={getattr(unstamped, name)!r}" for name in _REPR_FIELDS)
        text = f"Policy({text})"
    else:
        text = repr(value)
    return hashlib.sha256(text.encode()).hexdigest()


def _read_as_now(kept: list[Stamp], policies: list[Policy]) -> list[Stamp]:
    """Stamps kept in the ``repr`` form, read in today's: a kept digest that is the ``repr``
    digest of one of ``policies`` (or of its match) stands for that policy's digest now. One
    in today's form, or of a policy no longer there, is left as it is."""
    now = {}
    for p in policies:
        now[_repr_digest(p)] = _digest(p)
        now[_repr_digest(p.match)] = _digest(p.match)
    return [
        replace(s, digest=now.get(s.digest, s.digest), match=now.get(s.match, s.match))
        for s in kept
    ]


def _write_in_force(session, policies: list[Policy]) -> None:
    session.execute(IN_FORCE.delete())
    rows = [
        {
            "position": i,
            "name": s.name,
            "digest": s.digest,
            "match_digest": s.match,
            "since": s.since,
            "origin": s.by,
        }
        for i, s in enumerate(map(stamp, policies))
    ]
    if rows:
        session.execute(insert(IN_FORCE), rows)


def in_force_on_record(engine) -> list[Stamp] | None:
    """The policies in force when the service last kept them (None: never, here)."""
    metadata.create_all(engine)
    if "origin" not in {c["name"] for c in inspect(engine).get_columns(IN_FORCE.name)}:
        with engine.begin() as db:  # kept by a release before it
            db.execute(text(f"ALTER TABLE {IN_FORCE.name} ADD COLUMN origin VARCHAR(32)"))
    with engine.connect() as db:
        rows = db.execute(select(IN_FORCE).order_by(IN_FORCE.c.position)).all()
    return [
        Stamp(r.name, r.digest, r.match_digest, r.since, r.origin or POLICY_APPLIED) for r in rows
    ] or None


def fingerprint(config: Mapping, timeout_s: float, max_age_s: float | None) -> str:
    """The config file's policies, hashed: ``policies`` and ``policy_defaults`` and the timeout
    and max_age they are built over (a change to any of them changes what the file asks for)."""
    material = {**config, "timeout_s": timeout_s, "max_age_s": max_age_s}
    text = json.dumps(material, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Entry:
    kind: str
    at: datetime
    actor: str
    reason: str
    config_fingerprint: str
    candidate: dict | None = None
    of: Entry | None = None  # a supersession's apply
    id: int | None = None

    def summary(self) -> dict:
        return {"by": self.actor, "at": clock.isoformat(self.at), "reason": self.reason}


def record(store, audit: AuditRow, entry: Entry, policies: list[Policy] | None = None) -> None:
    """The audit row, then the entry (and the ``policies`` it puts in force), in one
    transaction: all on record, or nothing and ``StoreUnavailable`` says why."""
    metadata.create_all(store.engine)

    def write() -> None:
        with store.session() as session, session.begin():
            store.fence(session.connection())
            session.add(audit)
            session.flush()  # the audit row's id
            session.execute(
                insert(APPLIED_POLICIES).values(
                    at=entry.at,
                    kind=entry.kind,
                    actor=entry.actor,
                    reason=entry.reason,
                    candidate=entry.candidate,
                    config_fingerprint=entry.config_fingerprint,
                    of_id=entry.of.id if entry.of else None,
                    audit_id=audit.id,
                )
            )
            if policies is not None:
                _write_in_force(session, policies)

    try:
        store.write(write)  # after a pass's write in progress, not beside it
    except DBAPIError as error:
        raise StoreUnavailable(store.url, error) from error


def newest(engine) -> Entry | None:
    """The last apply, revert or supersession (None: nothing was ever applied here)."""
    metadata.create_all(engine)
    with engine.connect() as db:
        row = db.execute(
            select(APPLIED_POLICIES).order_by(APPLIED_POLICIES.c.id.desc()).limit(1)
        ).first()
        of = None
        if row is not None and row.of_id is not None:
            of = db.execute(
                select(APPLIED_POLICIES).where(APPLIED_POLICIES.c.id == row.of_id)
            ).first()
    return _entry(row, _entry(of)) if row is not None else None


def _entry(row, of: Entry | None = None) -> Entry | None:
    if row is None:
        return None
    return Entry(
        kind=row.kind,
        at=row.at,
        actor=row.actor,
        reason=row.reason,
        config_fingerprint=row.config_fingerprint,
        candidate=row.candidate,
        of=of,
        id=row.id,
    )


# -- apply, revert, start-up ---------------------------------------------------------------------


class StalePolicies(CandidateError):
    """The live policies are no longer those the change was made over (another admin's)."""


def version(source: Mapping) -> str:
    """The live policies' source, hashed: what an admin read them as (``GET api/policy``, the
    policy page), to change them over."""
    text = json.dumps(source, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_over(governor, over: str | None) -> None:
    """``StalePolicies`` when ``over`` (a version of the live policies a person read) is not
    the live one: for what compares a candidate with the live policies (the what-if) too."""
    _check_over(policy_admin(governor), over)


def _check_over(admin, over: str | None) -> None:
    """Refuse a change made over policies that are no longer live: two admins editing from the
    same page, or an apply after a prediction on policies another admin has since changed,
    silently undid the other's change."""
    if over is None or over == version(admin.source):
        return
    latest = (
        f"applied by {admin.applied['by']} at {admin.applied['at']} ({admin.applied['reason']})"
        if admin.applied
        else "the config file's govern"
    )
    raise StalePolicies(
        f"the live policies changed since you read them (now: {latest}): compare them with "
        "your candidate, then apply again"
    )


def apply(
    governor,
    candidate: dict,
    actor: str,
    reason: str,
    dry_run: bool = False,
    over: str | None = None,
) -> dict:
    """Audit the change (who, why, the diff), then make it: the candidate is kept in the store
    (in the audit's transaction) and governs from the next pass, or runs as a dry run beside
    the live policy. ``StoreUnavailable`` when either cannot be written: then nothing changed.
    ``over``: the ``version`` of the live policies it was made over (``StalePolicies`` if they
    changed since; None: not checked)."""
    admin = policy_admin(governor)
    # A dry run too: beside other live policies than those read, it compares the wrong ones.
    _check_over(admin, over)  # no await from here to the record: one change at a time
    if dry_run:
        return start_dry_run(governor, candidate, actor, reason)
    policies = validate(candidate, governor.options)
    config_of(governor)
    changes = diff(admin.source, candidate)
    now = clock.utcnow()
    row = AuditRow(
        at=now,
        action=APPLY,
        reason=reason,
        actor=actor,
        details={"diff": changes, "candidate": candidate, "policies": policy_names(policies)},
    )
    entry = Entry(APPLIED, now, actor, reason, admin.fingerprint, candidate)
    policies = in_force(policies, now, governor.policies)
    record(governor.store, row, entry, policies)  # on record and kept before it governs
    governor.policies = policies
    admin.source = candidate
    admin.applied = entry.summary()
    admin.superseded = None
    return {
        "applied": True,
        "policies": policy_names(policies),
        "diff": changes,
        "persists": True,
        "note": KEPT,
        "warnings": match_warnings(governor, policies),
        "config": config_lines(candidate),
    }


def revert(governor, actor: str, reason: str, over: str | None = None) -> dict:
    """Back to the config file's policies, audited and kept; ``CandidateError`` when they
    already govern (``StalePolicies``: not those read, ``over``)."""
    admin = policy_admin(governor)
    config = config_of(governor)
    if admin.applied is None:
        raise CandidateError("the config file's policies already govern: nothing to revert")
    _check_over(admin, over)
    changes = diff(admin.source, config)
    now = clock.utcnow()
    row = AuditRow(at=now, action=REVERT, reason=reason, actor=actor, details={"diff": changes})
    policies = in_force(admin.config_policies, now, governor.policies)
    record(governor.store, row, Entry(REVERTED, now, actor, reason, admin.fingerprint), policies)
    governor.policies = policies
    admin.source, admin.applied = config, None
    return {"reverted": True, "policies": policy_names(governor.policies), "diff": changes}


def in_force(
    policies: list[Policy],
    since: datetime,
    live: list[Policy] | list[Stamp] = (),
    by: str = POLICY_APPLIED,
) -> list[Policy]:
    """``policies`` as applied at ``since`` over ``live`` (those in force, or as kept at the
    last run): a deadline they bring in has its full notice from then
    (``Policy.in_force_since``), and its owner is told how it came in (``by``: an admin's
    apply or revert, or the config file changed). A policy that governs the same servers as
    before keeps its time and how it came in, so that an apply elsewhere gives its warned
    servers no second warning: the policy of that name unchanged, and the same matches ahead
    of it (``select`` takes the first that matches: a change to another's limits moves no
    server, one to its match may)."""
    before = _read_as_now([s if isinstance(s, Stamp) else stamp(s) for s in live], policies)
    after = [stamp(p) for p in policies]
    old = {s.name: (s, ahead) for s, ahead in zip(before, _aheads(before), strict=True)}
    kept = []
    for p, s, ahead in zip(policies, after, _aheads(after), strict=True):
        found = old.get(p.name)
        same = found is not None and found[0].digest == s.digest and found[1] == ahead
        if same:
            kept.append(replace(p, in_force_since=found[0].since, in_force_by=found[0].by))
        else:
            kept.append(replace(p, in_force_since=since, in_force_by=by))
    return kept


def _aheads(stamps: list[Stamp]) -> list[str]:
    """For each policy, the matches of those before it, hashed."""
    ahead, out = hashlib.sha256(), []
    for s in stamps:
        out.append(ahead.hexdigest())
        ahead.update(s.match.encode())
    return out


def config_of(governor) -> dict:
    """The config file's policies' source (``start`` sets it; a governor built without the
    service, as in tests, has its start-up policies)."""
    admin = policy_admin(governor)
    if admin.config is None:
        admin.config, admin.config_policies = admin.source, list(governor.policies)
        admin.fingerprint = _fingerprint(admin.config, governor.options)
    return admin.config


def _fingerprint(config: Mapping, options) -> str:
    max_age = options.max_age.total_seconds() if options.max_age else None
    return fingerprint(config, options.timeout.total_seconds(), max_age)


def start(governor, config: dict, log) -> None:
    """At start-up: the config file's policies, then the applied one, if it was applied over
    these same config policies; else the config file wins, and a ``superseded`` row and audit
    row say so (once: the stale apply does not come back). A policy that differs from the one
    of its name in force at the last run comes in as an applied one does, now: a server warned
    under the old one is warned again with the full notice, not stopped in the first pass (the
    new notice counted from the old warning), and a maximum age it brings in warns first."""
    previous = in_force_on_record(governor.store.engine)
    _start(governor, config, log)
    now = clock.utcnow()
    if previous is not None:
        governor.policies = in_force(governor.policies, now, previous, POLICY_CONFIG_CHANGED)
    # Kept before the wall clock stepped back (between runs): in force from now at the latest,
    # else every warned server was warned again at each pass and no deadline came.
    ahead = [p.name for p in governor.policies if p.in_force_since and p.in_force_since > now]
    if ahead:
        governor.policies = [
            replace(p, in_force_since=clock.not_after(p.in_force_since, now))
            for p in governor.policies
        ]
        log.warning(
            "policies: kept as in force from a time still to come (the wall clock stepped back "
            "since), in force from now: %s",
            ", ".join(ahead),
        )
    if previous is not None:
        since = {s.name: s.since for s in previous}
        changed = [
            p.name
            for p in governor.policies
            if p.name not in ahead and p.in_force_since != since.get(p.name, 0)
        ]
        if changed:
            log.warning(
                "policies: in force from now, as if applied (changed since the service last "
                "ran, or governing other servers): %s",
                ", ".join(changed),
            )
    try:
        governor.store.write(partial(_keep_in_force, governor.store, governor.policies))
    except DBAPIError as error:  # compared with the last kept at the next start
        log.error("policies: the policies in force are not on record: %s", error)


def _keep_in_force(store, policies: list[Policy], fenced: bool = False) -> None:
    with store.session() as session, session.begin():
        if fenced:  # the holder of the lease only (hub/lease.py)
            store.fence(session.connection())
        _write_in_force(session, policies)


async def keep_moved_in_force(store, policies: list[Policy]) -> None:
    """The policies' in-force times as a step of the wall clock moved them, kept for the next
    start (which read them as before the step: ahead of the clock after a step back, so
    notices never ended; behind it after one ahead, cut short). ``StoreUnavailable``."""
    try:
        await store.write_async(partial(_keep_in_force, store, policies, fenced=True))
    except DBAPIError as error:
        raise StoreUnavailable(store.url, error) from error


def _start(governor, config: dict, log) -> None:
    admin = policy_admin(governor)
    admin.source, admin.config = config, None
    config_of(governor)
    entry = newest(governor.store.engine)
    if entry is not None and entry.kind == REVERTED:
        governor.policies = in_force(admin.config_policies, entry.at)
    if entry is None or entry.kind == REVERTED:
        log.info("policies: the config file's (%s)", ", ".join(policy_names(governor.policies)))
        return
    if entry.kind == SUPERSEDED:
        admin.superseded = _superseded(entry.of or entry, entry.at, entry.reason)
        log.warning(_superseded_line(admin.superseded))
        return
    why = "the config file's policies changed since it was applied"
    if entry.config_fingerprint == admin.fingerprint:
        try:
            policies = validate(entry.candidate, governor.options)
        except CandidateError as error:
            why = f"it is no longer valid ({error})"
        else:
            governor.policies = in_force(policies, entry.at)
            admin.source, admin.applied = entry.candidate, entry.summary()
            log.info(
                "policies: applied by %s at %s (%s) in force over the config file's: %s",
                entry.actor,
                admin.applied["at"],
                entry.reason,
                ", ".join(policy_names(policies)),
            )
            return
    now = clock.utcnow()
    admin.superseded = _superseded(entry, now, why)
    log.warning(_superseded_line(admin.superseded))
    row = AuditRow(at=now, action=SUPERSEDE, reason=why, details=admin.superseded)
    try:
        record(
            governor.store,
            row,
            Entry(SUPERSEDED, now, "governor", why, admin.fingerprint, of=entry),
        )
    except StoreUnavailable as error:  # the config file governs anyway; said again next start
        log.error("policies: the supersession is not on record: %s", error)


def policy_view(governor) -> dict:
    """The live policies' source, where they come from (``origin``: config or applied), the
    apply in force or the one the config file superseded, and a dry run under way."""
    admin = policy_admin(governor)
    dry = admin.dry_run
    return {
        "source": admin.source,
        "version": version(admin.source),
        "policies": policy_names(governor.policies),
        "origin": admin.origin,
        "applied": admin.applied,
        "superseded": admin.superseded,
        "dry_run": None
        if dry is None
        else {"since": clock.isoformat(dry.since), "by": dry.actor, "candidate": dry.source},
    }


def _superseded(applied: Entry, since: datetime, why: str) -> dict:
    return {**applied.summary(), "since": clock.isoformat(since), "why": why}


def _superseded_line(superseded: dict) -> str:
    return (
        f"policies: the config file's govern; the policy applied by {superseded['by']} at "
        f"{superseded['at']} ({superseded['reason']}) was superseded by the config file at "
        f"{superseded['since']}: {superseded['why']}"
    )
