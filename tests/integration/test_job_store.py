"""The student's job store on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from services.student.store import JobStore


def test_jobs_batches_and_resume_points(ledger_url: str) -> None:
    store = JobStore(ledger_url)
    q = np.random.default_rng(0).random((10, 1, 4, 4)).astype(np.float32)
    job = store.create("t", q, batch_size=4, recipe='{"generator": "gaussian"}')
    assert (job.state, job.requested) == ("queued", 10)
    np.testing.assert_array_equal(store.queries(job.id), q)
    assert store.recipe(job.id) == '{"generator": "gaussian"}'
    store.record_batch(job.id, 0, 7, np.array([1, -1, 2, 3]))
    assert store.resume_points() == [(job.id, 1)]
    reopened = JobStore(ledger_url)
    store.record_batch(job.id, 1, 8, np.array([0, 0, -1, -1]))
    after = reopened.get(job.id)
    assert after is not None and (after.processed, after.answered, after.rounds, after.state) == (
        8,
        5,
        2,
        "running",
    )
    np.testing.assert_array_equal(reopened.labels(job.id), [1, -1, 2, 3, 0, 0, -1, -1])
    store.finish(job.id, "RESOURCE_EXHAUSTED: budgets spent")
    done = store.get(job.id)
    assert done is not None and done.state == "failed" and "budgets" in done.error
    assert store.resume_points() == []
    assert store.get("missing") is None


def test_query_pages_are_read_in_place(ledger_url: str) -> None:
    store = JobStore(ledger_url)
    x = np.random.default_rng(1).random((50, 1, 6, 6)).astype(np.float32)
    job = store.create("t", x, 16)
    np.testing.assert_array_equal(store.queries(job.id), x)
    for lo, hi in [(0, 16), (16, 32), (48, 64), (60, 70), (5, 5)]:
        np.testing.assert_array_equal(store.queries(job.id, lo, hi), x[lo:hi])


@pytest.mark.slow
def test_semi_supervised_student_learns_from_unanswered_queries(tmp_path: Path) -> None:
    """FixMatch through the student party's trainer: the request survives in the store,
    the unanswered queries are its unlabelled data, and it beats guessing."""
    from capc.task_config import TaskConfig, config_hash
    from services.student.training import ModelTrainer, TrainingError, TrainingOptions

    spec = {
        "num_classes": 2,
        "input_shape": [1, 8, 8],
        "mechanism": {"name": "gnmax", "sigma": 1.0},
        "quorum": 1,
    }
    task = TaskConfig.parse("t", spec, config_hash(spec))
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    x = (rng.random((200, 1, 8, 8)) * 0.2).astype(np.float32)
    x[y == 1, :, :4] += 0.7
    store = JobStore(str(tmp_path / "student.db"))
    job = store.create("t", x, batch_size=100)
    labels = np.where(np.arange(200) < 30, y, -1)  # 30 answered, 170 not
    store.record_batch(job.id, 0, 1, labels[:100])
    store.record_batch(job.id, 1, 2, labels[100:])
    store.finish(job.id)
    trainer = ModelTrainer(store, task, test_set=(x, y))
    fixmatch_on = TrainingOptions.parse(0.0, "fixmatch", "small-cnn")
    with pytest.raises(TrainingError, match="takes none, fixmatch"):
        trainer.check(
            [job.id], "small-cnn", 2, TrainingOptions.parse(0.0, "self-training", "small-cnn")
        )
    trainer.check([job.id], "small-cnn", 2, fixmatch_on)
    model = store.create_model([job.id], "small-cnn", 2, 0, fixmatch_on.to_dict())
    assert (
        model.options["semi_supervised"] == "fixmatch"
        and store.create_model([job.id], "small-cnn", 1, 0).options == {}
    )
    trainer.submit(model.id)
    deadline = time.monotonic() + 300
    while (m := store.model(model.id)) is not None and m.state not in ("done", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert m is not None and m.state == "done", m.error if m else None
    assert m.options["semi_supervised"] == "fixmatch" and m.examples == 30
    assert m.metrics["unlabelled_examples"] == 170
    assert float(m.metrics["test_accuracy"]) > 0.8  # type: ignore[arg-type]
    _, card = store.model_file(model.id) or (b"", {})
    assert card["options"]["semi_supervised"] == "fixmatch"  # type: ignore[index]
    assert "FixMatch" in str(card["method"])
