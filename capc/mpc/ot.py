"""Oblivious transfer: base OT from X25519, then IKNP extension.

Base OT (semi-honest; 128 per session). The receiver with choice c sends two
public keys: a real X25519 key in slot c and, in slot 1 - c, a hash-to-curve
point whose logarithm nobody knows. The sender encrypts message b under an
X25519 exchange with key b. Assumptions: computational Diffie-Hellman on
Curve25519 (the receiver cannot open the other slot), and indistinguishability
of a clamped X25519 public key from a hashed subgroup point (the sender cannot
tell the slots apart).

IKNP extension (Ishai, Kilian, Nissim, Petrank, Crypto 2003). Roles are
reversed in the base OTs: the extension receiver sends 128 pairs of seeds, the
extension sender picks one of each with its secret s. Every later batch of m
OTs costs 16 bytes from the receiver and 32 from the sender per OT, plus AES:
each seed is a PRG (AES-128-CTR) whose stream position advances with every
batch, so one set of base OTs serves a whole session. Rows are hashed with the
tweakable correlation-robust hash of :mod:`capc.mpc.blocks` with a tweak that
is unique per OT in the session.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from numpy.typing import NDArray

from capc.mpc.blocks import Blocks, FixedKeyHash, random_blocks, transpose_bits
from capc.mpc.curve25519 import oblivious_point

KAPPA = 128
KEY_BYTES = 32
SEED_BYTES = 16


class OTError(ValueError):
    """A malformed OT message."""


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

    def request(self, choices: NDArray[np.uint8]) -> tuple[bytes, ExtensionState]:
        """Message for the sender (128 x m bits) and the state to finish with."""
        m = choices.size
        mp = _padded(m)
        nbytes = mp // 8
        t = _prg_columns(self._k0, self._position, nbytes)
        g1 = _prg_columns(self._k1, self._position, nbytes)
        r = np.zeros(mp, dtype=np.uint8)
        r[:m] = choices
        rpack = np.packbits(r, bitorder="little")
        u = t ^ g1 ^ rpack[None, :]
        rows = transpose_bits(t, KAPPA)[:m].view(np.uint64).reshape(m, 2)
        state = ExtensionState(choices.astype(np.uint8), rows, self._counter)
        self._position += nbytes // 16
        self._counter += m
        return u.tobytes(), state

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
        self._position = 0
        self._counter = 0

    def respond(self, request: bytes, x0: Blocks, x1: Blocks) -> bytes:
        """Encrypt pairs (x0[j], x1[j]) (m, 2 each) against the receiver's request."""
        m = x0.shape[0]
        if x1.shape != x0.shape or x0.shape[1:] != (2,):
            raise ValueError(
                f"OT messages must be two arrays of shape (m, 2), got {x0.shape} and {x1.shape}"
            )
        mp = _padded(m)
        nbytes = mp // 8
        if len(request) != KAPPA * nbytes:
            raise OTError(
                f"OT extension request for {m} OTs must be {KAPPA * nbytes} bytes, got {len(request)}"
            )
        u = np.frombuffer(request, dtype=np.uint8).reshape(KAPPA, nbytes)
        q = _prg_columns(self._seeds, self._position, nbytes) ^ (u * self._s[:, None])
        rows = transpose_bits(q, KAPPA)[:m].view(np.uint64).reshape(m, 2)
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
