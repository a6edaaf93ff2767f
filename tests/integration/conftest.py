"""Ledger back-ends for integration tests: a SQLite file and the local PostgreSQL server.

PostgreSQL tests run in a fresh schema each. Without a server they are
skipped locally, but under CI=true a missing server fails them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from services.guardian.rounds import RoundEngine

PG_URL = os.environ.get("CAPC_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def _pg_available() -> str | None:
    try:
        import psycopg

        with psycopg.connect(
            PG_URL.replace("postgresql://", "postgresql://", 1), connect_timeout=3
        ):
            return None
    except Exception as err:
        return str(err)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A URL whose search_path is a new, empty schema (dropped afterwards)."""
    problem = _pg_available()
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL at {PG_URL} is required under CI=true: {problem}")
        pytest.skip(f"no PostgreSQL server: {problem}")
    import psycopg

    schema = f"capc_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "ledger.db")
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> RoundEngine:
    """The guardian's round engine over a fresh SQLite ledger: the one engine fixture.

    The test module says what the ledger holds: ``ENGINE_TASKS`` (task name -> config),
    ``ENGINE_PARTIES`` (party -> epsilon cap; default none) and ``ENGINE_SHARE_TIMEOUT``
    (seconds the engine waits for shares; default 3).
    """
    from services.common.ledger import Ledger
    from services.guardian.rounds import RoundEngine

    module = request.module
    tasks: Mapping[str, dict[str, Any]] = module.ENGINE_TASKS
    parties: Mapping[str, float] = getattr(module, "ENGINE_PARTIES", {})
    ledger = Ledger(str(tmp_path / "ledger.db"))
    for name, config in tasks.items():
        ledger.create_task(name, config)
    for party, cap in parties.items():
        ledger.register_party(party, cap)
    return RoundEngine(ledger, share_timeout=getattr(module, "ENGINE_SHARE_TIMEOUT", 3.0))
