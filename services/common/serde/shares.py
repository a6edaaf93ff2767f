"""Vote shares, validity proofs, vote checks and participation masks on the wire."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from capc.mpc import validity
from services.common.protocol import RequestError
from services.common.serde.wire import SHARE_DTYPE, check_length
from services.proto.capc.v1 import common_pb2, guardian_pb2


def share_to_bytes(share: NDArray[np.uint64]) -> bytes:
    """A (B, width) uint64 share as the bytes of ``Shares.guardian_share``."""
    if share.dtype != np.uint64 or share.ndim != 2:
        # A signed or float share would be wrapped silently: a bug, not a request.
        raise TypeError(f"a share is a (B, width) uint64 array, got {share.dtype} {share.shape}")
    return np.ascontiguousarray(share, dtype=SHARE_DTYPE).tobytes()


def shares_to_proto(
    round_id: int,
    share: NDArray[np.uint64],
    *,
    sealed_seed: bytes = b"",
    batch_hash: bytes = b"",
    proof: NDArray[np.uint64] | None = None,
) -> guardian_pb2.Shares:
    """A party's shares message: the guardian share with its shape, and the seed or hash;
    ``proof``: the guardian's share of its vote validity proof (B, n + 2), if any."""
    return guardian_pb2.Shares(
        round_id=round_id,
        shape=list(share.shape),
        guardian_share=share_to_bytes(share),
        sealed_seed=sealed_seed,
        batch_hash=batch_hash,
        proof=None
        if proof is None
        else guardian_pb2.ProofShare(shape=list(proof.shape), share=share_to_bytes(proof)),
    )


def share_from_bytes(data: bytes, shape: tuple[int, int]) -> NDArray[np.uint64]:
    """The (B, width) uint64 share in ``data``, which must be exactly that many values."""
    check_length(data, SHARE_DTYPE, shape, "the guardian share")
    return np.frombuffer(data, dtype=SHARE_DTYPE).astype(np.uint64).reshape(shape)


def shares_from_proto(
    msg: guardian_pb2.Shares, expected: tuple[int, int], field: bool = False
) -> NDArray[np.uint64]:
    """The guardian share of a shares message, which must have shape ``expected``: ring
    elements, or with ``field`` proven bit shares, each an element of F_p (below p)."""
    if tuple(msg.shape) != expected:
        raise RequestError(
            f"shares for round {msg.round_id} must have shape {expected}, got {tuple(msg.shape)}"
        )
    if field:
        return field_share_from_bytes(msg.guardian_share, expected, "the bit shares")
    return share_from_bytes(msg.guardian_share, expected)


def proof_from_proto(msg: guardian_pb2.Shares, expected: tuple[int, int]) -> NDArray[np.uint64]:
    """The guardian's share of a party's validity proof, which must have shape ``expected``
    and lie in F_p (each value below 2^61 - 1)."""
    if not msg.HasField("proof") or tuple(msg.proof.shape) != expected:
        got = tuple(msg.proof.shape) if msg.HasField("proof") else "none"
        raise RequestError(
            f"round {msg.round_id} takes vote validity proofs: the proof share must have "
            f"shape {expected}, got {got}"
        )
    check_length(msg.proof.share, SHARE_DTYPE, expected, "the proof share")
    return _field_elements(msg.proof.share, expected, "the proof share")


def field_share_from_bytes(data: bytes, shape: tuple[int, ...], what: str) -> NDArray[np.uint64]:
    """A (shape) array of F_p elements (uint64 little-endian, each below p) in ``data``."""
    check_length(data, SHARE_DTYPE, shape, what)
    return _field_elements(data, shape, what)


def _field_elements(data: bytes, shape: tuple[int, ...], what: str) -> NDArray[np.uint64]:
    values = np.frombuffer(data, dtype=SHARE_DTYPE).astype(np.uint64).reshape(shape)
    if (values >= np.uint64(validity.P)).any():
        raise RequestError(f"{what} must hold elements of F_p (below 2^61 - 1)")
    return values


def vote_check_to_proto(
    header: common_pb2.Header,
    round_id: int,
    parties: list[str],
    check: validity.VerifierShare,
) -> guardian_pb2.VoteCheck:
    """The student's verifier shares for ``parties``: f(t) (P, B) and combinations (P,)."""
    return guardian_pb2.VoteCheck(
        header=header,
        round_id=round_id,
        parties=parties,
        wire=share_to_bytes(np.ascontiguousarray(check.wire, dtype=np.uint64)),
        combined=share_to_bytes(np.ascontiguousarray(check.combined, dtype=np.uint64)[None]),
    )


def vote_check_from_proto(msg: guardian_pb2.VoteCheck, batch: int) -> validity.VerifierShare:
    """The student's verifier shares in ``msg``, for len(msg.parties) parties and ``batch``
    queries; RequestError when their sizes are off (values are checked by ``accept``)."""
    npart = len(msg.parties)
    check_length(msg.wire, SHARE_DTYPE, (npart, batch), "the wire shares")
    check_length(msg.combined, SHARE_DTYPE, (npart,), "the combined shares")
    wire = np.frombuffer(msg.wire, dtype=SHARE_DTYPE).astype(np.uint64).reshape(npart, batch)
    combined = np.frombuffer(msg.combined, dtype=SHARE_DTYPE).astype(np.uint64)
    return validity.VerifierShare(wire, combined)


# -- participation masks ------------------------------------------------------------
def participation_to_bytes(mask: NDArray[np.bool_] | None) -> bytes:
    """A (B,) mask of the queries a party votes on; None (all of them) is empty."""
    if mask is None:
        return b""
    return np.packbits(mask, bitorder="little").tobytes()


def participation_from_bytes(data: bytes, count: int) -> NDArray[np.bool_] | None:
    """The (count,) mask in ``data``; None when empty (the party votes on every query)."""
    if not data:
        return None
    bits = np.frombuffer(data, dtype=np.uint8)
    if len(bits) != (count + 7) // 8:
        raise RequestError(f"participation must carry {count} bits, got {8 * len(bits)}")
    mask: NDArray[np.bool_] = np.unpackbits(bits, count=count, bitorder="little").astype(bool)
    return mask
