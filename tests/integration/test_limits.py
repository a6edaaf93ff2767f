"""The gateway, the student party and the guardian take the same largest batch and refuse
one query more in the same words; the gateway refuses what one job message cannot carry."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn, TypeVar, cast

import grpc
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from fastapi.testclient import TestClient

from capc.data.generators import Recipe
from capc.round.errors import QuorumError
from capc.task_config import TaskConfig, config_hash
from services.common import serde
from services.common.limits import MAX_BATCH, batch_refusal
from services.common.protocol import RequestError
from services.common.serde import recipe_to_proto
from services.gateway.app import create_app
from services.gateway.backends import BackendError, Backends
from services.gateway.tokens import TokenStore
from services.guardian.rounds import RoundEngine
from services.proto.capc.v1 import common_pb2, guardian_pb2, student_pb2
from services.student.servicer import JobRunner, StudentParty
from services.student.store import JobStore
from services.student.training import ModelTrainer

T = TypeVar("T")
SHAPE = (1, 4, 4)  # the smallest images a recipe makes
TASK = {
    "num_classes": 3,
    "input_shape": list(SHAPE),
    "mechanism": {"name": "gnmax", "sigma": 5.0},
    "quorum": 1,
}
OVER = batch_refusal(MAX_BATCH + 1)


def test_the_refusal_names_the_limit() -> None:
    assert OVER is not None and f"at most {MAX_BATCH} queries, got {MAX_BATCH + 1}" in OVER
    assert batch_refusal(MAX_BATCH) is None and batch_refusal(1) is None
    assert batch_refusal(0) is not None


# -- guardian -----------------------------------------------------------------------
#: What the engine fixture (tests/integration/conftest.py) puts in its ledger.
ENGINE_TASKS = {"t": TASK}
ENGINE_SHARE_TIMEOUT = 1.0


def open_round(engine: RoundEngine, queries: common_pb2.QueryBatch) -> None:
    engine.open_round(
        "student",
        guardian_pb2.OpenRoundRequest(
            header=common_pb2.Header(protocol_version=2, task="t", config_hash=config_hash(TASK)),
            round_key="k",
            queries=queries,
            student_public_key=X25519PrivateKey.generate().public_key().public_bytes_raw(),
        ),
        b"s" * 16,
    )


def zeros(n: int) -> np.ndarray:
    return np.zeros((n, *SHAPE), dtype=np.float32)


def test_the_guardian_refuses_one_query_more_than_the_limit(engine: RoundEngine) -> None:
    assert OVER is not None
    with pytest.raises(RequestError) as err:
        open_round(
            engine, common_pb2.QueryBatch(tensor=serde.queries_to_proto(zeros(MAX_BATCH + 1)))
        )
    assert OVER in str(err.value)
    recipe = recipe_to_proto(Recipe("gaussian", 0, 0, MAX_BATCH + 1, SHAPE), with_hash=False)
    recipe.batch_hash = bytes(32)
    with pytest.raises(RequestError) as err:
        open_round(engine, common_pb2.QueryBatch(recipe=recipe))
    assert OVER in str(err.value)
    # The limit itself passes every check on the batch: the round fails later, for want of
    # parties.
    with pytest.raises(QuorumError):
        open_round(engine, common_pb2.QueryBatch(tensor=serde.queries_to_proto(zeros(MAX_BATCH))))


# -- student party, and the gateway in front of it -----------------------------------
class AbortedError(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code


class Context:
    """The one ServicerContext method CreateJob uses."""

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise AbortedError(code, details)


class Runner:
    def __init__(self) -> None:
        self.submitted: list[str] = []

    def submit(self, job_id: str) -> None:
        self.submitted.append(job_id)


@pytest.fixture
def party(tmp_path: Path) -> StudentParty:
    store = JobStore(str(tmp_path / "jobs.db"))
    task = TaskConfig.parse("t", TASK, config_hash(TASK))
    return StudentParty(store, cast(JobRunner, Runner()), task, cast(ModelTrainer, None))


def create_job(party: StudentParty, batch_size: int) -> student_pb2.Job:
    request = student_pb2.CreateJobRequest(
        header=common_pb2.Header(protocol_version=2, task="t"),
        queries=common_pb2.QueryBatch(tensor=serde.queries_to_proto(zeros(2))),
        batch_size=batch_size,
    )
    return party.CreateJob(request, cast(grpc.ServicerContext, Context()))


def test_the_student_party_refuses_one_query_more_than_the_limit(party: StudentParty) -> None:
    assert OVER is not None
    with pytest.raises(AbortedError) as err:
        create_job(party, MAX_BATCH + 1)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and OVER in str(err.value)
    job = create_job(party, MAX_BATCH)
    stored = party.store.get(job.id)
    assert stored is not None and stored.batch_size == MAX_BATCH


class InProcess(Backends):
    """The gateway's backends with the student party's servicer called in this process."""

    def __init__(self, party: StudentParty) -> None:
        super().__init__("127.0.0.1:1", "127.0.0.1:1", None, task="t")
        self.party = party

    def student_call(self, fn: Callable[..., T], request: object) -> T:
        if not isinstance(request, student_pb2.CreateJobRequest):
            raise NotImplementedError(type(request).__name__)
        try:
            return cast(T, self.party.CreateJob(request, cast(grpc.ServicerContext, Context())))
        except AbortedError as err:
            raise BackendError("student party", err.code, str(err)) from None


@pytest.fixture
def gateway(tmp_path: Path, party: StudentParty) -> Iterator[tuple[TestClient, dict[str, str]]]:
    tokens = TokenStore(str(tmp_path / "tokens.db"))
    secret, _ = tokens.create("analyst", "limits")
    backends = InProcess(party)
    with TestClient(create_app(backends, tokens)) as client:
        yield client, {"Authorization": f"Bearer {secret}"}
    backends.close()


def npy(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x)
    return buf.getvalue()


def test_the_gateway_refuses_one_query_more_and_forwards_the_limit(
    gateway: tuple[TestClient, dict[str, str]], party: StudentParty
) -> None:
    client, auth = gateway
    assert OVER is not None
    recipe = {"recipe": {"generator": "gaussian"}, "count": 8}
    r = client.post("/v1/jobs", headers=auth, json={**recipe, "batch_size": MAX_BATCH + 1})
    assert r.status_code == 422 and OVER in r.text
    upload = {"file": ("q.npy", npy(zeros(2)))}
    r = client.post("/v1/jobs/upload", headers=auth, files=upload, data={"batch_size": "4097"})
    assert r.status_code == 422 and OVER in r.text
    # At the limit the gateway forwards the job and the student party takes it.
    for r in (
        client.post("/v1/jobs", headers=auth, json={**recipe, "batch_size": MAX_BATCH}),
        client.post(
            "/v1/jobs/upload", headers=auth, files=upload, data={"batch_size": str(MAX_BATCH)}
        ),
    ):
        assert r.status_code == 201, r.text
        stored = party.store.get(r.json()["id"])
        assert stored is not None and stored.batch_size == MAX_BATCH


def test_the_gateway_refuses_an_upload_too_large_for_one_job_message(
    gateway: tuple[TestClient, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Integer uploads grow fourfold as float32: 2 uint8 queries of 16 pixels become 128 bytes.
    client, auth = gateway
    monkeypatch.setattr("services.gateway.routes.jobs.MAX_TENSOR_BYTES", 127)
    upload = {"file": ("q.npy", npy(np.zeros((2, *SHAPE), dtype=np.uint8)))}
    r = client.post("/v1/jobs/upload", headers=auth, files=upload)
    assert r.status_code == 413 and "128 bytes as float32 queries, over the 127" in r.text
    monkeypatch.setattr("services.gateway.routes.jobs.MAX_TENSOR_BYTES", 128)
    assert client.post("/v1/jobs/upload", headers=auth, files=upload).status_code == 201
