"""The end-to-end channel between the student and one answering party, relayed by the guardian.

Encrypted-query mode needs the student and each party to talk directly
(ciphertexts one way, masked logits the other, then their own 2PC), but a
hospital opens no port and the student reaches only the guardian. So
frames ride the party's Connect stream and the student's Relay stream, and
the guardian forwards them by round and party name.

The guardian must learn nothing from them: the party opens with a hello
carrying a fresh X25519 key; both ends derive a ChaCha20-Poly1305 key from
that key and the student's round key (sent with the round's work), bound to
the round and the party; every later frame is sealed with a per-direction
counter nonce, so a frame that is altered, replayed, reordered or moved to
another round or party fails to open.
"""

from __future__ import annotations

import hashlib
import queue
import struct
from collections.abc import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from capc.mpc.channel import ProtocolError
from services.common.buffers import BoundedBuffer
from services.common.limits import RELAY_BUFFER_FRAMES, RELAY_CHUNK_BYTES, STREAM_SEND_TIMEOUT_S

_INFO = b"capc/v1/relay"
#: Payload bytes per relayed frame; larger blobs are split.
CHUNK = RELAY_CHUNK_BYTES
_BLOB = struct.Struct("<Q")

Send = Callable[[bytes], None]


class RelayError(ProtocolError):
    """A relayed frame could not be accepted; the text says why."""


def _aad(round_id: int, party: str) -> bytes:
    return struct.pack("<Q", round_id) + party.encode()


def relay_session_id(round_id: int, party: str, party_key: bytes) -> bytes:
    """The 16-byte 2PC session id of one party's exchange in one round."""
    return hashlib.sha256(b"capc/v1/relay-session" + _aad(round_id, party) + party_key).digest()[
        :16
    ]


class RelayChannel:
    """One end of the sealed channel; a :class:`capc.mpc.channel.Channel`.

    ``send`` hands a sealed frame to the transport; the transport calls
    :meth:`feed` with every frame that arrives for this round and party.
    """

    def __init__(
        self, key: bytes, round_id: int, party: str, student_side: bool, send: Send
    ) -> None:
        self._aead = ChaCha20Poly1305(key)
        self._aad = _aad(round_id, party)
        self._out_dir = 1 if student_side else 2
        self._in_dir = 2 if student_side else 1
        self._sent = 0
        self._received = 0
        self._send = send
        # Bounded: the transport waits in feed() while this end is behind.
        self._inbox: BoundedBuffer[bytes] = BoundedBuffer(RELAY_BUFFER_FRAMES)

    @classmethod
    def for_party(
        cls, student_public: bytes, round_id: int, party: str, send: Send
    ) -> tuple[RelayChannel, bytes]:
        """The party's end and the hello payload (its ephemeral public key)."""
        try:
            student = X25519PublicKey.from_public_bytes(student_public)
        except ValueError as err:
            raise RelayError("the student's round key is not a 32-byte X25519 key") from err
        eph = X25519PrivateKey.generate()
        hello = eph.public_key().public_bytes_raw()
        return cls(
            _derive(eph.exchange(student), hello, round_id, party), round_id, party, False, send
        ), hello

    @classmethod
    def for_student(
        cls, student: X25519PrivateKey, hello: bytes, round_id: int, party: str, send: Send
    ) -> RelayChannel:
        """The student's end, from the party's hello."""
        try:
            shared = student.exchange(X25519PublicKey.from_public_bytes(hello))
        except ValueError as err:
            raise RelayError(f"{party}'s hello is not a 32-byte X25519 key") from err
        return cls(_derive(shared, hello, round_id, party), round_id, party, True, send)

    def _nonce(self, direction: int, n: int) -> bytes:
        return struct.pack("<IQ", direction, n)

    def send(self, frame: bytes) -> None:
        sealed = self._aead.encrypt(self._nonce(self._out_dir, self._sent), frame, self._aad)
        self._sent += 1
        self._send(sealed)

    def feed(self, sealed: bytes | None, timeout: float = STREAM_SEND_TIMEOUT_S) -> None:
        """A frame from the transport; None when the transport closed.

        Waits up to ``timeout`` s while this end's buffer is full; after that the
        reader is taken to be gone and the channel is closed.
        """
        if sealed is None:
            self._inbox.finish()
            return
        try:
            self._inbox.put(sealed, timeout=timeout)
        except queue.Full:
            self._inbox.close()

    def close(self) -> None:
        """This end is done: frames that still arrive are dropped, not buffered."""
        self._inbox.close()

    def recv(self, timeout: float | None = None) -> bytes:
        try:
            sealed = self._inbox.get(timeout=timeout)
        except queue.Empty:
            raise RelayError(
                f"the other side sent nothing for {timeout} s; is it still running?"
            ) from None
        if sealed is None:
            raise RelayError("the relay closed before the exchange finished")
        try:
            frame = self._aead.decrypt(self._nonce(self._in_dir, self._received), sealed, self._aad)
        except InvalidTag:
            raise RelayError(
                "a relayed frame does not open: altered, replayed, out of order, "
                "or from another round or party"
            ) from None
        self._received += 1
        return frame

    def send_blob(self, data: bytes) -> None:
        """A message of any size, as a length frame and chunks of at most CHUNK bytes."""
        self.send(_BLOB.pack(len(data)))
        for i in range(0, len(data), CHUNK):
            self.send(data[i : i + CHUNK])

    def recv_blob(self, max_bytes: int, timeout: float | None = None) -> bytes:
        """A message sent with :meth:`send_blob`; refuses one over ``max_bytes``."""
        head = self.recv(timeout)
        if len(head) != _BLOB.size:
            raise RelayError("expected a length frame")
        (size,) = _BLOB.unpack(head)
        if size > max_bytes:
            raise RelayError(f"a {size}-byte message exceeds the limit of {max_bytes}")
        parts = []
        got = 0
        while got < size:
            part = self.recv(timeout)
            got += len(part)
            if got > size:
                raise RelayError("a message is longer than it announced")
            parts.append(part)
        return b"".join(parts)


def _derive(shared: bytes, hello: bytes, round_id: int, party: str) -> bytes:
    return HKDF(hashes.SHA256(), 32, hello + _aad(round_id, party), _INFO).derive(shared)
