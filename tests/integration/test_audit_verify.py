"""``capc audit verify`` on real ledgers: a guardian's signed log and the heads two
hospitals kept, then every way of rewriting that history we know of."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import text

from capc.mechanisms.registry import from_config
from capc.task_config import config_hash
from services.answerer.budget import OwnBudget
from services.audit.verify import verify
from services.commands.cli import main
from services.common import serde
from services.common.ledger import Ledger
from services.common.ledger.audit import public_hex
from services.guardian import budgets
from services.proto.capc.v1 import common_pb2, guardian_pb2
from tests.e2e import tamper
from tests.own_rounds import admit

TASK: dict[str, Any] = {
    "num_classes": 10,
    "input_shape": [1, 28, 28],
    "mechanism": {"name": "robust-confident-gnmax", "sigma": 1.5, "threshold": 3.5, "sigma1": 2.0},
    "quorum": 1,
}
HOSPITALS = ("hospital-a", "hospital-b")


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, Ed25519PrivateKey]:
    """A guardian's ledger after six rounds with two hospitals, each keeping its heads."""
    key = Ed25519PrivateKey.generate()
    guardian = Ledger(str(tmp_path / "guardian.db"), signer=key)
    guardian.create_task("t", TASK)
    own = {}
    for name in HOSPITALS:
        guardian.register_party(name, 1e6, actor="guardian-cli")
        own[name] = OwnBudget(name, Ledger(str(tmp_path / f"{name}.db")), 1e4)
        own[name].welcome(budgets.registered(guardian, name))
    mech = from_config(TASK["mechanism"], 10)
    rng = np.random.default_rng(0)
    for k in range(6):
        res = guardian.reserve(
            f"k{k}", "t", "student", 8, {n: mech.worst_case(8) for n in HOSPITALS},
            mechanism=mech.name, quorum=2,
        )  # fmt: skip
        work = guardian_pb2.RoundWork(
            round_id=res.round_id,
            queries=common_pb2.QueryBatch(recipe=common_pb2.Recipe(count=8)),
            mechanism=serde.mechanism_to_proto(mech),
            vote_weight=1.0,
        )
        header = common_pb2.Header(task="t", config_hash=config_hash(TASK))
        for budget in own.values():
            admit(budget, work, header, TASK)
        answered = rng.random(8) < 0.5
        guardian.release(res.round_id)
        guardian.commit(
            res.round_id,
            {n: mech.event(answered) for n in HOSPITALS},
            outcome=budgets.outcome(answered),
        )
        for name, budget in own.items():
            settled = budgets.settlement_of(guardian, name, res.round_id)
            assert settled is not None and budget.settle(settled)
    for budget in own.values():
        budget.flush()  # as a party does when it stops: the last settlement is written
    return tmp_path, key


def ledgers(d: Path, guardian: str = "guardian.db") -> tuple[Ledger, dict[str, Ledger]]:
    return (
        Ledger(str(d / guardian), delta=None, migrate=False),
        {n: Ledger(str(d / f"{n}.db"), delta=None, migrate=False) for n in HOSPITALS},
    )


def copy(d: Path, name: str) -> str:
    return tamper.snapshot(str(d / "guardian.db"), d / name)


def test_an_untouched_history_verifies(history: tuple[Path, Ed25519PrivateKey]) -> None:
    d, key = history
    guardian, parties = ledgers(d)
    report = verify(guardian, parties)
    assert report.ok and report.key == public_hex(key) and "pinned" in report.key_source
    assert report.heads_checked == 2 * 7  # at connection and after each of six rounds
    assert report.entries == guardian.audit_head().seq
    # Without the hospitals the key is the database's own word: said so.
    alone = verify(guardian, {})
    assert alone.ok and alone.warnings and "no independent key" in alone.warnings[0]


def test_a_rewritten_entry_is_named(history: tuple[Path, Ed25519PrivateKey]) -> None:
    d, _ = history
    url = copy(d, "a.db")
    tamper.rewrite(url, 5, "someone-else")
    guardian, parties = ledgers(d, "a.db")
    report = verify(guardian, parties)
    first = report.first()
    assert not report.ok and first is not None and first.seq == 5
    assert "its signature does not match" in first.text
    # The CLI says the same, and exits 1.
    hospitals = [a for n in HOSPITALS for a in ("--party-ledger", f"{n}={d / f'{n}.db'}")]
    assert main(["audit", "verify", "--ledger", url, *hospitals]) == 1


def test_a_history_the_guardian_signed_again_disagrees_with_the_kept_heads(
    history: tuple[Path, Ed25519PrivateKey], capsys: pytest.CaptureFixture[str]
) -> None:
    d, key = history
    url = copy(d, "b.db")
    tamper.rewrite(url, 5, "someone-else", key=key)
    guardian, parties = ledgers(d, "b.db")
    assert guardian.check_audit()[1] is None, "consistently re-signed"
    report = verify(guardian, parties)
    first = report.first()
    assert not report.ok and first is not None and first.seq >= 5
    assert "differs from the signed head" in first.text
    hospitals = [a for n in HOSPITALS for a in ("--party-ledger", f"{n}={d / f'{n}.db'}")]
    assert main(["audit", "verify", "--ledger", url, *hospitals, "--json"]) == 1
    body = json.loads(capsys.readouterr().out)
    assert body["ok"] is False and body["first"]["seq"] >= 5


def test_removed_entries_and_another_key_are_caught(
    history: tuple[Path, Ed25519PrivateKey],
) -> None:
    d, _ = history
    url = copy(d, "c.db")
    n = Ledger(url, delta=None, migrate=False).audit_head().seq
    tamper.truncate(url, n - 4)
    guardian, parties = ledgers(d, "c.db")
    report = verify(guardian, parties)
    assert not report.ok and any("missing" in p.text for p in report.problems)
    # A database re-signed under another key, naming that key itself.
    url = copy(d, "d.db")
    other = Ed25519PrivateKey.generate()
    tamper.rewrite(url, 1, "ledger", key=other)
    forged = Ledger(url, delta=None, migrate=False)
    with forged.engine.begin() as conn:
        conn.execute(
            text("UPDATE ledger_settings SET value = :v WHERE key = 'audit_key'"),
            {"v": json.dumps({"key": public_hex(other), "from": 0})},
        )
    assert forged.check_audit()[1] is None, "consistent under the forged key"
    guardian, parties = ledgers(d, "d.db")
    report = verify(guardian, parties)
    assert not report.ok
    assert any("names audit key" in p.text for p in report.problems)
    assert report.first() is not None and report.first().seq == 1  # type: ignore[union-attr]
    # The same history with the real key given explicitly.
    assert not verify(guardian, {}, public_key=report.key).ok


@pytest.mark.parametrize("moved_back", [0, 1])
def test_moving_the_start_of_signing_does_not_unsign_the_log(
    history: tuple[Path, Ed25519PrivateKey], moved_back: int
) -> None:
    """The entry from which heads are signed lives in the database: someone who rewrites
    the entries after the last head a hospital kept, and moves that start past them so
    that none is checked, is still caught by the trusted key."""
    d, key = history
    url = copy(d, "e.db")
    # The guardian goes on after the last round: entries no hospital has seen a head of.
    Ledger(url, signer=key).register_party("hospital-c", 2.0, actor="guardian-cli")
    n = Ledger(url, delta=None, migrate=False).audit_head().seq
    tamper.rewrite(url, n, "someone-else")
    forged = Ledger(url, delta=None, migrate=False)
    with forged.engine.begin() as conn:
        conn.execute(
            text("UPDATE ledger_settings SET value = :v WHERE key = 'audit_key'"),
            {"v": json.dumps({"key": public_hex(key), "from": n - moved_back})},
        )
    guardian, parties = ledgers(d, "e.db")
    for report in (verify(guardian, parties), verify(guardian, {}, public_key=public_hex(key))):
        first = report.first()
        assert not report.ok and first is not None, report.problems
        assert "adoption of the guardian's audit key" in first.text


def test_a_log_signed_from_a_later_entry_on_still_verifies(tmp_path: Path) -> None:
    """A ledger written before it had a key: its adoption entry starts the signing."""
    url = str(tmp_path / "old.db")
    Ledger(url).register_party("hospital-a", 3.0, actor="guardian-cli")
    key = Ed25519PrivateKey.generate()
    ledger = Ledger(url, signer=key)
    ledger.register_party("hospital-b", 3.0, actor="guardian-cli")
    signed_from = ledger.audit_key()[1]  # type: ignore[index]
    assert signed_from > 0 and ledger.check_audit()[1] is None
    assert verify(ledger, {}, public_key=public_hex(key)).ok
