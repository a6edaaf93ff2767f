"""The student's jobs and models on the wire (the jobs API the gateway reads)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Protocol

from capc.mechanisms import Mechanism
from services.common.serde.mechanisms import mechanism_to_proto
from services.proto.capc.v1 import student_pb2


# Structural types: serde reads the role's records without importing the role.
class JobRecord(Protocol):
    """The fields of a student job (the student's store) this module reads."""

    @property
    def id(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def requested(self) -> int: ...

    @property
    def processed(self) -> int: ...

    @property
    def answered(self) -> int: ...

    @property
    def rounds(self) -> int: ...

    @property
    def error(self) -> str: ...

    @property
    def task(self) -> str: ...

    @property
    def source(self) -> str: ...

    @property
    def created_at(self) -> str: ...

    @property
    def round_seconds(self) -> float: ...

    @property
    def revealed(self) -> bool: ...


class ModelRecord(Protocol):
    """The fields of a student model (the student's store) this module reads."""

    @property
    def id(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def job_ids(self) -> Sequence[str]: ...

    @property
    def architecture(self) -> str: ...

    @property
    def epochs(self) -> int: ...

    @property
    def examples(self) -> int: ...

    @property
    def metrics(self) -> Mapping[str, object]: ...

    @property
    def error(self) -> str: ...

    @property
    def created_at(self) -> str: ...

    @property
    def options(self) -> Mapping[str, object]: ...


def job_to_proto(job: JobRecord, mechanism: Mechanism | None = None) -> student_pb2.Job:
    """A job as the jobs API returns it; with ``mechanism``, the one its rounds run (the
    job's, resolved at its creation)."""
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


def model_to_proto(model: ModelRecord) -> student_pb2.StudentModel:
    """A trained (or training) student model; metrics and options as sorted-key JSON."""
    return student_pb2.StudentModel(
        id=model.id,
        state=model.state,
        job_ids=list(model.job_ids),
        architecture=model.architecture,
        epochs=model.epochs,
        examples=model.examples,
        metrics_json=json.dumps(dict(model.metrics), sort_keys=True),
        error=model.error,
        created_at=model.created_at,
        options_json=json.dumps(dict(model.options), sort_keys=True),
    )
