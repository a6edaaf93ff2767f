"""Every conversion between wire messages and arrays, with the checks on what arrives.

The wire formats are fixed by the protos: a ``Tensor`` is C-order little-endian
data of the dtype it names ("float32" queries, "int64" labels); vote shares are
(B, width) little-endian uint64; a participation mask is one bit per query,
least significant bit first, padded to whole bytes, and empty when every party
votes on every query. Whatever arrives is checked against its shape before it
is read, and refused with :class:`~services.common.protocol.RequestError`
saying what was wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from capc.mechanisms import Mechanism, MechanismError, mechanism_class
from capc.mpc import validity
from capc.round.messages import (
    Opened,
    PartyShares,
    QueryBatch,
    Retry,
    RoundRequest,
    RoundWork,
    Settlement,
    ShareLayout,
    VoteVerdict,
)
from services.common.limits import MAX_BATCH, MAX_CIPHERTEXTS, count_refusal
from services.common.protocol import RequestError, query_recipe
from services.common.task import TaskConfig
from services.proto.capc.v1 import common_pb2, guardian_pb2

TensorDtype = Literal["float32", "int64"]
_WIRE: dict[str, np.dtype[np.generic]] = {
    "float32": np.dtype("<f4"),
    "int64": np.dtype("<i8"),
}
_SHARE = np.dtype("<u8")


# -- tensors ------------------------------------------------------------------------
def tensor_to_proto(array: ArrayLike, dtype: TensorDtype) -> common_pb2.Tensor:
    """``array`` as a Tensor of ``dtype``, converted if it is of another."""
    x = np.ascontiguousarray(array, dtype=_WIRE[dtype])
    return common_pb2.Tensor(shape=list(x.shape), dtype=dtype, data=x.tobytes())


def tensor_from_proto(
    t: common_pb2.Tensor, dtype: TensorDtype, what: str = "the tensor"
) -> NDArray[np.generic]:
    """The array of a Tensor that must be of ``dtype``; read in place, so read-only."""
    if t.dtype != dtype:
        raise RequestError(f"{what} must be {dtype}, got {t.dtype!r}")
    shape = tuple(int(n) for n in t.shape)
    _check_length(t.data, _WIRE[dtype], shape, what)
    return np.frombuffer(t.data, dtype=_WIRE[dtype]).reshape(shape)


def queries_to_proto(queries: ArrayLike) -> common_pb2.Tensor:
    """Queries (N, *input_shape) as a float32 Tensor."""
    return tensor_to_proto(queries, "float32")


def queries_from_proto(
    t: common_pb2.Tensor, input_shape: tuple[int, ...], max_count: int, what: str = "a batch"
) -> NDArray[np.float32]:
    """The queries of a Tensor, (N, *input_shape) float32 with 1 <= N <= ``max_count``, all finite.

    ``what`` names the request in the count refusal ("a batch", "a job").
    """
    if t.dtype != "float32":
        raise RequestError(f"queries must be float32, got {t.dtype!r}; convert them before sending")
    shape = tuple(int(n) for n in t.shape)
    if len(shape) != 1 + len(input_shape) or shape[1:] != input_shape:
        raise RequestError(
            f"queries must have shape (N, {', '.join(map(str, input_shape))}), got {shape}"
        )
    refusal = count_refusal(shape[0], max_count, what)
    if refusal is not None:
        raise RequestError(refusal)
    _check_length(t.data, _WIRE["float32"], shape, "queries")
    x: NDArray[np.float32] = np.frombuffer(t.data, dtype="<f4").reshape(shape)
    bad = ~np.isfinite(x).reshape(len(x), -1).all(axis=1)
    if bad.any():
        raise RequestError(
            f"{int(bad.sum())} queries contain NaN or infinity; clean them and send them again"
        )
    return x


def labels_to_proto(labels: ArrayLike) -> common_pb2.Tensor:
    """Labels (N,) or (N, k), -1 where not answered, as an int64 Tensor."""
    return tensor_to_proto(labels, "int64")


def labels_from_proto(t: common_pb2.Tensor) -> NDArray[np.int64]:
    labels: NDArray[np.int64] = tensor_from_proto(t, "int64", "labels").astype(np.int64, copy=False)
    return labels


# -- vote shares --------------------------------------------------------------------
def share_to_bytes(share: NDArray[np.uint64]) -> bytes:
    """A (B, width) uint64 share as the bytes of ``Shares.guardian_share``."""
    if share.dtype != np.uint64 or share.ndim != 2:
        # A signed or float share would be wrapped silently: a bug, not a request.
        raise TypeError(f"a share is a (B, width) uint64 array, got {share.dtype} {share.shape}")
    return np.ascontiguousarray(share, dtype=_SHARE).tobytes()


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
    _check_length(data, _SHARE, shape, "the guardian share")
    return np.frombuffer(data, dtype=_SHARE).astype(np.uint64).reshape(shape)


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
    _check_length(msg.proof.share, _SHARE, expected, "the proof share")
    return _field_elements(msg.proof.share, expected, "the proof share")


def field_share_from_bytes(data: bytes, shape: tuple[int, ...], what: str) -> NDArray[np.uint64]:
    """A (shape) array of F_p elements (uint64 little-endian, each below p) in ``data``."""
    _check_length(data, _SHARE, shape, what)
    return _field_elements(data, shape, what)


def _field_elements(data: bytes, shape: tuple[int, ...], what: str) -> NDArray[np.uint64]:
    values = np.frombuffer(data, dtype=_SHARE).astype(np.uint64).reshape(shape)
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
    _check_length(msg.wire, _SHARE, (npart, batch), "the wire shares")
    _check_length(msg.combined, _SHARE, (npart,), "the combined shares")
    wire = np.frombuffer(msg.wire, dtype=_SHARE).astype(np.uint64).reshape(npart, batch)
    combined = np.frombuffer(msg.combined, dtype=_SHARE).astype(np.uint64)
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


def _check_length(
    data: bytes, dtype: np.dtype[np.generic], shape: tuple[int, ...], what: str
) -> None:
    # math.prod on Python ints: a forged shape cannot overflow into a small byte count.
    expected = dtype.itemsize * math.prod(shape)
    if len(data) != expected:
        raise RequestError(
            f"{what} must be {expected} bytes ({shape} of {dtype.itemsize}-byte "
            f"little-endian {dtype.name}), got {len(data)}; shape and data disagree"
        )


# -- mechanisms ---------------------------------------------------------------------
def mechanism_to_proto(mechanism: Mechanism) -> common_pb2.Mechanism:
    """A round's mechanism, as the answering parties and the jobs API receive it."""
    return common_pb2.Mechanism(
        name=mechanism.name,
        outputs=mechanism.outputs,
        params={k: float(v) for k, v in mechanism.params.model_dump().items()},
    )


def mechanism_from_proto(msg: common_pb2.Mechanism) -> Mechanism:
    """The mechanism a round names; RequestError if the message is not a valid one."""
    if not msg.name or not msg.outputs:
        raise RequestError("the round names no mechanism or label space; is the guardian current?")
    try:
        return mechanism_class(msg.name).from_params(msg.outputs, dict(msg.params))
    except MechanismError as err:
        raise RequestError(str(err)) from err


def overrides_to_proto(overrides: Mapping[str, float] | None) -> common_pb2.Mechanism | None:
    """A job's overrides (parameter -> value) as a request carries them; None when empty."""
    if not overrides:
        return None
    return common_pb2.Mechanism(params={k: float(v) for k, v in overrides.items()})


def overrides_from_proto(msg: common_pb2.Mechanism | None) -> dict[str, float] | None:
    """A request's overrides; name, outputs and zero values mean 'keep the task's'."""
    if msg is None:
        return None
    if msg.name or msg.outputs:
        raise RequestError(
            "a job may only raise mechanism parameters; the mechanism and its label space are the task's"
        )
    out = {k: float(v) for k, v in msg.params.items() if v != 0.0}
    return out or None


# -- the guardian's round (capc.round messages) ---------------------------------------
#: Ciphertext layouts an encrypted batch may name.
LAYOUTS = ("batched", "single")


def query_batch_from_proto(msg: common_pb2.QueryBatch, task: TaskConfig) -> QueryBatch:
    """A round's queries, checked for ``task``: a plain tensor, a recipe with the hash of
    its batch, or ciphertexts made for the task's encryption settings."""
    source = msg.WhichOneof("source")
    if source == "encrypted":
        return _encrypted_batch(msg.encrypted, task)
    if source == "tensor" and task.encryption is not None:
        raise RequestError(
            f"task {task.name} takes its private queries encrypted only; send CKKS ciphertexts"
        )
    if source == "recipe":
        recipe = query_recipe(msg.recipe, task.input_shape, MAX_BATCH)
        if len(msg.recipe.batch_hash) != 32:
            raise RequestError(
                "a recipe must carry the 32-byte SHA-256 of its batch, for every party to check"
            )
        return QueryBatch("recipe", recipe.count, bytes(msg.recipe.batch_hash))
    if source != "tensor":
        raise RequestError("queries must be a float32 tensor, a recipe or an encrypted batch")
    return QueryBatch("tensor", len(queries_from_proto(msg.tensor, task.input_shape, MAX_BATCH)))


def _encrypted_batch(batch: common_pb2.EncryptedBatch, task: TaskConfig) -> QueryBatch:
    if task.encryption is None:
        raise RequestError(
            f"task {task.name} takes no encrypted queries (it has no encryption settings)"
        )
    if batch.settings_json != task.encryption.to_json():
        raise RequestError(
            f"the ciphertexts were made for encryption settings {batch.settings_json or 'none'}, "
            f"the task has {task.encryption.to_json()}"
        )
    if batch.layout not in LAYOUTS:
        raise RequestError(f"layout must be one of {', '.join(LAYOUTS)}, got {batch.layout!r}")
    # One query a slot: a CKKS ciphertext holds no more queries than it has slots.
    refusal = count_refusal(
        batch.batch, min(MAX_BATCH, task.encryption.params.slots), "an encrypted batch"
    )
    if refusal is not None:
        raise RequestError(refusal)
    if not 1 <= batch.ciphertexts <= MAX_CIPHERTEXTS:
        raise RequestError(
            f"a round names 1 to {MAX_CIPHERTEXTS} ciphertexts, got {batch.ciphertexts}"
        )
    if len(batch.ciphertext_hash) != 32:
        raise RequestError("ciphertext_hash must be the 32-byte SHA-256 of the ciphertexts")
    if len(batch.context_id) != 64 or any(c not in "0123456789abcdef" for c in batch.context_id):
        raise RequestError("context_id must be the hex SHA-256 of the public context")
    return QueryBatch("encrypted", int(batch.batch), bytes(batch.ciphertext_hash))


def round_request_from_proto(
    msg: guardian_pb2.OpenRoundRequest,
    querier: str,
    session_id: bytes,
    queries: QueryBatch,
    left_out: frozenset[str] = frozenset(),
    disclosure: Mapping[str, object] | None = None,
) -> RoundRequest:
    """An OpenRound request as the round core takes it (its queries checked already):
    ``left_out`` and ``disclosure`` are the guardian's own terms for the querier."""
    if not msg.round_key:
        raise RequestError("a round needs a round_key chosen by the student, used once")
    if len(msg.student_public_key) != 32:
        raise RequestError("student_public_key must be a 32-byte X25519 key")
    retry = None
    if msg.HasField("retry"):
        retry = Retry(int(msg.retry.round_id), msg.retry.party, msg.retry.reason)
    return RoundRequest(
        msg.round_key,
        querier,
        queries,
        bytes(msg.student_public_key),
        session_id,
        frozenset(msg.exclude),
        left_out,
        retry,
        disclosure,
    )


def round_work_to_proto(
    work: RoundWork, queries: common_pb2.QueryBatch, task_json: str
) -> guardian_pb2.RoundWork:
    """What one party is sent for a round: the core's work, with the request's queries and
    the task's canonical JSON."""
    return guardian_pb2.RoundWork(
        round_id=work.round_id,
        queries=queries,
        mechanism=mechanism_to_proto(work.mechanism),
        student_public_key=work.student_public_key,
        vote_weight=work.vote_weight,
        frac_bits=work.frac_bits,
        participation=participation_to_bytes(work.participation),
        teachers=work.teachers,
        task_json=task_json,
    )


def party_shares_from_proto(
    msg: guardian_pb2.Shares, party: str, layout: ShareLayout
) -> PartyShares:
    """A party's shares of the layout its round takes; RequestError when they are not. A
    proof is read first: a party sending plain shares is told proofs are needed."""
    expected = (layout.batch, layout.width)
    proof = None
    if layout.proof_width is not None:
        proof = proof_from_proto(msg, (layout.batch, layout.proof_width))
    share = shares_from_proto(msg, expected, field=layout.field)
    return PartyShares(
        int(msg.round_id), party, share, bytes(msg.sealed_seed), bytes(msg.batch_hash), proof
    )


def opened_to_proto(opened: Opened) -> guardian_pb2.OpenRoundReply:
    return guardian_pb2.OpenRoundReply(
        round_id=opened.round_id,
        included=list(opened.included),
        excluded_remaining_epsilon=dict(opened.excluded_remaining),
        seeds=[guardian_pb2.SealedSeed(party=p, sealed=s) for p, s in opened.seeds.items()],
        teachers=dict(opened.teachers),
        challenge=opened.challenge,
    )


def vote_verdict_to_proto(verdict: VoteVerdict) -> guardian_pb2.VoteCheckReply:
    return guardian_pb2.VoteCheckReply(
        round_id=verdict.round_id,
        included=list(verdict.included),
        excluded=[
            guardian_pb2.ExcludedVote(party=p, reason=why) for p, why in verdict.excluded.items()
        ],
        vote_weights=dict(verdict.vote_weights),
        teachers=dict(verdict.teachers),
    )


_SETTLEMENTS = {
    "charged": guardian_pb2.SETTLEMENT_CHARGED,
    "not_charged": guardian_pb2.SETTLEMENT_NOT_CHARGED,
    "worst_case": guardian_pb2.SETTLEMENT_WORST_CASE,
}


def settlement_to_proto(
    settled: Settlement, head: guardian_pb2.AuditHead
) -> guardian_pb2.RoundSettled:
    """How a round ended for a party, shown with the ledger's audit ``head``."""
    return guardian_pb2.RoundSettled(
        round_id=settled.round_id,
        settlement=_SETTLEMENTS[settled.kind],
        answered=settled.answered,
        head=head,
    )
