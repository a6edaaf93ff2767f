"""Database engines for the services' stores (SQLite file by default, PostgreSQL by URL)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event


def normalise_url(url: str) -> str:
    """``postgresql://`` URLs use the psycopg 3 driver; a bare path means a SQLite file."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    if "://" not in url:
        return f"sqlite:///{Path(url).resolve()}"
    return url


def make_engine(url: str) -> Engine:
    """An engine for ``url``. SQLite files get WAL, full sync, foreign keys and
    immediate write locks, so concurrent writers serialise instead of failing late."""
    url = normalise_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 60, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        # Take the write lock up front: budget checks must not interleave. Done by the
        # dialect, not a "begin" event: an engine with any connection event runs every
        # statement through the event dispatch, a quarter of a short statement's cost.
        engine.dialect.do_begin = _begin_immediate  # type: ignore[method-assign,assignment]
        return engine
    return create_engine(url, pool_pre_ping=True)


def _begin_immediate(dbapi_conn: Any) -> None:
    """Begin a SQLite transaction holding the database's write lock (``dbapi_conn``: the
    driver's connection, in autocommit mode)."""
    dbapi_conn.execute("BEGIN IMMEDIATE")


def as_utc(t: dt.datetime) -> dt.datetime:
    """A stored time with its zone: SQLite returns the UTC times it stored without one."""
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def iso_utc(t: dt.datetime) -> str:
    """ISO 8601 of a stored time, zone included."""
    return as_utc(t).isoformat()
