"""Multi-label rounds and personalized budgets through the secure path, end to end.

Four hospitals (separate processes, mutual TLS) hold multi-label teachers
trained on disjoint parts of animal-attributes (five attributes per animal);
two of them vote with ensembles of two teachers (each on its own half of the
hospital's data), so every mechanism below also sums ensembles' votes.
Their caps differ: two hospitals accept four times the epsilon of the other
two. One student labels held-out images under five tasks in turn: Binary
voting with a per-label confidence test, tau voting, confident Powerset
voting, and Binary voting with personalized weighting and with vanishing.

The guardian's noise is seeded (a test-only flag), so the test replays every
draw in order and checks each label vector against the mechanism object's plaintext
mechanism on the same teachers, and checks every party's ledger charge
against the mechanism's proven sensitivity (scaled by its weight, or only
for the queries it voted on).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from capc.mechanisms.argmax import noisy_argmax
from capc.mechanisms.base import NOT_ANSWERED, gaussian_noise
from capc.mechanisms.powerset import subset_bits
from capc.models.ensemble import Voters
from capc.mpc.mechanism_circuits import round_noise
from capc.privacy.randomness import SecureRandom
from capc.round.ledger import RoundState
from capc.task_config import TaskConfig, config_hash
from services.common import tls
from services.common.ledger import Ledger
from services.common.protocol import header
from services.local import LocalConsortium
from services.proto.capc.v1 import guardian_pb2, guardian_pb2_grpc
from services.student.client import StudentClient
from tests.e2e.jobs import assert_ledgers_agree

PARTIES = 4
#: Teachers per hospital: hospitals 1 and 2 vote with ensembles.
TEACHERS = [1, 2, 2, 1]
NOISE_SEED = "e2e-multilabel"
CAPS = [20000.0, 20000.0, 80000.0, 80000.0]
K = 5
BATCH = 64


def task(
    mechanism: dict[str, Any], personalization: dict[str, Any] | None = None
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "num_labels": K,
        "input_shape": [1, 28, 28],
        "mechanism": mechanism,
        "quorum": 3,
    }
    if personalization:
        config["personalization"] = personalization
    return config


TASKS = {
    "attr-binary": task({"name": "binary", "sigma": 0.7, "threshold": 1.0, "sigma1": 0.8}),
    "attr-tau": task({"name": "tau", "sigma": 0.6, "tau": 1.5}),
    "attr-powerset": task({"name": "powerset", "sigma": 0.8, "threshold": 2.0, "sigma1": 1.0}),
    "attr-weighted": task(
        {"name": "binary", "sigma": 0.7},
        {"mode": "weighting", "planned_queries": 500, "max_weight": 4.0},
    ),
    "attr-vanishing": task(
        {"name": "binary", "sigma": 0.7}, {"mode": "vanishing", "planned_queries": 500}
    ),
}


@pytest.fixture(scope="module")
def consortium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalConsortium]:
    c = LocalConsortium(
        tmp_path_factory.mktemp("multilabel"),
        parties=PARTIES,
        dataset="animal-attributes",
        task=TASKS["attr-binary"],
        epsilon_caps=CAPS,
        noise_seed=NOISE_SEED,
        epochs=4,
        teachers=TEACHERS,
    )
    c.prepare()
    ledger = Ledger(c.db)
    for name, config in TASKS.items():
        ledger.create_task(name, config)
    ledger.close()
    c.start()
    try:
        yield c
    finally:
        c.stop()


def student_for(c: LocalConsortium, name: str) -> StudentClient:
    config = TASKS[name]
    return StudentClient(
        f"127.0.0.1:{c.port}",
        tls.TLSFiles.in_dir(c.pki_dir, "student"),
        TaskConfig.parse(name, config, config_hash(config)),
        server_name="localhost",
    )


@dataclass
class Replay:
    """The guardian's draws, in order, and the plaintext mechanisms on the same teachers."""

    teachers: list[Voters]
    rng: SecureRandom

    def votes(self, x: np.ndarray) -> np.ndarray:
        """(B, teachers, k) 0/1 predictions of every hospital's teachers, in party order."""
        return np.concatenate([t.predict(x) for t in self.teachers], axis=1).astype(np.float64)


def spent_loss(ledger: Ledger) -> dict[str, np.ndarray]:
    return {f"hospital-{i}": ledger.spent_loss(f"hospital-{i}") for i in range(PARTIES)}


def wait_committed(ledger: Ledger, rounds: int) -> None:
    deadline = time.monotonic() + 30
    while ledger.count_rounds(RoundState.COMMITTED) < rounds and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ledger.count_rounds(RoundState.COMMITTED) == rounds


def test_every_mechanism_matches_plaintext_and_charges_its_sensitivity(
    consortium: LocalConsortium,
) -> None:
    replay = Replay(
        [Voters.load(consortium.model_paths(i)) for i in range(PARTIES)],
        SecureRandom.from_seed(NOISE_SEED),
    )
    assert all(t.multi_label and t.num_classes == K for t in replay.teachers)
    assert [len(t) for t in replay.teachers] == TEACHERS
    # The hospital each teacher belongs to: its weight and its participation are the party's.
    owner = np.repeat(np.arange(PARTIES), TEACHERS)
    ledger = Ledger(consortium.db)
    acct = ledger.accounting
    names = [f"hospital-{i}" for i in range(PARTIES)]
    queries, truth = consortium.queries, consortium.truth
    quality = {}
    for n, name in enumerate(TASKS):
        cfg = TaskConfig.parse(name, TASKS[name], config_hash(TASKS[name]))
        x = queries[n * BATCH : (n + 1) * BATCH]
        before = spent_loss(ledger)
        student = student_for(consortium, name)
        result = student.label_batch(x)
        student.close()
        wait_committed(ledger, n + 1)
        assert result.parties == tuple(names)
        assert result.labels.shape == (BATCH, K)
        votes = replay.votes(x)
        mech = cfg.mechanism
        p = mech.params.model_dump()
        weights = np.ones(PARTIES)
        voting = np.ones((BATCH, PARTIES), dtype=bool)
        if cfg.personalization is not None:
            # Each party's share of the plan from its cap, by the ledger's own accountant.
            mult = cfg.personalization.multipliers(CAPS, mech, acct, ledger.delta)
        if cfg.vanishing:
            rates = mult / mult.max()
            voting = replay.rng.uniform((BATCH, PARTIES)) < rates
            assert 0.1 < rates[0] < 0.5 and rates[2] == 1.0
        if cfg.weighting:
            root = np.sqrt(mult)
            weights = np.floor(np.minimum(root / root.mean(), 4.0) * 256) / 256
            assert weights[0] < 1.0 < weights[2]
        if mech.name == "powerset":
            hist = mech.summed_votes(votes)
            eta2 = gaussian_noise(hist.shape, p["sigma"], replay.rng)
            # Independent test noise on every subset count (offset-robust).
            eta1 = gaussian_noise(hist.shape, p["sigma1"], replay.rng)
            answered = (hist + round_noise(eta1)).max(axis=1) >= p["threshold"]
            chosen_labels = np.where(answered, noisy_argmax(hist, round_noise(eta2)), NOT_ANSWERED)
            expected = np.where(
                (chosen_labels == NOT_ANSWERED)[:, None],
                NOT_ANSWERED,
                subset_bits(np.maximum(chosen_labels, 0), K),
            )
        else:
            frac = 8 if mech.name == "tau" or cfg.weighting else 4
            if mech.name == "tau":
                # The parties' fixed point rounds each clipped vote down to the 2**-8 grid.
                clipped = np.stack([mech.unit_votes(votes[:, t]) for t in range(votes.shape[1])], 1)
                votes = np.floor(clipped * 256) / 256
            w, v = weights[owner], voting[:, owner]
            scaled = votes * (w[None, :, None] * v[:, :, None])
            counts = scaled.sum(axis=1)
            theta = (v * w).sum(axis=1) / 2.0
            noise = round_noise(gaussian_noise(counts.shape, p["sigma"], replay.rng), frac)
            if mech.confident:
                conf = round_noise(gaussian_noise(counts.shape, p["sigma1"], replay.rng), frac)
                expected, _ = mech.decide(counts, {"noise": noise, "confidence": conf}, theta)
            else:
                expected = (counts + noise >= theta[:, None]).astype(np.int8)
            answered = expected != NOT_ANSWERED
        np.testing.assert_array_equal(result.labels, expected, err_msg=name)
        got = result.labels
        released = got != NOT_ANSWERED
        quality[name] = (
            float(released.mean()),
            float((got[released] == truth[n * BATCH : (n + 1) * BATCH][released]).mean()),
        )
        after = spent_loss(ledger)
        for i, party in enumerate(names):
            owed = acct.cost(mech.event(answered[voting[:, i]], weights[i]))
            np.testing.assert_allclose(
                after[party] - before[party], owed, rtol=1e-9, atol=1e-12, err_msg=f"{name} {party}"
            )
        if cfg.vanishing:
            # A hospital that sat most queries out paid for fewer than a hospital that voted on all.
            assert (
                after["hospital-0"] - before["hospital-0"]
                < after["hospital-2"] - before["hospital-2"]
            ).all()
    print(quality)
    for name, (released, accuracy) in quality.items():
        assert released > 0.3, (name, released)
        assert accuracy > 0.75, (name, accuracy)
    assert ledger.verify_audit() > 0
    # Weighted and vanishing rounds too: each hospital charged itself at its own weight,
    # for the queries it voted on, exactly as the guardian did.
    assert_ledgers_agree(consortium)


def test_admin_view_shows_caps_spend_weights_and_projected_exhaustion(
    consortium: LocalConsortium,
) -> None:
    hub = guardian_pb2_grpc.GuardianHubStub(
        tls.secure_channel(
            f"127.0.0.1:{consortium.port}",
            tls.TLSFiles.in_dir(consortium.pki_dir, "gateway"),
            "localhost",
            role="guardian",
        )
    )
    weighted = TASKS["attr-weighted"]
    reply = hub.ListParties(
        guardian_pb2.ListPartiesRequest(header=header("attr-weighted", config_hash(weighted))),
        timeout=30,
    )
    parties = {p.name: p for p in reply.parties if p.role == "answerer"}
    assert [parties[f"hospital-{i}"].epsilon_cap for i in range(PARTIES)] == CAPS
    assert all(p.connected for p in parties.values())
    low, high = parties["hospital-0"], parties["hospital-2"]
    assert low.vote_weight < 1.0 < high.vote_weight and low.participation == 1.0
    assert low.queries_left > 0 and high.queries_left > 0
    # The projection is the worst case at the party's own weight: it matches the ledger.
    cfg = TaskConfig.parse("attr-weighted", weighted, config_hash(weighted))
    ledger = Ledger(consortium.db)
    per_query = cfg.mechanism.worst_case(1, low.vote_weight)
    assert low.queries_left == ledger.queries_fit(per_query, low.epsilon_cap, "hospital-0")
    assert low.epsilon_spent > 0
    vanishing = hub.ListParties(
        guardian_pb2.ListPartiesRequest(header=header("attr-vanishing", "")), timeout=30
    )
    rates = {p.name: p.participation for p in vanishing.parties}
    assert rates["hospital-0"] < 1.0 == rates["hospital-2"]
    # No task named: no projection.
    plain = hub.ListParties(guardian_pb2.ListPartiesRequest(header=header("", "")), timeout=30)
    assert all(p.queries_left == -1 for p in plain.parties)
