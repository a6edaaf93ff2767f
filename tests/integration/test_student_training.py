"""The student party's trainer on a real job store: the central experiment's head, the
CaPC loop's own records, reference statistics, and refusals that say what to do."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from capc.learning.last_layer import fit_batch_standardised, fit_linear
from capc.learning.supervised import fit
from capc.models import Teacher, build
from capc.models.inference import features
from capc.task_config import TaskConfig, config_hash
from services.student.predictor import load_teacher_bytes
from services.student.store import JobStore
from services.student.training import ModelTrainer, TrainingError, TrainingOptions

TASK = {"num_classes": 3, "input_shape": [1, 12, 12], "mechanism": {"name": "gnmax", "sigma": 1.0}}


def images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = rng.random((n, 1, 12, 12)).astype(np.float32) * 0.4
    x[y == 0, :, :, :6] += 0.6
    x[y == 1, :, :, 6:] += 0.6
    x[y == 2, :, :6, :] += 0.6
    return x, y


@pytest.fixture
def parts(tmp_path: Path) -> tuple[JobStore, TaskConfig, Teacher]:
    store = JobStore(str(tmp_path / "student.db"))
    task = TaskConfig.parse("t", TASK, config_hash(TASK))
    body = Teacher(
        "resnet10", (1, 12, 12), 3, build("resnet10", (1, 12, 12), 3, 4, seed=0), width=4
    )
    return store, task, body


def wait(store: JobStore, model_id: str) -> None:
    deadline = time.monotonic() + 120
    while (spec := store.model(model_id)) is not None and spec.state not in ("done", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_the_service_fits_the_central_experiments_head(
    parts: tuple[JobStore, TaskConfig, Teacher],
) -> None:
    store, task, body = parts
    x, y = images(120, 0)
    job = store.create("t", x, batch_size=40)
    for i in range(3):
        store.record_batch(job.id, i, i + 1, y[40 * i : 40 * (i + 1)])
    store.finish(job.id)
    test = images(90, 1)
    trainer = ModelTrainer(store, task, test, body, reference=images(90, 4)[0])
    trainer.check([job.id], "pretrained", 10)
    spec = store.create_model([job.id], "pretrained", 10, 0, TrainingOptions().to_dict())
    trainer.submit(spec.id)
    wait(store, spec.id)
    done = store.model(spec.id)
    assert done is not None and done.state == "done", done
    found = store.model_file(spec.id)
    assert found is not None
    model = load_teacher_bytes(found[0]).model
    # The experiment's student head: batch-standardised, balanced, L2 0.01, on features of
    # each round of 40 queries read with its own statistics.
    f = features(body.model, x, current_statistics=True, batch=40)
    head = fit_batch_standardised(f, y, 3, l2=0.01, balanced=True)
    fitted, expected = model.head[1], head[1]  # type: ignore[index]
    assert isinstance(fitted, torch.nn.Linear) and isinstance(expected, torch.nn.Linear)
    assert torch.allclose(fitted.weight, expected.weight, atol=1e-5)
    assert found[1]["reference"] == {"records": 90, "sha256": found[1]["reference"]["sha256"]}  # type: ignore[index]


def test_the_capc_loop_fits_own_records_with_or_without_jobs(
    parts: tuple[JobStore, TaskConfig, Teacher],
) -> None:
    store, task, body = parts
    own, test = images(60, 2), images(90, 3)
    trainer = ModelTrainer(store, task, test, body, own=own)
    # With its own records, a model of no jobs is the querier's model before it asked.
    trainer.check([], "pretrained", 10)
    spec = store.create_model([], "pretrained", 10, 0, TrainingOptions().to_dict())
    trainer.submit(spec.id)
    wait(store, spec.id)
    done = store.model(spec.id)
    assert done is not None and done.state == "done" and done.examples == 60, done
    assert 0.0 <= float(str(done.metrics["test_accuracy"])) <= 1.0
    alone = ModelTrainer(store, task, test, body)
    with pytest.raises(TrainingError, match="at least one finished job"):
        alone.check([], "pretrained", 10)
    with pytest.raises(TrainingError, match="takes none, fixmatch"):
        alone.check(["x"], "small-cnn", 10, TrainingOptions(semi_supervised="self-training"))
    blind = ModelTrainer(store, task, None, body)
    with pytest.raises(TrainingError, match="--reference-data"):
        blind.check(["x"], "pretrained", 10)
    # The held-out test set never serves as the reference batch, however it is given.
    assert alone.reference is None
    with pytest.raises(TrainingError, match="--reference-data FILE \\(256 real unlabelled"):
        alone.check(["x"], "pretrained", 10)
    assert trainer.reference is not None and len(trainer.reference) == 60


def test_own_weight_enters_the_querys_own_records_k_times(
    parts: tuple[JobStore, TaskConfig, Teacher],
) -> None:
    """The CaPC loop's ``own_weight``: the head is the experiment's head on the own
    records' features k times beside the bought labels', so the fit moves with k."""
    store, task, body = parts
    own, test = images(60, 2), images(90, 3)
    x, y = images(80, 5)
    y = (y + 1) % 3  # bought labels that disagree with the own records' classes
    job = store.create("t", x, batch_size=40)
    for i in range(2):
        store.record_batch(job.id, i, i + 1, y[40 * i : 40 * (i + 1)])
    store.finish(job.id)
    trainer = ModelTrainer(store, task, test, body, own=own)

    def head(k: int) -> torch.nn.Linear:
        options = TrainingOptions.parse(0.0, "none", "pretrained", k)
        trainer.check([job.id], "pretrained", 10, options)
        spec = store.create_model([job.id], "pretrained", 10, 0, options.to_dict())
        trainer.submit(spec.id)
        wait(store, spec.id)
        done = store.model(spec.id)
        assert done is not None and done.state == "done", done
        # Examples and the options record the distinct records and the weight asked for.
        assert done.examples == 60 + 80
        assert store.model_options(spec.id) == options.to_dict()
        found = store.model_file(spec.id)
        assert found is not None
        linear = load_teacher_bytes(found[0]).model.head[1]  # type: ignore[index]
        assert isinstance(linear, torch.nn.Linear)
        return linear

    once, four = head(1), head(4)
    assert not torch.allclose(once.weight, four.weight, atol=1e-3)
    # What the trainer fits: own features (in its order, its batches) four times, then the job's.
    order = np.random.default_rng(1).permutation(60)
    own_f = features(body.model, own[0][order], current_statistics=True, batch=512)
    job_f = features(body.model, x, current_statistics=True, batch=40)
    expected = fit_batch_standardised(
        torch.cat([own_f] * 4 + [job_f]),
        np.concatenate([own[1][order]] * 4 + [y]),
        3,
        l2=0.01,
        balanced=True,
    )[1]
    assert isinstance(expected, torch.nn.Linear)
    assert torch.allclose(four.weight, expected.weight, atol=1e-5)
    # Weighting own records that are not there, or a student that never reads them, is refused.
    heavy = TrainingOptions.parse(0.0, "none", "pretrained", 4)
    alone = ModelTrainer(store, task, test, body, reference=images(90, 4)[0])
    with pytest.raises(TrainingError, match=r"own_weight 4 .* has none \(start it with --own-data"):
        alone.check([job.id], "pretrained", 10, heavy)
    # A student trained from scratch reads them too (how a table task's hospital loops),
    # but not FixMatch, which has no place for labelled records that are not queries.
    trainer.check([job.id], "small-cnn", 10, TrainingOptions(own_weight=4))
    with pytest.raises(TrainingError, match="not FixMatch's"):
        trainer.check([job.id], "small-cnn", 10, TrainingOptions(semi_supervised="fixmatch"))


TABLE = {"num_classes": 2, "input_shape": [6], "mechanism": {"name": "gnmax", "sigma": 1.0}}


def rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, 6) table rows whose class is the sign of their first feature's offset."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    x[:, 0] += 2.0 * y - 1.0
    return x, y


def test_a_table_querier_without_a_body_loops_on_its_own_rows(tmp_path: Path) -> None:
    """The CaPC loop on a table task: no pretrained body, so the querier's MLP is trained
    from scratch on its own rows (``own_weight`` times, in the trainer's order) and the
    bought labels; a model of no jobs is its model alone."""
    store = JobStore(str(tmp_path / "student.db"))
    task = TaskConfig.parse("t", TABLE, config_hash(TABLE))
    own, test = rows(40, 2), rows(100, 3)
    x, y = rows(30, 5)
    y = 1 - y  # bought labels that disagree with the own rows' classes
    job = store.create("t", x, batch_size=30)
    store.record_batch(job.id, 0, 1, y)
    store.finish(job.id)
    trainer = ModelTrainer(store, task, test, None, own=own)
    assert trainer.default_architecture == "mlp"

    metrics: dict[str, object] = {}

    def trained(jobs: list[str], k: int) -> tuple[dict[str, torch.Tensor], int]:
        options = TrainingOptions.parse(0.0, "none", "mlp", k)
        trainer.check(jobs, "mlp", 20, options)
        spec = store.create_model(jobs, "mlp", 20, 7, options.to_dict())
        trainer.submit(spec.id)
        wait(store, spec.id)
        done = store.model(spec.id)
        assert done is not None and done.state == "done", done
        found = store.model_file(spec.id)
        assert found is not None
        metrics.clear()
        metrics.update(done.metrics)
        return load_teacher_bytes(found[0]).model.state_dict(), done.examples

    def expected(x: np.ndarray, y: np.ndarray) -> dict[str, torch.Tensor]:
        torch.manual_seed(7)
        return fit(build("mlp", (6,), 2), x, y, epochs=20, seed=7).state_dict()

    def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
        return a.keys() == b.keys() and all(torch.allclose(a[n], b[n]) for n in a)

    order = np.random.default_rng(1).permutation(40)
    ox, oy = own[0][order], own[1][order]
    before, examples = trained([], 1)
    # The model of own rows alone is the best of the MLP and logistic regressions, chosen
    # on a held-out part of the own rows (issue 56): on rows whose class is a linear
    # function of a feature, a logistic regression; refitted on all 40 rows.
    assert examples == 40 and str(metrics["before_model"]).startswith("logistic regression")
    choice = metrics["before_choice"]
    assert isinstance(choice, dict) and len(choice) == 4
    default = choice["the student's default model (mlp)"]
    assert choice[metrics["before_model"]] >= default
    l2 = float(str(metrics["before_model"]).rsplit(" ", 1)[1])
    flat = torch.from_numpy(own[0])
    expected_head = fit_linear(flat, own[1], 2, l2=l2)
    assert set(before) == {"head.weight", "head.bias"}
    assert torch.allclose(before["head.weight"], expected_head.weight, atol=1e-5)
    once, examples = trained([job.id], 1)
    assert examples == 40 + 30 and same(once, expected(np.concatenate([ox, x]), np.r_[oy, y]))
    four, _ = trained([job.id], 4)
    assert same(four, expected(np.concatenate([ox] * 4 + [x]), np.r_[oy, oy, oy, oy, y]))
    assert not same(once, four) and not same(before, once)
    # Without own rows the same party type still needs a job, and weights nothing.
    alone = ModelTrainer(store, task, test, None)
    with pytest.raises(TrainingError, match="at least one finished job"):
        alone.check([], "mlp", 20)
    with pytest.raises(TrainingError, match=r"own_weight 4 .* has none"):
        alone.check([job.id], "mlp", 20, TrainingOptions(own_weight=4))


def test_the_model_before_is_chosen_on_own_records_never_on_the_test_set(
    tmp_path: Path,
) -> None:
    """Which "before" model wins depends on the querier's own records alone: a test set
    with every label flipped changes its test accuracy, not the choice or the weights;
    the default model wins where it scores best on the held-out own rows."""
    store = JobStore(str(tmp_path / "student.db"))
    task = TaskConfig.parse("t", TABLE, config_hash(TABLE))
    own, test = rows(40, 2), rows(100, 3)
    flipped = (test[0], 1 - test[1])

    def before(test_set: tuple[np.ndarray, np.ndarray]) -> tuple[dict[str, object], bytes]:
        trainer = ModelTrainer(store, task, test_set, None, own=own)
        spec = store.create_model([], "mlp", 20, 7, TrainingOptions().to_dict())
        trainer.submit(spec.id)
        wait(store, spec.id)
        done, found = store.model(spec.id), store.model_file(spec.id)
        assert done is not None and done.state == "done" and found is not None, done
        return done.metrics, found[0]

    (m1, w1), (m2, w2) = before(test), before(flipped)
    assert m1["before_model"] == m2["before_model"] and m1["before_choice"] == m2["before_choice"]
    # The checkpoints' cards differ (their test accuracy); their weights do not.
    s1, s2 = load_teacher_bytes(w1).model.state_dict(), load_teacher_bytes(w2).model.state_dict()
    assert s1.keys() == s2.keys() and all(torch.equal(s1[k], s2[k]) for k in s1)
    acc1, acc2 = float(str(m1["test_accuracy"])), float(str(m2["test_accuracy"]))
    assert acc1 == pytest.approx(1.0 - acc2)
    # Too few own records to hold any out: the default model, said so.
    few = ModelTrainer(store, task, test, None, own=rows(6, 4))
    spec = store.create_model([], "mlp", 5, 0, TrainingOptions().to_dict())
    few.submit(spec.id)
    wait(store, spec.id)
    done = store.model(spec.id)
    assert done is not None and done.state == "done", done
    assert done.metrics["before_model"] == "the student's default model (mlp)"
    assert "before_choice" not in done.metrics


def test_training_reports_how_far_it_is_through_the_servicer(tmp_path: Path) -> None:
    """Issue 56: a model's training said only "training" until it ended. The trainer now
    reports epochs (a plain model) or candidate fits (the loop's "before"), and the
    student party's GetModel carries them while it trains, and none after."""
    from typing import cast

    import grpc

    from services.common import protocol
    from services.proto.capc.v1 import student_pb2
    from services.student.servicer import JobRunner, StudentParty
    from services.student.training import TrainingProgress

    store = JobStore(str(tmp_path / "student.db"))
    task = TaskConfig.parse("t", TABLE, config_hash(TABLE))
    x, y = rows(30, 5)
    job = store.create("t", x, batch_size=30)
    store.record_batch(job.id, 0, 1, y)
    store.finish(job.id)
    heard: list[tuple[int, int, str]] = []
    shown: list[tuple[int, int, str, str]] = []
    parties: list[StudentParty] = []

    def observe(model_id: str, now: TrainingProgress) -> None:
        # In the training thread, while it trains: what a client's GetModel sees then.
        heard.append((now.done, now.total, now.unit))
        m = parties[0].GetModel(
            student_pb2.GetModelRequest(header=protocol.header("t"), id=model_id),
            cast(grpc.ServicerContext, None),
        )
        shown.append((m.progress_done, m.progress_total, m.progress_unit, m.state))

    def train(trainer: ModelTrainer, jobs: list[str]) -> student_pb2.StudentModel:
        parties[:] = [StudentParty(store, cast(JobRunner, None), task, trainer)]
        spec = store.create_model(jobs, "mlp", 3, 0, TrainingOptions().to_dict())
        trainer.submit(spec.id)
        wait(store, spec.id)
        done = parties[0].GetModel(
            student_pb2.GetModelRequest(header=protocol.header("t"), id=spec.id),
            cast(grpc.ServicerContext, None),
        )
        assert done.state == "done", done
        return done

    done = train(ModelTrainer(store, task, rows(20, 3), None, on_progress=observe), [job.id])
    assert heard == [(1, 3, "epochs"), (2, 3, "epochs"), (3, 3, "epochs")]
    assert shown == [(d, t, u, "training") for d, t, u in heard]
    assert (done.progress_done, done.progress_total, done.progress_unit) == (0, 0, "")
    # The loop's "before": five fits (the default model and three logistic regressions
    # on part of the own rows, then the chosen one on all), no epochs of one of them.
    heard.clear()
    shown.clear()
    loop = ModelTrainer(store, task, rows(20, 3), None, own=rows(40, 2), on_progress=observe)
    train(loop, [])
    assert heard == [(i, 5, "candidate fits") for i in range(1, 6)]
    assert [s[:3] for s in shown] == heard


def test_a_diet_student_reports_the_queries_it_has_read(
    parts: tuple[JobStore, TaskConfig, Teacher],
) -> None:
    """Most of a DIET student's training is reading the jobs' queries through the body:
    it reports them round by round (the job's batch size), across every job."""
    from services.student.training import TrainingProgress

    store, task, body = parts
    ids = []
    for seed, n in ((0, 120), (1, 40)):
        x, y = images(n, seed)
        job = store.create("t", x, batch_size=40)
        for i in range(n // 40):
            store.record_batch(job.id, i, i + 1, y[40 * i : 40 * (i + 1)])
        store.finish(job.id)
        ids.append(job.id)
    heard: list[tuple[int, int, str]] = []

    def observe(model_id: str, now: TrainingProgress) -> None:
        heard.append((now.done, now.total, now.unit))

    trainer = ModelTrainer(
        store, task, images(30, 2), body, reference=images(90, 4)[0], on_progress=observe
    )
    spec = store.create_model(ids, "pretrained", 10, 0, TrainingOptions().to_dict())
    trainer.submit(spec.id)
    wait(store, spec.id)
    done = store.model(spec.id)
    assert done is not None and done.state == "done", done
    assert heard == [(k, 160, "queries read") for k in (40, 80, 120, 160)]
    assert trainer.progress(spec.id) is None  # nothing is reported once it is done


def test_a_fixmatch_student_reports_its_steps(tmp_path: Path) -> None:
    from services.student.training import TrainingProgress

    store = JobStore(str(tmp_path / "student.db"))
    task = TaskConfig.parse("t", TASK, config_hash(TASK))
    x, y = images(40, 0)
    job = store.create("t", x, batch_size=40)
    store.record_batch(job.id, 0, 1, y)
    store.finish(job.id)
    heard: list[tuple[int, int, str]] = []

    def observe(model_id: str, now: TrainingProgress) -> None:
        heard.append((now.done, now.total, now.unit))

    trainer = ModelTrainer(store, task, images(30, 2), None, on_progress=observe)
    options = TrainingOptions(semi_supervised="fixmatch")
    trainer.check([job.id], "small-cnn", 1, options)
    spec = store.create_model([job.id], "small-cnn", 1, 0, options.to_dict())
    trainer.submit(spec.id)
    wait(store, spec.id)
    done = store.model(spec.id)
    assert done is not None and done.state == "done", done
    steps = heard[-1][1]
    assert steps >= 20 and heard == [(k, steps, "steps") for k in range(1, steps + 1)]
