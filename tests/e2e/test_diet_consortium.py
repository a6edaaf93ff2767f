"""DIET through the services: hospitals hosting teacher ensembles, a student served one
record at a time.

Three hospitals (separate processes, mutual TLS) vote with ensembles of 2, 3 and 1
last-layer teachers on one pretrained body, each teacher on a disjoint part of its
hospital's animal-mnist images. An analyst labels Gaussian queries through the
gateway, trains the student and asks it for predictions. With the guardian's noise
seeded (a test-only flag) the labels are replayed against the plaintext mechanism on
the summed votes of all six teachers, and each hospital's ledger charge is one
teacher's, whatever its teacher count. The student's prediction for a record is the
same alone as among 255 others, so batch-of-1 accuracy equals batch-of-256 accuracy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from capc_client import ApiError, Client

from capc.data.generators import Recipe
from capc.learning.diet import BodyConfig, pretrained_body, save_body
from capc.learning.simclr import PretrainConfig
from capc.learning.supervised import accuracy
from capc.models import load_teacher
from capc.models.ensemble import Voters
from capc.privacy.randomness import SecureRandom
from capc.round.ledger import RoundState
from services.common.ledger import Ledger
from services.local import LocalConsortium

TEACHERS = [2, 3, 1]
NOISE_SEED = "e2e-diet"
TASK = {
    "num_classes": 10,
    "input_shape": [1, 28, 28],
    "mechanism": {"name": "gnmax", "sigma": 0.8},
    "quorum": 3,
}
QUERIES, BATCH = 384, 128


@pytest.fixture(scope="module")
def consortium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalConsortium]:
    root = tmp_path_factory.mktemp("diet")
    config = BodyConfig(width=4, pool=512, pretrain=PretrainConfig(steps=3, batch=64))
    body = pretrained_body(config, None, 10, lambda s: None, "cpu")
    save_body(root / "body.pt", body, config)
    c = LocalConsortium(
        root / "consortium",
        parties=len(TEACHERS),
        task=dict(TASK),
        body=root / "body.pt",
        teachers=TEACHERS,
        noise_seed=NOISE_SEED,
        epsilon_cap=1e6,
    )
    with c:
        c.start_student()
        c.start_gateway()
        yield c


@pytest.fixture(scope="module")
def analyst(consortium: LocalConsortium) -> Client:
    return Client(consortium.gateway_url, consortium.token("analyst", "ml"), ca=consortium.ca)


@pytest.fixture(scope="module")
def labelled(consortium: LocalConsortium, analyst: Client) -> str:
    job = analyst.submit_recipe("gaussian", QUERIES, seed=3, batch_size=BATCH)
    job = analyst.wait(job.id, timeout=600)
    assert job.state == "done", job.error
    return job.id


def test_ensembles_vote_as_their_teachers_summed_and_pay_as_one_teacher(
    consortium: LocalConsortium, analyst: Client, labelled: str
) -> None:
    labels = np.asarray(analyst.labels(labelled))
    assert labels.shape == (QUERIES,) and (labels >= 0).all()
    task = consortium.task_config
    voters = [Voters.load(consortium.model_paths(i)) for i in range(consortium.parties)]
    assert [len(v) for v in voters] == TEACHERS
    x = Recipe("gaussian", 3, 0, QUERIES, (1, 28, 28)).generate()
    rng = SecureRandom.from_seed(NOISE_SEED)
    expected = []
    for lo in range(0, QUERIES, BATCH):
        # Each hospital reads a round's queries with that round's own statistics.
        preds = np.concatenate(
            [v.predict(x[lo : lo + BATCH], current_statistics=True) for v in voters], axis=1
        )
        assert preds.shape == (BATCH, sum(TEACHERS))
        hist = task.mechanism.summed_votes(preds)
        assert (hist.sum(axis=1) == sum(TEACHERS)).all()
        spec = task.circuit_spec(sum(TEACHERS))
        noise = task.mechanism.draw_noise(BATCH, rng)
        expected.append(task.mechanism.oracle(hist, noise, spec.frac_bits)[0])
    np.testing.assert_array_equal(labels, np.concatenate(expected))
    # Each hospital pays for its queries as one teacher would: a record moves one vote.
    ledger = Ledger(consortium.db)
    deadline = time.monotonic() + 30
    while ledger.count_rounds(RoundState.COMMITTED) < QUERIES // BATCH:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    one_teacher = ledger.accounting.cost(task.mechanism.worst_case(QUERIES))
    for i in range(consortium.parties):
        np.testing.assert_allclose(ledger.spent_loss(f"hospital-{i}"), one_teacher, rtol=1e-9)
    ledger.close()


def test_the_admin_view_shows_each_hospitals_teachers(consortium: LocalConsortium) -> None:
    admin = Client(consortium.gateway_url, consortium.token("admin", "dpo"), ca=consortium.ca)
    parties = {p.name: p for p in admin.parties() if p.role == "answerer"}
    assert [parties[f"hospital-{i}"].teachers for i in range(3)] == TEACHERS


def test_a_record_is_predicted_alike_alone_and_in_any_request(
    consortium: LocalConsortium, analyst: Client, labelled: str
) -> None:
    model = analyst.wait_model(analyst.train([labelled]).id, timeout=600)
    assert model.state == "done", model.error
    assert model.options == {"l2": 0.01, "semi_supervised": "none"}
    card = analyst.model_card(model.id)
    assert card["reference"]["records"] == len(consortium.reference) >= 16
    x, y = consortium.queries[:256], np.asarray(consortium.truth[:256])
    batched = analyst.predict(model.id, x)
    alone = [analyst.predict(model.id, x[i : i + 1]) for i in range(len(x))]
    labels_1 = np.array([a.labels[0] for a in alone])
    np.testing.assert_array_equal(labels_1, batched.labels)
    np.testing.assert_allclose(
        np.array([a.scores[0] for a in alone]), np.array(batched.scores), atol=1e-5
    )
    assert float((labels_1 == y).mean()) == float((np.array(batched.labels) == y).mean())
    # The same record among other records, in another order, is predicted the same.
    order = np.random.default_rng(1).permutation(len(x))[:50]
    mixed = analyst.predict(model.id, x[order])
    np.testing.assert_array_equal(mixed.labels, np.array(batched.labels)[order])
    # The service's test accuracy is the accuracy of what it serves.
    scores = np.array(batched.scores)
    assert scores.shape == (256, 10) and np.allclose(scores.sum(axis=1), 1.0, atol=1e-4)
    tx, ty = consortium.queries, np.asarray(consortium.truth)
    served = np.array(analyst.predict(model.id, tx).labels)
    assert model.metrics["test_accuracy"] == pytest.approx(float((served == ty).mean()))
    # The head is the central-mode experiment's; read there with current statistics in
    # batches of 512 test images, it gives what the reference batch gives here.
    path = analyst.download_model(model.id, consortium.directory / "student.pt")
    central = accuracy(load_teacher(path).model, tx, ty, current_statistics=True, batch=512)
    print(f"student: {model.metrics['test_accuracy']:.3f} served, {central:.3f} as in central mode")
    assert abs(model.metrics["test_accuracy"] - central) <= 0.05
    # Bad requests say what is wrong.
    with pytest.raises(ApiError) as err:
        analyst.predict(model.id, np.zeros((2, 1, 27, 28), dtype=np.float32))
    assert err.value.status == 422 and "shape" in err.value.detail
    with pytest.raises(ApiError) as err:
        analyst.predict(model.id, [[1.0, 2.0], [3.0]])
    assert err.value.status == 422 and "records" in err.value.detail
    with pytest.raises(ApiError) as err:
        analyst.predict("00000000-0000-0000-0000-000000000000", x[:1])
    assert err.value.status == 404
    # capcctl predicts a JSON file of records.
    records = consortium.directory / "records.json"
    records.write_text(json.dumps(x[:3].tolist()))
    env = {
        **os.environ,
        "CAPC_URL": consortium.gateway_url,
        "CAPC_TOKEN": consortium.token("analyst", "cli"),
        "CAPC_CA": str(consortium.ca),
    }
    cmd = ["models", "predict", model.id, str(records), "--json"]
    out = subprocess.run(
        [sys.executable, "-m", "capc_client.cli", *cmd],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["labels"] == list(batched.labels[:3])


def test_semi_supervised_students_learn_from_unanswered_queries(
    consortium: LocalConsortium, analyst: Client, labelled: str
) -> None:
    # A job cut short by the budget leaves queries nobody answered: the caps are set so
    # that one more round of BATCH queries fits, and the job asks for two.
    task = consortium.task_config
    ledger = Ledger(consortium.db)
    one_round = ledger.accounting.cost(task.mechanism.worst_case(BATCH))
    caps = []
    for i in range(consortium.parties):
        total = ledger.spent_loss(f"hospital-{i}") + one_round
        caps.append(ledger.accounting.spent(total, ledger.delta).epsilon * (1 + 1e-6))
    ledger.close()
    # Each hospital lowers its own cap (its configuration, then a restart).
    for i, cap in enumerate(caps):
        consortium.restart_party(i, cap)
    # The gateway refuses a job the caps cannot finish unless asked to stop where they end.
    with pytest.raises(ApiError) as err:
        analyst.submit_recipe("gaussian", 2 * BATCH, seed=9, batch_size=BATCH)
    assert err.value.status == 409 and "Nothing was spent" in err.value.detail
    job = analyst.submit_recipe("gaussian", 2 * BATCH, seed=9, batch_size=BATCH, allow_partial=True)
    job = analyst.wait(job.id, timeout=600)
    assert job.state == "failed" and "RESOURCE_EXHAUSTED" in job.error
    assert job.processed == job.answered == BATCH
    # "pseudo-labels" is the deprecated name the API had for two methods: a pretrained
    # student reads it as pseudo-label-head, and its options say so.
    for mode, method in (
        ("self-training", "self-training"),
        ("pseudo-label-head", "pseudo-label-head"),
        ("pseudo-labels", "pseudo-label-head"),
    ):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            started = analyst.train([labelled, job.id], semi_supervised=mode)
        # The gateway's Deprecation header (RFC 9745) reaches the SDK's user as a warning.
        assert [w.category for w in said] == ([DeprecationWarning] if mode != method else [])
        model = analyst.wait_model(started.id, timeout=600)
        assert model.state == "done", model.error
        assert model.options["semi_supervised"] == method
        assert ("deprecated" in model.options) == (mode != method)
        assert model.metrics["unanswered_queries_used"] == BATCH
        assert model.examples == QUERIES + BATCH
        assert 0.0 <= model.metrics["test_accuracy"] <= 1.0
    # A student trained from scratch learns from unanswered queries by FixMatch only.
    with pytest.raises(ApiError) as err:
        analyst.train([labelled], architecture="small-cnn", semi_supervised="self-training")
    assert err.value.status == 422 and "takes none, fixmatch" in err.value.detail


def test_paths_of_an_ensemble_hospital(consortium: LocalConsortium) -> None:
    assert [len(consortium.model_paths(i)) for i in range(3)] == [1, 1, 1]
    assert all(isinstance(p, Path) and p.exists() for p in consortium.model_paths(1))
