"""Driving the student party's jobs API as the gateway does, for the end-to-end tests."""

from __future__ import annotations

import numpy as np

from services.common import tls
from services.local import TASK_NAME, LocalConsortium
from services.proto.capc.v1 import common_pb2, student_pb2, student_pb2_grpc

HEADER = common_pb2.Header(protocol_version=2, task=TASK_NAME)


def jobs_stub(
    consortium: LocalConsortium, name: str = "gateway"
) -> student_pb2_grpc.StudentPartyStub:
    """The student party's jobs API, over mutual TLS with ``name``'s certificate."""
    channel = tls.secure_channel(
        f"127.0.0.1:{consortium.student_port}",
        tls.TLSFiles.in_dir(consortium.pki_dir, name),
        "localhost",
        role="student",
    )
    return student_pb2_grpc.StudentPartyStub(channel)


def tensor_batch(x: np.ndarray) -> common_pb2.QueryBatch:
    """(N, *shape) float queries as an uploaded tensor."""
    x = np.ascontiguousarray(x, dtype="<f4")
    return common_pb2.QueryBatch(
        tensor=common_pb2.Tensor(shape=list(x.shape), dtype="float32", data=x.tobytes())
    )


def run_job(
    jobs: student_pb2_grpc.StudentPartyStub,
    queries: common_pb2.QueryBatch,
    batch_size: int,
    timeout: float,
) -> tuple[student_pb2.JobResults, np.ndarray]:
    """Create a job, follow it until it ends (it must end done), and fetch its results.

    Returns the results and the (N,) labels, -1 where a query was not answered.
    """
    job = jobs.CreateJob(
        student_pb2.CreateJobRequest(header=HEADER, queries=queries, batch_size=batch_size),
        timeout=30,
    )
    watch = student_pb2.WatchJobRequest(header=HEADER, id=job.id)
    states = [j.state for j in jobs.WatchJob(watch, timeout=timeout)]
    assert states[-1] == "done", states
    results = jobs.GetResults(student_pb2.GetResultsRequest(header=HEADER, id=job.id), timeout=30)
    return results, np.frombuffer(results.labels.data, dtype="<i8")


def gdp_epsilon(mu: float, delta: float) -> float:
    """Epsilon of a mu-GDP mechanism at ``delta``, solved here from the closed form with
    scipy (independent of capc.privacy): delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    def excess(eps: float) -> float:
        return float(
            norm.cdf(mu / 2 - eps / mu) - np.exp(eps) * norm.cdf(-mu / 2 - eps / mu) - delta
        )

    hi = 1.0
    while excess(hi) > 0:
        hi *= 2
    return float(brentq(excess, 0.0, hi, xtol=1e-12, rtol=1e-13))


def assert_ledgers_agree(consortium: LocalConsortium, timeout: float = 60.0) -> None:
    """Once every round has settled on both sides, each hospital's own ledger and the
    guardian's hold the same spend for it, to 1e-9 (relative)."""
    import time

    from services.common.ledger import Ledger

    guardian = Ledger(consortium.db, delta=None, migrate=False)
    own = {
        f"hospital-{i}": Ledger(consortium.party_ledger(i), delta=None, migrate=False)
        for i in range(consortium.parties)
    }
    deadline = time.monotonic() + timeout
    while guardian.open_rounds() or any(o.open_rounds() for o in own.values()):
        assert time.monotonic() < deadline, {n: o.open_rounds() for n, o in own.items()}
        time.sleep(0.2)
    for name, party in own.items():
        np.testing.assert_allclose(
            party.spent_loss(name), guardian.spent_loss(name), rtol=1e-9, atol=0, err_msg=name
        )
    for ledger in (guardian, *own.values()):
        ledger.close()
