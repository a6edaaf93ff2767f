"""Partitions and slow links between the guardian and hospitals (issue 34, item 6).

Two network namespaces hold the hospitals: "near" (3 hospitals, 100 Mbit/s)
and "far" (2 hospitals, 20 Mbit/s, 20 ms each way and 1 % loss through the
relay of services.testbed.proxy). The guardian listens on the lab's address
only. The far link is cut while the student labels: the far hospitals are
left out, every round still completes with the near ones, nothing is
charged to a hospital that did not vote and no round is left open; when the
link comes back the far hospitals reconnect and vote again. The ledger is
checked against an independent Gaussian-DP computation throughout.

Needs root and iproute2: skipped without them, but under CI=true it fails.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from capc.round.ledger import RoundState
from services.common.ledger import Ledger
from services.student.client import RoundResult
from services.testbed import netlab
from services.testbed.light import TASK, light_consortium, queries, wait_until
from services.testbed.proxy import LinkProxy
from tests.e2e.jobs import gdp_epsilon

pytestmark = pytest.mark.slow
BATCH = 16
SIGMA = 40.0  # the total stays a few epsilon, where the closed form is well conditioned


@pytest.fixture
def lab() -> netlab.NetLab:
    reason = netlab.unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the partition tests need network namespaces under CI=true: {reason}")
        pytest.skip(f"network namespaces unavailable: {reason}")
    return netlab.NetLab()


def check_ledger(ledger: Ledger, rounds: list[RoundResult], names: list[str]) -> None:
    """Every party is charged for exactly the rounds it voted in: an independent mu-GDP sum
    (each GNMax answer is a Gaussian mechanism of sensitivity sqrt(2), every query answered)."""
    wait_until(
        lambda: (
            ledger.count_rounds(RoundState.RESERVED) + ledger.count_rounds(RoundState.RELEASED) == 0
        ),
        30,
        "every round to be committed or aborted",
    )
    for name in names:
        answered = sum(len(r.labels) for r in rounds if name in r.parties)
        expected = gdp_epsilon(float(np.sqrt(2 * answered / SIGMA**2)), 1e-5) if answered else 0.0
        assert ledger.budget(name).spent == pytest.approx(expected, rel=1e-9, abs=1e-12), name


def test_a_partitioned_hospital_is_left_out_and_comes_back(
    lab: netlab.NetLab, tmp_path: Path
) -> None:
    task = dict(TASK, quorum=3, mechanism={"name": "gnmax", "sigma": SIGMA})
    with lab, light_consortium(tmp_path, parties=5, task=task) as c:
        near, far = lab.add(), lab.add()
        lab.shape(near, "100mbit")
        lab.shape(far, "20mbit")
        c.listen_host = near.host_addr
        c.start_guardian("--share-timeout", "3", "--round-timeout", "60")
        relay = LinkProxy((far.host_addr, 0), (near.host_addr, c.port), delay=0.02, loss=0.01)
        with relay:
            close, remote = c.names[:3], c.names[3:]
            c.wait_connected(c.start_parties(close, prefix=lab.prefix(near)), 3)
            c.wait_connected(
                c.start_parties(remote, target=relay.address, prefix=lab.prefix(far)), 2
            )
            ledger = c.ledger()
            student = c.student()
            rounds = [student.label_batch(queries(BATCH, seed=0))]
            assert sorted(rounds[0].parties) == c.names
            assert relay.bytes_total > 0  # the far hospitals' traffic took the slow path

            lab.partition(far)
            # Every round completes with the near hospitals alone; the first ones wait
            # the share timeout, then the silent far hospitals are not asked at all.
            cut_at = time.monotonic()
            while True:
                result = student.label_batch(queries(BATCH, seed=len(rounds)))
                assert sorted(result.parties) == close, result.parties
                rounds.append(result)
                if set(c.connected()) == set(close) and result.open_s < 2.0:
                    break
                assert time.monotonic() - cut_at < 120, "the far hospitals were never dropped"
                if result.open_s < 2.0:
                    # The far hospitals are no longer asked; their streams end when the
                    # transport notices (keepalive). A round a second meanwhile, not
                    # hundreds: the cores go to the other tests.
                    time.sleep(1.0)
            check_ledger(ledger, rounds, c.names)

            lab.heal(far)
            wait_until(lambda: set(c.connected()) == set(c.names), 150, "the far hospitals")
            rounds.append(student.label_batch(queries(BATCH, seed=len(rounds))))
            assert sorted(rounds[-1].parties) == c.names
            student.close()
            check_ledger(ledger, rounds, c.names)
            assert ledger.verify_audit() > 0
