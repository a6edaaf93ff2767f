"""The CaPC loop: a hospital queries the consortium and retrains its own model.

Three hospitals (separate processes, mutual TLS) vote with ensembles of two
last-layer teachers each. Hospital 0 also queries: it runs a student party of its
own, under its own student certificate, whose rounds leave hospital 0's teachers
out. It holds a few labelled records and many unlabelled ones; its model (the
pretrained body's last layer) is fitted on its labelled records alone, then again
on them plus the labels the other hospitals' teachers gave its unlabelled records.
Its held-out accuracy must improve, hospital 0 must pay nothing for its own
queries, and the others pay one teacher's cost each.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import numpy as np
import pytest

from capc.learning.diet import BodyConfig, pretrained_body, save_body
from capc.learning.simclr import PretrainConfig
from services.common import tls
from services.common.ledger import Ledger
from services.local import LocalConsortium
from services.proto.capc.v1 import student_pb2, student_pb2_grpc
from tests.e2e.jobs import HEADER, run_job, tensor_batch

TASK = {
    "num_classes": 10,
    "input_shape": [1, 28, 28],
    "mechanism": {"name": "gnmax", "sigma": 0.5},
    "quorum": 2,
}
OWN, UNLABELLED = 40, 600


@pytest.fixture(scope="module")
def consortium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalConsortium]:
    root = tmp_path_factory.mktemp("capc-loop")
    config = BodyConfig(width=8, pool=1024, pretrain=PretrainConfig(steps=20, batch=64))
    body = pretrained_body(config, None, 10, lambda s: None, "cpu")
    save_body(root / "body.pt", body, config)
    with LocalConsortium(
        root / "consortium",
        parties=3,
        task=dict(TASK),
        body=root / "body.pt",
        teachers=[2, 2, 2],
        epsilon_cap=1e6,
        held_out=1200,
    ) as c:
        yield c


def stub(c: LocalConsortium, port: int, name: str) -> student_pb2_grpc.StudentPartyStub:
    channel = tls.secure_channel(
        f"127.0.0.1:{port}", tls.TLSFiles.in_dir(c.pki_dir, name), "localhost", role="student"
    )
    return student_pb2_grpc.StudentPartyStub(channel)


def train(jobs: student_pb2_grpc.StudentPartyStub, job_ids: list[str]) -> dict[str, float]:
    model = jobs.TrainModel(student_pb2.TrainModelRequest(header=HEADER, job_ids=job_ids))
    deadline = time.monotonic() + 600
    while model.state not in ("done", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.5)
        model = jobs.GetModel(student_pb2.GetModelRequest(header=HEADER, id=model.id))
    assert model.state == "done", model.error
    metrics: dict[str, float] = json.loads(model.metrics_json)
    return metrics


def test_a_hospital_improves_its_own_model_by_querying_the_others(
    consortium: LocalConsortium,
) -> None:
    x, y = consortium.queries, np.asarray(consortium.truth)
    own = (x[:OWN], y[:OWN])
    unlabelled = x[OWN : OWN + UNLABELLED]
    test = (x[OWN + UNLABELLED :], y[OWN + UNLABELLED :])
    port = consortium.start_querier(0, own, test)
    jobs = stub(consortium, port, "hospital-0-querier")
    before = train(jobs, [])
    assert before["examples"] == OWN
    ledger = Ledger(consortium.db)
    spent = {f"hospital-{i}": ledger.spent_loss(f"hospital-{i}") for i in range(3)}
    results, labels = run_job(jobs, tensor_batch(unlabelled), 300, timeout=600)
    assert results.job.answered == UNLABELLED and (labels >= 0).all()
    agree = float((labels == y[OWN : OWN + UNLABELLED]).mean())
    after = train(jobs, [results.job.id])
    assert after["examples"] == OWN + UNLABELLED
    print(
        f"CaPC loop: hospital 0's model {before['test_accuracy']:.3f} -> "
        f"{after['test_accuracy']:.3f} on {len(test[0])} held-out records "
        f"({agree:.3f} of the returned labels right)"
    )
    assert after["test_accuracy"] > before["test_accuracy"] + 0.03
    # Hospital 0's teachers sat its own rounds out: its budget paid nothing for them.
    np.testing.assert_array_equal(ledger.spent_loss("hospital-0"), spent["hospital-0"])
    task = consortium.task_config
    one_teacher = ledger.accounting.cost(task.mechanism.worst_case(UNLABELLED))
    for name in ("hospital-1", "hospital-2"):
        np.testing.assert_allclose(ledger.spent_loss(name) - spent[name], one_teacher, rtol=1e-9)
    ledger.close()
