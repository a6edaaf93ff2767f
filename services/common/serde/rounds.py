"""The guardian's round (capc.round messages) to and from its protos."""

from __future__ import annotations

import json
from collections.abc import Mapping

from capc.round.messages import (
    Opened,
    PartyShares,
    QueryBatch,
    Retry,
    RoundRequest,
    RoundWork,
    Settlement,
    SettlementKind,
    ShareLayout,
    VoteVerdict,
)
from capc.task_config import TaskConfig, config_hash
from services.common.limits import MAX_BATCH, MAX_CIPHERTEXTS, count_refusal
from services.common.protocol import RequestError
from services.common.serde.mechanisms import mechanism_from_proto, mechanism_to_proto
from services.common.serde.recipes import query_recipe
from services.common.serde.shares import (
    participation_from_bytes,
    participation_to_bytes,
    proof_from_proto,
    shares_from_proto,
    shares_to_proto,
)
from services.common.serde.tensors import queries_from_proto
from services.proto.capc.v1 import common_pb2, guardian_pb2

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


def _work_queries(msg: common_pb2.QueryBatch) -> QueryBatch:
    """A round's queries as the party's rules need them: kind, count (1 to MAX_BATCH) and
    the digest it checks (a recipe's batch hash, the ciphertexts' hash)."""
    source = msg.WhichOneof("source")
    if source == "recipe":
        batch = QueryBatch("recipe", int(msg.recipe.count), bytes(msg.recipe.batch_hash))
    elif source == "tensor":
        count = int(msg.tensor.shape[0]) if msg.tensor.shape else 0
        batch = QueryBatch("tensor", count)
    elif source == "encrypted":
        batch = QueryBatch(
            "encrypted", int(msg.encrypted.batch), bytes(msg.encrypted.ciphertext_hash)
        )
    else:
        batch = QueryBatch("tensor", 0)
    if not 1 <= batch.count <= MAX_BATCH:
        raise RequestError(f"a round holds 1 to {MAX_BATCH} queries, this one {batch.count}")
    return batch


def round_work_from_proto(
    msg: guardian_pb2.RoundWork, party: str, header: common_pb2.Header
) -> RoundWork:
    """The work a party got, as its role takes it: the mechanism decoded once for the round,
    the batch's size and participation mask checked, and the task's configuration, which
    must hash to the header's config hash. RequestError saying what is wrong."""
    mechanism = mechanism_from_proto(msg.mechanism)
    queries = _work_queries(msg.queries)
    participation = participation_from_bytes(msg.participation, queries.count)
    try:
        config = json.loads(msg.task_json or "null")
    except ValueError:
        config = None
    if not isinstance(config, dict) or config_hash(config) != header.config_hash:
        raise RequestError(
            f"round {msg.round_id} names task {header.task!r} with config hash "
            f"{header.config_hash}, but carries a configuration that does not hash to it"
        )
    return RoundWork(
        int(msg.round_id),
        party,
        mechanism,
        bytes(msg.student_public_key),
        float(msg.vote_weight),
        int(msg.frac_bits),
        int(msg.teachers),
        participation,
        queries,
        header.task,
        config,
        # A networked guardian takes every plaintext vote with its validity proof.
        proven=not queries.encrypted,
    )


def party_shares_to_proto(shares: PartyShares) -> guardian_pb2.Shares:
    """A party's answer to a round, as it sends it to the guardian."""
    return shares_to_proto(
        shares.round_id,
        shares.share,
        sealed_seed=shares.sealed_seed,
        batch_hash=shares.batch_hash,
        proof=shares.proof,
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


def round_request_to_proto(
    request: RoundRequest,
    header: common_pb2.Header,
    queries: common_pb2.QueryBatch,
    overrides: common_pb2.Mechanism | None = None,
    hospital: str = "",
    reveal: bool = False,
    revealed_by: str = "",
) -> guardian_pb2.OpenRoundRequest:
    """The student's OpenRound: the core's request with the queries themselves, the job's
    mechanism overrides, the hospital it says it belongs to and whether its own records
    are shown in the clear (and by whose choice: ``revealed_by``)."""
    retry = None
    if request.retry is not None:
        r = request.retry
        retry = guardian_pb2.RetryWithout(round_id=r.round_id, party=r.party, reason=r.reason)
    return guardian_pb2.OpenRoundRequest(
        header=header,
        round_key=request.round_key,
        queries=queries,
        student_public_key=request.student_public_key,
        mechanism=overrides,
        exclude=sorted(request.exclude),
        hospital=hospital,
        reveal_records=reveal,
        retry=retry,
        revealed_by=revealed_by if reveal else "",
    )


def opened_from_proto(msg: guardian_pb2.OpenRoundReply) -> Opened:
    """The guardian's reply to OpenRound, as the student's role takes it."""
    return Opened(
        int(msg.round_id),
        tuple(msg.included),
        dict(msg.excluded_remaining_epsilon),
        {s.party: bytes(s.sealed) for s in msg.seeds},
        {p: int(n) for p, n in msg.teachers.items()},
        bytes(msg.challenge),
    )


def vote_verdict_from_proto(msg: guardian_pb2.VoteCheckReply) -> VoteVerdict:
    """The guardian's vote check, as the student's role takes it."""
    return VoteVerdict(
        int(msg.round_id),
        tuple(msg.included),
        {e.party: e.reason for e in msg.excluded},
        {p: int(w) for p, w in msg.vote_weights.items()},
        {p: int(n) for p, n in msg.teachers.items()},
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


_SETTLEMENTS: dict[SettlementKind, guardian_pb2.Settlement] = {
    "charged": guardian_pb2.SETTLEMENT_CHARGED,
    "not_charged": guardian_pb2.SETTLEMENT_NOT_CHARGED,
    "worst_case": guardian_pb2.SETTLEMENT_WORST_CASE,
}
_SETTLEMENT_KINDS: dict[int, SettlementKind] = {v: k for k, v in _SETTLEMENTS.items()}


def settlement_from_proto(msg: guardian_pb2.RoundSettled, party: str) -> Settlement | None:
    """How the guardian says a round ended for ``party``; None for a settlement this
    version does not know (the round then stays reserved)."""
    kind = _SETTLEMENT_KINDS.get(msg.settlement)
    if kind is None:
        return None
    return Settlement(int(msg.round_id), party, kind, bytes(msg.answered))


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
