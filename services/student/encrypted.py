"""The student's side of encrypted-query rounds.

The student keeps its CKKS secret key. For a round it encrypts the batch
once (:class:`EncryptedBatch`), opens a Relay stream to the guardian
(:class:`RelayRouter`), and when a party says hello it sends that party the
public context (unless cached there) and the ciphertexts, decrypts the
masked logits that come back (uniform polynomials: its values of the
logits are shares, :mod:`capc.he.masking`) and runs the logits-to-shares 2PC
as evaluator. Its output is its share of that party's one-hot vote; the sum
over parties is what a plain round gets by opening sealed seeds.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from numpy.typing import ArrayLike, NDArray

from capc.he.batched import encrypt_batch
from capc.he.ckks import MAX_CIPHERTEXT_BYTES, StudentKeys, to_bytes
from capc.he.masking import masked_batched, masked_single
from capc.he.plan import Plan, compile_model
from capc.he.single import SingleLayout, encrypt_query
from capc.models.registry import build
from capc.mpc.mechanism_circuits import LogitsToSharesCircuit
from capc.mpc.session import EvaluatorSession
from capc.mpc.votes import PartyInputError
from capc.task_config import Encryption
from services.common.buffers import BoundedBuffer
from services.common.limits import RELAY_BUFFER_FRAMES
from services.common.relay import CHUNK, RelayChannel, RelayError, relay_session_id
from services.proto.capc.v1 import common_pb2, guardian_pb2

log = logging.getLogger("capc.student.encrypted")


def layout_plan(settings: Encryption, input_shape: tuple[int, ...], num_classes: int) -> Plan:
    """The task architecture's plan: its shapes fix the packing (the weights are the parties')."""
    model = build(settings.architecture, input_shape, num_classes, settings.width)
    return compile_model(model.eval(), input_shape)


class StudentCrypto:
    """The student's keys for one task: one key set per layout, made on first use."""

    def __init__(
        self, settings: Encryption, input_shape: tuple[int, ...], num_classes: int
    ) -> None:
        self.settings = settings
        self.input_shape = input_shape
        self.num_classes = num_classes
        self.plan = layout_plan(settings, input_shape, num_classes)
        self.single = SingleLayout.for_plan(self.plan, settings.params.slots)
        self._keys: dict[str, StudentKeys] = {}

    def choose_layout(self, batch: int) -> str:
        """The layout that sends fewer ciphertexts for ``batch`` queries."""
        batched = self.plan.input_dim
        return "single" if batch * self.single.input_ciphertexts < batched else "batched"

    def keys(self, layout: str) -> StudentKeys:
        if layout not in self._keys:
            rotations = self.single.rotations if layout == "single" else ()
            self._keys[layout] = StudentKeys(self.settings.params, rotations)
        return self._keys[layout]

    def encrypt(self, queries: ArrayLike, layout: str | None = None) -> EncryptedBatch:
        """(B, *input_shape) queries -> the round's ciphertexts, serialised, and their hash."""
        x = np.asarray(queries, dtype=np.float64)
        if x.shape[1:] != self.input_shape or not len(x):
            raise ValueError(f"queries must have shape (B, {self.input_shape}), got {x.shape}")
        if not np.isfinite(x).all():
            raise ValueError("queries contain NaN or infinite values")
        chosen = layout or self.choose_layout(len(x))
        keys = self.keys(chosen)
        if chosen == "batched":
            cts = encrypt_batch(keys, x.reshape(len(x), -1))
        else:
            cts = [ct for q in x for ct in encrypt_query(keys, self.single, q)]
        blobs = [to_bytes(ct) for ct in cts]
        digest = hashlib.sha256()
        for b in blobs:
            digest.update(b)
        return EncryptedBatch(chosen, keys, blobs, digest.digest(), len(x), self.num_classes)

    def message(self, batch: EncryptedBatch) -> common_pb2.QueryBatch:
        return common_pb2.QueryBatch(
            encrypted=common_pb2.EncryptedBatch(
                context_id=batch.keys.context_id,
                layout=batch.layout,
                batch=batch.batch,
                ciphertexts=len(batch.blobs),
                ciphertext_hash=batch.ciphertext_hash,
                settings_json=self.settings.to_json(),
            )
        )


@dataclass
class EncryptedBatch:
    """One round's encrypted queries and, as parties answer, the student's vote shares."""

    layout: str
    keys: StudentKeys
    blobs: list[bytes]
    ciphertext_hash: bytes
    batch: int
    num_classes: int
    shares: dict[str, NDArray[np.uint64]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    done: dict[str, threading.Event] = field(default_factory=dict)

    def exchange(
        self,
        channel: RelayChannel,
        party: str,
        round_id: int,
        hello: bytes,
        cached: bool,
        timeout: float,
    ) -> None:
        """The student's half of one party's exchange (runs on its own thread)."""
        try:
            if not cached:
                channel.send_blob(self.keys.public_bytes())
            for blob in self.blobs:
                channel.send_blob(blob)
            params = self.keys.params
            count = self.num_classes if self.layout == "batched" else self.batch
            outputs = [
                self.keys.load_ciphertext(
                    channel.recv_blob(MAX_CIPHERTEXT_BYTES, timeout),
                    level=params.output_level,
                    what=f"{party}'s masked logits",
                )
                for _ in range(count)
            ]
            if self.layout == "batched":
                masked = masked_batched(self.keys, outputs, self.batch)
            else:
                masked = masked_single(self.keys, outputs, self.num_classes)
            spec = LogitsToSharesCircuit(self.num_classes, params.share_bits)
            session = EvaluatorSession(
                channel, relay_session_id(round_id, party, hello), timeout=timeout, max_frame=CHUNK
            )
            session.setup()
            out = session.run_round(
                round_id, spec.circuit(), spec.evaluator_inputs(masked), self.batch
            )
            self.shares[party] = out["vote_share"]
        except Exception as err:
            log.warning("encrypted exchange with %s in round %d failed: %s", party, round_id, err)
            self.errors[party] = str(err)
        finally:
            channel.close()
            self.done.setdefault(party, threading.Event()).set()

    def share(self, party: str, round_id: int, timeout: float) -> NDArray[np.uint64]:
        """The student's share of ``party``'s votes, once its exchange has finished."""
        if not self.done.setdefault(party, threading.Event()).wait(timeout):
            raise PartyInputError(
                party, round_id, f"its exchange with the student did not finish in {timeout} s"
            )
        if party not in self.shares:
            raise PartyInputError(
                party,
                round_id,
                "it answered the guardian but its exchange with the student failed: "
                f"{self.errors.get(party, 'no hello')}",
            )
        return self.shares[party]


class RelayRouter:
    """The student's Relay stream: routes frames to per-party channels, starts exchanges."""

    def __init__(self, header: common_pb2.Header, key: X25519PrivateKey, timeout: float) -> None:
        self._header = header
        self._key = key
        self._timeout = timeout
        self._out: BoundedBuffer[guardian_pb2.RelayFrame] = BoundedBuffer(RELAY_BUFFER_FRAMES)
        self._channels: dict[tuple[int, str], RelayChannel] = {}
        self._lock = threading.Lock()
        self.pending: EncryptedBatch | None = None
        self.ended = threading.Event()

    def outgoing(self) -> Iterator[guardian_pb2.RelayFrame]:
        while True:
            item = self._out.get()
            if item is None:
                return
            yield item

    def attach(self, incoming: Iterator[guardian_pb2.RelayFrame]) -> None:
        def pump() -> None:
            try:
                for frame in incoming:
                    self._dispatch(frame)
            except Exception as err:
                log.warning("the relay stream ended: %s", err)
            finally:
                self.ended.set()
                self._out.close()  # the call is over: exchanges still sending stop waiting
                with self._lock:
                    for ch in self._channels.values():
                        ch.feed(None)

        threading.Thread(target=pump, name="capc-relay", daemon=True).start()

    def _dispatch(self, frame: guardian_pb2.RelayFrame) -> None:
        key = (frame.round_id, frame.party)
        if not frame.hello:
            with self._lock:
                ch = self._channels.get(key)
            if ch is None:
                log.warning(
                    "a relayed frame from %s for round %d, which has no exchange",
                    frame.party,
                    frame.round_id,
                )
            else:
                ch.feed(bytes(frame.payload))
            return
        pending = self.pending
        payload = bytes(frame.payload)
        if pending is None or len(payload) != 33:
            log.warning("an unexpected hello from %s for round %d", frame.party, frame.round_id)
            return
        hello, cached = payload[:32], payload[32] == 1

        def send(data: bytes, rid: int = frame.round_id, party: str = frame.party) -> None:
            self._out.put(
                guardian_pb2.RelayFrame(
                    header=self._header, round_id=rid, party=party, payload=data
                )
            )

        try:
            channel = RelayChannel.for_student(self._key, hello, frame.round_id, frame.party, send)
        except RelayError as err:
            log.warning("%s", err)
            return
        with self._lock:
            self._channels[key] = channel
        threading.Thread(
            target=pending.exchange,
            args=(channel, frame.party, frame.round_id, hello, cached, self._timeout),
            name=f"capc-exchange-{frame.party}",
            daemon=True,
        ).start()

    def clear(self) -> None:
        """Drop the channels of finished rounds."""
        with self._lock:
            self._channels.clear()

    def close(self) -> None:
        self._out.finish()
