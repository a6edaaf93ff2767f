"""Oblivious transfer: base OT from X25519, then IKNP extension with the KOS check.

Base OT (semi-honest; 128 per session). The receiver with choice c sends two
public keys: a real X25519 key in slot c and, in slot 1 - c, a hash-to-curve
point whose logarithm nobody knows. The sender encrypts message b under an
X25519 exchange with key b. Assumptions: computational Diffie-Hellman on
Curve25519 (the receiver cannot open the other slot), and indistinguishability
of a clamped X25519 public key from a hashed subgroup point (the sender cannot
tell the slots apart).

IKNP extension (Ishai, Kilian, Nissim, Petrank, Crypto 2003). Roles are
reversed in the base OTs: the extension receiver (the student, whose choice
bits are its circuit inputs) sends 128 pairs of seeds, the extension sender
(the guardian) picks one of each with its secret bits (``s`` in the code):
the 128-bit Delta of the correlation q_j = t_j xor r_j Delta between the rows
of the two parties' matrices. Each seed is a PRG (AES-128-CTR) whose stream position advances
with every batch, so one set of base OTs serves a whole session. Rows are
hashed with the tweakable correlation-robust hash of :mod:`capc.mpc.blocks`
with a tweak that is unique per OT in the session.

Consistency check (Keller, Orsini, Scholl, "Actively secure OT extension with
optimal overhead", CRYPTO 2015). IKNP alone trusts the receiver to use one
choice vector r in every column u^i = G(k0_i) xor G(k1_i) xor r. A receiver
that puts r xor e_j into column i makes the sender's row
q_j = t_j xor r_j Delta xor Delta_i e_i: OT j decrypts correctly exactly when
Delta_i = 0, so the receiver learns Delta_i from whether its garbled
evaluation still works (selective failure), bit after bit, until it knows
Delta and with it both messages of every OT. So every batch of m OTs is
extended to m' = m + kappa + s (rounded up to a multiple of 128), the last
m' - m with random choice bits. With chi_j = H^(m' + 1 - j) for the row j in
0..m'-1 and a challenge H fixed only after u (H is derived from SHA-256 of the
session's joint key, the batch's position and u: Fiat-Shamir, so no extra
message), the receiver appends x = sum_j chi_j r_j and t = sum_j chi_j t_j in
GF(2^128), and the sender checks sum_j chi_j q_j = t + x Delta before it
encrypts anything. A failure raises :class:`OTConsistencyError` and closes the
sender for good. The m' - m extra OTs are discarded, never hashed.

Security of the check, with statistical parameter s = 64:

- honest receiver: x is uniform, so (x, t) says nothing about the choices,
  unless H lies in a proper subfield of GF(2^128) (the extra rows' powers of
  H then fail to span the field): probability 2^-64;
- deviating receiver: following KOS, a receiver whose columns do not all
  encode one choice vector passes only by guessing bits of Delta, each guess
  halving its chance, unless H makes two different column deviations cancel,
  which has probability at most 128^2 (m' + 1) / 2^128 per challenge (below
  2^-86 for m' < 2^28); re-deriving H for another u costs a SHA-256
  evaluation per try. A failed check ends the session, and Delta is fresh for
  every session, so guesses cannot accumulate: learning d bits of Delta costs
  an abort with probability 1 - 2^-d.

Wire cost: 16 bytes from the receiver and 32 from the sender per OT, plus
16 bytes per check OT (m' - m is between 192 and 319) and 32 bytes for
(x, t): at most 5 KiB per batch whatever its size.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import time
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from numpy.typing import NDArray

from capc.mpc import gf128
from capc.mpc.blocks import BLOCK_BYTES, Blocks, FixedKeyHash, random_blocks, transpose_bits
from capc.mpc.channel import ProtocolError
from capc.mpc.curve25519 import oblivious_point

KAPPA = 128
KEY_BYTES = 32
SEED_BYTES = 16
#: Statistical security parameter s of the consistency check (bits).
STAT_SECURITY = 64
#: OTs added to every batch for the consistency check, then discarded (KOS: kappa + s).
CHECK_OTS = KAPPA + STAT_SECURITY
#: The receiver's answer to the check: x and t, one GF(2^128) element each.
CHECK_BYTES = 2 * BLOCK_BYTES


class OTError(ValueError):
    """A malformed OT message."""


class OTConsistencyError(ProtocolError):
    """The extension receiver's matrix failed the consistency check; the session must end."""


# -- base OT -----------------------------------------------------------------


@dataclass
class BaseOTReceiver:
    """Base-OT receiver with one choice bit per OT."""

    choices: NDArray[np.uint8]
    _secrets: list[X25519PrivateKey]

    @classmethod
    def start(cls, choices: NDArray[np.uint8]) -> tuple[BaseOTReceiver, bytes]:
        """Returns the receiver and its first message: 2 x 32-byte keys per OT."""
        secrets = [X25519PrivateKey.generate() for _ in range(choices.size)]
        keys = bytearray()
        for c, sk in zip(choices.tolist(), secrets, strict=True):
            real = sk.public_key().public_bytes_raw()
            fake = oblivious_point(os.urandom(32))
            keys += (real + fake) if c == 0 else (fake + real)
        return cls(choices.astype(np.uint8), secrets), bytes(keys)

    def finish(self, reply: bytes) -> list[bytes]:
        """The chosen 16-byte messages from the sender's reply."""
        n = self.choices.size
        per = KEY_BYTES + 2 * SEED_BYTES
        if len(reply) != n * per:
            raise OTError(f"base OT reply must be {n * per} bytes, got {len(reply)}")
        out = []
        for i, (c, sk) in enumerate(zip(self.choices.tolist(), self._secrets, strict=True)):
            chunk = reply[i * per : (i + 1) * per]
            epk = chunk[:KEY_BYTES]
            ct = chunk[KEY_BYTES + c * SEED_BYTES : KEY_BYTES + (c + 1) * SEED_BYTES]
            pad = _pad(sk.exchange(X25519PublicKey.from_public_bytes(epk)), epk, i, c)
            out.append(bytes(a ^ b for a, b in zip(ct, pad, strict=True)))
        return out


def _pad(shared: bytes, epk: bytes, index: int, slot: int) -> bytes:
    h = hashlib.sha256(
        b"capc/mpc/base-ot/" + shared + epk + index.to_bytes(4, "big") + bytes([slot])
    )
    return h.digest()[:SEED_BYTES]


def base_ot_send(messages: list[tuple[bytes, bytes]], request: bytes) -> bytes:
    """Sender side: encrypt each pair of 16-byte messages to the receiver's two keys."""
    n = len(messages)
    if len(request) != n * 2 * KEY_BYTES:
        raise OTError(f"base OT request must be {n * 2 * KEY_BYTES} bytes, got {len(request)}")
    reply = bytearray()
    for i, (m0, m1) in enumerate(messages):
        e = X25519PrivateKey.generate()
        epk = e.public_key().public_bytes_raw()
        reply += epk
        for slot, msg in enumerate((m0, m1)):
            raw = request[(2 * i + slot) * KEY_BYTES : (2 * i + slot + 1) * KEY_BYTES]
            try:
                shared = e.exchange(X25519PublicKey.from_public_bytes(raw))
            except ValueError as err:
                raise OTError(f"base OT key {i}/{slot} is not a usable X25519 public key") from err
            reply += bytes(a ^ b for a, b in zip(msg, _pad(shared, epk, i, slot), strict=True))
    return bytes(reply)


# -- IKNP extension --------------------------------------------------------------


def _prg_columns(seeds: list[bytes], position: int, nbytes: int) -> NDArray[np.uint8]:
    """Row i: ``nbytes`` of seed i's AES-CTR stream from block ``position``; (128, nbytes)."""
    nblocks = nbytes // 16
    return np.stack([random_blocks(nblocks, s, position).view(np.uint8).reshape(-1) for s in seeds])


def _padded(m: int) -> int:
    return -(-m // KAPPA) * KAPPA


def _extended(m: int) -> int:
    """Rows of the matrix for m OTs: m plus the check's OTs, a multiple of 128."""
    return _padded(m + CHECK_OTS)


def request_bytes(m: int) -> int:
    """Size of the receiver's message for m OTs: the 128 x m' bit matrix u, then (x, t)."""
    return KAPPA * _extended(m) // 8 + CHECK_BYTES


def _challenge_key(
    session: bytes, position: int, counter: int, m: int, u: NDArray[np.uint8]
) -> bytes:
    """AES key whose GHASH key H is the check's challenge; computed after u is fixed.

    ``session`` (the joint fixed AES key) stops precomputation across sessions;
    position and counter make every batch's challenge different.
    """
    h = hashlib.sha256(b"capc/mpc/ot-check/" + session + struct.pack(">QQQ", position, counter, m))
    h.update(np.ascontiguousarray(u).data)
    return h.digest()[:16]


class ExtensionReceiver:
    """IKNP receiver (the evaluator): holds both seeds of every base OT."""

    def __init__(self, seed_pairs: list[tuple[bytes, bytes]], hasher: FixedKeyHash) -> None:
        if len(seed_pairs) != KAPPA:
            raise ValueError(f"IKNP needs {KAPPA} base OTs, got {len(seed_pairs)}")
        self._k0 = [p[0] for p in seed_pairs]
        self._k1 = [p[1] for p in seed_pairs]
        self._hash = hasher
        self._position = 0  # in 16-byte blocks of every seed's stream
        self._counter = 0  # OTs done so far; part of each tweak
        self.last_check_s = 0.0  # seconds spent on the consistency check in the last batch

    def request(self, choices: NDArray[np.uint8]) -> tuple[bytes, ExtensionState]:
        """Message for the sender (:func:`request_bytes` of m) and the state to finish with.

        ``choices`` holds m bits (uint8 0/1), one per OT.
        """
        m = choices.size
        mx = _extended(m)
        nbytes = mx // 8
        t = _prg_columns(self._k0, self._position, nbytes)
        g1 = _prg_columns(self._k1, self._position, nbytes)
        # The check's OTs get random choices: they are what makes x uniform.
        r = np.concatenate([choices.astype(np.uint8).ravel(), random_choices(mx - m)])
        u = t ^ g1 ^ np.packbits(r, bitorder="little")[None, :]
        t_rows = transpose_bits(t, KAPPA)  # (m', 16): row j of the receiver's matrix
        start = time.perf_counter()
        key = _challenge_key(self._hash.key, self._position, self._counter, m, u)
        # x = sum chi_j r_j: hash the rows r_j * 1, where 1 is 0x80 in byte 0 (GCM's bit order).
        r_rows = np.zeros((mx, BLOCK_BYTES), dtype=np.uint8)
        r_rows[:, 0] = r << 7
        check = gf128.poly_hash(key, r_rows) + gf128.poly_hash(key, t_rows)
        self.last_check_s = time.perf_counter() - start
        rows = t_rows[:m].view(np.uint64).reshape(m, 2)
        state = ExtensionState(choices.astype(np.uint8).ravel(), rows, self._counter)
        self._position += nbytes // 16
        self._counter += m
        return u.tobytes() + check, state

    def finish(self, state: ExtensionState, reply: bytes | memoryview) -> Blocks:
        """The chosen blocks (m, 2) from the sender's reply (m x 2 blocks)."""
        m = state.choices.size
        if len(reply) != m * 32:
            raise OTError(f"OT extension reply must be {m * 32} bytes, got {len(reply)}")
        y = np.frombuffer(reply, dtype="<u8").astype(np.uint64).reshape(m, 2, 2)
        tw = np.arange(state.counter, state.counter + m, dtype=np.uint64)
        pad = self._hash(state.rows, tw, _OT_DOMAIN)
        chosen = np.where(state.choices[:, None].astype(bool), y[:, 1], y[:, 0])
        return chosen ^ pad


@dataclass
class ExtensionState:
    choices: NDArray[np.uint8]
    rows: Blocks
    counter: int


_OT_DOMAIN = 1 << 63


class ExtensionSender:
    """IKNP sender (the garbler): knows one seed per base OT, chosen by its secret s."""

    def __init__(self, s: NDArray[np.uint8], seeds: list[bytes], hasher: FixedKeyHash) -> None:
        if s.size != KAPPA or len(seeds) != KAPPA:
            raise ValueError(f"IKNP needs {KAPPA} base OTs")
        self._s = s.astype(np.uint8)
        self._seeds = seeds
        self._hash = hasher
        self._s_block = np.packbits(self._s, bitorder="little").view(np.uint64).astype(np.uint64)
        # Delta as a GF(2^128) element in GCM byte order: the same bytes as a matrix row.
        self._delta = np.packbits(self._s, bitorder="little").tobytes()
        self._position = 0
        self._counter = 0
        self._failed = False
        self.last_check_s = 0.0  # seconds spent on the consistency check in the last batch

    def respond(self, request: bytes, x0: Blocks, x1: Blocks) -> bytes:
        """Encrypt pairs (x0[j], x1[j]) (m, 2 each) against the receiver's request.

        Checks the request first (see the module docstring); raises
        :class:`OTConsistencyError`, having sent nothing, if it fails, and on
        every call after that.
        """
        if self._failed:
            raise OTConsistencyError(
                "an earlier OT consistency check failed; this OT extension is closed: open a new session"
            )
        m = x0.shape[0]
        if x1.shape != x0.shape or x0.shape[1:] != (2,):
            raise ValueError(
                f"OT messages must be two arrays of shape (m, 2), got {x0.shape} and {x1.shape}"
            )
        mx = _extended(m)
        nbytes = mx // 8
        if len(request) != request_bytes(m):
            raise OTError(
                f"OT extension request for {m} OTs must be {request_bytes(m)} bytes, got {len(request)}"
            )
        body = np.frombuffer(request, dtype=np.uint8)
        u = body[: KAPPA * nbytes].reshape(KAPPA, nbytes)
        x = body[KAPPA * nbytes : KAPPA * nbytes + BLOCK_BYTES].tobytes()
        t_sum = body[KAPPA * nbytes + BLOCK_BYTES :]
        q = _prg_columns(self._seeds, self._position, nbytes) ^ (u * self._s[:, None])
        q_rows = transpose_bits(q, KAPPA)  # (m', 16)
        start = time.perf_counter()
        key = _challenge_key(self._hash.key, self._position, self._counter, m, u)
        expect = np.frombuffer(gf128.gcm_mul(x, self._delta), dtype=np.uint8) ^ t_sum
        consistent = hmac.compare_digest(gf128.poly_hash(key, q_rows), expect.tobytes())
        self.last_check_s = time.perf_counter() - start
        if not consistent:
            self._failed = True
            raise OTConsistencyError(
                "the evaluator's OT extension request failed the consistency check: its matrix "
                "columns do not encode one choice vector (a deviating or faulty evaluator); "
                "no OT reply was sent and this session is closed"
            )
        rows = q_rows[:m].view(np.uint64).reshape(m, 2)
        tw = np.arange(self._counter, self._counter + m, dtype=np.uint64)
        pads = self._hash(
            np.concatenate([rows, rows ^ self._s_block]), np.concatenate([tw, tw]), _OT_DOMAIN
        )
        self._position += nbytes // 16
        self._counter += m
        y = np.stack([x0 ^ pads[:m], x1 ^ pads[m:]], axis=1)
        return np.ascontiguousarray(y).astype("<u8").tobytes()


def base_seeds() -> list[tuple[bytes, bytes]]:
    """Fresh seed pairs for the base OTs of one session."""
    return [(os.urandom(SEED_BYTES), os.urandom(SEED_BYTES)) for _ in range(KAPPA)]


def random_choices(n: int) -> NDArray[np.uint8]:
    """Uniform secret choice bits from the OS CSPRNG."""
    return np.unpackbits(np.frombuffer(os.urandom(-(-n // 8)), dtype=np.uint8), bitorder="little")[
        :n
    ]
