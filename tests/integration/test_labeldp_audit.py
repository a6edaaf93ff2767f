"""The canary audit on the real label-DP mechanisms, and on deliberately broken ones.

Real ALIBI, randomized response and PATE-FM: the empirical lower bound (of
the model attack and of the attack on the mechanism's own release) never
exceeds the provable epsilon. Broken: ALIBI with its noise switched off, and
ALIBI whose noise is that of eps 10 but which is charged eps 1 (a tenth),
and the old ALIBI that added floating-point Laplace noise (its porous
support gives the label away): the audit refutes all three claims. The victim trains without augmentation or
weight decay, so a leak the mechanism lets through reaches the model.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from capc.labeldp import alibi, pipeline
from capc.labeldp.pipeline import CanarySplit, DataConfig, PateFmSettings, PublicBodyConfig
from capc.labeldp.training import TrainConfig
from capc.learning.fixmatch import FixMatchConfig
from capc.models.registry import Classifier
from capc.onehot import one_hot
from capc.privacy.randomness import SecureRandom

MEMORISING = TrainConfig(epochs=40, batch=64, lr=0.05, weight_decay=0.0, augment=False)


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CanarySplit, Classifier]]:
    split = pipeline.load(DataConfig("digits", canaries=100, seed=0))
    body = pipeline.public_body(
        split, PublicBodyConfig(steps=100), tmp_path_factory.mktemp("bodies")
    )
    yield split, body


def lower_bounds(row: dict[str, Any]) -> list[float]:
    return [
        row["audit"]["lower"],
        *([row["release_audit"]["lower"]] if "release_audit" in row else []),
        *([row["support_audit"]["lower"]] if "support_audit" in row else []),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_real_alibi_and_rr_are_never_refuted(
    digits: tuple[CanarySplit, Classifier], epsilon: float
) -> None:
    split, body = digits
    for run in (pipeline.run_alibi, pipeline.run_rr):
        row = run(split, body, epsilon, MEMORISING, SecureRandom.from_seed(f"real-{epsilon}"))
        assert not row["flagged"] and max(lower_bounds(row)) <= epsilon, row


@pytest.mark.slow
def test_real_pate_fm_is_never_refuted(digits: tuple[CanarySplit, Classifier]) -> None:
    split, body = digits
    quick = FixMatchConfig(steps=60, unlabelled_ratio=4)
    settings = PateFmSettings(teachers=20, teacher=quick, student=quick)
    row = pipeline.run_pate_fm(
        split, pipeline.pool_features(split, body), 4.0, settings, SecureRandom.from_seed("p")
    )
    assert not row["flagged"] and row["audit"]["lower"] <= row["epsilon"] <= 4.0, row


@pytest.mark.slow
def test_alibi_with_its_noise_switched_off_is_refuted(
    digits: tuple[CanarySplit, Classifier],
) -> None:
    split, body = digits
    clean = one_hot(split.y[split.train], split.classes)
    row = pipeline.run_alibi(
        split, body, 1.0, MEMORISING, SecureRandom.from_seed(0), released=clean, train_scale=1e-3
    )
    assert row["flagged"]
    assert row["audit"]["lower"] > 1.0 and row["release_audit"]["lower"] > 1.0, row


@pytest.mark.slow
def test_alibi_charged_at_a_tenth_of_its_cost_is_refuted(
    digits: tuple[CanarySplit, Classifier],
) -> None:
    split, body = digits
    noisy = alibi.noisy_labels(split.y[split.train], split.classes, 10.0, SecureRandom.from_seed(1))
    row = pipeline.run_alibi(
        split,
        body,
        1.0,
        MEMORISING,
        SecureRandom.from_seed(0),
        released=noisy,
        train_scale=alibi.laplace_scale(10.0),
    )
    assert row["flagged"] and row["epsilon"] == 1.0
    assert row["audit"]["lower"] > 1.0 and row["release_audit"]["lower"] > 1.0, row


@pytest.mark.slow
def test_alibi_with_floating_point_noise_is_refuted(digits: tuple[CanarySplit, Classifier]) -> None:
    """The release ALIBI made before it moved to the grid: one-hot plus float Laplace at the
    right scale. Only the support attack sees it; it needs no model."""
    split, body = digits
    clean = one_hot(split.y[split.train], split.classes)
    old = clean + SecureRandom.from_seed(2).laplace(clean.shape, 2.0)
    row = pipeline.run_alibi(split, body, 1.0, MEMORISING, SecureRandom.from_seed(0), released=old)
    support = row["support_audit"]
    assert row["flagged"] and support["correct"] == support["guesses"] > 0
    assert support["refuting_lower"] > 1.0, row
