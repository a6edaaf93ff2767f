"""The guardian's ledger on SQLite and PostgreSQL: life cycle, caps, races, crashes, audit."""

from __future__ import annotations

import multiprocessing as mp
import threading
from pathlib import Path

import numpy as np
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect as sa_inspect
from sqlalchemy import text, update

from capc.mpc.mechanism_circuits import cutoff_delta
from capc.privacy import events
from capc.privacy.accountant import Accountant
from capc.privacy.accountants import GaussianDp
from capc.privacy.events import DpEvent, GaussianEvent, PureDpEvent
from capc.round.errors import (
    DuplicateRoundError,
    LedgerRefusedError,
    QuorumError,
    RoundStateError,
    TeacherCountError,
    UnknownPartyError,
)
from capc.round.ledger import RoundState
from services.common.ledger import KeptSetting, Ledger
from services.common.ledger.models import Base

DELTA = 1e-5
GDP = GaussianDp()


def gnmax_cost(queries: int, sigma: float = 40.0) -> DpEvent:
    """Data-independent worst case of a GNMax batch: ``queries`` Gaussian mechanisms of
    sensitivity sqrt(2)."""
    return events.repeat(GaussianEvent(np.sqrt(2.0), sigma), queries)


def epsilon(event: DpEvent) -> float:
    """Epsilon of ``event`` alone at DELTA by exact Gaussian DP."""
    return GDP.spent(GDP.cost(event), DELTA).epsilon


def fresh(url: str) -> Ledger:
    ledger = Ledger(url, delta=DELTA)
    ledger.create_task("digits", {"classes": 10, "mechanism": "gnmax", "sigma": 40.0})
    return ledger


def test_round_life_cycle_and_independent_recomputation(ledger_url: str) -> None:
    ledger = fresh(ledger_url)
    for name, cap in (("h1", 3.0), ("h2", 8.0), ("h3", 8.0)):
        ledger.register_party(name, cap)
    acct = {p: Accountant(p, GaussianDp()) for p in ("h1", "h2", "h3")}
    for k in range(4):
        cost = gnmax_cost(50)
        res = ledger.reserve(
            f"r{k}", "digits", "student", 50, {p: cost for p in acct}, mechanism="gnmax", quorum=2
        )
        ledger.release(res.round_id)
        used = res.included[:2] if k == 3 else res.included  # in the last round h3 drops out
        ledger.commit(res.round_id, {p: cost for p in used})
        for p in used:
            acct[p].compose(gnmax_cost(50))
    for b in ledger.budgets():
        expect = acct[b.name].spent(DELTA).epsilon if acct[b.name].history else 0.0
        assert b.spent == pytest.approx(expect, rel=1e-9)
        assert b.remaining == pytest.approx(max(0.0, b.cap - b.spent))
    assert ledger.count_rounds(RoundState.COMMITTED) == 4
    assert ledger.verify_audit() >= 3 + 1 + 4 * 3
    rows = ledger.entries(party="h3")
    assert {r.kind for r in rows} == {"charge"} and len(rows) == 4
    assert ledger.entries(round_id=4, party="h3")[0].epsilon_alone == 0.0


def test_cap_excludes_parties_and_quorum_refuses_without_writing(ledger_url: str) -> None:
    ledger = fresh(ledger_url)
    ledger.register_party("small", 0.5)
    ledger.register_party("big", 50.0)
    cost = gnmax_cost(200)
    assert epsilon(cost) > 0.5
    res = ledger.reserve(
        "a", "digits", "student", 200, {"small": cost, "big": cost}, mechanism="gnmax", quorum=1
    )
    assert res.included == ("big",)
    assert res.excluded == {"small": pytest.approx(0.5)}
    before = ledger.spent_loss("big").copy()
    rounds = ledger.count_rounds()
    with pytest.raises(QuorumError, match=r"small: 0\.5 eps left") as err:
        ledger.reserve(
            "b", "digits", "student", 200, {"small": cost, "big": cost}, mechanism="gnmax", quorum=2
        )
    assert err.value.remaining == {"small": pytest.approx(0.5)}
    np.testing.assert_array_equal(ledger.spent_loss("big"), before)
    assert ledger.count_rounds() == rounds
    # The refused key was not consumed.
    ledger.reserve("b", "digits", "student", 1, {"big": gnmax_cost(1)}, mechanism="gnmax", quorum=1)


def test_replays_unknowns_and_wrong_transitions_are_refused(ledger_url: str) -> None:
    ledger = fresh(ledger_url)
    ledger.register_party("h1", 5.0)
    res = ledger.reserve("k", "digits", "s", 1, {"h1": gnmax_cost(1)}, mechanism="gnmax", quorum=1)
    with pytest.raises(DuplicateRoundError, match="used once"):
        ledger.reserve("k", "digits", "s", 1, {"h1": gnmax_cost(1)}, mechanism="gnmax", quorum=1)
    with pytest.raises(UnknownPartyError, match="ghost"):
        ledger.reserve(
            "k2", "digits", "s", 1, {"ghost": gnmax_cost(1)}, mechanism="gnmax", quorum=1
        )
    with pytest.raises(LedgerRefusedError, match="no task"):
        ledger.reserve("k3", "nope", "s", 1, {"h1": gnmax_cost(1)}, mechanism="gnmax", quorum=1)
    with pytest.raises(LedgerRefusedError, match="proven only for Gaussian"):
        ledger.reserve(
            "k4", "digits", "s", 1, {"h1": PureDpEvent(0.1)}, mechanism="laplace", quorum=1
        )
    with pytest.raises(RoundStateError, match="only a released round"):
        ledger.commit(res.round_id, {"h1": gnmax_cost(1)})
    ledger.release(res.round_id)
    with pytest.raises(RoundStateError, match="never released"):
        ledger.abort(res.round_id)
    with pytest.raises(RoundStateError, match="only a reserved round"):
        ledger.release(res.round_id)
    with pytest.raises(LedgerRefusedError, match="delta"):
        Ledger(ledger_url, delta=1e-6)


def test_recovery_never_undercounts(ledger_url: str) -> None:
    ledger = fresh(ledger_url)
    ledger.register_party("h1", 10.0)
    cost = gnmax_cost(100)
    a = ledger.reserve("a", "digits", "s", 100, {"h1": cost}, mechanism="gnmax", quorum=1)
    b = ledger.reserve("b", "digits", "s", 100, {"h1": cost}, mechanism="gnmax", quorum=1)
    ledger.release(b.round_id)
    ledger.close()  # the guardian "crashes" here
    reopened = Ledger(ledger_url, delta=DELTA)
    assert reopened.recover() == (1, 1)
    assert reopened.round_state(a.round_id) == RoundState.ABORTED
    assert reopened.round_state(b.round_id) == RoundState.COMMITTED
    np.testing.assert_allclose(reopened.spent_loss("h1"), GDP.cost(cost), rtol=1e-12)
    assert (reopened.spent_loss("h1") >= GDP.cost(cost)).all()


def test_audit_chain_detects_tampering(ledger_url: str) -> None:
    ledger = fresh(ledger_url)
    ledger.register_party("h1", 1.0)
    ledger.register_party("h1", 2.0, actor="data-office")
    n = ledger.verify_audit()
    assert ledger.audit_entries(limit=1)[0].action == "set_cap"
    with ledger.engine.begin() as conn:
        conn.execute(text("UPDATE audit_log SET actor = 'someone-else' WHERE seq = :s"), {"s": n})
    with pytest.raises(LedgerRefusedError, match=f"entry {n}"):
        ledger.verify_audit()


def test_migrations_match_the_models(ledger_url: str) -> None:
    ledger = fresh(ledger_url)
    with ledger.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def _race(url: str, key: str, results: list[str]) -> None:
    ledger = Ledger(url, delta=DELTA)
    try:
        ledger.reserve(
            key,
            "digits",
            "s",
            100,
            {"h1": gnmax_cost(100), "h2": gnmax_cost(100)},
            mechanism="gnmax",
            quorum=2,
        )
        results.append("ok")
    except QuorumError:
        results.append("refused")
    finally:
        ledger.close()


def _affordable_rounds(cap: float) -> int:
    k = 0
    while epsilon(gnmax_cost(100 * (k + 1))) <= cap:
        k += 1
    return k


def test_racing_threads_never_overspend(ledger_url: str) -> None:
    ledger = fresh(ledger_url)
    cap = 2.5
    ledger.register_party("h1", cap)
    ledger.register_party("h2", 100.0)
    k = _affordable_rounds(cap)
    assert 1 <= k < 12
    results: list[str] = []
    threads = [
        threading.Thread(target=_race, args=(ledger_url, f"t{i}", results)) for i in range(12)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("ok") == k
    assert ledger.budget("h1").spent <= cap


def _race_process(url: str, key: str, queue: mp.Queue) -> None:  # type: ignore[type-arg]
    out: list[str] = []
    _race(url, key, out)
    queue.put(out[0])


@pytest.mark.slow
def test_racing_processes_never_overspend(ledger_url: str) -> None:
    ledger = fresh(ledger_url)
    cap = 2.0
    ledger.register_party("h1", cap)
    ledger.register_party("h2", 100.0)
    ledger.close()
    k = _affordable_rounds(cap)
    # Fresh processes forked from multiprocessing's server, which imported this module
    # once (spawned ones imported it again each time).
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    queue: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_race_process, args=(ledger_url, f"p{i}", queue)) for i in range(8)]
    for p in procs:
        p.start()
    outcomes = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert outcomes.count("ok") == k
    assert Ledger(ledger_url, delta=DELTA).budget("h1").spent <= cap


def test_sqlite_path_and_url_forms(tmp_path: Path) -> None:
    a = Ledger(str(tmp_path / "x.db"))
    b = Ledger(f"sqlite:///{tmp_path / 'x.db'}")
    a.register_party("h", 1.0)
    assert [p.name for p in b.budgets()] == ["h"]


def test_querier_allowance_is_a_fair_share(ledger_url: str) -> None:
    ledger = fresh(ledger_url)
    ledger.register_party("h1", 50.0)
    ledger.register_party("h2", 50.0)
    cost = gnmax_cost(100)
    one = epsilon(cost)
    ledger.set_allowance("lab-a", one * 1.2, actor="data-office")  # one round fits, two do not
    both = {"h1": cost, "h2": cost}
    first = ledger.reserve("a1", "digits", "lab-a", 100, both, mechanism="gnmax", quorum=1)
    assert first.included == ("h1", "h2")
    with pytest.raises(QuorumError) as err:
        ledger.reserve("a2", "digits", "lab-a", 100, both, mechanism="gnmax", quorum=1)
    assert set(err.value.remaining) == {"h1", "h2"}
    assert all(0 < v < 0.2 * one + 1e-9 for v in err.value.remaining.values())
    # Another querier still has the rest of the parties' budgets.
    assert ledger.reserve(
        "b1", "digits", "lab-b", 100, both, mechanism="gnmax", quorum=2
    ).included == ("h1", "h2")
    # Aborting returns the querier's share too.
    ledger.abort(first.round_id)
    assert ledger.querier_spent("lab-a", "h1") == 0.0
    assert ledger.reserve(
        "a3", "digits", "lab-a", 100, both, mechanism="gnmax", quorum=2
    ).included == ("h1", "h2")
    allowance_changes = [e for e in ledger.audit_entries(limit=50) if e.action == "set_allowance"]
    assert [(e.actor, e.detail["querier"]) for e in allowance_changes] == [("data-office", "lab-a")]
    with pytest.raises(LedgerRefusedError, match="positive"):
        ledger.set_allowance("lab-a", -1.0, actor="x")


def test_ledger_admits_exactly_what_exact_gaussian_dp_allows(ledger_url: str) -> None:
    # sigma 40 votes, eps 10, delta 1e-5: 3201 GNMax answers by exact Gaussian DP (2849 by RDP).
    ledger = fresh(ledger_url)
    assert ledger.accountant == "gdp"
    ledger.register_party("h1", 10.0)
    admitted = 0
    for size in (100, 1):
        while True:
            try:
                res = ledger.reserve(
                    f"r{admitted}-{size}",
                    "digits",
                    "s",
                    size,
                    {"h1": gnmax_cost(size)},
                    mechanism="gnmax",
                    quorum=1,
                )
            except QuorumError:
                break
            ledger.release(res.round_id)
            ledger.commit(res.round_id, {"h1": gnmax_cost(size)})
            admitted += size
    assert admitted == 3201
    assert ledger.queries_fit(gnmax_cost(1), 10.0) == 3201
    assert ledger.queries_fit(gnmax_cost(1), 10.0, "h1") == 0
    spent = ledger.budget("h1").spent
    assert 9.99 < spent <= 10.0
    # An independent accountant: dp-accounting's privacy-loss distributions.
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    pld = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dp_accounting.GaussianDpEvent(40.0 / np.sqrt(2.0)), 3201)
    assert spent == pytest.approx(pld.get_epsilon(DELTA), rel=1e-6)


def test_ledger_accountant_is_fixed_at_creation(tmp_path: Path) -> None:
    path = str(tmp_path / "rdp.db")
    rdp_ledger = Ledger(path, accountant="rdp")
    assert rdp_ledger.accountant == "rdp"
    rdp_ledger.close()
    assert Ledger(path).accountant == "rdp"
    with pytest.raises(LedgerRefusedError, match="created with the rdp accountant"):
        Ledger(path, accountant="gdp")
    with pytest.raises(LedgerRefusedError, match="unknown accountant"):
        Ledger(str(tmp_path / "other.db"), accountant="pld")
    # RDP's budget filter is proven for Gaussian mechanisms only.
    ledger = Ledger(path)
    ledger.create_task("digits", {"classes": 10})
    ledger.register_party("h1", 5.0)
    with pytest.raises(LedgerRefusedError, match="proven only for Gaussian"):
        ledger.reserve("x", "digits", "s", 1, {"h1": PureDpEvent(0.1)}, mechanism="l", quorum=1)
    res = ledger.reserve("y", "digits", "s", 10, {"h1": gnmax_cost(10)}, mechanism="g", quorum=1)
    assert res.included == ("h1",)


def test_migration_keeps_an_existing_rdp_ledger_exactly(tmp_path: Path) -> None:
    """A ledger written before revision 0003 (RDP vectors, no accountant) reports what it did."""
    import json

    from alembic import command
    from alembic.config import Config

    from capc.privacy.accountants import RenyiDp
    from capc.privacy.conversion import DEFAULT_ORDERS
    from services.common.db import make_engine, normalise_url
    from services.common.ledger import store

    url = normalise_url(str(tmp_path / "old.db"))
    engine = make_engine(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(store._MIGRATIONS))
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0002")
        conn.commit()
    old = RenyiDp().cost(gnmax_cost(700))
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO ledger_settings (key, value) VALUES ('orders', :o), ('delta', :d)"),
            {"o": json.dumps(DEFAULT_ORDERS.tolist()), "d": repr(DELTA)},
        )
        conn.execute(
            text("INSERT INTO ledger_settings (key, value) VALUES ('audit_head', :h)"),
            {"h": json.dumps([0, "0" * 64])},
        )
        conn.execute(
            text(
                "INSERT INTO parties (name, role, epsilon_cap, status, created_at) "
                "VALUES ('h1', 'answerer', 20.0, 'active', '2026-01-01')"
            )
        )
        conn.execute(
            text("INSERT INTO party_spend (party, rdp, rounds) VALUES ('h1', :r, 3)"),
            {"r": json.dumps(old.tolist())},
        )
    engine.dispose()
    ledger = Ledger(url)
    assert ledger.accountant == "rdp"
    before = RenyiDp().spent(old, DELTA).epsilon
    assert ledger.budget("h1").spent == before
    np.testing.assert_array_equal(ledger.spent_loss("h1"), old)


def test_querier_spend_counts_rounds_reserved_before_the_allowance(ledger_url: str) -> None:
    ledger = fresh(ledger_url)
    ledger.register_party("h1", 50.0)
    a = ledger.reserve("a", "digits", "q", 100, {"h1": gnmax_cost(100)}, mechanism="g", quorum=1)
    ledger.set_allowance("q", 40.0, actor="data-office")
    b = ledger.reserve("b", "digits", "q", 100, {"h1": gnmax_cost(100)}, mechanism="g", quorum=1)
    for r in (a, b):
        ledger.release(r.round_id)
        ledger.commit(r.round_id, {"h1": gnmax_cost(100)})
    # Both rounds were the querier's: its share is what both charged, never forgotten.
    assert ledger.querier_spent("q", "h1") == pytest.approx(epsilon(gnmax_cost(200)), rel=1e-9)


def test_the_enforced_cap_never_exceeds_what_the_party_declared(ledger_url: str) -> None:
    ledger = fresh(ledger_url)
    ledger.register_party("h1", 20.0, actor="guardian-cli")
    ledger.register_party("h1", 20.0)  # idempotent with the same cap
    assert ledger.budget("h1").cap == 20.0 and ledger.budget("h1").declared_cap is None
    # The hospital declares 8: the guardian's 20 is clamped, and the change is audited
    # under the hospital's identity.
    assert ledger.declare_cap("h1", 8.0, actor="h1") == 8.0
    entry = ledger.audit_entries(limit=1)[0]
    assert (entry.actor, entry.action) == ("h1", "declare_cap")
    assert entry.detail["old"] == 20.0 and entry.detail["new"] == 8.0
    # The guardian's operator raising its own registration cannot lift it past 8 ...
    ledger.register_party("h1", 1e6, actor="guardian-cli")
    assert ledger.budget("h1").cap == 8.0 and ledger.budget("h1").registered_cap == 1e6
    # ... and a round that fits 20 but not 8 leaves the hospital out.
    big = next(n for n in range(100, 100_000, 100) if 8.0 < epsilon(gnmax_cost(n)) <= 20.0)
    with pytest.raises(QuorumError):
        ledger.reserve("x", "digits", "q", big, {"h1": gnmax_cost(big)}, mechanism="g", quorum=1)
    # The operator may lower its own side below the declaration; the smaller cap holds.
    ledger.register_party("h1", 3.0, actor="guardian-cli")
    assert ledger.budget("h1").cap == 3.0
    assert ledger.declare_cap("h1", 5.0, actor="h1") == 3.0
    with pytest.raises(LedgerRefusedError, match="keeps its role"):
        ledger.register_party("h1", 3.0, role="student")
    with pytest.raises(UnknownPartyError):
        ledger.declare_cap("nobody", 1.0, actor="nobody")
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(LedgerRefusedError, match="positive"):
            ledger.declare_cap("h1", bad, actor="h1")


def test_noise_too_small_to_account_is_a_clear_refusal(ledger_url: str) -> None:
    ledger = fresh(ledger_url)
    ledger.register_party("h1", 20.0)
    tiny = events.repeat(GaussianEvent(1.0, 1e-200), 10)
    with pytest.raises(LedgerRefusedError, match="not finite"):
        ledger.reserve("t", "digits", "q", 10, {"h1": tiny}, mechanism="g", quorum=1)


def test_a_small_total_beside_a_large_reservation_never_shrinks(ledger_url: str) -> None:
    ledger = fresh(ledger_url)
    ledger.register_party("h1", 1e6)
    small = events.repeat(GaussianEvent(1.0, 900.0), 3)
    a = ledger.reserve("a", "digits", "q", 3, {"h1": small}, mechanism="g", quorum=1)
    ledger.release(a.round_id)
    ledger.commit(a.round_id, {"h1": small})
    for k in range(5):
        big = ledger.reserve(
            f"b{k}", "digits", "q", 4000, {"h1": gnmax_cost(4000, 1.0)}, mechanism="g", quorum=1
        )
        ledger.abort(big.round_id)
    assert (ledger.spent_loss("h1") >= GDP.cost(small)).all()


def test_privacy_audits_sit_beside_the_claimed_epsilon(ledger_url: str) -> None:
    from capc.audit import bounds

    ledger = fresh(ledger_url)
    ledger.register_party("h1", 50.0)
    ledger.register_party("h2", 50.0)
    r = ledger.reserve("a", "digits", "q", 100, {"h1": gnmax_cost(100)}, mechanism="g", quorum=1)
    ledger.release(r.round_id)
    ledger.commit(r.round_id, {"h1": gnmax_cost(100)})
    claimed = ledger.budget("h1").spent
    kept = ledger.record_privacy_audit(
        "h1", canaries=200, guesses=40, correct=25, attack="canary labels", actor="auditor"
    )
    want = bounds.empirical_epsilon(25, 40, 200, delta=DELTA)
    assert kept.claimed_epsilon == claimed and kept.delta == DELTA and kept.accountant == "gdp"
    assert kept.empirical_lower == pytest.approx(want.lower) and not kept.refuted
    # h2 spent nothing: any positive lower bound refutes its claim of 0.
    refuted = ledger.record_privacy_audit(
        "h2", canaries=100, guesses=100, correct=100, attack="canary labels", actor="gateway",
        note="gateway:auditor (token ab12)",
    )  # fmt: skip
    last = ledger.audit_entries(limit=1)[0]
    assert (last.actor, last.note) == ("gateway", "gateway:auditor (token ab12)")
    assert refuted.claimed_epsilon == 0.0 and refuted.refuted and refuted.empirical_upper is None
    assert [a.party for a in ledger.privacy_audits()] == ["h2", "h1"]
    assert [a.id for a in ledger.privacy_audits("h1")] == [kept.id]
    entries = [e for e in ledger.audit_entries() if e.action == "privacy_audit"]
    assert {e.detail["party"] for e in entries} == {"h1", "h2"}
    assert ledger.verify_audit() > 0
    for bad in (
        {"canaries": 10, "guesses": 11, "correct": 1},
        {"canaries": 10, "guesses": 5, "correct": 6},
        {"canaries": 0, "guesses": 0, "correct": 0},
        {"canaries": 10, "guesses": -1, "correct": 0},
    ):
        with pytest.raises(LedgerRefusedError, match=r"canaries|whole number"):
            ledger.record_privacy_audit(
                "h1",
                canaries=bad["canaries"],
                guesses=bad["guesses"],
                correct=bad["correct"],
                attack="x",
                actor="a",
            )
    with pytest.raises(UnknownPartyError):
        ledger.record_privacy_audit(
            "nobody", canaries=1, guesses=0, correct=0, attack="x", actor="a"
        )
    assert len(ledger.privacy_audits()) == 2


def _rewrite(ledger: Ledger, seq: int, actor: str) -> None:
    """What someone with write access to the database and no key can do: change an entry
    and recompute every hash after it, so the bare chain is consistent again."""
    from services.common.db import as_utc
    from services.common.ledger import audit
    from services.common.ledger.models import AuditRow

    rows = ledger.audit_rows()
    prev = rows[seq - 2].hash if seq > 1 else audit.GENESIS
    with ledger.engine.begin() as conn:
        for row in rows[seq - 1 :]:
            who = actor if row.seq == seq else row.actor
            digest = audit.digest(
                prev, row.seq, as_utc(row.at), who, row.action, row.detail, row.note
            )
            conn.execute(
                update(AuditRow)
                .where(AuditRow.seq == row.seq)
                .values(actor=who, prev_hash=prev, hash=digest)
            )
            prev = digest
        conn.execute(
            text("UPDATE ledger_settings SET value = :v WHERE key = 'audit_head'"),
            {"v": f'[{rows[-1].seq}, "{prev}", ""]'},
        )


def test_signed_heads_name_a_rewritten_entry_that_the_bare_chain_misses(ledger_url: str) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from services.common.ledger import audit

    key = Ed25519PrivateKey.generate()
    ledger = Ledger(ledger_url, delta=DELTA, signer=key)
    ledger.create_task("digits", {"classes": 10})
    for name in ("h1", "h2", "h3"):
        ledger.register_party(name, 5.0, actor="guardian-cli")
    ledger.record("h2", "duplicate_connection_refused", {"party": "h2"}, note="x" * 5000)
    n = ledger.verify_audit()
    head = ledger.audit_head()
    assert head.seq == n and audit.head_signed(audit.public_hex(key), head)
    assert ledger.audit_key() == (audit.public_hex(key), 0)
    assert len(ledger.audit_entries(limit=1)[0].note or "") == 1000
    # A second key cannot take over the ledger.
    with pytest.raises(LedgerRefusedError, match="signed by key"):
        Ledger(ledger_url, delta=DELTA, signer=Ed25519PrivateKey.generate())
    unsigned = Ledger(ledger_url, delta=DELTA)
    _rewrite(unsigned, 3, "someone-else")
    chain_only = audit.check_chain(unsigned.audit_rows(), None)
    assert chain_only == (n, None), "the bare chain was recomputed and looks fine"
    with pytest.raises(LedgerRefusedError, match="entry 3: its signature does not match"):
        unsigned.verify_audit()
    # An entry written without the key (straight into the database) is named as well.
    fresh_ledger = Ledger(ledger_url, delta=DELTA, signer=key)
    _rewrite(fresh_ledger, 3, "guardian-cli")  # back to what was signed
    assert fresh_ledger.check_audit()[1] is None
    Ledger(ledger_url, delta=DELTA).record("intruder", "note", {})
    problem = fresh_ledger.check_audit()[1]
    assert problem is not None and problem.seq == n + 1 and "not signed" in problem.reason


def test_a_partys_own_ledger_numbers_rounds_as_the_guardian_and_settles_them(
    ledger_url: str,
) -> None:
    ledger = fresh(ledger_url)
    ledger.register_party("h1", 10.0)
    terms = {"weight": 1.0, "batch": 50}
    res = ledger.reserve(
        "guardian-round-41", "digits", "guardian", 50, {"h1": gnmax_cost(50)},
        mechanism="gnmax", quorum=1, round_id=41, terms=terms,
    )  # fmt: skip
    assert res.round_id == 41
    with pytest.raises(DuplicateRoundError):
        ledger.reserve(
            "other-key", "digits", "guardian", 50, {"h1": gnmax_cost(50)},
            mechanism="gnmax", quorum=1, round_id=41,
        )  # fmt: skip
    ledger.reserve(
        "guardian-round-7", "digits", "guardian", 10, {"h1": gnmax_cost(10)},
        mechanism="gnmax", quorum=1, round_id=7,
    )  # fmt: skip
    assert ledger.open_rounds() == [7, 41] and ledger.last_round() == 41
    record = ledger.round_charges(41)
    assert record is not None and record.terms == terms and record.outcome is None
    # Nothing is settled yet: reservations never count as settled.
    assert ledger.settled_loss("h1", 100)[0] == 0.0
    ledger.release(41)
    ledger.commit(41, {"h1": gnmax_cost(20)}, outcome={"answered": "ff"})
    ledger.abort(7)
    assert ledger.open_rounds() == []
    record = ledger.round_charges(41)
    assert record is not None and record.outcome == {"answered": "ff"}
    assert record.charges["h1"][0].value == "charge"
    np.testing.assert_allclose(ledger.settled_loss("h1", 41), GDP.cost(gnmax_cost(20)), rtol=1e-12)
    assert ledger.settled_loss("h1", 40)[0] == pytest.approx(0.0, abs=1e-12)
    # A running total altered in the database shows in the settled loss.
    with ledger.engine.begin() as conn:
        conn.execute(text("UPDATE party_spend SET loss = '[0.0]' WHERE party = 'h1'"))
    assert ledger.settled_loss("h1", 41)[0] == 0.0
    assert ledger.round_charges(999) is None


def test_commit_at_reservation_charges_the_worst_case(ledger_url: str) -> None:
    ledger = fresh(ledger_url)
    ledger.register_party("h1", 10.0)
    res = ledger.reserve("a", "digits", "s", 30, {"h1": gnmax_cost(30)}, mechanism="g", quorum=1)
    ledger.release(res.round_id)
    ledger.commit_at_reservation(res.round_id, actor="h1")
    np.testing.assert_allclose(ledger.spent_loss("h1"), GDP.cost(gnmax_cost(30)), rtol=1e-12)
    record = ledger.round_charges(res.round_id)
    assert record is not None and record.state == RoundState.COMMITTED
    assert record.charges["h1"][1] == gnmax_cost(30).to_dict()


def test_reports_are_kept_with_the_party(ledger_url: str) -> None:
    ledger = fresh(ledger_url)
    ledger.register_party("h1", 10.0)
    ledger.store_report("h1", {"through": 3, "settled": [0.5]})
    report = ledger.budget("h1").report
    assert report is not None and report["through"] == 3 and "received_at" in report
    with pytest.raises(UnknownPartyError):
        ledger.store_report("ghost", {})


def test_a_settlement_releases_commits_and_keeps_its_setting_in_one_transaction(
    ledger_url: str,
) -> None:
    # A party's own ledger settles a round the guardian has released already: one durable
    # write holds the release, the charge and the guardian's audit head, or none of them.
    ledger = fresh(ledger_url)
    ledger.register_party("h1", 10.0)
    res = ledger.reserve("a", "digits", "s", 30, {"h1": gnmax_cost(30)}, mechanism="g", quorum=1)
    head = KeptSetting("guardian_head", '{"seq": 5}', actor="h1", action="guardian_head")
    with pytest.raises(RoundStateError):  # without release a reserved round stays reserved
        ledger.commit(res.round_id, {"h1": gnmax_cost(10)}, actor="guardian", keep=head)
    assert ledger.setting("guardian_head") is None  # ... and the setting was not kept
    ledger.commit(res.round_id, {"h1": gnmax_cost(10)}, actor="guardian", release=True, keep=head)
    record = ledger.round_charges(res.round_id)
    assert record is not None and record.state == RoundState.COMMITTED
    assert ledger.setting("guardian_head") == '{"seq": 5}'
    np.testing.assert_allclose(ledger.spent_loss("h1"), GDP.cost(gnmax_cost(10)), rtol=1e-12)
    actions = [e.action for e in ledger.audit_entries(10)]
    assert {"release", "commit", "guardian_head"} <= set(actions)
    # The ledger's own settings are never kept this way, not even beside a settlement.
    other = ledger.reserve("b", "digits", "s", 30, {"h1": gnmax_cost(30)}, mechanism="g", quorum=1)
    with pytest.raises(LedgerRefusedError, match="not a setting"):
        ledger.abort(other.round_id, keep=KeptSetting("audit_head", "x", actor="h1"))
    assert ledger.round_charges(other.round_id).state == RoundState.RESERVED  # type: ignore[union-attr]
    ledger.commit_at_reservation(other.round_id, actor="guardian", release=True)
    np.testing.assert_allclose(
        ledger.spent_loss("h1"), GDP.cost(gnmax_cost(10)) + GDP.cost(gnmax_cost(30)), rtol=1e-9
    )


def test_the_operator_pins_a_teacher_count_and_a_party_may_not_exceed_it(
    ledger_url: str,
) -> None:
    ledger = fresh(ledger_url)
    ledger.register_party("h1", 5.0, teachers=4, actor="guardian-cli")
    entry = ledger.audit_entries(limit=1)[0]
    assert (entry.action, entry.detail["teachers"]) == ("register_party", 4)
    assert ledger.budget("h1").registered_teachers == 4
    # The same pin again changes nothing; a cap alone (None) keeps the pinned count.
    n = ledger.audit_head().seq
    ledger.register_party("h1", 5.0, teachers=4, actor="guardian-cli")
    ledger.register_party("h1", 5.0, actor="guardian-cli")
    assert ledger.audit_head().seq == n and ledger.budget("h1").registered_teachers == 4
    assert [ledger.admit_teachers("h1", k, actor="h1") for k in (1, 4)] == [1, 4]
    for claimed in (5, 1024, 0):
        with pytest.raises(TeacherCountError, match=f"declared {claimed} teachers"):
            ledger.admit_teachers("h1", claimed, actor="h1")
        refused = ledger.audit_entries(limit=1)[0]
        assert (refused.actor, refused.action) == ("h1", "refuse_teachers")
        assert (refused.detail["declared"], refused.detail["pinned"]) == (claimed, 4)
    # Changing the pin is audited under the operator.
    ledger.register_party("h1", 5.0, teachers=50, actor="data-office")
    changed = ledger.audit_entries(limit=1)[0]
    assert (changed.actor, changed.action) == ("data-office", "set_teachers")
    assert (changed.detail["old"], changed.detail["new"]) == (4, 50)
    assert ledger.admit_teachers("h1", 50, actor="h1") == 50
    for bad in (0, -1, 1025, 2.5, True):
        with pytest.raises(LedgerRefusedError, match="teacher"):
            ledger.register_party("h1", 5.0, teachers=bad, actor="data-office")  # type: ignore[arg-type]
    assert ledger.budget("h1").registered_teachers == 50
    with pytest.raises(UnknownPartyError):
        ledger.admit_teachers("nobody", 1, actor="nobody")
    ledger.verify_audit()


def test_migration_0006_leaves_existing_parties_unpinned_until_the_operator_pins_them(
    ledger_url: str,
) -> None:
    """A ledger at revision 0005 with a party that holds a reservation gains the column
    (and loses it on a downgrade); the migration invents no count, so the party is refused
    until its operator pins one."""
    from alembic import command
    from alembic.config import Config

    from services.common.db import make_engine, normalise_url
    from services.common.ledger import store

    url = normalise_url(ledger_url)
    ledger = fresh(url)
    ledger.register_party("h1", 20.0, teachers=3, actor="guardian-cli")
    res = ledger.reserve("r", "digits", "s", 5, {"h1": gnmax_cost(5)}, mechanism="g", quorum=1)
    ledger.close()
    engine = make_engine(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(store._MIGRATIONS))
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0005")
        conn.commit()
        assert "registered_teachers" not in {
            c["name"] for c in sa_inspect(conn).get_columns("parties")
        }
    engine.dispose()
    with pytest.raises(LedgerRefusedError, match="run `capc guardian --migrate`"):
        Ledger(url, delta=DELTA, migrate=False)
    ledger = Ledger(url, delta=DELTA)
    assert ledger.round_state(res.round_id) == RoundState.RESERVED
    assert ledger.budget("h1").registered_teachers is None
    with pytest.raises(TeacherCountError, match="pinned no teacher count"):
        ledger.admit_teachers("h1", 1, actor="h1")
    ledger.register_party("h1", 20.0, teachers=2, actor="guardian-cli")
    changed = ledger.audit_entries(limit=1)[0]
    assert (changed.action, changed.detail["old"], changed.detail["new"]) == (
        "set_teachers",
        None,
        2,
    )
    assert ledger.admit_teachers("h1", 2, actor="h1") == 2
    ledger.verify_audit()
    ledger.close()


def test_migration_0007_counts_the_rounds_each_party_was_asked_in_from_the_audit_log(
    ledger_url: str,
) -> None:
    """A ledger at revision 0006 gains ``rounds_asked`` filled from its ``reserve`` audit
    entries: the aborted round counts, as it must for (eps, delta + R 2^-40)."""
    from alembic import command
    from alembic.config import Config

    from services.common.db import make_engine, normalise_url
    from services.common.ledger import store

    url = normalise_url(ledger_url)
    ledger = fresh(url)
    ledger.register_party("h1", 20.0, teachers=1, actor="guardian-cli")
    ledger.register_party("h2", 20.0, teachers=1, actor="guardian-cli")
    both = {"h1": gnmax_cost(5), "h2": gnmax_cost(5)}
    kept = ledger.reserve("r1", "digits", "s", 5, both, mechanism="g", quorum=1)
    ledger.release(kept.round_id)
    ledger.commit(kept.round_id, both)
    dropped = ledger.reserve("r2", "digits", "s", 5, both, mechanism="g", quorum=1)
    ledger.abort(dropped.round_id, reason="test")
    ledger.reserve("r3", "digits", "s", 5, {"h1": gnmax_cost(5)}, mechanism="g", quorum=1)
    assert {b.name: b.rounds_asked for b in ledger.budgets()} == {"h1": 3, "h2": 2}
    ledger.close()
    engine = make_engine(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(store._MIGRATIONS))
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0006")
        conn.commit()
        assert "rounds_asked" not in {
            c["name"] for c in sa_inspect(conn).get_columns("party_spend")
        }
    engine.dispose()
    ledger = Ledger(url, delta=DELTA)
    budgets = {b.name: b for b in ledger.budgets()}
    assert {name: b.rounds_asked for name, b in budgets.items()} == {"h1": 3, "h2": 2}
    assert {name: b.rounds for name, b in budgets.items()} == {"h1": 2, "h2": 1}
    # The ledger's delta with the noise cut-off's term, then the ring conversion's.
    assert budgets["h2"].full_delta(DELTA) == cutoff_delta(DELTA, budgets["h2"].spent, 2) + (
        2 * 2.0**-40
    )
    ledger.close()
