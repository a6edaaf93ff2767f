"""The student's job store on SQLite and PostgreSQL."""

from __future__ import annotations

import numpy as np

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
