"""A hospital's own ledger beside the guardian's, on real ledgers (and over mutual TLS).

Each round is charged twice, independently: by the guardian's ledger and by the
hospital's own from the mechanism and parameters the round carried. They must agree
to 1e-9 (here: exactly), the hospital must refuse past its own cap whatever the
guardian's ledger says, and a crash may over-count, never under-count.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import event

from capc.mechanisms.registry import from_config
from capc.round.ledger import RoundState
from capc.task_config import config_hash
from services.answerer.budget import GUARDIAN_HEAD, GUARDIAN_KEY, OwnBudget, VoteRefusedError
from services.common import pki, serde, tls
from services.common.ledger import Ledger
from services.common.ledger.audit import public_hex, sign_head
from services.common.limits import MAX_DEFINED_TASKS
from services.common.protocol import PROTOCOL_VERSION, RequestError
from services.guardian import budgets
from services.guardian.hub import RunningServer, serve
from services.proto.capc.v1 import common_pb2, guardian_pb2, guardian_pb2_grpc
from tests.own_rounds import admit as own_admit
from tests.own_rounds import define

NAME = "hospital-a"
TASKS: dict[str, dict[str, Any]] = {
    "single": {
        "num_classes": 10,
        "input_shape": [1, 28, 28],
        "mechanism": {
            "name": "robust-confident-gnmax",
            "sigma": 1.5,
            "threshold": 3.5,
            "sigma1": 2.0,
        },
        "quorum": 1,
    },
    "labels": {
        "num_labels": 5,
        "input_shape": [1, 28, 28],
        "mechanism": {"name": "binary", "sigma": 2.0, "threshold": 2.0, "sigma1": 3.0},
        "quorum": 1,
    },
}


def outputs(config: dict[str, Any]) -> int:
    """The task's classes or labels."""
    return int(config.get("num_classes") or config["num_labels"])


class Pair:
    """The guardian's ledger and one hospital's own, and rounds charged on both."""

    def __init__(self, directory: Path, cap: float = 1e4, guardian_cap: float = 1e6) -> None:
        self.key = Ed25519PrivateKey.generate()
        self.guardian = Ledger(str(directory / "guardian.db"), signer=self.key)
        self.guardian.register_party(NAME, guardian_cap, actor="guardian-cli")
        self.own = OwnBudget(NAME, Ledger(str(directory / "own.db")), cap)
        self.keys = 0

    def welcome(self) -> None:
        self.own.welcome(budgets.registered(self.guardian, NAME))

    def work(
        self,
        task: str,
        batch: int,
        weight: float = 1.0,
        voting: np.ndarray | None = None,
    ) -> tuple[guardian_pb2.RoundWork, common_pb2.Header, int]:
        """Reserve a round at the guardian as the round engine does; the work it sends."""
        config = TASKS[task]
        self.guardian.create_task(task, config)
        mech = from_config(config["mechanism"], outputs(config))
        count = batch if voting is None else int(voting.sum())
        self.keys += 1
        res = self.guardian.reserve(
            f"k{self.keys}", task, "student", batch, {NAME: mech.worst_case(count, weight)},
            mechanism=mech.name, quorum=1,
        )  # fmt: skip
        work = guardian_pb2.RoundWork(
            round_id=res.round_id,
            queries=common_pb2.QueryBatch(
                recipe=common_pb2.Recipe(generator="gaussian", count=batch, shape=[1, 28, 28])
            ),
            mechanism=serde.mechanism_to_proto(mech),
            vote_weight=weight,
            participation=serde.participation_to_bytes(voting),
        )
        header = common_pb2.Header(
            protocol_version=PROTOCOL_VERSION, task=task, config_hash=config_hash(config)
        )
        define(self.own, config, header)
        return work, header, res.round_id

    def commit(
        self, task: str, round_id: int, answered: np.ndarray, weight: float, voting: Any
    ) -> guardian_pb2.RoundSettled:
        """The guardian's release and commit of what ``answered`` released; its settlement."""
        config = TASKS[task]
        mech = from_config(config["mechanism"], outputs(config))
        mask = np.ones(len(answered), dtype=bool) if voting is None else voting
        self.guardian.release(round_id)
        self.guardian.commit(
            round_id, {NAME: mech.event(answered[mask], weight)}, outcome=budgets.outcome(answered)
        )
        settled = budgets.settlement_of(self.guardian, NAME, round_id)
        assert settled is not None and settled.settlement == guardian_pb2.SETTLEMENT_CHARGED
        return settled


@pytest.fixture
def pair(tmp_path: Path) -> Pair:
    p = Pair(tmp_path)
    p.welcome()
    return p


@pytest.mark.parametrize(
    ("task", "weight", "vanishing"),
    [
        ("single", 1.0, False),
        ("single", 0.75, False),
        ("single", 1.0, True),
        ("labels", 1.25, True),
    ],
)
def test_each_round_is_charged_the_same_on_both_sides(
    pair: Pair, task: str, weight: float, vanishing: bool
) -> None:
    rng = np.random.default_rng(3)
    k = outputs(TASKS[task])
    for batch in (16, 5, 33):
        voting = rng.random(batch) < 0.6 if vanishing else None
        work, header, rid = pair.work(task, batch, weight, voting)
        own_admit(pair.own, work, header)
        # Reserved in the hospital's own ledger before it votes, under the guardian's id.
        assert pair.own.open_rounds() == [rid]
        np.testing.assert_array_equal(
            pair.own.ledger.spent_loss(NAME), pair.guardian.spent_loss(NAME)
        )
        shape = (batch, k) if task == "labels" else (batch,)
        answered = rng.random(shape) < 0.5
        assert pair.own.settle(pair.commit(task, rid, answered, weight, voting))
        assert not pair.own.settle(budgets.settlement_of(pair.guardian, NAME, rid))  # type: ignore[arg-type]
    # The last settlement is held until the next reservation or a flush (one write a round).
    pair.own.flush()
    mine, theirs = pair.own.ledger.spent_loss(NAME), pair.guardian.spent_loss(NAME)
    assert theirs[0] > 0
    np.testing.assert_allclose(mine, theirs, rtol=1e-9, atol=0)
    report = pair.own.report()
    assert report.through_round == pair.guardian.last_round() and report.open_rounds == 0
    pair.guardian.store_report(NAME, {"through": report.through_round,
                                      "settled": list(report.settled_loss),
                                      "epsilon_spent": report.epsilon_spent,
                                      "open_rounds": 0,
                                      "accounting": report.accounting_json})  # fmt: skip
    seen = budgets.compare(pair.guardian, pair.guardian.budget(NAME))
    assert seen.state == "agree" and abs(seen.gap) < 1e-9
    # Every round's signed head was kept.
    heads = [e for e in pair.own.ledger.audit_entries(limit=100) if e.action == "guardian_head"]
    assert len(heads) == 4  # at connection and after each of the three rounds


def test_the_hospital_refuses_past_its_own_cap_whatever_the_guardian_says(tmp_path: Path) -> None:
    pair = Pair(tmp_path, cap=20.0)
    pair.welcome()
    # The guardian's ledger would admit far more (its cap for the party is 1e6 here).
    work, header, _ = pair.work("single", 64)
    with pytest.raises(VoteRefusedError) as refusal:
        own_admit(pair.own, work, header)
    assert refusal.value.budget and "its cap of 20 eps" in str(refusal.value)
    assert pair.own.open_rounds() == [] and pair.own.ledger.spent_loss(NAME)[0] == 0.0
    # A round that fits is admitted; the next that would not is refused, on the worst case.
    fits = next(b for b in range(64, 0, -1) if pair.own.ledger.accounting.fits(
        pair.own.ledger.accounting.cost(from_config(TASKS["single"]["mechanism"], 10).worst_case(b)),
        20.0, pair.own.ledger.delta))  # fmt: skip
    work, header, _ = pair.work("single", fits)
    own_admit(pair.own, work, header)
    work, header, _ = pair.work("single", 1)
    with pytest.raises(VoteRefusedError, match="past its cap"):
        own_admit(pair.own, work, header)
    eps = pair.own.ledger.budget(NAME).spent
    assert 0 < eps <= 20.0


def test_bad_rounds_are_refused_with_reasons(pair: Pair) -> None:
    work, header, _ = pair.work("single", 8)
    own_admit(pair.own, work, header)
    with pytest.raises(VoteRefusedError, match="already voted"):
        own_admit(pair.own, work, header)
    work, header, _ = pair.work("single", 8)
    # A round names its task by name and hash: one the stream never defined is refused,
    # and so is a definition that does not hash to its header.
    lying = common_pb2.Header(protocol_version=2, task="single", config_hash="0" * 64)
    with pytest.raises(VoteRefusedError, match="defined no task 'single'"):
        own_admit(pair.own, work, lying)
    pair.own.define(guardian_pb2.TaskDefinition(config_json="{}"), lying)
    with pytest.raises(VoteRefusedError, match="defined no task 'single'"):
        own_admit(pair.own, work, lying)
    # Two tasks may share a configuration (so its hash): each is known by its name too.
    twin = common_pb2.Header(
        protocol_version=PROTOCOL_VERSION, task="twin", config_hash=header.config_hash
    )
    with pytest.raises(VoteRefusedError, match="defined no task 'twin'"):
        own_admit(pair.own, work, twin)
    assert own_admit(pair.own, work, twin, TASKS["single"]).task == "twin"
    work, header, _ = pair.work("single", 8)
    # The same task name with another configuration is refused, not silently accounted.
    other = dict(TASKS["single"], quorum=2)
    with pytest.raises(VoteRefusedError, match="another configuration"):
        own_admit(
            pair.own,
            work,
            common_pb2.Header(task="single", config_hash=config_hash(other)),
            other,
        )
    # A looser mechanism than the task's is refused whatever the guardian sends: the
    # party would reserve (and charge itself) less than the round spends.
    mech = from_config(TASKS["single"]["mechanism"], 10)
    looser = dict(
        mech.params.model_dump(), name=mech.name, sigma=mech.params.model_dump()["sigma"] / 2
    )
    work.mechanism.CopyFrom(serde.mechanism_to_proto(from_config(looser, 10)))
    with pytest.raises(VoteRefusedError, match="below the task's"):
        own_admit(pair.own, work, header)
    assert work.round_id not in pair.own.open_rounds()
    empty = guardian_pb2.RoundWork(round_id=999, mechanism=serde.mechanism_to_proto(mech))
    with pytest.raises(VoteRefusedError, match="queries must be"):
        own_admit(pair.own, empty, header)


def test_a_party_keeps_a_bounded_number_of_task_definitions(pair: Pair) -> None:
    """A guardian defining task after task cannot grow a party's memory without bound:
    past MAX_DEFINED_TASKS the oldest definition is forgotten (its rounds are refused,
    nothing reserved, until a stream defines it again); the newest still decode."""
    work, header, _ = pair.work("single", 4)
    headers = []
    for quorum in range(1, MAX_DEFINED_TASKS + 2):
        config = dict(TASKS["single"], quorum=quorum)
        h = common_pb2.Header(
            protocol_version=PROTOCOL_VERSION, task="single", config_hash=config_hash(config)
        )
        define(pair.own, config, h)
        headers.append(h)
    assert headers[0].config_hash == header.config_hash
    with pytest.raises(VoteRefusedError, match="defined no task 'single'"):
        pair.own.decode(work, headers[0])
    assert pair.own.decode(work, headers[-1]).task.quorum == MAX_DEFINED_TASKS + 1
    # A definition sent again is the newest: it outlives those defined before it.
    define(pair.own, TASKS["single"], headers[0])
    newer = dict(TASKS["single"], quorum=MAX_DEFINED_TASKS + 2)
    define(pair.own, newer, common_pb2.Header(task="single", config_hash=config_hash(newer)))
    assert pair.own.decode(work, headers[0]).task.quorum == 1
    with pytest.raises(VoteRefusedError, match="defined no task 'single'"):
        pair.own.decode(work, headers[2])


def test_settlements_never_undercount(pair: Pair) -> None:
    w1, h1, r1 = pair.work("single", 10)
    w2, h2, r2 = pair.work("single", 10)
    w3, h3, r3 = pair.work("single", 10)
    w4, h4, r4 = pair.work("single", 10)
    for w, h in ((w1, h1), (w2, h2), (w3, h3), (w4, h4)):
        own_admit(pair.own, w, h)
    worst = pair.own.ledger.spent_loss(NAME) / 4
    # Aborted at the guardian: nothing.
    pair.guardian.abort(r1)
    assert pair.own.settle(budgets.settlement_of(pair.guardian, NAME, r1))  # type: ignore[arg-type]
    # Released, then the guardian restarted: committed at its reservation, the worst case.
    pair.guardian.release(r2)
    pair.guardian.commit_at_reservation(r2, actor="recovery")
    settled = budgets.settlement_of(pair.guardian, NAME, r2)
    assert settled is not None and settled.settlement == guardian_pb2.SETTLEMENT_WORST_CASE
    assert pair.own.settle(settled)
    # Still open at the guardian: no settlement, the reservation stays.
    assert pair.guardian.round_state(r3) == RoundState.RESERVED
    assert budgets.settlement_of(pair.guardian, NAME, r3) is None
    # A mask of the wrong length is refused: the reservation stays charged.
    bad = guardian_pb2.RoundSettled(
        round_id=r4, settlement=guardian_pb2.SETTLEMENT_CHARGED, answered=b"\x01"
    )
    bad.head.CopyFrom(settled.head)  # a head that checks: the mask itself is refused
    assert not pair.own.settle(bad)
    # "Not charged" under a head its key did not sign is not believed: the reservation stays.
    forged = guardian_pb2.RoundSettled(round_id=r4, settlement=guardian_pb2.SETTLEMENT_NOT_CHARGED)
    forged.head.CopyFrom(settled.head)
    forged.head.signature = sign_head(
        Ed25519PrivateKey.generate(), forged.head.seq, forged.head.hash
    )
    assert not pair.own.settle(forged)
    assert pair.own.ledger.audit_entries(limit=1)[0].action == "guardian_head_invalid"
    assert pair.own.open_rounds() == [r3, r4]
    pair.own.flush()
    np.testing.assert_allclose(pair.own.ledger.spent_loss(NAME), 3 * worst, rtol=1e-12)
    # A round this party never reserved is nothing to it.
    assert not pair.own.settle(
        guardian_pb2.RoundSettled(round_id=12345, settlement=guardian_pb2.SETTLEMENT_NOT_CHARGED)
    )


def test_the_guardian_is_checked_on_every_welcome(tmp_path: Path) -> None:
    pair = Pair(tmp_path)
    pair.welcome()
    assert pair.own.refusing is None
    assert pair.own.ledger.setting(GUARDIAN_KEY) == public_hex(pair.key)
    # Another audit key later: refused until the operator pins the new one.
    other = Ledger(str(tmp_path / "other.db"), signer=Ed25519PrivateKey.generate())
    other.register_party(NAME, 5.0)
    pair.own.welcome(budgets.registered(other, NAME))
    assert pair.own.refusing is not None and "--guardian-audit-key" in pair.own.refusing
    work, header, _ = pair.work("single", 4)
    with pytest.raises(VoteRefusedError, match="audit key changed"):
        own_admit(pair.own, work, header)
    # Another accountant or delta: the two ledgers could not be compared.
    rdp = Ledger(str(tmp_path / "rdp.db"), accountant="rdp", signer=pair.key)
    rdp.register_party(NAME, 5.0)
    pair.own.welcome(budgets.registered(rdp, NAME))
    assert pair.own.refusing is not None and "--accountant" in pair.own.refusing
    pair.welcome()
    assert pair.own.refusing is None


def test_heads_are_kept_checked_and_never_go_back(pair: Pair) -> None:
    head = pair.guardian.audit_head()
    kept = json.loads(pair.own.ledger.setting(GUARDIAN_HEAD) or "{}")
    assert kept["seq"] == head.seq and kept["hash"] == head.hash
    forged = guardian_pb2.AuditHead(
        seq=head.seq + 1,
        hash="ab" * 32,
        signature=sign_head(Ed25519PrivateKey.generate(), 1, "ab" * 32),
    )
    pair.own.keep_head(forged, 7)
    back = guardian_pb2.AuditHead(
        seq=1, hash=pair.guardian.audit_rows(0, 1)[0].hash,
        signature=pair.guardian.audit_rows(0, 1)[0].signature or "",
    )  # fmt: skip
    pair.own.keep_head(back, 8)
    actions = [e.action for e in pair.own.ledger.audit_entries(limit=3)]
    assert actions[:2] == ["guardian_head_conflict", "guardian_head_invalid"]
    assert json.loads(pair.own.ledger.setting(GUARDIAN_HEAD) or "{}")["seq"] == head.seq


def test_a_changed_own_cap_is_audited(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "own.db"))
    OwnBudget(NAME, ledger, 4.0)
    assert OwnBudget(NAME, ledger, 2.5).cap == 2.5
    entry = ledger.audit_entries(limit=1)[0]
    assert (entry.actor, entry.action, entry.detail["new"]) == (NAME, "set_cap", 2.5)


# -- over mutual TLS ------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    pki.init_ca(d, dev=True)
    for role, name in (("guardian", "guardian"), ("gateway", "gateway"), ("answerer", NAME)):
        pki.issue(d, role, name, dev=True)
    return d


@pytest.fixture
def hub(pki_dir: Path, tmp_path: Path) -> Iterator[tuple[RunningServer, Ledger]]:
    from services.common.ledger.audit import load_key

    ledger = Ledger(
        str(tmp_path / "guardian.db"), signer=load_key(pki.audit_key_path(pki_dir, "guardian"))
    )
    ledger.register_party(NAME, 1e6, teachers=1, actor="guardian-cli")
    ledger.create_task("single", TASKS["single"])
    server = serve(ledger, "127.0.0.1:0", tls.TLSFiles.in_dir(pki_dir, "guardian"))
    yield server, ledger
    server.stop()


def _stub(hub: RunningServer, pki_dir: Path, who: str) -> guardian_pb2_grpc.GuardianHubStub:
    return guardian_pb2_grpc.GuardianHubStub(
        tls.secure_channel(
            f"127.0.0.1:{hub.port}", tls.TLSFiles.in_dir(pki_dir, who), "localhost", role="guardian"
        )
    )


def _connect(
    hub: RunningServer, pki_dir: Path, first: guardian_pb2.PartyMessage | None
) -> tuple[queue.Queue[guardian_pb2.PartyMessage | None], Any]:
    out: queue.Queue[guardian_pb2.PartyMessage | None] = queue.Queue()
    if first is not None:
        out.put(first)
    return out, _stub(hub, pki_dir, NAME).Connect(iter(out.get, None))


HEADER = common_pb2.Header(protocol_version=PROTOCOL_VERSION)
TEACHER = guardian_pb2.TeacherInfo(architecture="mlp", input_shape=[4], num_classes=10)


def test_a_party_must_declare_its_own_cap(hub: tuple[RunningServer, Ledger], pki_dir: Path) -> None:
    server, _ = hub
    for first, text in (
        (
            guardian_pb2.PartyMessage(
                header=HEADER, register=guardian_pb2.Register(teachers=[TEACHER])
            ),
            "--epsilon-cap",
        ),
        (guardian_pb2.PartyMessage(header=HEADER, heartbeat=guardian_pb2.Heartbeat()), "Register"),
    ):
        _, stream = _connect(server, pki_dir, first)
        with pytest.raises(grpc.RpcError) as err:
            next(stream)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert text in str(err.value.details())


def test_the_guardian_holds_no_larger_cap_and_settles_what_the_party_holds_open(
    hub: tuple[RunningServer, Ledger], pki_dir: Path
) -> None:
    server, ledger = hub
    mech = from_config(TASKS["single"]["mechanism"], 10)
    done = ledger.reserve("r1", "single", "student", 4, {NAME: mech.worst_case(4)},
                          mechanism=mech.name, quorum=1)  # fmt: skip
    ledger.release(done.round_id)
    answered = np.array([True, False, True, True])
    ledger.commit(done.round_id, {NAME: mech.event(answered)}, outcome=budgets.outcome(answered))
    register = guardian_pb2.Register(
        teachers=[TEACHER], epsilon_cap=3.0, open_rounds=[done.round_id, 777]
    )
    out, stream = _connect(
        server, pki_dir, guardian_pb2.PartyMessage(header=HEADER, register=register)
    )
    welcome = next(stream)
    assert welcome.WhichOneof("body") == "registered"
    assert welcome.registered.epsilon_cap == 3.0
    assert welcome.registered.audit_public_key.hex() == ledger.audit_key()[0]  # type: ignore[index]
    settled = next(stream)
    assert settled.WhichOneof("body") == "settled"
    assert settled.settled.round_id == done.round_id
    assert settled.settled.settlement == guardian_pb2.SETTLEMENT_CHARGED
    assert np.array_equal(
        np.unpackbits(
            np.frombuffer(settled.settled.answered, np.uint8), count=4, bitorder="little"
        ),
        answered,
    )
    gateway = _stub(server, pki_dir, "gateway")
    (party,) = gateway.ListParties(
        guardian_pb2.ListPartiesRequest(header=HEADER), timeout=10
    ).parties
    assert (party.epsilon_cap, party.declared_cap, party.registered_cap) == (3.0, 3.0, 1e6)
    assert party.ledgers == "unreported"
    entry = gateway.ListAudit(guardian_pb2.ListAuditRequest(header=HEADER, limit=1), timeout=10)
    assert entry.entries[0].action == "declare_cap" and entry.entries[0].actor == NAME
    assert entry.chain_valid and entry.head.signature
    # The party reports its own ledger: the guardian sets it beside its own.
    settled_loss = ledger.settled_loss(NAME, done.round_id).tolist()
    accounting = ledger.accounting_json()

    def report(loss: list[float], acct: str = accounting) -> str:
        out.put(guardian_pb2.PartyMessage(header=HEADER, report=guardian_pb2.SpendReport(
            through_round=done.round_id, settled_loss=loss, accounting_json=acct,
            epsilon_spent=1.0, epsilon_cap=3.0)))  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            (p,) = gateway.ListParties(guardian_pb2.ListPartiesRequest(header=HEADER)).parties
            if (
                p.party_reported_at
                and p.party_epsilon_spent == 1.0
                and (p.ledgers != state_before[0])
            ):
                state_before[0] = p.ledgers
                return str(p.ledgers)
            assert time.monotonic() < deadline
            time.sleep(0.05)

    state_before = ["unreported"]
    assert report(settled_loss) == "agree"
    assert report([settled_loss[0] * (1 - 1e-6)]) == "diverged"
    assert report(settled_loss, accounting.replace("1e-05", "1e-06")) == "incomparable"
    # A budget refusal for a round that never asked the party is not audited: a party
    # cannot fill the guardian's log (the e2e tests audit real refusals).
    before = ledger.audit_head().seq
    for _ in range(20):
        out.put(guardian_pb2.PartyMessage(header=HEADER, failure=guardian_pb2.RoundFailure(
            round_id=5, reason="own cap: nope", budget_refused=True)))  # fmt: skip
    out.put(guardian_pb2.PartyMessage(header=HEADER, heartbeat=guardian_pb2.Heartbeat()))
    time.sleep(1.0)
    assert ledger.audit_head().seq == before
    stream.cancel()


@pytest.mark.parametrize(
    "report",
    [
        guardian_pb2.SpendReport(settled_loss=[float("nan")]),
        guardian_pb2.SpendReport(settled_loss=[-1.0]),
        guardian_pb2.SpendReport(settled_loss=[0.0] * (serde.MAX_LOSS_ENTRIES + 1)),
        guardian_pb2.SpendReport(epsilon_spent=float("nan")),
        guardian_pb2.SpendReport(epsilon_cap=float("inf")),
        guardian_pb2.SpendReport(epsilon_spent=-3.0),
    ],
)
def test_a_deviating_partys_report_is_refused_and_nothing_is_kept(
    tmp_path: Path, report: guardian_pb2.SpendReport
) -> None:
    ledger = Ledger(str(tmp_path / "g.db"), delta=1e-5)
    ledger.register_party(NAME, 5.0)
    with pytest.raises(RequestError, match="spend report"):
        budgets.store_report(ledger, NAME, report)
    assert ledger.budget(NAME).report is None


def test_an_encrypted_round_is_charged_the_full_vote_it_casts(pair: Pair) -> None:
    """An encrypted round's vote is a whole one-hot, whatever weight the round names: a
    guardian that names weight 0 (or another) must not get it for nothing."""
    work, header, rid = pair.work("single", 8)
    encrypted = common_pb2.EncryptedBatch(batch=8, ciphertexts=1, layout="batched")
    for weight, participation in ((0.0, b""), (0.5, b""), (1.0, b"\xff")):
        work.queries.CopyFrom(common_pb2.QueryBatch(encrypted=encrypted))
        work.vote_weight, work.participation = weight, participation
        with pytest.raises(VoteRefusedError, match="weight 1"):
            own_admit(pair.own, work, header)
        assert pair.own.open_rounds() == []
    work.vote_weight, work.participation = 1.0, b""
    own_admit(pair.own, work, header)
    assert pair.own.open_rounds() == [rid]
    np.testing.assert_array_equal(pair.own.ledger.spent_loss(NAME), pair.guardian.spent_loss(NAME))


def test_streams_that_never_register_are_held_to_the_identitys_limit(
    hub: tuple[RunningServer, Ledger], pki_dir: Path
) -> None:
    """A hospital (or a thief of its key) that opens Connect streams and never registers
    holds at most MAX_STREAMS_PER_IDENTITY of them; the next is refused at once, and the
    slots come back when they end."""
    from services.common.limits import MAX_STREAMS_PER_IDENTITY

    server, _ = hub
    stub = _stub(server, pki_dir, NAME)
    held = []
    for _ in range(MAX_STREAMS_PER_IDENTITY):
        out: queue.Queue[guardian_pb2.PartyMessage | None] = queue.Queue()
        held.append((out, stub.Connect(iter(out.get, None))))
    time.sleep(1.0)  # every held stream is waiting for its Register at the guardian
    extra = stub.Connect(iter(()), timeout=5)
    try:
        with pytest.raises(grpc.RpcError) as err:
            next(extra)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value
        assert "MAX_STREAMS_PER_IDENTITY" in str(err.value.details())
    finally:
        for out, stream in held:
            stream.cancel()
            out.put(None)
    register = guardian_pb2.Register(teachers=[TEACHER], epsilon_cap=3.0)
    deadline = time.monotonic() + 10
    while True:
        out, stream = _connect(
            server, pki_dir, guardian_pb2.PartyMessage(header=HEADER, register=register)
        )
        try:
            assert next(stream).WhichOneof("body") == "registered"
            break
        except grpc.RpcError as refused:
            assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert time.monotonic() < deadline, "the held streams were never released"
            time.sleep(0.1)
    stream.cancel()
    out.put(None)


def _cap_between(pair: Pair, low: np.ndarray, high: np.ndarray) -> float:
    """An own cap that the loss ``low`` fits and ``high`` does not (epsilon at the
    ledger's delta, midway between theirs)."""
    acct, delta = pair.own.ledger.accounting, pair.own.ledger.delta
    lo, hi = acct.spent(low, delta).epsilon, acct.spent(high, delta).epsilon
    assert lo < hi, (lo, hi)
    return (lo + hi) / 2


Work = tuple[guardian_pb2.RoundWork, common_pb2.Header, int]


def _race(
    pair: Pair, works: list[Work], settlements: list[guardian_pb2.RoundSettled]
) -> tuple[list[int], list[int]]:
    """Admit every round, one thread each, while one more thread applies the settlements
    in order (as the party's stream reader does), all released together by a barrier:
    (admitted round ids, round ids refused on the party's own cap). Any other refusal,
    or a settlement with nothing to do, fails the test."""
    start = threading.Barrier(len(works) + 1)
    admitted: list[int] = []
    refused: list[int] = []
    errors: list[BaseException | str] = []
    lock = threading.Lock()

    def admit(work: guardian_pb2.RoundWork, header: common_pb2.Header, rid: int) -> None:
        start.wait()
        try:
            own_admit(pair.own, work, header)
        except VoteRefusedError as err:
            with lock:
                (refused.append(rid) if err.budget else errors.append(err))
            return
        with lock:
            admitted.append(rid)

    def settle() -> None:
        start.wait()
        for msg in settlements:
            if not pair.own.settle(msg):
                with lock:
                    errors.append(f"round {msg.round_id} was not settled")

    threads = [threading.Thread(target=admit, args=w) for w in works]
    threads.append(threading.Thread(target=settle))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return sorted(admitted), sorted(refused)


def test_a_refused_round_is_followed_by_a_vote_once_a_reservation_settles(tmp_path: Path) -> None:
    """Issue 41, item 7: a hospital that refused a round voted in a later one. That is
    right: a round's work can reach the party before the settlement of the round
    before it (the guardian commits after the student has its labels), so the
    earlier round still holds its worst case and the party refuses; once the
    settlement replaces that reservation with the actual, smaller charge, the next
    round fits. What must hold is that its own spend never passes its cap."""
    pair = Pair(tmp_path)
    mech = from_config(TASKS["single"]["mechanism"], 10)
    acct = pair.own.ledger.accounting
    worst = acct.cost(mech.worst_case(8))
    # Nothing answered: the actual charge is the threshold tests' alone, below the worst case.
    actual = acct.cost(mech.event(np.zeros(8, dtype=bool), 1.0))
    assert actual[0] < worst[0]
    cap = _cap_between(pair, actual + worst, 2 * worst)
    pair.own = OwnBudget(NAME, pair.own.ledger, cap)
    pair.welcome()
    first, h1, r1 = pair.work("single", 8)
    own_admit(pair.own, first, h1)
    second, h2, r2 = pair.work("single", 8)
    with pytest.raises(VoteRefusedError, match="past its cap") as refusal:
        own_admit(pair.own, second, h2)  # the first round's worst case is still held
    assert refusal.value.budget
    assert pair.own.settle(pair.commit("single", r1, np.zeros(8, dtype=bool), 1.0, None))
    third, h3, r3 = pair.work("single", 8)
    own_admit(pair.own, third, h3)  # the late vote: it fits again
    assert pair.own.open_rounds() == [r3] and r2 not in pair.own.open_rounds()
    np.testing.assert_allclose(pair.own.ledger.spent_loss(NAME), actual + worst, rtol=1e-12)
    assert pair.own.ledger.budget(NAME).spent <= cap
    # And no further worst case fits now.
    fourth, h4, _ = pair.work("single", 8)
    with pytest.raises(VoteRefusedError, match="past its cap"):
        own_admit(pair.own, fourth, h4)


def test_its_own_spend_never_passes_its_cap_under_concurrent_rounds(tmp_path: Path) -> None:
    """Issue 41, item 7, under load without timing: rounds admitted by threads released
    together by a barrier, then settlements racing further admissions. Exactly as many
    worst cases as fit are admitted, the rest are refused on the party's own cap, and
    after every phase its spend (charges and open reservations) is within its cap,
    whatever the interleaving."""
    pair = Pair(tmp_path)
    mech = from_config(TASKS["single"]["mechanism"], 10)
    acct, delta = pair.own.ledger.accounting, pair.own.ledger.delta
    worst = acct.cost(mech.worst_case(8))
    actual = acct.cost(mech.event(np.zeros(8, dtype=bool), 1.0))
    fit = 3
    cap = _cap_between(pair, fit * worst, (fit + 1) * worst)
    pair.own = OwnBudget(NAME, pair.own.ledger, cap)
    pair.welcome()

    def within_cap() -> None:
        spent = pair.own.ledger.budget(NAME).spent
        assert 0 < spent <= cap, (spent, cap)
        assert acct.fits(pair.own.ledger.spent_loss(NAME), cap, delta)

    # Phase 1: eight rounds at once; three worst cases fit, five are refused on the cap.
    admitted, refused = _race(pair, [pair.work("single", 8) for _ in range(8)], [])
    assert len(admitted) == fit and len(refused) == 8 - fit, (admitted, refused)
    assert pair.own.open_rounds() == admitted
    within_cap()

    # Phase 2: the admitted rounds' settlements (nothing answered) race eight more rounds.
    settlements = [pair.commit("single", r, np.zeros(8, dtype=bool), 1.0, None) for r in admitted]
    later, refused_later = _race(pair, [pair.work("single", 8) for _ in range(8)], settlements)
    assert len(later) + len(refused_later) == 8
    within_cap()
    # Whatever the interleaving: the settled charges plus the worst cases of the rounds
    # admitted meanwhile, no more of them than fit once every settlement is in.
    expected = fit * actual + len(later) * worst
    pair.own.flush()  # a settlement that came after the last admission is still held
    np.testing.assert_allclose(pair.own.ledger.spent_loss(NAME), expected, rtol=1e-9)
    assert pair.own.open_rounds() == later
    most = max(k for k in range(9) if acct.fits(fit * actual + k * worst, cap, delta))
    assert len(later) <= most < 8, (later, most)

    # Phase 3: the late rounds settle; a round afterwards is admitted exactly when it fits.
    for rid in later:
        assert pair.own.settle(pair.commit("single", rid, np.zeros(8, dtype=bool), 1.0, None))
    spent = (fit + len(later)) * actual
    last, header, rid = pair.work("single", 8)
    if acct.fits(spent + worst, cap, delta):
        own_admit(pair.own, last, header)
        spent = spent + worst
    else:
        with pytest.raises(VoteRefusedError, match="past its cap"):
            own_admit(pair.own, last, header)
    np.testing.assert_allclose(pair.own.ledger.spent_loss(NAME), spent, rtol=1e-9)
    within_cap()


def test_one_durable_write_a_round_and_never_an_under_count(tmp_path: Path) -> None:
    """A settlement is written in the next round's reservation's transaction: one
    commit a round. Until then the database holds the round's worst case (a crash
    over-counts), while the party's own reads see it settled; a reservation refused
    on the cap still writes the settlements held before it."""
    pair = Pair(tmp_path)
    mech = from_config(TASKS["single"]["mechanism"], 10)
    acct = pair.own.ledger.accounting
    worst = acct.cost(mech.worst_case(8))
    actual = acct.cost(mech.event(np.zeros(8, dtype=bool), 1.0))
    assert actual[0] < worst[0]
    pair.own = OwnBudget(
        NAME, pair.own.ledger, _cap_between(pair, 4 * actual + worst, 5 * actual + worst)
    )
    pair.welcome()
    commits = 0

    @event.listens_for(pair.own.ledger.engine, "commit")
    def _count(conn: Any) -> None:
        nonlocal commits
        commits += 1

    for k in range(5):
        work, header, rid = pair.work("single", 8)
        own_admit(pair.own, work, header)
        assert commits == k + 1
        settled = pair.commit("single", rid, np.zeros(8, dtype=bool), 1.0, None)
        assert pair.own.settle(settled)
        assert commits == k + 1  # held, not written
        # The database still holds the worst case; the party's own reads see it settled.
        np.testing.assert_allclose(pair.own.ledger.spent_loss(NAME), k * actual + worst, rtol=1e-9)
        assert pair.own.ledger.open_rounds() == [rid] and pair.own.open_rounds() == []
        assert not pair.own.settle(settled)  # told twice: nothing more to do
    # Four settled charges and a worst case fit; five and a worst case do not: refused,
    # and the fifth settlement, held before it, is written all the same.
    work, header, _ = pair.work("single", 8)
    with pytest.raises(VoteRefusedError, match="past its cap"):
        own_admit(pair.own, work, header)
    assert commits == 6
    np.testing.assert_allclose(pair.own.ledger.spent_loss(NAME), 5 * actual, rtol=1e-9)
    assert pair.own.ledger.open_rounds() == []
    pair.own.flush()  # nothing held: nothing written
    assert commits == 6


def _attested(epsilon: float, file: bytes) -> guardian_pb2.DpAttestation:
    from capc.privacy.dp_training import plan_training as plan
    from capc.round.training import Attestation, file_digest

    rec = plan(epsilon, 1e-5, 30, clip=1.0, records=80)
    return serde.attestation_to_proto(Attestation((rec,), file_digest([file], [rec])))


def test_a_register_attesting_dp_training_is_charged_once_and_shown(
    hub: tuple[RunningServer, Ledger], pki_dir: Path
) -> None:
    server, ledger = hub
    att = _attested(2.0, b"\x01" * 32)
    gateway = _stub(server, pki_dir, "gateway")
    for _ in range(2):  # a reconnection attests the same files: charged once
        register = guardian_pb2.Register(teachers=[TEACHER], epsilon_cap=5.0, dp_training=att)
        _, stream = _connect(
            server, pki_dir, guardian_pb2.PartyMessage(header=HEADER, register=register)
        )
        assert next(stream).WhichOneof("body") == "registered"
        (party,) = gateway.ListParties(
            guardian_pb2.ListPartiesRequest(header=HEADER), timeout=10
        ).parties
        assert party.dp_trained
        stream.cancel()
    [training] = party.trainings
    assert training.sha256 == att.sha256 and training.described.startswith("DP-SGD, 30 steps")
    assert party.epsilon_spent == pytest.approx(training.epsilon, rel=1e-9)
    assert party.rounds_epsilon == pytest.approx(0.0, abs=1e-9)
    charged = [e for e in ledger.audit_entries(limit=100) if e.action == "dp_training"]
    assert [e.actor for e in charged] == [NAME]
    # Another teacher past the cap the party declared: the Register is refused.
    register = guardian_pb2.Register(
        teachers=[TEACHER], epsilon_cap=5.0, dp_training=_attested(4.5, b"\x02" * 32)
    )
    _, stream = _connect(
        server, pki_dir, guardian_pb2.PartyMessage(header=HEADER, register=register)
    )
    with pytest.raises(grpc.RpcError) as err:
        next(stream)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "past its cap" in str(err.value.details())
    assert len(ledger.trainings(NAME)) == 1
    assert ledger.verify_audit() > 0
