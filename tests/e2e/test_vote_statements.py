"""Issue 41, item 1: every mode carries a vote statement.

Tau voting: a deviating hospital votes +a on one label and -a on every other,
inside the circuit's range window. Before tau carried a proof statement that
vote counted, and with two honest hospitals against it decided every label
(the target 1, the rest 0; on the old code this test fails there). Now its
vote fails the proof and is left out, and the labels are exactly those of the
plaintext mechanism on the honest votes with the guardian's (seeded) noise.
Its strongest *valid* vote counts as one teacher's vote, no more.

Real processes: the guardian and two honest hospitals (``capc answerer``) over
mutual TLS; the deviating hospital an in-test party speaking the same gRPC
protocol with its own certificate; the student a real client.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from capc.he.plan import compile_model
from capc.mechanisms.base import gaussian_noise
from capc.models import Teacher
from capc.models.checkpoint import load_teacher
from capc.mpc.mechanism_circuits import round_noise
from capc.privacy.randomness import SecureRandom
from services.answerer.budget import OwnBudget
from services.answerer.encrypted import Answer, EncryptedAnswerer
from services.answerer.party import AnsweringParty
from services.common import tls
from services.common.ledger import Ledger
from services.testbed.light import light_consortium, queries
from tests.e2e.light import DeviatingParty, label_skew, strongest_valid

LABELS = 5
SIGMA = 1.0
NOISE_SEED = "issue-41-tau"
#: tau above sqrt(5): no honest vote is clipped, each honest teacher votes 0 or 1 a label.
TAU = {
    "num_labels": LABELS,
    "input_shape": [4],
    "mechanism": {"name": "tau", "sigma": SIGMA, "tau": 2.5},
    "quorum": 2,
}
GRID = 256  # tau's vote grid: 2^8 a vote


def expected(counts: np.ndarray, voters: int, rng: SecureRandom) -> np.ndarray:
    """The plaintext mechanism: counts (B, k) in votes + the guardian's next noise draw,
    on the circuit's 8-bit grid, against half the voters' weight."""
    noise = round_noise(gaussian_noise(counts.shape, SIGMA, rng), 8)
    return (counts + noise >= voters / 2.0).astype(np.int64)


def test_a_tau_vote_that_skews_every_label_moves_none(tmp_path: Path) -> None:
    # Small noise is expensive: the caps are the test's, not a deployment's.
    with light_consortium(tmp_path, parties=3, task=TAU, cap=1e4) as c:
        c.start_guardian("--share-timeout", "20", "--noise-seed", NOISE_SEED, "--insecure-dev")
        honest, mallory_name = c.names[:2], c.names[2]
        c.wait_connected(c.start_parties(honest), 2)
        rng = SecureRandom.from_seed(NOISE_SEED)
        x = queries(32)
        votes = load_teacher(c.model).predict(x)  # (B, k) 0/1: both honest hospitals vote it
        target = int(np.argmin(votes.sum(axis=0)))
        # 5 votes: inside the range window (9 sigma past [0, W]) for every count the
        # honest hospitals can have (0 to 2) by 4 sigma, and past the threshold (1.5
        # with it) by 3.5 sigma: counted, it would decide nearly every label.
        mallory = DeviatingParty(c, mallory_name, label_skew(target, 5 * GRID))
        student = c.student()
        try:
            result = student.label_batch(x)
        finally:
            student.close()
        mallory.leave()
        assert mallory.rounds == [result.round_id]
        want = expected(2.0 * votes, 2, rng)
        np.testing.assert_array_equal(result.labels, want)
        assert set(result.invalid) == {mallory_name}, result.invalid
        assert "validity proof" in result.invalid[mallory_name]
        assert sorted(result.parties) == honest
        # Had the vote counted, the target label would be 1 and every other 0 on every
        # query: the honest labels differ from that, so the comparison above sees it.
        skewed = np.zeros_like(want)
        skewed[:, target] = 1
        assert (want != skewed).any(axis=1).mean() > 0.5
        # A failed check is a dispute between the querier and the party, never the
        # party's fault alone (docs/security.md).
        flagged = [e for e in c.ledger().audit_entries(200) if e.action == "dispute"]
        assert [(e.detail["querier"], e.detail["party"]) for e in flagged] == [
            ("student", mallory_name)
        ]

        # Its strongest valid vote (its one teacher's full vote on the target) counts,
        # as one more teacher's vote: no more.
        mallory = DeviatingParty(c, mallory_name, strongest_valid(target))
        student = c.student()
        try:
            valid = student.label_batch(x)
        finally:
            student.close()
        mallory.leave()
        assert not valid.invalid and sorted(valid.parties) == sorted(c.names)
        counts = 2.0 * votes
        counts[:, target] += 1.0
        np.testing.assert_array_equal(valid.labels, expected(counts, 3, rng))


# -- encrypted-query mode -------------------------------------------------------------
K = 3
ENCRYPTED_SEED = "issue-41-encrypted"
ENCRYPTED = {
    "num_classes": K,
    "input_shape": [4],
    "mechanism": {"name": "gnmax", "sigma": SIGMA},
    "quorum": 2,
    "encryption": {"architecture": "he-mlp", "width": 8, "params": {}},
}


class SkewingAnswerer(EncryptedAnswerer):
    """A hospital that evaluates and runs its 2PC honestly, then adds ``offset`` (K,) to the
    share it sends the guardian: its vote, as the shares sum it, is the honest one-hot plus
    the offset (the sum of the offset's entries is 0, so the vote still totals 1)."""

    def __init__(self, name: str, teacher: Teacher, offset: np.ndarray) -> None:
        super().__init__(name, teacher)
        self.offset = offset.astype(np.uint64)  # two's complement: -a is 2^64 - a

    def answer(self, *args: Any, **kwargs: Any) -> Answer:
        honest = super().answer(*args, **kwargs)
        return Answer(honest.share + self.offset[None, :], honest.ciphertext_hash)


@pytest.mark.slow
def test_an_encrypted_vote_that_skews_one_class_moves_no_label(tmp_path: Path) -> None:
    with light_consortium(tmp_path, parties=3, task=ENCRYPTED, cap=1e4) as c:
        c.start_guardian("--share-timeout", "120", "--noise-seed", ENCRYPTED_SEED, "--insecure-dev")
        honest, mallory_name = c.names[:2], c.names[2]
        c.wait_connected(c.start_parties(honest), 2)
        teacher = load_teacher(c.model)
        x = queries(16).astype(np.float64)
        logits = compile_model(teacher.model.cpu().eval(), (4,)).forward(x)
        votes = logits.argmax(axis=1)  # every hospital's teacher is this one
        target = int(np.argmin(np.bincount(votes, minlength=K)))
        # +2a on the target, -a on the others (a = 2 votes), inside the range window (9 sigma
        # past [0, W]) for every count three voters can make: counted as a sum it takes
        # the target nearly everywhere. Even offsets leave its lowest bits its honest vote.
        offset = np.full(K, -2, dtype=np.int64)
        offset[target] = 2 * (K - 1)
        ledger = Ledger(str(tmp_path / "mallory-ledger.db"))
        mallory = AnsweringParty(
            mallory_name,
            teacher,
            c.address,
            tls.TLSFiles.in_dir(c.pki_dir, mallory_name),
            OwnBudget(mallory_name, ledger, c.cap),
            "localhost",
        )
        mallory._encrypted = SkewingAnswerer(mallory_name, teacher, offset)
        stop = threading.Event()
        thread = threading.Thread(target=mallory.run, args=(stop,), daemon=True)
        thread.start()
        try:
            assert mallory.connected.wait(60)
            student = c.student(timeout=180)
            try:
                result = student.label_encrypted(x)
            finally:
                student.close()
        finally:
            stop.set()
        assert sorted(result.parties) == sorted(c.names)
        # The plaintext mechanism on the three teachers' votes with the guardian's noise:
        # where no teacher's top two logits are close (CKKS errors are ~1e-3).
        top = np.sort(logits, axis=1)
        clear = top[:, -1] - top[:, -2] > 1e-2
        assert clear.mean() > 0.8
        cfg = c.task_config
        spec = cfg.circuit_spec(3)
        noise = cfg.mechanism.draw_noise(len(x), SecureRandom.from_seed(ENCRYPTED_SEED))
        hist = 3.0 * np.eye(K)[votes]
        want = cfg.mechanism.oracle(hist, noise, spec.frac_bits)[0]
        np.testing.assert_array_equal(result.labels[clear], want[clear])
        # Counted as a sum, the skewed vote would have decided nearly every label.
        skewed = np.argmax(hist + offset + round_noise(noise["eta2"], spec.frac_bits), axis=1)
        assert (skewed == target).mean() > 0.8 and (want == target).mean() < 0.5
        assert not [e for e in c.ledger().audit_entries(200) if e.action == "histogram_violation"]
