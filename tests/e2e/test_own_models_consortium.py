"""A real consortium round answered by hospitals that bring their own models.

Three hospitals, one teacher each, as separate processes over mutual TLS:
hospital-0 votes with an ONNX file, hospital-1 with a TorchScript file,
hospital-2 with its own PyTorch factory and a state dict
(``tests.e2e.own_models:images_small_cnn@weights.pt``); each was converted
from the capc teacher :meth:`LocalConsortium.prepare` trained for it, and each
party checks its model against the task at start (``--task``). With the
guardian's test-only noise seed the student's labels must equal the plaintext
mechanism on the same models' votes with the replayed noise.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from capc.models import load_teacher
from capc.models.ensemble import Voters
from capc.models.foreign import Interface
from capc.privacy.randomness import SecureRandom
from services.local import TASK_NAME, LocalConsortium
from tests.e2e.jobs import assert_ledgers_agree
from tests.e2e.own_models import export_onnx, export_torchscript

PARTIES = 3
NOISE_SEED = "e2e-own-models"
#: What each hospital's --model is, by hospital index.
FORMATS = ("onnx", "torchscript", "module:tests.e2e.own_models:images_small_cnn")


@dataclass
class OwnModelConsortium(LocalConsortium):
    """A :class:`LocalConsortium` whose hospitals vote with their own models (FORMATS[i])
    and check them against the task file when they start."""

    @property
    def task_file(self) -> Path:
        return self.directory / f"{TASK_NAME}.json"

    def own_model(self, i: int) -> str:
        """Hospital ``i``'s ``--model``."""
        if i == 0:
            return str(self.directory / "hospital-0.onnx")
        if i == 1:
            return str(self.directory / "hospital-1.ts")
        return (
            f"tests.e2e.own_models:images_small_cnn@{self.directory / f'hospital-{i}-weights.pt'}"
        )

    def voters(self, i: int) -> Voters:
        """Hospital ``i``'s own model, loaded as its party loads it (for the task)."""
        t = self.task_config
        want = Interface(t.name, t.input_shape, t.outputs, t.multi_label)
        return Voters.load([self.own_model(i)], want, trust_code=True)

    def convert(self) -> None:
        """Each hospital's trained capc teacher in the format it brings; the task file."""
        shape = tuple(self.task["input_shape"])
        for i in range(self.parties):
            model = load_teacher(self.model_path(i)).model.eval()
            if i == 0:
                export_onnx(model, shape, Path(self.own_model(0)))
            elif i == 1:
                export_torchscript(model, shape, Path(self.own_model(1)))
            else:
                torch.save(model.state_dict(), self.directory / f"hospital-{i}-weights.pt")
        self.task_file.write_text(json.dumps(self.task))

    def model_args(self, i: int) -> list[str]:
        # TorchScript and module:factory are code: their hospitals say they trust it.
        trust = ["--trust-model-code"] if i > 0 else []
        return ["--model", self.own_model(i), "--task", str(self.task_file), *trust]


@pytest.fixture(scope="module")
def consortium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnModelConsortium]:
    # One epoch: the test checks that labels follow the votes, not how good they are.
    c = OwnModelConsortium(
        tmp_path_factory.mktemp("own-models"), parties=PARTIES, noise_seed=NOISE_SEED, epochs=1
    )
    try:
        c.prepare()
        c.convert()
        c.start()
        yield c
    finally:
        c.stop()


def test_own_models_vote_as_the_teachers_they_came_from(consortium: OwnModelConsortium) -> None:
    x = consortium.queries[:64]
    for i in range(PARTIES):
        voters = consortium.voters(i)
        assert voters.architecture == FORMATS[i]
        original = load_teacher(consortium.model_path(i)).predict(x)
        np.testing.assert_array_equal(voters.predict(x)[:, 0], original)


def test_a_round_answered_by_own_models_equals_the_plaintext_mechanism(
    consortium: OwnModelConsortium,
) -> None:
    student = consortium.student()
    queries = consortium.queries[:48]
    labels, rounds = student.label(queries, batch_size=48)
    student.close()
    assert len(rounds) == 1 and len(rounds[0].parties) == PARTIES
    voters = {f"hospital-{i}": consortium.voters(i) for i in range(PARTIES)}
    task = consortium.task_config
    votes = np.stack([voters[n].predict(queries)[:, 0] for n in rounds[0].parties], axis=1)
    noise = task.mechanism.draw_noise(len(queries), SecureRandom.from_seed(NOISE_SEED))
    spec = task.circuit_spec(PARTIES)
    expected, _ = task.mechanism.oracle(task.mechanism.summed_votes(votes), noise, spec.frac_bits)
    np.testing.assert_array_equal(labels, expected)
    # Each party said what it votes with, and charged itself what the guardian did.
    for i in range(PARTIES):
        proc = next(p for p in consortium.procs if p.name == f"hospital-{i}")
        assert proc.said(f"1 teacher: {FORMATS[i]}")
    assert_ledgers_agree(consortium)
