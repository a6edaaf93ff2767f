"""Sessions refuse tampered, truncated, replayed, reordered and foreign messages."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from capc.mpc import ot
from capc.mpc.channel import (
    Channel,
    Kind,
    MessageSizeError,
    PeerAbortedError,
    ProtocolError,
    ReplayError,
    TamperedMessageError,
    memory_channel_pair,
)
from capc.mpc.circuit import Party
from capc.mpc.mechanism_circuits import ConfidentGNMaxCircuit
from capc.mpc.session import EvaluatorSession, GarblerSession, LocalPair, new_session_id
from tests.unit.mpc.deviating import deviate

B, K = 16, 4
SPEC = ConfidentGNMaxCircuit(K, 10, sigma=2.0, threshold=5.0, sigma1=3.0)


def inputs() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    hist = rng.integers(0, 10, (B, K)).astype(np.uint64)
    student = rng.integers(0, 2**63, (B, K), dtype=np.uint64)
    return SPEC.garbler_inputs(
        hist - student, np.zeros((B, K)), np.zeros(B)
    ), SPEC.evaluator_inputs(student)


@dataclass
class Meddler:
    """Passes frames on, letting a test change the n-th frame this end sends."""

    inner: Channel
    target: int = -1
    action: Callable[[bytes], list[bytes]] = lambda f: [f]
    sent: list[bytes] = field(default_factory=list)

    def send(self, frame: bytes) -> None:
        n = len(self.sent)
        self.sent.append(frame)
        for out in self.action(frame) if n == self.target else [frame]:
            self.inner.send(out)

    def recv(self, timeout: float | None = None) -> bytes:
        return self.inner.recv(timeout)


def run_sessions(
    garbler: GarblerSession, evaluator: EvaluatorSession, rounds: int = 1, setup: bool = True
) -> tuple[BaseException | None, BaseException | None]:
    """Set up (unless done already) and run rounds on both sides; returns each side's error (or None)."""
    g_in, e_in = inputs()
    errors: dict[str, BaseException | None] = {"g": None, "e": None}

    def g_side() -> None:
        try:
            if setup:
                garbler.setup()
            for r in range(rounds):
                garbler.run_round(r, SPEC.circuit(), g_in, B)
        except BaseException as err:
            errors["g"] = err

    t = threading.Thread(target=g_side)
    t.start()
    try:
        if setup:
            evaluator.setup()
        for r in range(rounds):
            evaluator.run_round(r, SPEC.circuit(), e_in, B)
    except BaseException as err:
        errors["e"] = err
    t.join()
    return errors["g"], errors["e"]


def meddled(
    target: int, action: Callable[[bytes], list[bytes]]
) -> tuple[BaseException | None, BaseException | None]:
    """Garbler's ``target``-th frame is changed on its way to the evaluator."""
    ch_g, ch_e = memory_channel_pair()
    sid = new_session_id()
    g = GarblerSession(Meddler(ch_g, target, action), sid, timeout=10)
    e = EvaluatorSession(ch_e, sid, timeout=10)
    return run_sessions(g, e)


# Garbler frames: 0 hello, 1 base-OT request, 2 garbled circuit.
GARBLED_FRAME = 2


def flip(index: int) -> Callable[[bytes], list[bytes]]:
    def act(frame: bytes) -> list[bytes]:
        b = bytearray(frame)
        b[index] ^= 0x01
        return [bytes(b)]

    return act


def test_clean_run_has_no_errors() -> None:
    ch_g, ch_e = memory_channel_pair()
    sid = new_session_id()
    assert run_sessions(GarblerSession(ch_g, sid), EvaluatorSession(ch_e, sid), rounds=2) == (
        None,
        None,
    )


@pytest.mark.parametrize("where", [40, -20, -1])
def test_tampered_garbled_circuit_is_detected(where: int) -> None:
    g_err, e_err = meddled(GARBLED_FRAME, flip(where))
    assert isinstance(e_err, TamperedMessageError)
    assert "altered" in str(e_err)
    assert isinstance(g_err, PeerAbortedError)  # the garbler is told why, and stops


def test_truncated_frame_is_detected() -> None:
    _, e_err = meddled(GARBLED_FRAME, lambda f: [f[:-100]])
    assert isinstance(e_err, MessageSizeError)
    assert "truncated" in str(e_err)
    _g_err, e_err = meddled(GARBLED_FRAME, lambda f: [f[:10]])
    assert isinstance(e_err, MessageSizeError)


def test_replayed_frame_is_detected() -> None:
    _, e_err = meddled(1, lambda f: [f, f])  # the base-OT request arrives twice
    assert isinstance(e_err, (ReplayError, ProtocolError))
    assert "replayed" in str(e_err) or "expected" in str(e_err)


def test_frame_from_another_session_is_rejected() -> None:
    taps: list[Meddler] = []

    def wrap(ch: Channel, party: Party) -> Channel:
        if party == Party.GARBLER:
            taps.append(Meddler(ch))
            return taps[-1]
        return ch

    LocalPair(timeout=10, wrap=wrap).run(SPEC.circuit(), *inputs(), B)
    stolen = taps[0].sent[GARBLED_FRAME]
    _, e_err = meddled(GARBLED_FRAME, lambda f: [stolen])
    assert isinstance(e_err, TamperedMessageError)
    assert "another session" in str(e_err)


def test_replayed_round_is_refused_before_anything_is_sent() -> None:
    pair = LocalPair(timeout=10)
    g_in, e_in = inputs()
    pair.run(SPEC.circuit(), g_in, e_in, B)
    with pytest.raises(ReplayError, match="replayed round"):
        pair.garbler.run_round(0, SPEC.circuit(), g_in, B)
    with pytest.raises(ReplayError, match="replayed round"):
        pair.evaluator.run_round(0, SPEC.circuit(), e_in, B)


def test_parties_must_agree_on_the_circuit() -> None:
    ch_g, ch_e = memory_channel_pair()
    sid = new_session_id()
    g, e = GarblerSession(ch_g, sid, timeout=10), EvaluatorSession(ch_e, sid, timeout=10)
    other = ConfidentGNMaxCircuit(K, 10, sigma=2.0, confident=False)
    g_in, _ = inputs()
    rng = np.random.default_rng(1)
    e_in = other.evaluator_inputs(rng.integers(0, 2**63, (B, K), dtype=np.uint64))
    errors: list[BaseException] = []

    def g_side() -> None:
        try:
            g.setup()
            g.run_round(0, SPEC.circuit(), g_in, B)
        except BaseException as err:
            errors.append(err)

    t = threading.Thread(target=g_side)
    t.start()
    e.setup()
    with pytest.raises(PeerAbortedError, match="different circuit"):
        e.run_round(0, other.circuit(), e_in, B)
    t.join()
    assert "different circuit" in str(errors[0])


def test_sessions_must_share_an_id_and_take_opposite_roles() -> None:
    ch_g, ch_e = memory_channel_pair()
    g_err, e_err = run_sessions(
        GarblerSession(ch_g, new_session_id(), timeout=10),
        EvaluatorSession(ch_e, new_session_id(), timeout=10),
    )
    assert "different session" in str(e_err) or "different session" in str(g_err)


def test_bad_input_fails_before_any_message_and_the_session_survives() -> None:
    pair = LocalPair(timeout=10)
    g_in, e_in = inputs()
    with pytest.raises(ValueError, match="shape"):
        pair.evaluator.run_round(0, SPEC.circuit(), {"shares": e_in["shares"][:3]}, B)
    pair.run(SPEC.circuit(), g_in, e_in, B)  # still usable


def test_a_failed_session_cannot_be_reused() -> None:
    ch_g, ch_e = memory_channel_pair()
    sid = new_session_id()
    g = GarblerSession(Meddler(ch_g, GARBLED_FRAME, flip(40)), sid, timeout=10)
    e = EvaluatorSession(ch_e, sid, timeout=10)
    run_sessions(g, e)
    _, e_in = inputs()
    with pytest.raises(ProtocolError, match="open a new session"):
        e.run_round(5, SPEC.circuit(), e_in, B)


def test_oversized_message_is_refused() -> None:
    pair_errors: list[BaseException] = []
    try:
        LocalPair(timeout=10, max_message=1000).run(SPEC.circuit(), *inputs(), B)
    except BaseException as err:
        pair_errors.append(err)
    assert pair_errors and isinstance(pair_errors[0], (MessageSizeError, PeerAbortedError))
    assert "exceeds" in str(pair_errors[0]) or "limit" in str(pair_errors[0])


def test_unexpected_message_kind_is_named() -> None:
    ch_g, ch_e = memory_channel_pair()
    sid = new_session_id()
    g = GarblerSession(
        Meddler(ch_g, 1, lambda f: [f[:5] + bytes([Kind.OUTPUT_LABELS]) + f[6:]]), sid, timeout=10
    )
    _, e_err = run_sessions(g, EvaluatorSession(ch_e, sid, timeout=10))
    assert isinstance(e_err, ProtocolError)
    assert "BASE_OT_REQUEST" in str(e_err) or "altered" in str(e_err)


# -- a deviating student ------------------------------------------------------------


def test_a_deviating_student_is_caught_by_the_ot_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Selective failure: the student encodes another choice bit in one column of its OT matrix.

    Without a consistency check the student learns the guardian's bit s_i from
    whether its labels still work, and keeps the session alive for the next bit.
    """
    pair = LocalPair(timeout=10)
    # Read the guardian's secret only to pick a column where the attack would leak.
    column = int(np.flatnonzero(pair.garbler._ext._s)[0])
    deviate(monkeypatch, pair.evaluator._ext, [column], 0)  # row 0: the student's first input bit
    g_err, e_err = run_sessions(pair.garbler, pair.evaluator, setup=False)
    assert isinstance(g_err, ProtocolError)
    assert "consistency check" in str(g_err)
    assert isinstance(e_err, PeerAbortedError)  # the student is told, and the session is dead
    assert "consistency check" in str(e_err)
    _, e_in = inputs()
    with pytest.raises(ProtocolError, match="open a new session"):
        pair.evaluator.run_round(1, SPEC.circuit(), e_in, B)


# -- the fixed AES key ---------------------------------------------------------------

GUARDIAN_KEY = X25519PrivateKey.from_private_bytes(bytes(range(32)))
STUDENT_KEY = X25519PrivateKey.from_private_bytes(bytes(range(32, 64)))


class ReplayingGarbler(GarblerSession):
    """A guardian that sends the same hello key every time."""

    def _hello_key(self) -> X25519PrivateKey:
        return GUARDIAN_KEY


class ReplayingEvaluator(EvaluatorSession):
    """A student that sends the same hello key every time."""

    def _hello_key(self) -> X25519PrivateKey:
        return STUDENT_KEY


def fixed_key_fingerprint(session: GarblerSession | EvaluatorSession) -> bytes:
    """The session's fixed-key hash of one constant block: equal exactly when the AES keys are."""
    probe = np.zeros((1, 2), dtype=np.uint64)
    return session._hash(probe, np.zeros(1, dtype=np.uint64), 0).tobytes()


def fixed_keys(
    garbler_cls: type[GarblerSession], evaluator_cls: type[EvaluatorSession], sid: bytes
) -> bytes:
    """Run a hello (and base OTs) between the two classes; the AES key both ended with."""
    ch_g, ch_e = memory_channel_pair()
    g, e = garbler_cls(ch_g, sid, timeout=10), evaluator_cls(ch_e, sid, timeout=10)
    LocalPair.both(g.setup, e.setup)
    assert fixed_key_fingerprint(g) == fixed_key_fingerprint(e)
    return fixed_key_fingerprint(g)


def test_a_student_cannot_choose_the_fixed_aes_key() -> None:
    """The student picks the session id and replays its hello; the guardian's randomness differs."""
    sid = new_session_id()
    first = fixed_keys(GarblerSession, ReplayingEvaluator, sid)
    second = fixed_keys(GarblerSession, ReplayingEvaluator, sid)
    assert first != second


def test_the_fixed_aes_key_depends_on_both_parties_and_the_session() -> None:
    sid = new_session_id()
    both = fixed_keys(ReplayingGarbler, ReplayingEvaluator, sid)
    assert fixed_keys(ReplayingGarbler, ReplayingEvaluator, sid) == both  # a function of them
    assert fixed_keys(GarblerSession, ReplayingEvaluator, sid) != both  # guardian's part
    assert fixed_keys(ReplayingGarbler, EvaluatorSession, sid) != both  # student's part
    assert fixed_keys(ReplayingGarbler, ReplayingEvaluator, new_session_id()) != both


# -- bounded buffering ----------------------------------------------------------------


def padded_requests(monkeypatch: pytest.MonkeyPatch, extra: int) -> None:
    """From now on every OT-extension request carries ``extra`` bytes more than it needs."""
    honest = ot.ExtensionReceiver.request

    def request(self: ot.ExtensionReceiver, choices: np.ndarray) -> tuple[bytes, object]:
        message, state = honest(self, choices)
        return message + bytes(extra), state

    monkeypatch.setattr(ot.ExtensionReceiver, "request", request)


def test_a_round_request_longer_than_its_circuit_needs_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 3 frames' worth of extra bytes, each frame within the frame limit: the garbler
    # stops at the first frame past the size the circuit fixes, not at 512 MiB.
    padded_requests(monkeypatch, 3 << 20)
    ch_g, ch_e = memory_channel_pair()
    sid = new_session_id()
    g = GarblerSession(ch_g, sid, timeout=10)
    e = EvaluatorSession(ch_e, sid, timeout=10, max_frame=1 << 20)
    g_err, _ = run_sessions(g, e)
    assert isinstance(g_err, MessageSizeError)
    needed = 36 + ot.request_bytes(SPEC.circuit().evaluator_input_wires.size * B)
    assert f"ROUND_REQUEST message exceeds the limit of {needed} bytes" in str(g_err)


def test_a_frame_larger_than_the_frame_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    padded_requests(monkeypatch, 6 << 20)
    ch_g, ch_e = memory_channel_pair()
    sid = new_session_id()
    g = GarblerSession(ch_g, sid, timeout=10)
    e = EvaluatorSession(ch_e, sid, timeout=10, max_frame=8 << 20)
    g_err, _ = run_sessions(g, e)
    assert isinstance(g_err, MessageSizeError)
    assert f"more than the {4 << 20} a frame may hold" in str(g_err)
