"""The student party's jobs API (for the gateway) and the worker that runs jobs round by round."""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import numpy as np

from capc.data.generators import Recipe
from capc.mpc.channel import ProtocolError
from services.common.protocol import RequestError, check_version, query_recipe, query_tensor
from services.common.task import TaskConfig
from services.proto.capc.v1 import common_pb2, student_pb2, student_pb2_grpc
from services.student.client import StudentClient
from services.student.store import TERMINAL, Job, JobStore

log = logging.getLogger("capc.student")
MAX_QUERIES = 100_000
MAX_BATCH = 4096
SERVICE = "capc.v1.StudentParty"
POLICY: dict[str, tuple[str, ...]] = {
    f"/{SERVICE}/CreateJob": ("gateway", "student"),
    f"/{SERVICE}/WatchJob": ("gateway", "student"),
    f"/{SERVICE}/GetResults": ("gateway", "student"),
}


def to_proto(job: Job) -> student_pb2.Job:
    return student_pb2.Job(
        id=job.id,
        state=job.state,
        requested=job.requested,
        processed=job.processed,
        answered=job.answered,
        rounds=job.rounds,
        error=job.error,
    )


class JobRunner:
    """Runs queued jobs one after another through one StudentClient (one 2PC session)."""

    def __init__(self, store: JobStore, make_client: Callable[[], StudentClient]) -> None:
        self.store = store
        self._make_client = make_client
        self._queue: queue.Queue[tuple[str, int]] = queue.Queue()
        self._client: StudentClient | None = None
        for job_id, start in store.resume_points():
            self._queue.put((job_id, start))
        threading.Thread(target=self._loop, name="capc-jobs", daemon=True).start()

    def submit(self, job_id: str) -> None:
        self._queue.put((job_id, 0))

    def _loop(self) -> None:
        while True:
            job_id, start = self._queue.get()
            self._run(job_id, start)

    def _run(self, job_id: str, start: int) -> None:
        job = self.store.get(job_id)
        if job is None:
            return
        queries = self.store.queries(job_id)
        recipe = self.store.recipe(job_id)
        base = Recipe.from_json(recipe) if recipe else None
        batches = range(start, -(-len(queries) // job.batch_size))
        for index in batches:
            lo, hi = index * job.batch_size, min(len(queries), (index + 1) * job.batch_size)
            batch = queries[lo:hi]
            for attempt in range(3):
                try:
                    if self._client is None:
                        self._client = self._make_client()
                    if base is not None:
                        part = dataclasses.replace(base, start=base.start + lo, count=hi - lo)
                        result = self._client.label_recipe(part)
                    else:
                        result = self._client.label_batch(batch)
                    self.store.record_batch(job_id, index, result.round_id, result.labels)
                    break
                except grpc.RpcError as err:
                    code = err.code() if hasattr(err, "code") else None
                    details = err.details() if hasattr(err, "details") else str(err)
                    if code in (
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        grpc.StatusCode.INVALID_ARGUMENT,
                        grpc.StatusCode.PERMISSION_DENIED,
                    ):
                        self.store.finish(job_id, f"{code.name if code else 'error'}: {details}")
                        return
                    self._reset()
                    if attempt == 2:
                        self.store.finish(job_id, f"guardian unavailable: {details}")
                        return
                    time.sleep(1.0 + attempt)
                except (ProtocolError, RuntimeError) as err:
                    self._reset()
                    if attempt == 2:
                        self.store.finish(job_id, f"2PC failed: {err}")
                        return
                    time.sleep(1.0 + attempt)
        self.store.finish(job_id)

    def _reset(self) -> None:
        if self._client is not None:
            self._client.close(timeout=1)
            self._client = None


class StudentParty(student_pb2_grpc.StudentPartyServicer):
    def __init__(self, store: JobStore, runner: JobRunner, task: TaskConfig) -> None:
        self.store = store
        self.runner = runner
        self.task = task

    def _check(self, header: common_pb2.Header, context: grpc.ServicerContext) -> None:
        try:
            check_version(header, "student party")
        except RequestError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        if header.task and header.task != self.task.name:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"this student party serves task {self.task.name!r}, not {header.task!r}",
            )

    def CreateJob(
        self, request: student_pb2.CreateJobRequest, context: grpc.ServicerContext
    ) -> student_pb2.Job:
        self._check(request.header, context)
        source = request.queries.WhichOneof("source")
        recipe_json = None
        try:
            if source == "recipe":
                recipe = query_recipe(request.queries.recipe, self.task.input_shape, MAX_QUERIES)
                x = recipe.generate()
                recipe_json = recipe.to_json()
            elif source == "tensor":
                x = query_tensor(request.queries.tensor, self.task.input_shape, MAX_QUERIES)
            else:
                raise RequestError("jobs take an uploaded float32 tensor or a recipe")
            batch = request.batch_size or 256
            if not 1 <= batch <= MAX_BATCH:
                raise RequestError(f"batch_size must lie in [1, {MAX_BATCH}], got {batch}")
        except RequestError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        job = self.store.create(self.task.name, x.astype(np.float32), batch, recipe_json)
        self.runner.submit(job.id)
        return to_proto(job)

    def _job(self, job_id: str, context: grpc.ServicerContext) -> Job:
        job = self.store.get(job_id)
        if job is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no job {job_id!r}")
        assert job is not None
        return job

    def WatchJob(
        self, request: student_pb2.WatchJobRequest, context: grpc.ServicerContext
    ) -> Iterator[student_pb2.Job]:
        self._check(request.header, context)
        last: Job | None = None
        while context.is_active():
            job = self._job(request.id, context)
            if job != last:
                yield to_proto(job)
                last = job
            if job.state in TERMINAL:
                return
            time.sleep(0.1)

    def GetResults(
        self, request: student_pb2.GetResultsRequest, context: grpc.ServicerContext
    ) -> student_pb2.JobResults:
        self._check(request.header, context)
        job = self._job(request.id, context)
        labels = self.store.labels(job.id)
        queries = self.store.queries(job.id)[: len(labels)]
        return student_pb2.JobResults(
            job=to_proto(job),
            labels=common_pb2.Tensor(
                shape=list(labels.shape), dtype="int64", data=labels.astype("<i8").tobytes()
            ),
            queries=common_pb2.Tensor(
                shape=list(queries.shape), dtype="float32", data=queries.astype("<f4").tobytes()
            ),
        )
