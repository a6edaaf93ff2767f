"""Every conversion between wire messages and arrays, with the checks on what arrives.

The wire formats are fixed by the protos: a ``Tensor`` is C-order little-endian
data of the dtype it names ("float32" queries, "int64" labels); vote shares are
(B, width) little-endian uint64; a participation mask is one bit per query,
least significant bit first, padded to whole bytes, and empty when every party
votes on every query. Whatever arrives is checked against its shape before it
is read, and refused with :class:`~services.common.protocol.RequestError`
saying what was wrong.

One module per message family (:mod:`.tensors`, :mod:`.recipes`, :mod:`.shares`,
:mod:`.mechanisms`, :mod:`.rounds`, :mod:`.ledger`, :mod:`.jobs`); services import them from here, and no
service copies fields between a message and a domain object itself.
"""

from __future__ import annotations

from services.common.serde.jobs import (
    job_to_proto,
    model_to_proto,
)
from services.common.serde.ledger import (
    MAX_LOSS_ENTRIES,
    NO_PROJECTION,
    attestation_from_proto,
    attestation_to_proto,
    audit_head_from_proto,
    audit_head_to_proto,
    party_status_to_proto,
    privacy_audit_to_proto,
    register_to_proto,
    registered_to_proto,
    spend_report_from_proto,
    spend_report_to_proto,
    training_to_proto,
)
from services.common.serde.mechanisms import (
    mechanism_from_proto,
    mechanism_to_proto,
)
from services.common.serde.recipes import (
    RecipeError,
    query_recipe,
    recipe_from_proto,
    recipe_to_proto,
    regenerate,
)
from services.common.serde.rounds import (
    LAYOUTS,
    EncryptedQueries,
    PartyWork,
    RecipeQueries,
    TensorQueries,
    WorkQueries,
    opened_from_proto,
    opened_to_proto,
    party_shares_from_proto,
    party_shares_to_proto,
    query_batch_from_proto,
    round_request_from_proto,
    round_request_to_proto,
    round_work_from_proto,
    round_work_to_proto,
    settlement_from_proto,
    settlement_to_proto,
    task_definition_from_proto,
    task_definition_to_proto,
    vote_verdict_from_proto,
    vote_verdict_to_proto,
)
from services.common.serde.shares import (
    field_share_from_bytes,
    participation_from_bytes,
    participation_to_bytes,
    proof_from_proto,
    share_from_bytes,
    share_to_bytes,
    shares_from_proto,
    shares_to_proto,
    vote_check_from_proto,
    vote_check_to_proto,
)
from services.common.serde.tensors import (
    labels_from_proto,
    labels_to_proto,
    queries_from_proto,
    queries_to_proto,
    tensor_from_proto,
    tensor_to_proto,
)
from services.common.serde.wire import (
    SHARE_DTYPE,
    WIRE_DTYPES,
    TensorDtype,
    check_length,
)

__all__ = [
    "LAYOUTS",
    "MAX_LOSS_ENTRIES",
    "NO_PROJECTION",
    "SHARE_DTYPE",
    "WIRE_DTYPES",
    "EncryptedQueries",
    "PartyWork",
    "RecipeError",
    "RecipeQueries",
    "TensorDtype",
    "TensorQueries",
    "WorkQueries",
    "attestation_from_proto",
    "attestation_to_proto",
    "audit_head_from_proto",
    "audit_head_to_proto",
    "check_length",
    "field_share_from_bytes",
    "job_to_proto",
    "labels_from_proto",
    "labels_to_proto",
    "mechanism_from_proto",
    "mechanism_to_proto",
    "model_to_proto",
    "opened_from_proto",
    "opened_to_proto",
    "participation_from_bytes",
    "participation_to_bytes",
    "party_shares_from_proto",
    "party_shares_to_proto",
    "party_status_to_proto",
    "privacy_audit_to_proto",
    "proof_from_proto",
    "queries_from_proto",
    "queries_to_proto",
    "query_batch_from_proto",
    "query_recipe",
    "recipe_from_proto",
    "recipe_to_proto",
    "regenerate",
    "register_to_proto",
    "registered_to_proto",
    "round_request_from_proto",
    "round_request_to_proto",
    "round_work_from_proto",
    "round_work_to_proto",
    "settlement_from_proto",
    "settlement_to_proto",
    "share_from_bytes",
    "share_to_bytes",
    "shares_from_proto",
    "shares_to_proto",
    "spend_report_from_proto",
    "spend_report_to_proto",
    "task_definition_from_proto",
    "task_definition_to_proto",
    "tensor_from_proto",
    "tensor_to_proto",
    "training_to_proto",
    "vote_check_from_proto",
    "vote_check_to_proto",
    "vote_verdict_from_proto",
    "vote_verdict_to_proto",
]
