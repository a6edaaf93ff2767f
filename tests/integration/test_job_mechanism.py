"""A job's mechanism is resolved once, when the student party creates the job: the task's,
tightened by the job's overrides, stored as that configuration and read back as it was
(rows stored before that held the overrides only, and are read too)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import NoReturn, cast

import grpc
import numpy as np
import pytest

from capc.task_config import TaskConfig, TaskError, config_hash
from services.common import serde
from services.common.protocol import PROTOCOL_VERSION
from services.proto.capc.v1 import common_pb2, student_pb2
from services.student.servicer import JobRunner, StudentParty, job_mechanism
from services.student.store import JobStore
from services.student.training import ModelTrainer

CONFIG: dict[str, object] = {
    "num_classes": 3,
    "input_shape": [2],
    "mechanism": {"name": "confident-gnmax", "sigma": 2.0, "threshold": 3.0, "sigma1": 4.0},
}
TASK = TaskConfig.parse("t", CONFIG, config_hash(CONFIG))


class RefusedError(Exception):
    """The servicer aborted the call."""


class Context:
    """The servicer context's abort, as a test reads it."""

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise RefusedError(code, details)


def create(party: StudentParty, **overrides: float) -> student_pb2.Job:
    x = np.zeros((4, 2), np.float32)
    request = student_pb2.CreateJobRequest(
        header=common_pb2.Header(protocol_version=PROTOCOL_VERSION, task="t"),
        queries=common_pb2.QueryBatch(tensor=serde.queries_to_proto(x)),
        count=4,
        batch_size=4,
        mechanism_overrides=overrides,
    )
    return party.CreateJob(request, cast(grpc.ServicerContext, Context()))


def test_a_job_stores_its_resolved_mechanism_and_refuses_a_looser_one(tmp_path: Path) -> None:
    store = JobStore(str(tmp_path / "jobs.db"))
    submitted: list[str] = []
    runner = cast(JobRunner, SimpleNamespace(submit=submitted.append))
    party = StudentParty(store, runner, TASK, cast(ModelTrainer, None))
    reply = create(party, sigma=5.0)
    raised = {"name": "confident-gnmax", "sigma": 5.0, "threshold": 3.0, "sigma1": 4.0}
    job = store.get(reply.id)
    assert job is not None and job.mechanism == raised and submitted == [reply.id]
    assert job_mechanism(job, TASK) == TASK.tightened({"sigma": 5.0}).mechanism
    assert dict(reply.mechanism.params) == {k: v for k, v in raised.items() if k != "name"}
    # No overrides: the task's own, spelled out in full.
    plain = store.get(create(party).id)
    assert plain is not None and plain.mechanism == TASK.mechanism.to_config()
    # Looser than the task's policy: refused before a job exists.
    for looser, why in (({"sigma": 1.0}, "is below the task's"), ({"tau": 2.0}, "no parameter")):
        with pytest.raises(RefusedError, match=why) as refused:
            create(party, **looser)
        assert refused.value.args[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert len(submitted) == 2


def test_stored_rows_of_either_form_are_read_and_checked(tmp_path: Path) -> None:
    store = JobStore(str(tmp_path / "jobs.db"))
    x = np.zeros((4, 2), np.float32)
    # A row from before jobs stored their mechanism: its overrides, resolved on reading.
    legacy = store.get(store.create("t", x, 4, None, {"sigma": 6.0}).id)
    assert legacy is not None
    assert job_mechanism(legacy, TASK).params.model_dump()["sigma"] == 6.0
    none = store.get(store.create("t", x, 4).id)
    assert none is not None and job_mechanism(none, TASK) is TASK.mechanism
    # A stored mechanism the task does not allow (a row written for another task, or
    # changed by hand) is refused, not run (the runner checks it once a job).
    for stored in (
        {"name": "confident-gnmax", "sigma": 1.0, "threshold": 3.0, "sigma1": 4.0},
        {"name": "gnmax", "sigma": 9.0},
        {"sigma": 1.0},
    ):
        row = store.get(store.create("t", x, 4, None, stored).id)
        assert row is not None
        with pytest.raises(TaskError):
            TASK.running(job_mechanism(row, TASK))


def test_a_row_whose_mechanism_does_not_resolve_is_listed_without_one(tmp_path: Path) -> None:
    """A row the task no longer allows (a job made before the task's policy was raised, or
    written by hand) fails its own job when it runs; the jobs API still lists it, and
    every other job, rather than failing every listing on that one row."""
    store = JobStore(str(tmp_path / "jobs.db"))
    runner = cast(JobRunner, SimpleNamespace(submit=lambda _: None))
    party = StudentParty(store, runner, TASK, cast(ModelTrainer, None))
    good = create(party, sigma=5.0)
    x = np.zeros((4, 2), np.float32)
    bad = [
        store.create("t", x, 4, None, {"sigma": 1.0}).id,  # below the task's: refused
        store.create("t", x, 4, None, {"name": "gnmax", "sigma": -2.0}).id,  # no mechanism
    ]
    header = common_pb2.Header(protocol_version=PROTOCOL_VERSION, task="t")
    listed = party.ListJobs(
        student_pb2.ListJobsRequest(header=header), cast(grpc.ServicerContext, Context())
    )
    by_id = {j.id: j for j in listed.jobs}
    assert set(by_id) == {good.id, *bad}
    assert by_id[good.id].mechanism.params["sigma"] == 5.0
    assert all(not by_id[b].HasField("mechanism") for b in bad)
