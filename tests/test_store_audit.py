"""New audit rows are stored as SQLAlchemy's ORM stored them (the store inserts them with one
Core statement; hub/store.py): the same values in every column, a column's default where a row
left it unset or None, SQL NULL and JSON null kept apart, ids rising in the rows' order and
given to the rows, so a cull's outcome lands on its own row."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.hub.store import Store
from jupyter_gpu_gov.hub.tables import AuditRow

COLUMNS = ("at", "server_key", "user", "action", "reason", "actor", "dry_run", "details")


def _rows(now, make=AuditRow) -> list[AuditRow]:
    """``make``: the ORM's constructor, or ``AuditRow.made`` (a pass's rows)."""
    return [
        make(at=now, action="clock-step", reason="stepped"),  # the rest unset
        make(
            at=now,
            server_key=None,
            user=None,
            action="warn",
            reason=None,
            actor=None,
            dry_run=None,
            details=None,
        ),
        make(
            at=now + timedelta(seconds=1),
            server_key="ann/",
            user="ann",
            action="cull",
            reason="idle 2 h",
            actor="user:bob",
            dry_run=True,
            details={"gpus": ["GPU-1"], "n": 2},
        ),
        make(at=now, server_key="bo/x", user="bo", action="error", reason="e", actor="governor"),
    ]


def _stored(store: Store, ids: list[int]) -> list[tuple]:
    audit = AuditRow.__table__
    query = select(audit.c.id, *(audit.c[c] for c in COLUMNS)).where(audit.c.id.in_(ids))
    with store.engine.connect() as db:
        return [tuple(r) for r in db.execute(query.order_by(audit.c.id))]


def audit_rows_store_as_the_orm_stored(url: str) -> None:
    store = Store(url)
    now = clock.utcnow()
    orm = _rows(now)
    with store.session() as session, session.begin():
        session.add_all(orm)  # how audit rows were written before
    made = _rows(now, AuditRow.made)  # made without the constructor, flushed by the ORM
    with store.session() as session, session.begin():
        session.add_all(made)  # (a database that cannot return ids in order)
    written = _rows(now, AuditRow.made)
    store.save(audits=written)

    ids = [row.id for row in written]
    assert ids == sorted(ids) and len(set(ids)) == len(ids) and ids[0] > made[-1].id
    before, after = _stored(store, [r.id for r in orm]), _stored(store, ids)
    assert [r[1:] for r in after] == [r[1:] for r in before]
    assert [r[1:] for r in _stored(store, [r.id for r in made])] == [r[1:] for r in before]
    assert [r[0] for r in after] == ids
    # SQL NULL (left unset) and JSON null (set to None) stay apart.
    with store.engine.connect() as db:
        audit = AuditRow.__table__
        nulls = db.execute(
            select(audit.c.details.is_(None)).where(audit.c.id.in_(ids)).order_by(audit.c.id)
        ).scalars()
        assert list(nulls) == [True, False, False, True]
    # The rows in memory hold what was stored, as after a flush.
    for mine, flushed, theirs in zip(written, made, orm, strict=True):
        assert [getattr(mine, c) for c in COLUMNS] == [getattr(theirs, c) for c in COLUMNS]
        assert [getattr(flushed, c) for c in COLUMNS] == [getattr(theirs, c) for c in COLUMNS]
    # A cull's outcome is written on its own row, by the id it was given.
    written[2].reason = "idle 2 h; culled"
    store.save(updated_audits=[written[2]])
    assert [r.reason for r in store.audit_rows(limit=2)] == ["e", "idle 2 h; culled"]


def test_audit_rows_store_as_the_orm_stored_on_sqlite(tmp_path):
    audit_rows_store_as_the_orm_stored(f"sqlite:///{tmp_path}/gov.sqlite")


def test_an_audit_row_made_refuses_what_is_not_its_column():
    """A misspelt column is an error, as the ORM's constructor made it, not a value dropped."""
    with pytest.raises(TypeError, match="reasn"):
        AuditRow.made(at=clock.utcnow(), action="warn", reasn="idle")
    with pytest.raises(TypeError):
        AuditRow(at=clock.utcnow(), action="warn", reasn="idle")
