"""A hospital whose teachers are ONNX answers without torch: the torch-free answerer image
(deploy/Dockerfile's ``onnx`` stage) has none, so its import path must never need it.

Three hospitals, each voting with an ONNX file written here with the ``onnx`` package
(no torch anywhere in the making), run as separate processes whose ``PYTHONPATH`` puts
a ``torch`` package first that raises on import: any ``import torch`` on the
answerer's way (start, model load, a round) fails the party. With the guardian's
test-only noise seed the student's labels must equal the plaintext mechanism on the
ONNX models' votes with the replayed noise, so the parties really answered.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from capc.models.ensemble import Voters
from capc.models.foreign import Interface
from capc.privacy.randomness import SecureRandom
from services.local import LocalConsortium
from tests.e2e.jobs import assert_ledgers_agree
from tests.e2e.own_models import write_onnx

ROOT = Path(__file__).resolve().parents[2]
PARTIES = 3
NOISE_SEED = "e2e-onnx-without-torch"
#: What the stand-in ``torch`` package raises: a party that imports torch exits with it.
BLOCKED = "torch is unimportable here: the ONNX answerer must not import it"


def blocked_torch(directory: Path) -> Path:
    """A directory holding a ``torch`` package that raises ImportError when imported."""
    package = directory / "no-torch" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"raise ImportError({BLOCKED!r})\n")
    return package.parent


def without_torch(directory: Path) -> list[str]:
    """The command prefix that runs a process with torch unimportable."""
    path = os.pathsep.join([str(blocked_torch(directory)), str(ROOT), str(ROOT / "clients")])
    return ["env", f"PYTHONPATH={path}"]


@pytest.fixture(scope="module")
def consortium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalConsortium]:
    directory = tmp_path_factory.mktemp("onnx-without-torch")
    models = {i: directory / f"hospital-{i}.onnx" for i in range(PARTIES)}
    for i, path in models.items():
        write_onnx(path, seed=i)
    c = LocalConsortium(
        directory,
        parties=PARTIES,
        noise_seed=NOISE_SEED,
        own_models=models,
        teachers=[1] * PARTIES,
        party_prefix=without_torch(directory),
    )
    try:
        c.prepare()  # the models exist: it fits none
        c.start()
        yield c
    finally:
        c.stop()


def test_the_stand_in_really_makes_torch_unimportable(tmp_path: Path) -> None:
    """Without this the test below could pass with torch imported after all."""
    prefix = without_torch(tmp_path)
    done = subprocess.run(
        [*prefix, sys.executable, "-c", "import torch"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0 and BLOCKED in done.stderr, done.stderr
    # And the answerer's whole import path loads under it.
    done = subprocess.run(
        [
            *prefix,
            sys.executable,
            "-c",
            "import sys, services.commands.cli, services.answerer.main; "
            "assert 'torch' not in sys.modules, 'torch imported'",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_onnx_teachers_answer_a_round_with_torch_unimportable(
    consortium: LocalConsortium,
) -> None:
    student = consortium.student()
    queries = consortium.queries[:32]
    labels, rounds = student.label(queries, batch_size=32)
    student.close()
    assert len(rounds) == 1 and len(rounds[0].parties) == PARTIES
    task = consortium.task_config
    want = Interface(task.name, task.input_shape, task.outputs, task.multi_label)
    voters = {
        f"hospital-{i}": Voters.load([str(consortium.own_models[i])], want) for i in range(PARTIES)
    }
    votes = np.stack([voters[n].predict(queries)[:, 0] for n in rounds[0].parties], axis=1)
    noise = task.mechanism.draw_noise(len(queries), SecureRandom.from_seed(NOISE_SEED))
    spec = task.circuit_spec(PARTIES)
    expected, _ = task.mechanism.oracle(task.mechanism.summed_votes(votes), noise, spec.frac_bits)
    np.testing.assert_array_equal(labels, expected)
    for i in range(PARTIES):
        proc = next(p for p in consortium.procs if p.name == f"hospital-{i}")
        assert proc.said("1 teacher: onnx")
        # Still serving after the round, and nothing on its way tried torch.
        assert proc.popen.poll() is None and BLOCKED not in "".join(proc.lines)
    assert_ledgers_agree(consortium)
