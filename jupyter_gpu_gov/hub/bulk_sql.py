"""A performance measure, kept apart: one prepared statement run over many rows straight
through the driver, for the usage ledger's writes and a pass's server rows
(docs/benchmarks-history.md, "With the usage ledger", "Wave 9"). The plain path is SQLAlchemy's
``Connection.execute`` of the same statement; ``tests/test_usage_service.py`` checks both store the
same."""

from __future__ import annotations

import operator
from collections.abc import Sequence

from sqlalchemy import JSON, Float


class Executemany:
    """A Core statement compiled once for a dialect and run as one DBAPI ``executemany`` of
    rows given as tuples in the order of ``names`` (its bind parameters).

    Through ``Connection.execute`` SQLAlchemy checks and converts every row's parameters one by
    one, which for the ledger's rows cost more than SQLite's writing (docs/benchmarks-history.md).
    Here the only per-row work is the column types' own conversions (UTC datetimes); ``Float``
    parameters must be given as ``float`` (their conversion is only ``float()``)."""

    def __init__(self, statement, dialect, names: Sequence[str]) -> None:
        compiled = statement.compile(dialect=dialect)
        self.sql = str(compiled)
        self.names = tuple(names)
        if set(self.names) != set(compiled.binds):
            raise ValueError(f"parameters {sorted(compiled.binds)}, given {self.names}")
        # Positional paramstyles (SQLite's qmark) take tuples in the statement's order; named
        # ones (psycopg's pyformat), dicts.
        order = list(compiled.positiontup) if compiled.positiontup else None
        self._named = order is None
        self._pick = None
        if order is not None and tuple(order) != self.names:
            self._pick = operator.itemgetter(*(self.names.index(n) for n in order))
        self._convert = []
        for i, name in enumerate(self.names):
            kind = compiled.binds[name].type
            processor = kind.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None and not isinstance(kind, Float):
                self._convert.append((i, processor, isinstance(kind, JSON)))

    def run(self, connection, rows: Sequence[tuple]) -> None:
        if self._convert:
            rows = [list(row) for row in rows]
            for i, processor, each in self._convert:
                if each:  # JSON documents (dicts) cannot be looked up: each is converted
                    for row in rows:
                        row[i] = processor(row[i])
                    continue
                # Rows of one call share values (every session's ``at`` is the pass's time):
                # each distinct value is converted once (these columns hold datetimes, strings).
                done: dict = {}
                for row in rows:
                    value = row[i]
                    if value not in done:
                        done[value] = processor(value)
                    row[i] = done[value]
        if self._named:
            params: Sequence = [dict(zip(self.names, row, strict=True)) for row in rows]
        elif self._pick is not None:
            params = [self._pick(row) for row in rows]
        else:
            params = [tuple(row) for row in rows]
        connection.exec_driver_sql(self.sql, params)
