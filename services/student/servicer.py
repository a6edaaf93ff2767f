"""The student party's jobs API (for the gateway) and the worker that runs jobs round by round."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import numpy as np

from capc.data.generators import Recipe
from capc.data.schema import RecordSchema
from capc.data.table_queries import default_generator
from capc.mechanisms import Mechanism, MechanismError, from_config
from capc.mpc.channel import ProtocolError
from capc.mpc.votes import PartyInputError
from capc.task_config import TaskConfig, TaskError
from services.common import serde
from services.common.limits import (
    DEFAULT_BATCH,
    DEFAULT_EPOCHS,
    DEFAULT_LIST_PAGE,
    MAX_JOB_QUERIES,
    MAX_LIST_PAGE,
    MAX_PREDICT_RECORDS,
    RESULTS_PAGE,
    batch_refusal,
)
from services.common.protocol import RequestError, check_version
from services.proto.capc.v1 import common_pb2, student_pb2, student_pb2_grpc
from services.student.client import StudentClient
from services.student.loop import MAX_REVEALED_BY, LoopIdentity, clear_records_refusal
from services.student.loop import report as loop_report
from services.student.predictor import PredictionError, Predictor
from services.student.store import TERMINAL, Job, JobStore, StudentModel
from services.student.training import ModelTrainer, TrainingError, TrainingOptions

log = logging.getLogger("capc.student")
SERVICE = "capc.v1.StudentParty"
POLICY: dict[str, tuple[str, ...]] = {
    f"/{SERVICE}/{rpc}": ("gateway", "student")
    for rpc in (
        "CreateJob",
        "WatchJob",
        "GetJob",
        "GetResults",
        "ListJobs",
        "TrainModel",
        "GetModel",
        "ListModels",
        "DownloadModel",
        "Predict",
        "GetLoop",
    )
}


def job_mechanism(job: Job, task: TaskConfig) -> Mechanism:
    """The mechanism ``job`` runs, as it was resolved and stored at its creation (a row
    from before issue 55 stored the overrides only: resolved now, as its creation would
    have). Not checked against ``task``'s policy: :meth:`JobRunner._run` does that, once
    a job. TaskError for a stored configuration that is no mechanism of ``task``'s."""
    stored = job.mechanism
    if not stored:
        return task.mechanism
    if "name" not in stored:
        return task.tightened({str(k): float(str(v)) for k, v in stored.items()}).mechanism
    try:
        return from_config(stored, task.outputs)
    except MechanismError as err:
        raise TaskError(f"job {job.id}: {err}") from err


def job_reply(job: Job, task: TaskConfig | None = None) -> student_pb2.Job:
    """A job as the jobs API returns it; with ``task``, the mechanism its rounds run, or
    none for a stored one that does not resolve (a row from before the task's policy
    was raised, or changed by hand): its runner fails that job, and the API still lists
    it and every other. Not checked against the policy here: the runner does, once."""
    mech = None
    if task is not None:
        with contextlib.suppress(TaskError):
            mech = job_mechanism(job, task)
    return serde.job_to_proto(job, mech)


class JobRunner:
    """Runs queued jobs one after another through one StudentClient (one 2PC session)."""

    def __init__(
        self,
        store: JobStore,
        make_client: Callable[[], StudentClient],
        records: RecordSchema | None = None,
    ) -> None:
        self.store = store
        self._make_client = make_client
        # The task's schema: the layout of a table recipe's rows.
        self._task_records = records
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
            try:
                self._run(job_id, start)
            except Exception as err:
                # Whatever one job meets, the runner lives on for the next.
                log.exception("job %s failed", job_id)
                self._reset()
                with contextlib.suppress(Exception):
                    self.store.finish(job_id, f"internal error: {type(err).__name__}: {err}")

    def _run(self, job_id: str, start: int) -> None:
        job = self.store.get(job_id)
        if job is None:
            return
        recipe = self.store.recipe(job_id)
        base = Recipe.from_json(recipe) if recipe else None
        if base is not None and start == 0:
            self.store.set_queries(job_id, base.generate(self._task_records))
        queries = self.store.queries(job_id)
        running: TaskConfig | None = None
        batches = range(start, -(-len(queries) // job.batch_size))
        for index in batches:
            lo, hi = index * job.batch_size, min(len(queries), (index + 1) * job.batch_size)
            batch = queries[lo:hi]
            for attempt in range(3):
                try:
                    if self._client is None:
                        self._client = self._make_client()
                    if running is None:
                        # The stored mechanism checked against the task's policy, once a job.
                        task = self._client.task
                        running = task.running(job_mechanism(job, task))
                    if base is not None:
                        part = dataclasses.replace(base, start=base.start + lo, count=hi - lo)
                        # The batch is already generated: it only needs hashing.
                        result = self._client.label_recipe(part, running, images=batch)
                    elif self._client.task.encryption is not None:
                        # an encrypted-query task: uploaded records leave only as ciphertexts
                        result = self._client.label_encrypted(batch, running)
                    else:
                        result = self._client.label_batch(
                            batch, running, job.revealed, job.revealed_by
                        )
                    self.store.record_batch(
                        job_id,
                        index,
                        result.round_id,
                        result.labels,
                        result.open_s + result.mpc_s,
                    )
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
                except TaskError as err:
                    # A stored mechanism the task (changed since?) no longer allows.
                    self.store.finish(job_id, f"mechanism: {err}")
                    return
                except PartyInputError as err:
                    # One party's bad input: the round was abandoned (the guardian aborted
                    # it, charging nothing); a bad seed was retried once without its party
                    # already (StudentClient), so this is a second bad input or another kind.
                    log.warning("job %s: %s", job_id, err)
                    self.store.finish(job_id, f"party {err.party}: {err}")
                    return
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
    def __init__(
        self,
        store: JobStore,
        runner: JobRunner,
        task: TaskConfig,
        trainer: ModelTrainer,
        identity: LoopIdentity | None = None,
    ) -> None:
        self.identity = identity or LoopIdentity("", "")
        self.store = store
        self.runner = runner
        self.task = task
        self.trainer = trainer
        self.predictor = Predictor(store)

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
                if not request.queries.recipe.shape:  # the gateway leaves it to the task
                    request.queries.recipe.shape.extend(self.task.input_shape)
                if not request.queries.recipe.generator:  # so is the default generator
                    request.queries.recipe.generator = default_generator(self.task.records)
                recipe = serde.query_recipe(
                    request.queries.recipe, self.task.input_shape, MAX_JOB_QUERIES, "a job"
                )
                try:
                    # One image checks the parameters; the runner generates the batch, so a
                    # large recipe never holds this call past the caller's deadline.
                    dataclasses.replace(recipe, count=1).generate(self.task.records)
                except ValueError as err:
                    raise RequestError(str(err)) from err
                x = np.zeros((recipe.count, *self.task.input_shape), dtype=np.float32)
                recipe_json = recipe.to_json()
            elif source == "tensor":
                x = serde.queries_from_proto(
                    request.queries.tensor, self.task.input_shape, MAX_JOB_QUERIES, "a job"
                )
            else:
                raise RequestError("jobs take an uploaded float32 tensor or a recipe")
            reveal = request.reveal_records_to_answerers
            refusal = clear_records_refusal(self.identity, self.task, source, reveal)
            if refusal is not None:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal)
            batch = request.batch_size or DEFAULT_BATCH
            refusal = batch_refusal(batch)
            if refusal is not None:
                raise RequestError(f"batch_size: {refusal}")
            # Resolved once, here: the job stores and every round carries this mechanism.
            mechanism = self.task.tightened(dict(request.mechanism_overrides)).mechanism
        except (RequestError, TaskError) as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        # Only uploaded records in a plaintext task travel in the clear.
        revealed = reveal and source == "tensor" and self.task.encryption is None
        job = self.store.create(
            self.task.name,
            x.astype(np.float32),
            batch,
            recipe_json,
            mechanism.to_config(),
            revealed,
            request.revealed_by[:MAX_REVEALED_BY],
        )
        self.runner.submit(job.id)
        return job_reply(job, self.task)

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
                yield job_reply(job, self.task)
                last = job
            if job.state in TERMINAL:
                return
            time.sleep(0.1)

    def GetJob(
        self, request: student_pb2.WatchJobRequest, context: grpc.ServicerContext
    ) -> student_pb2.Job:
        self._check(request.header, context)
        return job_reply(self._job(request.id, context), self.task)

    def GetResults(
        self, request: student_pb2.GetResultsRequest, context: grpc.ServicerContext
    ) -> student_pb2.JobResults:
        self._check(request.header, context)
        job = self._job(request.id, context)
        limit = request.limit or RESULTS_PAGE
        if limit > RESULTS_PAGE:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"limit must be at most {RESULTS_PAGE}")
        all_labels = self.store.labels(job.id)
        lo, hi = request.offset, min(len(all_labels), request.offset + limit)
        labels = all_labels[lo:hi]
        queries = self.store.queries(job.id, lo, hi)
        return student_pb2.JobResults(
            total=len(all_labels),
            job=job_reply(job, self.task),
            labels=serde.labels_to_proto(labels),
            queries=serde.queries_to_proto(queries),
        )

    def ListJobs(
        self, request: student_pb2.ListJobsRequest, context: grpc.ServicerContext
    ) -> student_pb2.ListJobsReply:
        self._check(request.header, context)
        limit = request.limit or DEFAULT_LIST_PAGE
        if limit > MAX_LIST_PAGE:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"limit must be at most {MAX_LIST_PAGE}"
            )
        jobs = self.store.jobs(limit, request.offset)
        return student_pb2.ListJobsReply(jobs=[job_reply(j, self.task) for j in jobs])

    def TrainModel(
        self, request: student_pb2.TrainModelRequest, context: grpc.ServicerContext
    ) -> student_pb2.StudentModel:
        self._check(request.header, context)
        arch = request.architecture or self.trainer.default_architecture
        epochs = request.epochs or DEFAULT_EPOCHS
        try:
            options = TrainingOptions.parse(
                request.l2, request.semi_supervised, arch, request.own_weight
            )
            self.trainer.check(list(request.job_ids), arch, epochs, options)
        except TrainingError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        model = self.store.create_model(
            list(request.job_ids),
            arch,
            epochs,
            int(request.seed % (1 << 31)),
            options.to_dict(),
        )
        self.trainer.submit(model.id)
        return serde.model_to_proto(model)

    def _model(self, model_id: str, context: grpc.ServicerContext) -> StudentModel:
        model = self.store.model(model_id)
        if model is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no student model {model_id!r}")
        assert model is not None
        return model

    def GetModel(
        self, request: student_pb2.GetModelRequest, context: grpc.ServicerContext
    ) -> student_pb2.StudentModel:
        self._check(request.header, context)
        return self._model_proto(self._model(request.id, context))

    def _model_proto(self, model: StudentModel) -> student_pb2.StudentModel:
        """A model as the API shows it, with how far its training is while it trains."""
        out = serde.model_to_proto(model)
        now = None if self.trainer is None else self.trainer.progress(model.id)
        if now is not None and model.state == "training":
            out.progress_done, out.progress_total = now.done, now.total
            out.progress_unit = now.unit
        return out

    def ListModels(
        self, request: student_pb2.ListModelsRequest, context: grpc.ServicerContext
    ) -> student_pb2.ListModelsReply:
        self._check(request.header, context)
        return student_pb2.ListModelsReply(
            models=[self._model_proto(m) for m in self.store.models()]
        )

    def DownloadModel(
        self, request: student_pb2.GetModelRequest, context: grpc.ServicerContext
    ) -> student_pb2.ModelFile:
        self._check(request.header, context)
        model = self._model(request.id, context)
        found = self.store.model_file(model.id)
        if found is None:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"model {model.id} is {model.state}; its weights exist once it is done",
            )
        assert found is not None
        checkpoint, card = found
        return student_pb2.ModelFile(
            model=serde.model_to_proto(model),
            checkpoint=checkpoint,
            card_json=json.dumps(card, sort_keys=True),
        )

    def Predict(
        self, request: student_pb2.PredictRequest, context: grpc.ServicerContext
    ) -> student_pb2.PredictReply:
        self._check(request.header, context)
        model = self._model(request.id, context)
        try:
            records = serde.queries_from_proto(
                request.records, self.task.input_shape, MAX_PREDICT_RECORDS, "a prediction request"
            )
        except RequestError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"records: {err}")
        try:
            out = self.predictor.predict(model.id, records)
        except PredictionError as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        return student_pb2.PredictReply(
            id=model.id,
            labels=serde.labels_to_proto(out.labels),
            scores=serde.tensor_to_proto(out.scores, "float32"),
        )

    def GetLoop(
        self, request: student_pb2.GetLoopRequest, context: grpc.ServicerContext
    ) -> student_pb2.LoopReport:
        self._check(request.header, context)
        return loop_report(self.store, self.identity, serde.model_to_proto)
