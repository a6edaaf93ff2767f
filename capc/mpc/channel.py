"""Message channels and authenticated framing for two-party sessions.

A session only needs something that moves byte strings in order between the
two parties: :class:`Channel`. Tests and benchmarks use the in-memory pair
below; the services carry the same frames over their gRPC streams.

Every frame carries a header (protocol version, message kind, sequence
number, round id, payload length) and a Poly1305 tag under a one-time key
derived from the session key and the sequence number. A frame that was
altered, cut short, replayed, reordered or taken from another session fails
with a :class:`ProtocolError` that says which. Authenticity of the peer itself
comes from mutual TLS in the services; this layer makes the 2PC messages
tamper-evident end to end, whatever relays them.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import queue
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.poly1305 import Poly1305

# 2: the OT-extension request carries the consistency check; the fixed AES key
# comes from both hellos. A version-1 peer is refused at the hello, by name.
PROTOCOL_VERSION = 2
MAGIC = b"CPMC"
_HEADER = struct.Struct(">4sBBBBQQI")
HEADER_BYTES = _HEADER.size
TAG_BYTES = 16
#: Frames are at most this large; longer messages are split.
DEFAULT_MAX_FRAME = 4 * 1024 * 1024
#: A whole message (all its frames) may not exceed this.
DEFAULT_MAX_MESSAGE = 512 * 1024 * 1024
_LAST = 1


Buffer = bytes | bytearray | memoryview
Payload = Buffer | Sequence[Buffer]


class ProtocolError(Exception):
    """A 2PC message could not be accepted; the text says why and what to do."""


class TamperedMessageError(ProtocolError):
    """The frame's tag does not verify: altered in transit, or from another session."""


class ReplayError(ProtocolError):
    """A frame or round arrived again or out of order."""


class MessageSizeError(ProtocolError):
    """A frame or message is truncated or larger than allowed."""


class PeerAbortedError(ProtocolError):
    """The other party gave up on the session and said why."""


class Kind(enum.IntEnum):
    HELLO = 1
    BASE_OT_REQUEST = 2
    BASE_OT_REPLY = 3
    ROUND_REQUEST = 4
    GARBLED = 5
    OUTPUT_LABELS = 6
    ABORT = 7


class Channel(Protocol):
    """An ordered, reliable pipe of byte strings to the other party."""

    def send(self, frame: bytes) -> None: ...

    def recv(self, timeout: float | None = None) -> bytes: ...


class MemoryChannel:
    """One end of an in-process channel (see :func:`memory_channel_pair`)."""

    def __init__(self, inbox: queue.Queue[bytes], outbox: queue.Queue[bytes]) -> None:
        self._inbox = inbox
        self._outbox = outbox

    def send(self, frame: bytes) -> None:
        self._outbox.put(frame)

    def recv(self, timeout: float | None = None) -> bytes:
        try:
            frame = self._inbox.get(timeout=timeout)
        except queue.Empty:
            raise ProtocolError(
                f"the other party sent nothing for {timeout} s; is it still running?"
            ) from None
        return frame


def memory_channel_pair() -> tuple[MemoryChannel, MemoryChannel]:
    """Two connected in-process channel ends."""
    a: queue.Queue[bytes] = queue.Queue()
    b: queue.Queue[bytes] = queue.Queue()
    return MemoryChannel(a, b), MemoryChannel(b, a)


@dataclass
class Message:
    kind: Kind
    round_id: int
    payload: bytes


class FramedLink:
    """Sends and receives whole messages as authenticated, numbered frames.

    Before :meth:`set_key` (the hello exchange) frames carry a zero tag and are
    accepted only as HELLO; afterwards every frame must verify.
    """

    def __init__(
        self,
        channel: Channel,
        direction: int,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_message: int = DEFAULT_MAX_MESSAGE,
        timeout: float | None = 300.0,
    ) -> None:
        self._channel = channel
        self._direction = direction
        self._max_frame = max_frame
        self._max_message = max_message
        self._timeout = timeout
        self._key: bytes | None = None
        self._send_seq = 0
        self._recv_seq = 0

    def set_key(self, key: bytes) -> None:
        self._key = key

    def _one_time_key(self, direction: int, seq: int) -> bytes:
        assert self._key is not None
        return hashlib.blake2b(
            struct.pack(">BQ", direction, seq), key=self._key, digest_size=32
        ).digest()

    def _tag(self, direction: int, seq: int, header: bytes, body: memoryview) -> bytes:
        if self._key is None:
            return bytes(TAG_BYTES)
        mac = Poly1305(self._one_time_key(direction, seq))
        mac.update(header)
        mac.update(body)
        return mac.finalize()

    def send(self, kind: Kind, round_id: int, payload: Payload) -> None:
        """Send one message, split into frames of at most ``max_frame`` payload bytes.

        ``payload`` is bytes or a sequence of buffers sent back to back, so
        large numpy arrays go out without being joined first.
        """
        parts = (
            [memoryview(payload)]
            if isinstance(payload, bytes | bytearray | memoryview)
            else [memoryview(p).cast("B") for p in payload]
        )
        size = sum(p.nbytes for p in parts)
        if size > self._max_message:
            raise MessageSizeError(
                f"message of {size} bytes exceeds the limit of {self._max_message}"
            )
        chunks = [
            p[i : i + self._max_frame] for p in parts for i in range(0, p.nbytes, self._max_frame)
        ]
        if not chunks:
            chunks = [memoryview(b"")]
        for n, chunk in enumerate(chunks):
            last = n == len(chunks) - 1
            header = _HEADER.pack(
                MAGIC,
                PROTOCOL_VERSION,
                kind,
                _LAST if last else 0,
                0,
                self._send_seq,
                round_id,
                chunk.nbytes,
            )
            self._channel.send(
                b"".join((header, chunk, self._tag(self._direction, self._send_seq, header, chunk)))
            )
            self._send_seq += 1

    def recv(
        self, expected: Kind, round_id: int | None = None, max_bytes: int | None = None
    ) -> Message:
        """Receive one whole message of kind ``expected`` (for ``round_id`` if given).

        ``max_bytes``: the most the message may hold, when the protocol fixes its
        size; a peer that sends more is refused at the first frame past it, so it
        cannot make this side buffer more than the protocol needs.
        """
        limit = self._max_message if max_bytes is None else min(max_bytes, self._max_message)
        parts: list[memoryview] = []
        total = 0
        while True:
            frame = self._channel.recv(self._timeout)
            if len(frame) < HEADER_BYTES + TAG_BYTES:
                raise MessageSizeError(
                    f"truncated frame: {len(frame)} bytes is shorter than a header and tag"
                )
            magic, version, kind, flags, _, seq, rid, length = _HEADER.unpack_from(frame)
            if magic != MAGIC:
                raise ProtocolError(
                    "not a capc 2PC frame (bad magic); check that both ends run capc"
                )
            if version != PROTOCOL_VERSION:
                raise ProtocolError(
                    f"peer speaks 2PC protocol version {version}, this side {PROTOCOL_VERSION}; upgrade one side"
                )
            if length > self._max_frame:
                raise MessageSizeError(
                    f"frame {seq} carries {length} payload bytes, more than the {self._max_frame} "
                    "a frame may hold"
                )
            if len(frame) != HEADER_BYTES + length + TAG_BYTES:
                raise MessageSizeError(
                    f"frame {seq} announces {length} payload bytes but carries {len(frame) - HEADER_BYTES - TAG_BYTES}: truncated or padded"
                )
            view = memoryview(frame)
            body, tag = view[:-TAG_BYTES], frame[-TAG_BYTES:]
            if self._key is not None:
                try:
                    mac = Poly1305(self._one_time_key(1 - self._direction, seq))
                    mac.update(body)
                    mac.verify(tag)
                except InvalidSignature:
                    raise TamperedMessageError(
                        f"frame {seq} failed authentication: it was altered in transit or belongs to another session"
                    ) from None
            if seq != self._recv_seq:
                raise ReplayError(
                    f"expected frame {self._recv_seq}, got frame {seq}: a replayed or reordered message"
                )
            self._recv_seq += 1
            if kind == Kind.ABORT:
                raise PeerAbortedError(
                    f"the other party aborted: {frame[HEADER_BYTES:-TAG_BYTES].decode(errors='replace')}"
                )
            if kind != expected:
                name = Kind(kind).name if kind in Kind._value2member_map_ else str(kind)
                raise ProtocolError(f"expected a {expected.name} message, got {name}")
            if round_id is not None and rid != round_id:
                raise ReplayError(f"message for round {rid} arrived during round {round_id}")
            total += length
            if total > limit:
                raise MessageSizeError(
                    f"a {Kind(kind).name} message exceeds the limit of {limit} bytes"
                )
            parts.append(view[HEADER_BYTES:-TAG_BYTES])
            if flags & _LAST:
                return Message(Kind(kind), rid, b"".join(parts))

    def abort(self, reason: str) -> None:
        """Tell the other party why this side stops (best effort)."""
        with contextlib.suppress(Exception):
            self.send(Kind.ABORT, 0, reason.encode()[:4096])
