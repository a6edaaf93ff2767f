"""The CaPC loop at the student party: a hospital labels its own records and retrains.

A student party started with ``--hospital NAME`` queries for that hospital. Its
uploaded tensors are then the hospital's own unlabelled records, not public data:
in a plaintext task the answering hospitals would see them, so a job must carry the
explicit choice ``reveal_records_to_answerers`` (which the guardian audits), and is
refused without it. An encrypted task needs no choice: records leave only as CKKS
ciphertexts. The loop's report compares the hospital's model fitted on its own
labelled records alone ("before") with one fitted on them plus the returned labels
("after"), both tested on its own held-out records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from capc.task_config import TaskConfig
from services.proto.capc.v1 import student_pb2
from services.student.store import JobStore, StudentModel

#: Longest name of who revealed a job's records that is kept and sent (the gateway's
#: "token NAME (ID)"; the guardian keeps as much of it in its audit entry).
MAX_REVEALED_BY = 128


@dataclass(frozen=True)
class LoopIdentity:
    """Whom a querying student party works for: ``hospital`` ("" for none) and the
    certificate name its rounds are charged under (``querier``)."""

    hospital: str
    querier: str


def clear_records_refusal(
    identity: LoopIdentity, task: TaskConfig, source: str | None, reveal: bool
) -> str | None:
    """Why a job of ``source`` ("tensor", "recipe") may not run as asked, or None."""
    if not identity.hospital or source != "tensor" or task.encryption is not None:
        return None
    if reveal:
        return None
    return (
        f"this student party queries for hospital {identity.hospital}: the uploaded records "
        f"are its own, and task {task.name} is not encrypted, so every answering hospital "
        "would see them in the clear. Resubmit with reveal_records_to_answerers=true "
        "(capcctl: --reveal-records-to-answerers) if the hospital accepts that, knowing "
        "the guardian's audit log records it; or run the loop on an encrypted task "
        "(HE-friendly teachers, docs/encrypted.md), where they leave only as ciphertexts"
    )


def _newest_done(models: list[StudentModel], with_jobs: bool) -> StudentModel | None:
    """The newest finished model with (or without) jobs; ``models`` newest first."""
    for m in models:
        if m.state == "done" and bool(m.job_ids) == with_jobs:
            return m
    return None


def report(
    store: JobStore,
    identity: LoopIdentity,
    model_proto: Callable[[StudentModel], student_pb2.StudentModel],
) -> student_pb2.LoopReport:
    """The loop's state: before/after models (newest finished), labels bought over every
    job (answered queries) and records sent in the clear."""
    models = store.models()
    before, after = _newest_done(models, False), _newest_done(models, True)
    out = student_pb2.LoopReport(hospital=identity.hospital, querier=identity.querier)
    if before is not None:
        out.before.CopyFrom(model_proto(before))
    if after is not None:
        out.after.CopyFrom(model_proto(after))
    offset = 0
    while True:
        jobs = store.jobs(500, offset)
        for job in jobs:
            out.jobs += 1
            out.labels_bought += job.answered
            out.records_revealed += job.processed if job.revealed else 0
        if len(jobs) < 500:
            return out
        offset += 500
