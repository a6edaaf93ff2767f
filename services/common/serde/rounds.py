"""The guardian's round (capc.round messages) to and from its protos."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from capc.mechanisms import Mechanism
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
from capc.task_config import TaskConfig, TaskError, config_hash
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


def round_work_to_proto(work: RoundWork, queries: common_pb2.QueryBatch) -> guardian_pb2.RoundWork:
    """What one party is sent for a round: the core's work (the job's mechanism, once) with
    the request's queries; the task travels by name and hash in the message's header."""
    return guardian_pb2.RoundWork(
        round_id=work.round_id,
        queries=queries,
        mechanism=mechanism_to_proto(work.mechanism),
        student_public_key=work.student_public_key,
        vote_weight=work.vote_weight,
        frac_bits=work.frac_bits,
        participation=participation_to_bytes(work.participation),
        teachers=work.teachers,
    )


def task_definition_to_proto(task_json: str) -> guardian_pb2.TaskDefinition:
    """A task's canonical JSON, as a party's stream carries it once, before the first work
    that names it."""
    return guardian_pb2.TaskDefinition(config_json=task_json)


def task_definition_from_proto(
    msg: guardian_pb2.TaskDefinition, header: common_pb2.Header
) -> tuple[TaskConfig, dict[str, object]]:
    """The task a stream defines (parsed as every party parses it) and its configuration,
    which must hash to the header's config hash. RequestError saying what is wrong."""
    try:
        config = json.loads(msg.config_json or "null")
        digest = config_hash(config) if isinstance(config, dict) else None
    except (ValueError, RecursionError):  # nested past the parser's depth: no configuration
        digest = None
    if digest is None or digest != header.config_hash:
        raise RequestError(
            f"the definition of task {header.task!r} does not hash to its config hash "
            f"{header.config_hash}"
        )
    try:
        return TaskConfig.parse(header.task, config, header.config_hash), config
    except TaskError as err:
        raise RequestError(str(err)) from err


@dataclass(frozen=True)
class TensorQueries:
    """A round's queries in the clear: (B, *input_shape) float32, checked for the task."""

    x: NDArray[np.float32]


@dataclass(frozen=True)
class RecipeQueries:
    """Programmatic queries: the party regenerates the batch (:func:`.regenerate`) and
    checks it against the SHA-256 the student sent with it."""

    recipe: common_pb2.Recipe


@dataclass(frozen=True)
class EncryptedQueries:
    """CKKS ciphertexts the party evaluates with the student over the relay (their
    settings, context id, layout, count and hash)."""

    batch: common_pb2.EncryptedBatch


#: The closed set of what a round's queries may be; a party answers each kind its way.
WorkQueries = TensorQueries | RecipeQueries | EncryptedQueries


@dataclass(frozen=True)
class PartyWork:
    """A round's work as a party decodes it, once: the core's work (the job's mechanism,
    checked against the task's policy), the task it names, and its queries by kind."""

    work: RoundWork
    task: TaskConfig
    queries: WorkQueries


def _work_queries(msg: common_pb2.QueryBatch, task: TaskConfig) -> tuple[QueryBatch, WorkQueries]:
    """A round's queries as the party's rules need them (kind, count from 1 to MAX_BATCH,
    the digest it checks) and as it answers them."""
    source = msg.WhichOneof("source")
    queries: WorkQueries
    if source == "recipe":
        batch = QueryBatch("recipe", int(msg.recipe.count), bytes(msg.recipe.batch_hash))
        queries = RecipeQueries(msg.recipe)
    elif source == "encrypted":
        enc = msg.encrypted
        batch = QueryBatch("encrypted", int(enc.batch), bytes(enc.ciphertext_hash))
        queries = EncryptedQueries(enc)
    elif source == "tensor":
        x = queries_from_proto(msg.tensor, task.input_shape, MAX_BATCH)
        batch, queries = QueryBatch("tensor", len(x)), TensorQueries(x)
    else:
        raise RequestError("queries must be a float32 tensor, a recipe or an encrypted batch")
    if not 1 <= batch.count <= MAX_BATCH:
        raise RequestError(f"a round holds 1 to {MAX_BATCH} queries, this one {batch.count}")
    return batch, queries


def round_work_from_proto(
    msg: guardian_pb2.RoundWork,
    party: str,
    header: common_pb2.Header,
    task: TaskConfig,
    config: Mapping[str, object],
) -> PartyWork:
    """The work a party got, decoded once: the mechanism checked against ``task``'s policy
    (the task's own or a tightening of it: an honest party votes at nothing looser,
    whatever a guardian sends), the batch's size and participation mask checked, and
    the queries by kind. ``task`` and ``config``: the task the header names, as the
    stream defined it. RequestError saying what is wrong."""
    if task.name != header.task or task.config_hash != header.config_hash:
        raise RequestError(
            f"round {msg.round_id} names task {header.task!r} ({header.config_hash}), not "
            f"{task.name!r} ({task.config_hash})"
        )
    mechanism = mechanism_from_proto(msg.mechanism)
    try:
        task = task.running(mechanism)
    except TaskError as err:
        raise RequestError(f"round {msg.round_id}: {err}") from err
    batch, queries = _work_queries(msg.queries, task)
    participation = participation_from_bytes(msg.participation, batch.count)
    work = RoundWork(
        int(msg.round_id),
        party,
        mechanism,
        bytes(msg.student_public_key),
        float(msg.vote_weight),
        int(msg.frac_bits),
        int(msg.teachers),
        participation,
        batch,
        task.name,
        config,
        # A networked guardian takes every plaintext vote with its validity proof.
        proven=not batch.encrypted,
    )
    return PartyWork(work, task, queries)


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
    mechanism: Mechanism | None = None,
    hospital: str = "",
    reveal: bool = False,
    revealed_by: str = "",
) -> guardian_pb2.OpenRoundRequest:
    """The student's OpenRound: the core's request with the queries themselves, the job's
    mechanism (None: the task's own), the hospital it says it belongs to and whether its own records
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
        mechanism=None if mechanism is None else mechanism_to_proto(mechanism),
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
