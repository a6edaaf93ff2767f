"""Student models: trained on finished jobs' labels, downloaded, used to predict; and the
CaPC loop's report."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

from services.common import serde
from services.common.protocol import RequestError
from services.gateway import schemas
from services.gateway.backends import BackendError, Backends
from services.gateway.deps import ERRORS, JOB_ID, Admin, Analyst, Backend
from services.gateway.replies import loop_out, model_out
from services.proto.capc.v1 import student_pb2

router = APIRouter()

#: RFC 9745's ``Deprecation`` value (a structured-field date: when it was deprecated) for
#: a model asked for with "pseudo-labels", the one name the API had for two methods.
PSEUDO_LABELS_DEPRECATED = f"@{int(datetime(2026, 11, 27, tzinfo=UTC).timestamp())}"


@router.post(
    "/v1/models",
    status_code=201,
    response_model=schemas.ModelOut,
    responses=ERRORS,
    tags=["models"],
    summary="Train a student model on the labels of finished jobs",
)
def train_model(
    body: schemas.ModelCreate, _: Analyst, backends: Backend, response: Response
) -> schemas.ModelOut:
    model = backends.student_call(
        backends.jobs.TrainModel,
        student_pb2.TrainModelRequest(
            header=backends.header,
            job_ids=body.job_ids,
            architecture=body.architecture or "",
            epochs=body.epochs,
            seed=body.seed,
            l2=body.l2 or 0.0,
            semi_supervised=body.semi_supervised,
            own_weight=body.own_weight or 0,
        ),
    )
    if body.semi_supervised == "pseudo-labels":
        # Clients learn it from the header; the model's options say what it was read as.
        response.headers["Deprecation"] = PSEUDO_LABELS_DEPRECATED
    return model_out(model)


@router.get(
    "/v1/loop",
    response_model=schemas.LoopOut,
    responses=ERRORS,
    tags=["models"],
    summary="The CaPC loop: the hospital's model before and after, and what it cost",
)
def loop(_: Analyst, backends: Backend) -> schemas.LoopOut:
    report = backends.student_call(
        backends.jobs.GetLoop, student_pb2.GetLoopRequest(header=backends.header)
    )
    return loop_out(report, backends.querier_spends(report.querier))


@router.get(
    "/v1/admin/loops",
    response_model=schemas.LoopList,
    responses=ERRORS,
    tags=["admin"],
    summary="Every CaPC loop the guardian bound: its hospital and what it cost the others",
)
def loops(_: Admin, backends: Backend) -> schemas.LoopList:
    # A hospital's own gateway shows its own loop; the consortium's, every one.
    mine = backends.hospital
    return schemas.LoopList(
        loops=[x for x in loop_spends(backends) if not mine or x.hospital == mine]
    )


def loop_spends(backends: Backends) -> list[schemas.LoopSpend]:
    """Each bound querier's spends, one guardian read a loop (few: one per hospital)."""
    out = []
    for querier, hospital in sorted(backends.list_parties().bound_queriers.items()):
        spends = backends.querier_spends(querier)
        by_party = {p: e for p, e in spends.querier_epsilon.items() if e > 0}
        out.append(
            schemas.LoopSpend(
                hospital=hospital,
                querier=querier,
                epsilon_by_party=by_party,
                epsilon_spent=max(by_party.values(), default=0.0),
            )
        )
    return out


@router.get("/v1/models", response_model=schemas.ModelList, responses=ERRORS, tags=["models"])
def list_models(_: Analyst, backends: Backend) -> schemas.ModelList:
    reply = backends.student_call(
        backends.jobs.ListModels, student_pb2.ListModelsRequest(header=backends.header)
    )
    return schemas.ModelList(models=[model_out(m) for m in reply.models])


@router.get(
    "/v1/models/{model_id}", response_model=schemas.ModelOut, responses=ERRORS, tags=["models"]
)
def get_model(model_id: Annotated[str, JOB_ID], _: Analyst, backends: Backend) -> schemas.ModelOut:
    return model_out(
        backends.student_call(
            backends.jobs.GetModel,
            student_pb2.GetModelRequest(header=backends.header, id=model_id),
        )
    )


def _model_file(backends: Backends, model_id: str) -> student_pb2.ModelFile:
    reply: student_pb2.ModelFile = backends.student_call(
        backends.jobs.DownloadModel,
        student_pb2.GetModelRequest(header=backends.header, id=model_id),
    )
    return reply


@router.get(
    "/v1/models/{model_id}/weights",
    responses={
        **ERRORS,
        200: {
            "description": "the checkpoint: a torch state dict with its model card",
            "content": {"application/octet-stream": {}},
        },
    },
    tags=["models"],
    response_class=Response,
)
def model_weights(model_id: Annotated[str, JOB_ID], _: Analyst, backends: Backend) -> Response:
    f = _model_file(backends, model_id)
    return Response(
        f.checkpoint,
        media_type="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="capc-student-{model_id}.pt"'},
    )


@router.post(
    "/v1/models/{model_id}/predict",
    response_model=schemas.PredictOut,
    responses={**ERRORS, 413: {"model": schemas.ErrorOut}},
    tags=["models"],
    summary="Predict one or many records with a trained student model",
    description="Each record's prediction depends on that record alone: a batch of one "
    "is predicted exactly as it would be among others (a current-statistics model reads "
    "the stored statistics of its reference batch).",
)
def predict(
    model_id: Annotated[str, JOB_ID], body: schemas.PredictIn, _: Analyst, backends: Backend
) -> schemas.PredictOut:
    try:
        records = np.asarray(body.records, dtype=np.float32)
    except (ValueError, TypeError):
        raise HTTPException(
            422,
            "records: every record must be a nested list of numbers of the task's input "
            "shape, all records of the same shape",
        ) from None
    if records.ndim < 2 or records.dtype == object:
        raise HTTPException(
            422, "records: a list of records, each of the task's input shape (at least 1-D)"
        )
    reply = backends.student_call(
        backends.jobs.Predict,
        student_pb2.PredictRequest(
            header=backends.header, id=model_id, records=serde.queries_to_proto(records)
        ),
    )
    try:
        labels = serde.labels_from_proto(reply.labels)
        scores = serde.tensor_from_proto(reply.scores, "float32", "scores")
    except RequestError as err:
        raise BackendError("student party", None, f"a malformed prediction: {err}") from None
    return schemas.PredictOut(model=reply.id, labels=labels.tolist(), scores=scores.tolist())


@router.get("/v1/models/{model_id}/card", responses=ERRORS, tags=["models"])
def model_card(model_id: Annotated[str, JOB_ID], _: Analyst, backends: Backend) -> dict[str, Any]:
    card: dict[str, Any] = json.loads(_model_file(backends, model_id).card_json)
    return card
