"""A real local consortium: guardian and five answering parties as separate processes over mutual TLS.

The student labels held-out animal-mnist images through the network. With the guardian's
test-only noise seed the test replays the noise and checks every label
against the mechanism's plaintext oracle on the same teachers (the one central
labelling uses), and checks the ledger against an independent accountant.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from capc.data.generators import Recipe
from capc.models import load_teacher
from capc.privacy.randomness import SecureRandom
from capc.round.ledger import RoundState
from capc.round.messages import QueryBatch
from capc.task_config import TaskConfig
from services.common import tls
from services.common.ledger import Ledger
from services.common.serde import recipe_to_proto
from services.local import LocalConsortium
from services.proto.capc.v1 import common_pb2, student_pb2
from services.student.client import StudentClient
from tests.e2e.jobs import (
    HEADER,
    assert_ledgers_agree,
    gdp_epsilon,
    jobs_stub,
    run_job,
    tensor_batch,
)

PARTIES = 5
NOISE_SEED = "e2e-consortium"


@pytest.fixture(scope="module")
def consortium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalConsortium]:
    # Three epochs train teachers past the accuracy checked here; eight cost 50 s more CPU.
    with LocalConsortium(
        tmp_path_factory.mktemp("consortium"), parties=PARTIES, noise_seed=NOISE_SEED, epochs=3
    ) as c:
        yield c


def replay(
    c: LocalConsortium, queries: np.ndarray, batches: list[int], parties: list[tuple[str, ...]]
) -> np.ndarray:
    """The plaintext mechanism on the same teachers with the guardian's replayed noise."""
    teachers = {f"hospital-{i}": load_teacher(c.model_path(i)) for i in range(c.parties)}
    rng = SecureRandom.from_seed(NOISE_SEED)
    task = c.task_config
    out = []
    start = 0
    for b, used in zip(batches, parties, strict=True):
        xb = queries[start : start + b]
        start += b
        hist = task.mechanism.summed_votes(
            np.stack([teachers[n].predict(xb) for n in used], axis=1)
        )
        spec = task.circuit_spec(len(used))
        labels, _ = task.mechanism.oracle(hist, task.mechanism.draw_noise(b, rng), spec.frac_bits)
        out.append(labels)
    return np.concatenate(out)


def test_labels_equal_the_plaintext_mechanism_and_the_ledger_is_exact(
    consortium: LocalConsortium,
) -> None:
    student = consortium.student()
    queries = consortium.queries[:256]
    truth = consortium.truth[:256]
    labels, rounds = student.label(queries, batch_size=64)
    student.close()
    assert len(rounds) == 4 and all(len(r.parties) == PARTIES for r in rounds)
    expected = replay(
        consortium, queries, [len(r.labels) for r in rounds], [r.parties for r in rounds]
    )
    np.testing.assert_array_equal(labels, expected)
    answered = labels >= 0
    assert answered.mean() > 0.5 and (labels[answered] == truth[answered]).mean() > 0.6

    ledger = Ledger(consortium.db)
    # The guardian commits a round after the student's last message; until then
    # the ledger holds the (larger) reservation.
    deadline = time.monotonic() + 30
    while ledger.count_rounds(RoundState.COMMITTED) < len(rounds) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ledger.count_rounds(RoundState.COMMITTED) == len(rounds)
    params = consortium.task_config.mechanism.params.model_dump()
    # Independently: every threshold test (independent noise on every class, sensitivity
    # sqrt(2)) and every answer (sensitivity sqrt(2)) is a Gaussian mechanism; they
    # compose to mu-GDP with mu**2 the sum of squares.
    tests = sum(len(r.labels) for r in rounds)
    answers = sum(int((r.labels >= 0).sum()) for r in rounds)
    mu = np.sqrt(2 * tests / params["sigma1"] ** 2 + 2 * answers / params["sigma"] ** 2)
    for i in range(PARTIES):
        assert ledger.budget(f"hospital-{i}").spent == pytest.approx(
            gdp_epsilon(float(mu), 1e-5), rel=1e-7
        )
    # Each hospital charged itself the same rounds from its own ledger.
    assert_ledgers_agree(consortium)
    assert ledger.verify_audit() > 0
    print(
        json.dumps(
            {
                "answered": float(answered.mean()),
                "accuracy": float((labels[answered] == truth[answered]).mean()),
            }
        )
    )


def test_a_party_that_drops_is_left_out_and_not_charged(
    consortium: LocalConsortium, tmp_path: Path
) -> None:
    before = Ledger(consortium.db).budget("hospital-4")
    victim = next(p for p in consortium.procs if p.name == "hospital-4")
    victim.popen.kill()
    victim.popen.wait(timeout=10)
    student = consortium.student()
    labels, rounds = student.label(consortium.queries[:64], batch_size=64)
    student.close()
    assert rounds[0].parties == tuple(f"hospital-{i}" for i in range(4))
    assert len(labels) == 64
    ledger = Ledger(consortium.db)
    deadline = time.monotonic() + 30
    while ledger.count_rounds(RoundState.RELEASED) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ledger.budget("hospital-4").spent == pytest.approx(before.spent)
    assert ledger.budget("hospital-0").spent > 0
    assert_ledgers_agree(consortium)
    # The hospital comes back without anyone restarting the guardian.
    consortium.start_party(4).wait_ready()


def test_student_service_runs_a_job_for_the_gateway(consortium: LocalConsortium) -> None:
    consortium.start_student()
    jobs = jobs_stub(consortium)
    header = HEADER
    results, labels = run_job(jobs, tensor_batch(consortium.queries[:100]), 40, timeout=120)
    assert len(labels) == 100 and results.job.rounds == 3
    assert results.job.answered == int((labels >= 0).sum()) > 50
    # A job of programmatic queries: each round travels as a recipe.
    recipe = recipe_to_proto(
        Recipe("spectral", seed=5, start=0, count=50, shape=(1, 28, 28)), with_hash=False
    )
    results, labels = run_job(jobs, common_pb2.QueryBatch(recipe=recipe), 25, timeout=120)
    assert results.job.rounds == 2 and len(labels) == 50
    assert tuple(results.queries.shape) == (50, 1, 28, 28)
    # Bad uploads are refused with a reason; nothing is queued.
    bad = np.full((4, 1, 28, 28), np.nan, dtype="<f4")
    with pytest.raises(grpc.RpcError) as err:
        jobs.CreateJob(
            student_pb2.CreateJobRequest(
                header=header,
                queries=common_pb2.QueryBatch(
                    tensor=common_pb2.Tensor(
                        shape=[4, 1, 28, 28], dtype="float32", data=bad.tobytes()
                    )
                ),
            ),
            timeout=10,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "NaN" in str(
        err.value.details()
    )
    with pytest.raises(grpc.RpcError) as err:
        jobs.CreateJob(
            student_pb2.CreateJobRequest(
                header=header,
                queries=common_pb2.QueryBatch(
                    tensor=common_pb2.Tensor(shape=[2, 3], dtype="float32", data=bytes(24))
                ),
            ),
            timeout=10,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "shape" in str(
        err.value.details()
    )
    with pytest.raises(grpc.RpcError) as err:
        jobs.GetResults(student_pb2.GetResultsRequest(header=header, id="nope"), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    # Hospitals may not use the student's jobs API.
    hospital = jobs_stub(consortium, "hospital-0")
    with pytest.raises(grpc.RpcError) as err:
        hospital.GetResults(
            student_pb2.GetResultsRequest(header=header, id=results.job.id), timeout=10
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_programmatic_queries_travel_as_recipes(consortium: LocalConsortium) -> None:
    """Answering parties regenerate the batch from the recipe, check its hash, and vote on it."""
    student = consortium.student()
    recipe = Recipe("dead_leaves", seed=11, start=0, count=48, shape=(1, 28, 28))
    result = student.label_recipe(recipe)
    student.close()
    assert len(result.labels) == 48 and len(result.parties) >= 3
    # A recipe whose hash does not match what the parties regenerate is refused by every party.
    student = consortium.student()
    forged = recipe_to_proto(Recipe("spectral", seed=11, start=0, count=8, shape=(1, 28, 28)))
    forged.batch_hash = bytes(32)
    with pytest.raises(grpc.RpcError) as err:
        student._round(common_pb2.QueryBatch(recipe=forged), QueryBatch("recipe", 8))
    student.close()
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "nothing was charged" in str(err.value.details())


def test_a_mechanism_added_as_one_module_runs_through_the_services(
    consortium: LocalConsortium,
) -> None:
    """robust-confident-gnmax exists only as capc/mechanisms/robust_confident_gnmax.py: the
    guardian, the hospitals and the student run it, and the ledger charges its per-class
    test at sensitivity sqrt(2)."""
    config = {
        "num_classes": 10,
        "input_shape": [1, 28, 28],
        "mechanism": {
            "name": "robust-confident-gnmax",
            "sigma": 1.5,
            "threshold": 3.5,
            "sigma1": 2.0,
        },
        "quorum": 3,
    }
    ledger = Ledger(consortium.db)
    digest = ledger.create_task("robust", config)
    before = {b.name: ledger.spent_loss(b.name) for b in ledger.budgets()}
    student = StudentClient(
        f"127.0.0.1:{consortium.port}",
        tls.TLSFiles.in_dir(consortium.pki_dir, "student"),
        TaskConfig.parse("robust", config, digest),
        server_name="localhost",
    )
    try:
        result = student.label_batch(consortium.queries[:64])
    finally:
        student.close()
    answered = result.labels >= 0
    truth = consortium.truth[:64]
    assert answered.sum() > 0 and (result.labels[answered] == truth[answered]).mean() > 0.6
    deadline = time.monotonic() + 30
    while ledger.round_state(result.round_id) != RoundState.COMMITTED:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # 64 per-class tests of sensitivity sqrt(2) at sigma1 = 2, answers at sqrt(2) / 1.5.
    mu2 = 64 * 2 / 2.0**2 + int(answered.sum()) * 2 / 1.5**2
    for party in result.parties:
        charged = ledger.spent_loss(party) - before[party]
        assert charged[0] == pytest.approx(mu2, rel=1e-12)


def test_bad_rounds_and_exhausted_budgets_are_refused_with_reasons(
    consortium: LocalConsortium,
) -> None:
    """Runs last: it lowers every cap."""
    from services.proto.capc.v1 import guardian_pb2, guardian_pb2_grpc

    student = consortium.student()
    hub = guardian_pb2_grpc.GuardianHubStub(
        tls.secure_channel(
            f"127.0.0.1:{consortium.port}",
            tls.TLSFiles.in_dir(consortium.pki_dir, "student"),
            "localhost",
            role="guardian",
        )
    )
    header = student.header
    key = student.key.public_key().public_bytes_raw()

    def open_round(
        tensor: common_pb2.Tensor, round_key: str, hdr: common_pb2.Header = header
    ) -> None:
        hub.OpenRound(
            guardian_pb2.OpenRoundRequest(
                header=hdr,
                round_key=round_key,
                queries=common_pb2.QueryBatch(tensor=tensor),
                student_public_key=key,
            ),
            metadata=[("capc-session-id", "ab" * 16)],
            timeout=60,
        )

    nan = np.full((2, 1, 28, 28), np.nan, dtype="<f4")
    cases = [
        (common_pb2.Tensor(shape=[2, 1, 28, 28], dtype="float32", data=nan.tobytes()), "NaN"),
        (common_pb2.Tensor(shape=[2, 1, 28, 28], dtype="float32", data=bytes(100)), "bytes"),
        (
            common_pb2.Tensor(
                shape=[2, 3, 28, 28], dtype="float32", data=bytes(2 * 3 * 28 * 28 * 4)
            ),
            "shape",
        ),
        (
            common_pb2.Tensor(shape=[2, 1, 28, 28], dtype="float64", data=bytes(2 * 784 * 8)),
            "float32",
        ),
    ]
    for tensor, reason in cases:
        with pytest.raises(grpc.RpcError) as err:
            open_round(tensor, f"bad-{reason}")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and reason in str(
            err.value.details()
        )
    good = np.ascontiguousarray(consortium.queries[:2], dtype="<f4")
    tensor = common_pb2.Tensor(shape=[2, 1, 28, 28], dtype="float32", data=good.tobytes())
    with pytest.raises(grpc.RpcError) as err:
        open_round(
            tensor,
            "x",
            common_pb2.Header(protocol_version=2, task=header.task, config_hash="0" * 64),
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "config hash" in str(
        err.value.details()
    )

    # Exhausted budgets: each hospital restarts with a cap of its own below its spend;
    # the guardian takes each declaration, every party is left out, and the round is
    # refused naming them.
    for p in [p for p in consortium.procs if p.name.startswith("hospital-")]:
        p.popen.terminate()
        p.popen.wait(timeout=15)
    consortium.epsilon_caps = [1e-3] * consortium.parties
    for i in range(consortium.parties):
        consortium.start_party(i).wait_ready()
    assert {b.cap for b in Ledger(consortium.db).budgets()} == {1e-3}
    rounds_before = Ledger(consortium.db).count_rounds()
    with pytest.raises(grpc.RpcError) as err:
        open_round(tensor, "exhausted")
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "hospital-0" in str(err.value.details()) and "eps left" in str(err.value.details())
    assert Ledger(consortium.db).count_rounds() == rounds_before
    student.close()
