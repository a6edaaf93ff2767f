"""Availability under abuse, through the real processes (issue 34, item 3).

Guardian and answering parties run as ``capc`` processes over mutual TLS
(tests/e2e/light.py); the student's side is this test, acting as an honest
student (StudentClient) or a deviating one (raw stubs).
"""

from __future__ import annotations

import contextlib
import queue
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from capc.mpc.channel import ProtocolError
from capc.mpc.session import EvaluatorSession, new_session_id
from capc.round.ledger import RoundState
from services.common import pki, protocol
from services.common.ledger import Ledger
from services.common.limits import MAX_OPEN_ROUNDS_PER_QUERIER, MAX_STREAMS_PER_IDENTITY
from services.common.mpc_stream import StreamChannel
from services.proto.capc.v1 import common_pb2, guardian_pb2, student_pb2
from services.testbed.light import (
    TASK_NAME,
    LightConsortium,
    light_consortium,
    queries,
    tensor_batch,
    wait_until,
)
from tests.e2e.light import DeviatingParty

ROUND_TIMEOUT = 4.0


def test_a_round_never_computed_is_aborted_without_a_restart(tmp_path: Path) -> None:
    with light_consortium(tmp_path, parties=2) as c:
        guardian = c.start_guardian("--share-timeout", "2", "--round-timeout", str(ROUND_TIMEOUT))
        c.wait_connected(c.start_parties(c.names), 2)
        ledger = c.ledger()
        # A student opens a round and never runs its 2PC: both parties' budgets are held.
        stale = c.open_round_without_computing(queries(8))
        assert sorted(stale.included) == c.names
        assert ledger.round_state(stale.round_id) == RoundState.RESERVED
        held = {n: ledger.budget(n).spent for n in c.names}
        assert all(v > 0 for v in held.values())
        # An honest student's round meanwhile is computed, released and charged.
        student = c.student()
        done = student.label_batch(queries(8, seed=1))
        student.close()
        wait_until(
            lambda: ledger.round_state(done.round_id) == RoundState.COMMITTED, 30, "the commit"
        )
        # The stale round is aborted once its timeout passes; the guardian never restarted.
        wait_until(
            lambda: ledger.round_state(stale.round_id) == RoundState.ABORTED,
            ROUND_TIMEOUT + 10,
            "the stale round to be aborted",
        )
        assert guardian.popen.poll() is None
        assert not any("recovered after a restart" in line for line in guardian.lines)
        charged = {n: ledger.budget(n).spent for n in c.names}
        for n in c.names:
            alone = [e.epsilon_alone for e in ledger.entries(party=n)]
            assert len(alone) == 1  # only the computed round's charge is left
            assert charged[n] == pytest.approx(alone[0], rel=1e-9)
        # The released round stays charged after the timeout has passed for it too.
        time.sleep(ROUND_TIMEOUT + 1)
        assert ledger.round_state(done.round_id) == RoundState.COMMITTED
        assert {n: ledger.budget(n).spent for n in c.names} == charged
        assert ledger.verify_audit() > 0


def test_a_round_with_an_unopenable_seed_is_retried_once_without_that_party(
    tmp_path: Path,
) -> None:
    """Issue 41, item 5: one hospital whose sealed seed never opens used to fail every
    job until an operator excluded it by hand. Now each such round is abandoned before
    its 2PC (aborted, nothing released, nobody charged), retried once without that
    party, and the guardian audits a dispute between the student and the party with the
    student's reason. The party left out pays nothing for the retry; the others pay for
    the retry alone, on both their ledgers."""
    with light_consortium(tmp_path, parties=3) as c:
        c.start_guardian("--share-timeout", "5")
        honest = c.names[:2]
        c.wait_connected(c.start_parties(honest), 2)
        mallory = DeviatingParty(c, "hospital-2")
        c.start_student()
        jobs = c.jobs()
        header = common_pb2.Header(protocol_version=2, task=TASK_NAME)

        def job(n: int, seed: int) -> student_pb2.Job:
            created = jobs.CreateJob(
                student_pb2.CreateJobRequest(
                    header=header, queries=tensor_batch(queries(n, seed)), batch_size=n
                ),
                timeout=30,
            )
            watch = student_pb2.WatchJobRequest(header=header, id=created.id)
            states: list[student_pb2.Job] = list(jobs.WatchJob(watch, timeout=120))
            return states[-1]

        first = job(8, 0)
        assert first.state == "done", first.error
        assert first.processed == 8 and first.rounds == 1
        ledger = c.ledger()
        assert len(mallory.rounds) == 1  # the retry never asked it again
        failed = mallory.rounds[0]
        wait_until(lambda: ledger.round_state(failed) == RoundState.ABORTED, 30, "the abort")
        wait_until(lambda: not ledger.open_rounds(), 30, "the retry's commit")
        entries = ledger.audit_entries(200)
        reserved = [int(str(e.detail["round"])) for e in entries if e.action == "reserve"]
        assert sorted(reserved) == [failed, failed + 1], reserved
        retry = failed + 1
        assert ledger.round_state(retry) == RoundState.COMMITTED
        # Charges: nobody for the abandoned round (no noisy output left it), the honest
        # parties for the retry, the party left out nothing at all.
        assert not ledger.entries(round_id=failed)
        charged = {e.party: e.epsilon_alone for e in ledger.entries(round_id=retry)}
        assert set(charged) == set(honest) and all(v > 0 for v in charged.values())
        assert ledger.budget("hospital-2").spent == 0.0
        for p in honest:
            assert ledger.budget(p).spent == pytest.approx(charged[p], rel=1e-9)
        # Audited: a dispute naming both sides with the student's reason, and the abort.
        disputes = [e for e in entries if e.action == "dispute"]
        assert [(e.actor, e.detail) for e in disputes] == [
            (
                "guardian",
                {"round": failed, "querier": "student", "party": "hospital-2",
                 "check": "sealed_seed"},
            )
        ]  # fmt: skip
        assert "hospital-2" in (disputes[0].note or "") and "sealed seed" in (
            disputes[0].note or ""
        )
        aborts = [e for e in entries if e.action == "abort" and e.detail["round"] == failed]
        assert len(aborts) == 1 and "hospital-2" in str(aborts[0].detail["reason"])
        # Each honest hospital's own ledger settled the abandoned round as not charged
        # and charged itself the retry, as the guardian did.
        own = {
            n: Ledger(str(tmp_path / f"{n}-ledger.db"), delta=None, migrate=False) for n in honest
        }
        wait_until(lambda: not any(o.open_rounds() for o in own.values()), 30, "own ledgers")
        for name, mine in own.items():
            assert mine.round_state(failed) == RoundState.ABORTED
            np.testing.assert_allclose(
                mine.spent_loss(name), ledger.spent_loss(name), rtol=1e-9, atol=0, err_msg=name
            )
            mine.close()
        # The next job meets the same party and is retried the same way; the pattern stays
        # one pair, which points nowhere: the student could be the one lying.
        second = job(8, 1)
        assert second.state == "done", second.error
        assert len(mallory.rounds) == 2
        assert [(d.querier, d.party, d.failures, d.points_to) for d in ledger.disputes()] == [
            ("student", "hospital-2", 2, "undetermined")
        ]


def test_the_job_runner_survives_a_party_whose_seed_does_not_open(tmp_path: Path) -> None:
    """A second party's unopenable seed in the retry fails the job, naming the party; the
    runner goes on with the next job."""
    with light_consortium(tmp_path, parties=3) as c:
        c.start_guardian("--share-timeout", "5")
        c.wait_connected(c.start_parties(c.names[:1]), 1)
        mallory = DeviatingParty(c, "hospital-1")
        eve = DeviatingParty(c, "hospital-2")
        c.start_student()
        jobs = c.jobs()
        header = common_pb2.Header(protocol_version=2, task=TASK_NAME)

        def job(n: int) -> student_pb2.Job:
            created = jobs.CreateJob(
                student_pb2.CreateJobRequest(
                    header=header, queries=tensor_batch(queries(n)), batch_size=n
                ),
                timeout=30,
            )
            watch = student_pb2.WatchJobRequest(header=header, id=created.id)
            states: list[student_pb2.Job] = list(jobs.WatchJob(watch, timeout=120))
            return states[-1]

        bad = job(8)
        assert bad.state == "failed"
        assert "sealed seed" in bad.error
        # Retried once without the first (hospital-1 sorts first), then the second failed.
        assert len(mallory.rounds) == 1 and len(eve.rounds) == 2
        ledger = c.ledger()
        for rid in {*mallory.rounds, *eve.rounds}:
            wait_until(lambda r=rid: ledger.round_state(r) == RoundState.ABORTED, 30, "aborts")
        assert all(b.spent == 0.0 for b in ledger.budgets())
        # The same runner goes on with the next job once the parties are gone.
        mallory.leave()
        eve.leave()
        wait_until(
            lambda: not {"hospital-1", "hospital-2"} & set(c.connected()), 30, "them to leave"
        )
        c.wait_connected(c.start_parties(c.names[1:2]), 1)
        good = job(8)
        assert good.state == "done", good.error
        assert good.processed == 8


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory (VmHWM) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc status")


def test_oversized_2pc_frames_after_a_valid_setup_do_not_inflate_the_guardian(
    tmp_path: Path,
) -> None:
    with light_consortium(tmp_path, parties=2) as c:
        guardian = c.start_guardian()
        cfg = c.task_config
        sid = new_session_id()
        stream = StreamChannel(protocol.header(cfg.name, cfg.config_hash))
        responses = c.stub().Compute(stream.outgoing(), metadata=[("capc-session-id", sid.hex())])
        stream.attach(responses)
        EvaluatorSession(stream, sid, timeout=30).setup()  # a valid session, base OTs done
        before = peak_rss_mib(guardian.popen.pid)
        frame = bytes(16 << 20)

        def flood() -> None:
            with contextlib.suppress(ProtocolError):  # the guardian stops reading
                for _ in range(48):
                    stream.send(frame)

        threading.Thread(target=flood, daemon=True).start()
        assert stream.ended.wait(60), "the guardian kept reading"
        time.sleep(1.0)
        grown = peak_rss_mib(guardian.popen.pid) - before
        assert grown < 160, f"the guardian grew by {grown:.0f} MiB"
        error = stream.error
        assert isinstance(error, grpc.RpcError)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "exceeds the limit" in str(error.details()) and "MAX_MPC_FRAME_BYTES" in str(
            error.details()
        )
        assert guardian.popen.poll() is None
        responses.cancel()


def idle_compute(c: LightConsortium, name: str = "student") -> Any:
    """A Compute stream that sends nothing: it only holds its place."""
    never: queue.Queue[guardian_pb2.MpcFrame | None] = queue.Queue()
    return c.stub(name).Compute(
        iter(never.get, None), metadata=[("capc-session-id", secrets.token_hex(16))]
    )


def refused_within(call: Any, seconds: float) -> str | None:
    """The details of the call's RESOURCE_EXHAUSTED refusal, or None if it stays up."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if call.done():
            assert call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, call.code()
            return str(call.details())
        time.sleep(0.05)
    return None


def test_one_identity_holds_a_bounded_number_of_streams(tmp_path: Path) -> None:
    with light_consortium(tmp_path, parties=2) as c:
        c.start_guardian()
        held = [idle_compute(c) for _ in range(MAX_STREAMS_PER_IDENTITY)]
        time.sleep(1.0)
        assert not any(call.done() for call in held)
        extra = idle_compute(c)
        why = refused_within(extra, 10)
        assert why is not None, "a stream past the limit was accepted"
        assert "student already holds 8 streams" in why and "MAX_STREAMS_PER_IDENTITY" in why
        assert "Close idle clients" in why
        assert not any(call.done() for call in held)
        # Another identity is not affected, and a closed stream makes room again.
        pki.issue(c.pki_dir, "student", "student-2", dev=True)
        assert refused_within(idle_compute(c, "student-2"), 1.0) is None
        held.pop().cancel()
        time.sleep(0.5)
        assert refused_within(idle_compute(c), 1.0) is None
        for call in held:
            call.cancel()


def test_one_querier_holds_a_bounded_number_of_open_rounds(tmp_path: Path) -> None:
    with light_consortium(tmp_path, parties=2) as c:
        c.start_guardian("--share-timeout", "2", "--round-timeout", "5")
        c.wait_connected(c.start_parties(c.names), 2)
        opened = [
            c.open_round_without_computing(queries(2)).round_id
            for _ in range(MAX_OPEN_ROUNDS_PER_QUERIER)
        ]
        ledger = c.ledger()
        assert ledger.count_rounds(RoundState.RESERVED) == MAX_OPEN_ROUNDS_PER_QUERIER
        with pytest.raises(grpc.RpcError) as err:
            c.open_round_without_computing(queries(2))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = str(err.value.details())
        assert "MAX_OPEN_ROUNDS_PER_QUERIER" in details and "nothing was reserved" in details
        assert ledger.count_rounds(RoundState.RESERVED) == MAX_OPEN_ROUNDS_PER_QUERIER
        # Another querier still opens rounds.
        pki.issue(c.pki_dir, "student", "student-2", dev=True)
        assert c.open_round_without_computing(queries(2), "student-2").round_id > max(opened)
        # Once the reaper has aborted the stale rounds, the first querier gets in again.
        wait_until(
            lambda: ledger.count_rounds(RoundState.RESERVED) == 0, 30, "the stale rounds to go"
        )
        c.open_round_without_computing(queries(2))


def idle_connect(c: LightConsortium, name: str) -> tuple[Any, Any]:
    """An answering party's Connect stream that sends nothing after its registration."""
    outgoing: queue.Queue[guardian_pb2.PartyMessage | None] = queue.Queue()
    outgoing.put(
        guardian_pb2.PartyMessage(
            header=protocol.header(),
            register=guardian_pb2.Register(
                teachers=[guardian_pb2.TeacherInfo(architecture="mlp")], epsilon_cap=c.cap
            ),
        )
    )
    responses = c.stub(name).Connect(iter(outgoing.get, None))
    return outgoing, responses


def test_many_idle_streams_do_not_starve_a_unary_call(tmp_path: Path) -> None:
    hospitals = 72  # more than the 64 threads the guardian once served every call with
    with light_consortium(tmp_path, parties=hospitals) as c:
        c.start_guardian()
        streams = [idle_connect(c, name) for name in c.names]
        computes = [idle_compute(c) for _ in range(MAX_STREAMS_PER_IDENTITY)]
        time.sleep(2.0)  # the guardian takes up every stream
        # Every hospital and the student hold their streams; an admin read still answers.
        admin = c.stub("gateway")
        reply = admin.ListParties(
            guardian_pb2.ListPartiesRequest(header=protocol.header()), timeout=15
        )
        assert len(reply.parties) == hospitals
        wait_until(
            lambda: (
                sum(
                    p.connected
                    for p in admin.ListParties(
                        guardian_pb2.ListPartiesRequest(header=protocol.header()), timeout=15
                    ).parties
                )
                == hospitals
            ),
            30,
            "every hospital to be connected",
        )
        for _, responses in streams:
            assert next(responses).WhichOneof("body") == "registered"
        assert not any(call.done() for call in computes)
        for outgoing, responses in streams:
            outgoing.put(None)
            responses.cancel()
        for call in computes:
            call.cancel()
