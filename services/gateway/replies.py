"""The backends' gRPC replies as the gateway's response schemas."""

from __future__ import annotations

import json
from typing import Any, cast

from google.protobuf.message import Message as ProtoMessage

from services.gateway import schemas
from services.proto.capc.v1 import guardian_pb2, student_pb2


def fields(msg: ProtoMessage, **overrides: Any) -> dict[str, Any]:
    """A message's scalar and repeated-scalar fields by name, then ``overrides``: the
    response models take what they declare and ignore the rest."""
    out: dict[str, Any] = {}
    for f in msg.DESCRIPTOR.fields:
        if f.message_type is None:
            value = getattr(msg, f.name)
            out[f.name] = list(value) if f.is_repeated else value
    out.update(overrides)
    return out


def privacy_audit_out(a: guardian_pb2.PrivacyAudit) -> schemas.PrivacyAuditOut:
    """An audit, with its unbounded ends (absent in the message) as null."""
    return schemas.PrivacyAuditOut(
        **fields(
            a,
            empirical_point=a.empirical_point if a.HasField("empirical_point") else None,
            empirical_upper=a.empirical_upper if a.HasField("empirical_upper") else None,
        )
    )


def job_out(job: student_pb2.Job) -> schemas.JobOut:
    return schemas.JobOut(
        **fields(
            job,
            progress=job.processed / job.requested if job.requested else 0.0,
            mechanism=schemas.MechanismOut(
                name=job.mechanism.name,
                outputs=job.mechanism.outputs,
                params=dict(job.mechanism.params),
            )
            if job.HasField("mechanism")
            else None,
        )
    )


def model_out(model: student_pb2.StudentModel) -> schemas.ModelOut:
    return schemas.ModelOut(
        **fields(
            model,
            metrics=json.loads(model.metrics_json or "{}"),
            options=json.loads(model.options_json or "{}"),
        )
    )


def _accuracy(model: schemas.ModelOut | None) -> float | None:
    value = None if model is None else model.metrics.get("test_accuracy")
    return float(value) if isinstance(value, int | float) else None


def loop_out(
    report: student_pb2.LoopReport, spends: guardian_pb2.ListPartiesReply
) -> schemas.LoopOut:
    """The loop's report with the guardian's per-party epsilon for the querier."""
    before = model_out(report.before) if report.before.id else None
    after = model_out(report.after) if report.after.id else None
    acc_before, acc_after = _accuracy(before), _accuracy(after)
    by_party = {p: e for p, e in spends.querier_epsilon.items() if e > 0}
    return schemas.LoopOut(
        **fields(report),
        bound_hospital=spends.querier_hospital,
        before=before,
        after=after,
        accuracy_before=acc_before,
        accuracy_after=acc_after,
        gain=None if acc_before is None or acc_after is None else acc_after - acc_before,
        epsilon_by_party=by_party,
        epsilon_spent=max(by_party.values(), default=0.0),
        queries_left={
            p.name: p.queries_left
            for p in spends.parties
            if p.role == "answerer" and p.queries_left >= 0 and p.name != spends.querier_hospital
        },
    )


def party_out(p: guardian_pb2.PartyStatus, ledger_delta: float) -> schemas.PartyOut:
    """A party's status; the guardian states its full delta (ledger_delta with the
    noise cut-off's term, + R 2^-40)."""
    return schemas.PartyOut(
        **fields(
            p,
            ledger_delta=ledger_delta,
            last_seen=p.last_seen or None,
            queries_left=None if p.queries_left < 0 else p.queries_left,
            declared_cap=p.declared_cap or None,
            own_ledger=schemas.PartyLedgerOut(
                state=cast(schemas.LedgerState, p.ledgers or "unreported"),
                epsilon_spent=p.party_epsilon_spent,
                through_round=p.party_through_round,
                open_rounds=p.party_open_rounds,
                reported_at=p.party_reported_at or None,
                gap=p.ledger_gap,
            ),
            trainings=[schemas.TrainingOut(**fields(t)) for t in p.trainings],
        )
    )
