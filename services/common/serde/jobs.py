"""The student's jobs and models on the wire (the jobs API the gateway reads)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from capc.mechanisms import Mechanism
from services.common.serde.mechanisms import mechanism_to_proto
from services.proto.capc.v1 import student_pb2

if TYPE_CHECKING:  # the student's store records; serde reads only their fields
    from services.student.store import Job, StudentModel


def job_to_proto(job: Job, mechanism: Mechanism | None = None) -> student_pb2.Job:
    """A job as the jobs API returns it; with ``mechanism``, the one its rounds run (the
    task's, with the job's overrides applied by the caller)."""
    msg = student_pb2.Job(
        id=job.id,
        state=job.state,
        requested=job.requested,
        processed=job.processed,
        answered=job.answered,
        rounds=job.rounds,
        error=job.error,
        task=job.task,
        source=job.source,
        created_at=job.created_at,
        round_seconds=job.round_seconds,
        records_revealed=job.revealed,
    )
    if mechanism is not None:
        msg.mechanism.CopyFrom(mechanism_to_proto(mechanism))
    return msg


def model_to_proto(model: StudentModel) -> student_pb2.StudentModel:
    """A trained (or training) student model; metrics and options as sorted-key JSON."""
    return student_pb2.StudentModel(
        id=model.id,
        state=model.state,
        job_ids=list(model.job_ids),
        architecture=model.architecture,
        epochs=model.epochs,
        examples=model.examples,
        metrics_json=json.dumps(model.metrics, sort_keys=True),
        error=model.error,
        created_at=model.created_at,
        options_json=json.dumps(model.options, sort_keys=True),
    )
