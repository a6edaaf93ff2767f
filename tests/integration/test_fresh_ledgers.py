"""A process that creates several SQLite ledgers migrates once and copies the result
(services.common.ledger.schema): a copied ledger is the one Alembic's migrations make,
and a copy never replaces a ledger that another process created meanwhile."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from services.common.ledger import Ledger
from services.common.ledger.schema import _place


def canonical(sql: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A CREATE statement's lines, its foreign keys as a set: Alembic writes those of a
    table it rebuilds in an order that differs from run to run."""
    lines = [line.strip().rstrip(",").strip() for line in (sql or "").splitlines()]
    keys = sorted(line for line in lines if line.startswith("FOREIGN KEY"))
    return tuple(line for line in lines if not line.startswith("FOREIGN KEY")), tuple(keys)


def schema(path: Path) -> list[object]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY type, name")
        version = conn.execute("SELECT version_num FROM alembic_version").fetchall()
        return [*((t, n, canonical(sql)) for t, n, sql in rows.fetchall()), version]


def test_a_copied_ledger_is_the_migrated_one(tmp_path: Path) -> None:
    Ledger(str(tmp_path / "first.db")).close()
    copied = Ledger(str(tmp_path / "copied.db"))  # this process has migrated one: a copy
    copied.register_party("hospital-0", 1.0)
    assert copied.budget("hospital-0").cap == 1.0
    copied.close()
    # An existing (empty) file is always migrated by Alembic.
    (tmp_path / "migrated.db").touch()
    Ledger(str(tmp_path / "migrated.db")).close()
    assert schema(tmp_path / "copied.db") == schema(tmp_path / "migrated.db")
    assert len(schema(tmp_path / "migrated.db")) > 10


def test_a_copy_never_replaces_a_ledger_created_meanwhile(tmp_path: Path) -> None:
    theirs = tmp_path / "ledger.db"
    theirs.write_bytes(b"another process's ledger")
    assert not _place(theirs, b"a fresh one")
    assert theirs.read_bytes() == b"another process's ledger"
    assert _place(tmp_path / "new.db", b"a fresh one")
    assert (tmp_path / "new.db").read_bytes() == b"a fresh one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.db", "new.db"]
