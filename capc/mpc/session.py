"""Two-party sessions: the guardian garbles, the student evaluates.

A session runs over one :class:`~capc.mpc.channel.Channel`:

1. hello: both sides send an ephemeral X25519 key; the session key that
   authenticates every later frame, and the fixed AES key of the garbling and
   OT hashes, are derived from the exchange, the session id and both hellos,
   so neither party chooses the AES key alone;
2. base OTs, once: 128 OTs in which the garbler (the OT-extension sender)
   learns one seed of each pair the evaluator holds;
3. rounds, each over a batch of B queries of one circuit:
   evaluator -> ROUND_REQUEST (round id, batch, circuit digest, OT extension
   request for its input bits with the answer to its consistency check, which
   the garbler verifies before it sends anything); garbler -> GARBLED (tables,
   its input labels, the OT replies carrying the evaluator's input labels,
   output decode bits);
   evaluator -> OUTPUT_LABELS (labels of the garbler's outputs).

Round ids must increase within a session, so a replayed round is refused.
Before it sends GARBLED the garbler calls ``on_release``: the guardian records
the round as released in its ledger there, durably, before anything that
depends on its noise leaves the machine.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from numpy.typing import NDArray

from capc.mpc import ot
from capc.mpc.blocks import FixedKeyHash
from capc.mpc.channel import (
    DEFAULT_MAX_FRAME,
    DEFAULT_MAX_MESSAGE,
    Buffer,
    Channel,
    FramedLink,
    Kind,
    MessageSizeError,
    PeerAbortedError,
    ProtocolError,
    ReplayError,
    memory_channel_pair,
)
from capc.mpc.circuit import Circuit, Party
from capc.mpc.garbling import (
    Garbler,
    OutputLabelError,
    decode_evaluator_outputs,
    evaluate,
    garbler_output_labels,
)

U64 = NDArray[np.uint64]
Values = Mapping[str, U64]

_HELLO = struct.Struct(">B16s32s")
_ROUND = struct.Struct(">I32s")
SESSION_ID_BYTES = 16


def _wire(blocks: U64) -> Buffer:
    """Little-endian bytes of a uint64 array without a copy where the host is little-endian."""
    arr = np.ascontiguousarray(blocks, dtype="<u8")
    if arr.size == 0:
        return b""
    return arr.data.cast("B")


@dataclass
class RoundStats:
    """What one round cost on this side; seconds and bytes."""

    batch: int = 0
    and_gates: int = 0
    garble_s: float = 0.0
    evaluate_s: float = 0.0
    ot_s: float = 0.0
    ot_check_s: float = 0.0  # part of ot_s: the OT consistency check
    bytes_sent: int = 0
    bytes_received: int = 0


@dataclass
class _Counters:
    sent: int = 0
    received: int = 0


class _CountingChannel:
    def __init__(self, inner: Channel, counters: _Counters) -> None:
        self._inner = inner
        self._c = counters

    def send(self, frame: bytes) -> None:
        self._c.sent += len(frame)
        self._inner.send(frame)

    def recv(self, timeout: float | None = None) -> bytes:
        frame = self._inner.recv(timeout)
        self._c.received += len(frame)
        return frame


@dataclass
class _State:
    round_counter: int = 0
    last_round_id: int = -1
    broken: str | None = None
    base_ot_s: float = 0.0
    stats: RoundStats = field(default_factory=RoundStats)


class _Session:
    role: Party
    # Set by the hello: the fixed-key hash needs both parties' contributions.
    _hash: FixedKeyHash

    def __init__(
        self,
        channel: Channel,
        session_id: bytes,
        *,
        timeout: float | None = 300.0,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_message: int = DEFAULT_MAX_MESSAGE,
    ) -> None:
        if len(session_id) != SESSION_ID_BYTES:
            raise ValueError(f"session ids are {SESSION_ID_BYTES} bytes, got {len(session_id)}")
        self.session_id = session_id
        self._bytes = _Counters()
        direction = 0 if self.role == Party.GARBLER else 1
        self._link = FramedLink(
            _CountingChannel(channel, self._bytes), direction, max_frame, max_message, timeout
        )
        self._state = _State()
        self._ready = False

    def _base_ots(self) -> None:
        raise NotImplementedError

    def setup(self) -> None:
        """Hello and the session's base OTs; once per session, before any round."""
        start = time.perf_counter()
        try:
            self._hello()
            self._base_ots()
        except BaseException as err:
            self._fail(err)
            raise
        self._ready = True
        self._state.base_ot_s = time.perf_counter() - start

    @property
    def base_ot_s(self) -> float:
        """Seconds spent in the hello and base OTs."""
        return self._state.base_ot_s

    @property
    def last_stats(self) -> RoundStats:
        """Costs of the most recent round."""
        return self._state.stats

    def _hello_key(self) -> X25519PrivateKey:
        """This side's contribution to the hello: a fresh ephemeral key (tests pin it)."""
        return X25519PrivateKey.generate()

    def _hello(self) -> None:
        sk = self._hello_key()
        mine = _HELLO.pack(int(self.role), self.session_id, sk.public_key().public_bytes_raw())
        self._link.send(Kind.HELLO, 0, mine)
        theirs = self._link.recv(Kind.HELLO, max_bytes=_HELLO.size).payload
        if len(theirs) != _HELLO.size:
            raise MessageSizeError(f"hello must be {_HELLO.size} bytes, got {len(theirs)}")
        role, sid, pk = _HELLO.unpack(theirs)
        if sid != self.session_id:
            raise ProtocolError(
                "the other party joined a different session; check the session id both sides use"
            )
        if role == int(self.role) or role not in (int(Party.GARBLER), int(Party.EVALUATOR)):
            raise ProtocolError(
                f"both parties claim role {Party(role).name}; one must garble, the other evaluate"
            )
        try:
            shared = sk.exchange(X25519PublicKey.from_public_bytes(pk))
        except ValueError as err:
            raise ProtocolError("the other party's hello key is not a valid X25519 key") from err
        g_hello, e_hello = (mine, theirs) if self.role == Party.GARBLER else (theirs, mine)
        session_key, fixed_key = derive_keys(shared, self.session_id, g_hello, e_hello)
        self._link.set_key(session_key)
        self._hash = FixedKeyHash(fixed_key)

    def _guard(self, round_id: int) -> None:
        if not self._ready:
            raise ProtocolError("call setup() before running rounds")
        if self._state.broken is not None:
            raise ProtocolError(
                f"this session failed earlier ({self._state.broken}); open a new session"
            )
        if round_id <= self._state.last_round_id:
            raise ReplayError(
                f"round {round_id} is not after round {self._state.last_round_id}: replayed round refused"
            )

    def parting_words(self) -> str | None:
        """Once the peer's stream has ended: the reason it gave if what it sent last was
        an abort, else None. Call only after the end of its stream (it never waits)."""
        try:
            self._link.recv(Kind.ABORT)
        except PeerAbortedError as err:
            return str(err)
        except Exception:
            return None
        return None

    def abort(self, reason: str) -> None:
        """Stop this session and tell the other party why (best effort)."""
        if self._state.broken is None:
            self._fail(ProtocolError(reason))

    def _fail(self, err: BaseException) -> None:
        self._state.broken = str(err) or type(err).__name__
        if not isinstance(err, PeerAbortedError):
            self._link.abort(self._state.broken)

    def _begin_round(self, round_id: int, circuit: Circuit, batch: int) -> RoundStats:
        self._state.last_round_id = round_id
        self._state.stats = RoundStats(batch=batch, and_gates=circuit.num_and * batch)
        self._bytes.sent = self._bytes.received = 0
        return self._state.stats

    def _end_round(self, stats: RoundStats) -> None:
        stats.bytes_sent = self._bytes.sent
        stats.bytes_received = self._bytes.received
        self._state.round_counter += 1


class GarblerSession(_Session):
    """The guardian's side: garbles, supplies noise-folded inputs, learns its outputs only."""

    role = Party.GARBLER

    def _base_ots(self) -> None:
        """As base-OT receiver: learn one seed of each of the evaluator's pairs."""
        choices = ot.random_choices(ot.KAPPA)
        receiver, request = ot.BaseOTReceiver.start(choices)
        self._link.send(Kind.BASE_OT_REQUEST, 0, request)
        reply_bytes = ot.KAPPA * (ot.KEY_BYTES + 2 * ot.SEED_BYTES)
        seeds = receiver.finish(self._link.recv(Kind.BASE_OT_REPLY, max_bytes=reply_bytes).payload)
        self._ext = ot.ExtensionSender(choices, seeds, self._hash)

    def run_round(
        self,
        round_id: int,
        circuit: Circuit,
        inputs: Values,
        batch: int,
        on_release: Callable[[], None] | None = None,
    ) -> dict[str, U64]:
        """Garble ``circuit`` over ``batch`` queries; returns the garbler's outputs {name: (B, count)}."""
        self._guard(round_id)
        bits = circuit.input_bits(
            Party.GARBLER, inputs, batch
        )  # bad input fails before any message
        stats = self._begin_round(round_id, circuit, batch)
        try:
            # The request's size follows from the circuit: nothing larger is buffered.
            request_bytes = _ROUND.size + ot.request_bytes(
                circuit.evaluator_input_wires.size * batch
            )
            request = self._link.recv(Kind.ROUND_REQUEST, round_id, request_bytes).payload
            if len(request) < _ROUND.size:
                raise MessageSizeError("round request is truncated")
            their_batch, digest = _ROUND.unpack_from(request)
            if digest != circuit.digest:
                raise ProtocolError(
                    f"the evaluator runs a different circuit than {circuit.name}; both sides must agree on the task"
                )
            if their_batch != batch:
                raise ProtocolError(
                    f"the evaluator has {their_batch} queries in round {round_id}, the garbler {batch}"
                )
            t0 = time.perf_counter()
            garbler = Garbler(circuit, batch, os.urandom(16), self._state.round_counter, self._hash)
            tables = garbler.garble()
            labels = garbler.garbler_labels(bits)
            decode = garbler.decode_bits()
            t1 = time.perf_counter()
            l0, l1 = garbler.evaluator_label_pairs()
            ot_reply = self._ext.respond(
                request[_ROUND.size :], l0.reshape(-1, 2), l1.reshape(-1, 2)
            )
            t2 = time.perf_counter()
            if on_release is not None:
                on_release()
            self._link.send(
                Kind.GARBLED,
                round_id,
                [
                    _wire(tables),
                    _wire(labels),
                    ot_reply,
                    np.packbits(decode, bitorder="little").tobytes(),
                ],
            )
            n_out = circuit.output_wires(Party.GARBLER).size
            reply = self._link.recv(Kind.OUTPUT_LABELS, round_id, n_out * batch * 16).payload
            if len(reply) != n_out * batch * 16:
                raise MessageSizeError(
                    f"output labels must be {n_out * batch * 16} bytes, got {len(reply)}"
                )
            out_labels = (
                np.frombuffer(reply, dtype="<u8")
                .astype(np.uint64, copy=False)
                .reshape(n_out, batch, 2)
            )
            try:
                out_bits = garbler.decode_garbler_outputs(out_labels)
            except OutputLabelError as err:
                raise ProtocolError(str(err)) from err
            stats.garble_s = t1 - t0
            stats.ot_s = t2 - t1
            stats.ot_check_s = self._ext.last_check_s
        except BaseException as err:
            self._fail(err)
            raise
        self._end_round(stats)
        return circuit.decode_outputs(Party.GARBLER, out_bits)


class EvaluatorSession(_Session):
    """The student's side: obtains its input labels by OT, evaluates, learns its outputs only."""

    role = Party.EVALUATOR

    def _base_ots(self) -> None:
        """As base-OT sender of fresh seed pairs."""
        request = self._link.recv(
            Kind.BASE_OT_REQUEST, max_bytes=ot.KAPPA * 2 * ot.KEY_BYTES
        ).payload
        pairs = ot.base_seeds()
        self._link.send(Kind.BASE_OT_REPLY, 0, ot.base_ot_send(pairs, request))
        self._ext = ot.ExtensionReceiver(pairs, self._hash)

    def run_round(
        self, round_id: int, circuit: Circuit, inputs: Values, batch: int
    ) -> dict[str, U64]:
        """Evaluate ``circuit`` over ``batch`` queries; returns the evaluator's outputs {name: (B, count)}."""
        self._guard(round_id)
        bits = circuit.input_bits(Party.EVALUATOR, inputs, batch)
        stats = self._begin_round(round_id, circuit, batch)
        try:
            t0 = time.perf_counter()
            request, ot_state = self._ext.request(bits.ravel())
            t_ot = time.perf_counter() - t0
            stats.ot_check_s = self._ext.last_check_s
            self._link.send(
                Kind.ROUND_REQUEST, round_id, _ROUND.pack(batch, circuit.digest) + request
            )
            n_g = circuit.garbler_input_wires.size
            n_e = circuit.evaluator_input_wires.size
            n_dec = circuit.output_wires(Party.EVALUATOR).size * batch
            sizes = (
                circuit.num_and * batch * 32,
                n_g * batch * 16,
                n_e * batch * 32,
                -(-n_dec // 8),
            )
            payload = self._link.recv(Kind.GARBLED, round_id, sum(sizes)).payload
            if len(payload) != sum(sizes):
                raise MessageSizeError(
                    f"garbled circuit for {batch} queries of {circuit.name} must be {sum(sizes)} bytes, got {len(payload)}"
                )
            offsets = np.cumsum((0, *sizes))
            view = memoryview(payload)
            part = [view[offsets[i] : offsets[i + 1]] for i in range(4)]
            tables = (
                np.frombuffer(part[0], dtype="<u8")
                .astype(np.uint64, copy=False)
                .reshape(2, circuit.num_and, batch, 2)
            )
            g_labels = (
                np.frombuffer(part[1], dtype="<u8")
                .astype(np.uint64, copy=False)
                .reshape(n_g, batch, 2)
            )
            t0 = time.perf_counter()
            e_labels = self._ext.finish(ot_state, part[2]).reshape(n_e, batch, 2)
            t_ot += time.perf_counter() - t0
            decode = np.unpackbits(np.frombuffer(part[3], dtype=np.uint8), bitorder="little")[
                :n_dec
            ]
            t0 = time.perf_counter()
            wires = evaluate(
                circuit,
                batch,
                self._state.round_counter,
                self._hash,
                tables,
                np.concatenate([g_labels, e_labels]),
            )
            out_bits = decode_evaluator_outputs(circuit, wires, decode.reshape(-1, batch))
            stats.evaluate_s = time.perf_counter() - t0
            stats.ot_s = t_ot
            self._link.send(
                Kind.OUTPUT_LABELS,
                round_id,
                [_wire(garbler_output_labels(circuit, wires))],
            )
        except BaseException as err:
            self._fail(err)
            raise
        self._end_round(stats)
        return circuit.decode_outputs(Party.EVALUATOR, out_bits)


def derive_keys(
    shared: bytes, session_id: bytes, g_hello: bytes, e_hello: bytes
) -> tuple[bytes, bytes]:
    """The 32-byte session (frame) key and the 16-byte fixed AES key of one session.

    Both come from HKDF-SHA256 of the X25519 secret of the two ephemeral hello
    keys, salted with the session id, over both hellos (which also carry the
    id). Deriving the fixed key from the session id alone would let whoever
    picks the id (the student) choose it; here each party's fresh key changes
    it. A party that waits for the other's hello can try many keys of its own,
    but each try gives an unrelated pseudorandom AES key: it can pick among
    those it tried, never fix one.
    """
    info = g_hello + e_hello
    session_key = HKDF(hashes.SHA256(), 32, session_id, b"capc/mpc/session-key" + info).derive(
        shared
    )
    fixed_key = HKDF(hashes.SHA256(), 16, session_id, b"capc/mpc/fixed-key" + info).derive(shared)
    return session_key, fixed_key


def new_session_id() -> bytes:
    """A fresh random session id."""
    return os.urandom(SESSION_ID_BYTES)


@dataclass
class LocalResult:
    """Outputs of an in-process round and both sides' costs."""

    garbler: dict[str, U64]
    evaluator: dict[str, U64]
    garbler_stats: RoundStats
    evaluator_stats: RoundStats


class LocalPair:
    """A garbler and an evaluator session in one process, joined by a memory channel.

    For tests, benchmarks and central-mode experiments: the same code paths as
    over the network, with the garbler on a helper thread.
    """

    def __init__(
        self,
        timeout: float | None = 300.0,
        wrap: Callable[[Channel, Party], Channel] | None = None,
        max_message: int = DEFAULT_MAX_MESSAGE,
    ) -> None:
        ch_g, ch_e = memory_channel_pair()
        g_chan: Channel = ch_g if wrap is None else wrap(ch_g, Party.GARBLER)
        e_chan: Channel = ch_e if wrap is None else wrap(ch_e, Party.EVALUATOR)
        sid = new_session_id()
        self.garbler = GarblerSession(g_chan, sid, timeout=timeout, max_message=max_message)
        self.evaluator = EvaluatorSession(e_chan, sid, timeout=timeout, max_message=max_message)
        self.both(self.garbler.setup, self.evaluator.setup)
        self._next_round = 0

    @property
    def base_ot_s(self) -> float:
        """Wall time of the hello and base OTs, garbler side."""
        return self.garbler.base_ot_s

    @staticmethod
    def both(
        garbler_side: Callable[[], object], evaluator_side: Callable[[], object]
    ) -> tuple[object, object]:
        """Run the two sides concurrently; re-raises the first error of either."""
        box: dict[str, object] = {}
        errors: list[BaseException] = []

        def run_garbler() -> None:
            try:
                box["g"] = garbler_side()
            except BaseException as err:
                errors.append(err)

        thread = threading.Thread(target=run_garbler, name="capc-garbler")
        thread.start()
        try:
            box["e"] = evaluator_side()
        except BaseException as err:
            errors.append(err)
        finally:
            thread.join()
        if errors:
            raise errors[0]
        return box["g"], box["e"]

    def run(
        self, circuit: Circuit, garbler_inputs: Values, evaluator_inputs: Values, batch: int
    ) -> LocalResult:
        """One round of ``circuit`` over ``batch`` queries."""
        rid = self._next_round
        self._next_round += 1
        g, e = self.both(
            lambda: self.garbler.run_round(rid, circuit, garbler_inputs, batch),
            lambda: self.evaluator.run_round(rid, circuit, evaluator_inputs, batch),
        )
        assert isinstance(g, dict) and isinstance(e, dict)
        return LocalResult(g, e, self.garbler.last_stats, self.evaluator.last_stats)
