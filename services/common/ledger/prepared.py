"""Core statements run on the database driver's own cursor, inside a SQLAlchemy transaction.

A round's ledger steps are a dozen short statements each, run hundreds of times a
second at 200 hospitals. SQLAlchemy spends about 40 microseconds of CPU setting up
each one (an execution context, its cache lookup, a result object); the driver
itself takes a few. A :class:`Prepared` statement is compiled once per dialect, with
SQLAlchemy's own compiler, and run with SQLAlchemy's own type processing (JSON,
enums and times are stored exactly as a plain ``Connection.execute`` stores them),
on the driver connection of the caller's :class:`~sqlalchemy.Connection`: in its
transaction, which SQLAlchemy begins, commits and rolls back as before.

What stays as with ``Connection.execute``: the engine's ``before_cursor_execute``
and ``after_cursor_execute`` listeners see every statement (an injected failure or a
tracer works as before), a driver error comes out as SQLAlchemy's exception (an
``IntegrityError`` is one), a lost connection is invalidated, and a connection with
no transaction begins one first (autobegin: on SQLite ``BEGIN IMMEDIATE``).

Only statements whose parameters are all plain binds: an expanding ``IN`` list is
refused when compiled (run those with ``Connection.execute``), and so is a bind the
statement would fill from a column default, which the caller must give instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement

Row = tuple[Any, ...]
Processor = Callable[[Any], Any]


#: A bind the caller must give.
_REQUIRED = object()


@dataclass
class _Form:
    """A statement as one dialect runs it."""

    dialect: Dialect
    sql: str
    #: Bind names in the order the driver takes them (qmark), or None where it takes them
    #: by name (pyformat: psycopg).
    order: tuple[str, ...] | None
    #: Each bind's processor (SQLAlchemy's, for its type and this dialect; None for none)
    #: and its value when the caller gives none (a literal of the statement).
    binds: dict[str, tuple[Processor | None, Any]]
    #: Each result column's type (None: the statement returns no rows).
    columns: tuple[Any, ...] | None
    #: The result processors, from the first cursor's description.
    results: tuple[Processor | None, ...] | None = None


class Prepared:
    """``statement`` (SQLAlchemy Core), run on the driver's cursor (module docstring)."""

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement
        self._forms: dict[Dialect, _Form] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Prepared({self.statement})"

    def _form(self, dialect: Dialect) -> _Form:
        form = self._forms.get(dialect)
        if form is None:
            with self._lock:
                form = self._forms.get(dialect)
                if form is None:
                    form = self._forms[dialect] = self._compile(dialect)
        return form

    def _compile(self, dialect: Dialect) -> _Form:
        compiled: Any = self.statement.compile(dialect=dialect)
        if "__[POSTCOMPILE_" in compiled.string:
            raise TypeError(f"an expanding IN list cannot be prepared: {self.statement}")
        if getattr(compiled, "escaped_bind_names", None):
            raise TypeError(f"bind names that need escaping cannot be prepared: {self.statement}")
        # Columns SQLAlchemy would fill from their Python defaults, which no driver does.
        defaulted = [*compiled.insert_prefetch, *compiled.update_prefetch]
        if defaulted:
            names = ", ".join(str(c.name) for c in defaulted)
            raise TypeError(f"give {names} in the statement's values: {self.statement}")
        binds = {
            name: (
                bind.type.dialect_impl(dialect).bind_processor(dialect),
                _REQUIRED if bind.required else bind.effective_value,
            )
            for name, bind in compiled.binds.items()
        }
        order = tuple(compiled.positiontup) if compiled.positional else None
        selected: Any = getattr(self.statement, "selected_columns", None)
        columns = None
        if getattr(self.statement, "is_select", False) and selected is not None:
            columns = tuple(c.type for c in selected)
        return _Form(dialect, compiled.string, order, binds, columns)

    @staticmethod
    def _bound(form: _Form, params: Mapping[str, Any]) -> Any:
        binds = form.binds
        names = form.order if form.order is not None else binds
        values = []
        for name in names:
            proc, literal = binds[name]
            value = params[name] if literal is _REQUIRED else params.get(name, literal)
            values.append(value if proc is None else proc(value))
        if form.order is not None:
            return tuple(values)
        return dict(zip(names, values, strict=True))

    def _execute(self, conn: Connection, params: Sequence[Mapping[str, Any]], many: bool) -> Any:
        """The cursor that ran the statement once for each of ``params`` (``many``), or once."""
        if not conn.in_transaction():
            conn.begin()  # as Connection.execute would (autobegin)
        form = self._form(conn.dialect)
        bound: Any = [self._bound(form, p) for p in params]
        if not many:
            bound = bound[0]
        cursor = None
        sql = form.sql
        try:
            cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
            # The engine's listeners see the statement, as they do for Connection.execute.
            for fn in conn.dispatch.before_cursor_execute:
                sql, bound = fn(conn, cursor, sql, bound, None, many)
            if many:
                cursor.executemany(sql, bound)
            else:
                cursor.execute(sql, bound)
            conn.dispatch.after_cursor_execute(conn, cursor, sql, bound, None, many)
        except BaseException as err:
            # SQLAlchemy's own handling: a driver's error as its exception class, a lost
            # connection invalidated. Any other error (a listener's) comes out as it is, as
            # from Connection.execute (the statement is what tells its handler to wrap).
            driver = isinstance(err, conn.dialect.loaded_dbapi.Error)
            conn._handle_dbapi_exception(err, sql if driver else None, bound, cursor, None)
        return cursor

    def _rows(self, cursor: Any, form: _Form) -> list[Row]:
        try:
            fetched = cursor.fetchall()
            description = cursor.description
        finally:
            cursor.close()
        results = form.results
        if results is None:
            if form.columns is None:
                raise TypeError(f"a statement that returns no rows: {self.statement}")
            dialect = form.dialect
            results = form.results = tuple(
                t.dialect_impl(dialect).result_processor(dialect, d[1])
                for t, d in zip(form.columns, description, strict=True)
            )
        if not any(results):
            return [tuple(r) for r in fetched]
        return [
            tuple(v if p is None else p(v) for v, p in zip(r, results, strict=True))
            for r in fetched
        ]

    # -- the calls -------------------------------------------------------------------
    def rows(self, conn: Connection, params: Mapping[str, Any] | None = None) -> list[Row]:
        """Every row the statement returns, each column of its type."""
        cursor = self._execute(conn, [params or {}], False)
        return self._rows(cursor, self._form(conn.dialect))

    def first(self, conn: Connection, params: Mapping[str, Any] | None = None) -> Row | None:
        """The first row, None when there is none."""
        found = self.rows(conn, params)
        return found[0] if found else None

    def scalar(self, conn: Connection, params: Mapping[str, Any] | None = None) -> Any:
        """The first column of the first row, None when there is none."""
        row = self.first(conn, params)
        return None if row is None else row[0]

    def scalars(self, conn: Connection, params: Mapping[str, Any] | None = None) -> list[Any]:
        """The first column of every row."""
        return [r[0] for r in self.rows(conn, params)]

    def run(self, conn: Connection, params: Mapping[str, Any] | None = None) -> int:
        """Run a statement that returns no rows; the rows it changed."""
        cursor = self._execute(conn, [params or {}], False)
        try:
            return int(cursor.rowcount)
        finally:
            cursor.close()

    def run_many(self, conn: Connection, params: Sequence[Mapping[str, Any]]) -> None:
        """Run a statement that returns no rows once for each of ``params`` (executemany)."""
        if params:
            self._execute(conn, params, True).close()


__all__ = ["Prepared", "Row"]
