"""A pretraining paused at its deadline and resumed computes what an uninterrupted one does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from capc.learning import diet, simclr
from capc.learning.diet import BodyConfig, pretrained_body, synthetic_pool
from capc.learning.simclr import PretrainConfig, PretrainingPausedError, pretrain
from capc.models import build
from capc.models.checkpoint import weights_sha256


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_paused_pretraining_resumes_bit_for_bit(
    tmp_path: Path, precision: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = np.random.default_rng(0).random((64, 1, 12, 12)).astype(np.float32)
    config = PretrainConfig(steps=5, batch=16, seed=3, precision=precision)
    whole = build("resnet10", (1, 12, 12), 3, width=4, seed=0)
    losses = pretrain(whole, pool, config)

    # Saves between pauses too: every second step.
    monkeypatch.setattr(simclr, "SAVE_EVERY", 2)
    state = tmp_path / "state.pt"
    pauses = []
    while True:
        # A fresh process each time: new model object, state read from the file.
        model = build("resnet10", (1, 12, 12), 3, width=4, seed=0)
        try:
            resumed = pretrain(model, pool, config, state=state, deadline=0.0)
            break
        except PretrainingPausedError as paused:
            pauses.append(paused.step)
            assert state.exists() and "run the same command again" in str(paused)
    # A deadline already passed still lets every call make one step.
    assert pauses == [1, 2, 3, 4]
    assert resumed == losses
    assert weights_sha256(model.features) == weights_sha256(whole.features)


def test_a_state_of_another_pretraining_is_refused(tmp_path: Path) -> None:
    pool = np.random.default_rng(0).random((64, 1, 12, 12)).astype(np.float32)
    state = tmp_path / "state.pt"
    model = build("resnet10", (1, 12, 12), 3, width=4, seed=0)
    with pytest.raises(PretrainingPausedError):
        pretrain(model, pool, PretrainConfig(steps=3, batch=16), state=state, deadline=0.0)
    with pytest.raises(ValueError, match="belongs to another pretraining"):
        pretrain(model, pool, PretrainConfig(steps=4, batch=16), state=state)
    with pytest.raises(ValueError, match="needs a state file"):
        pretrain(model, pool, PretrainConfig(steps=4, batch=16), deadline=0.0)


def test_a_cached_body_pauses_and_resumes_to_the_uninterrupted_body(tmp_path: Path) -> None:
    config = BodyConfig(
        width=4, input_shape=(1, 12, 12), pool=64, pretrain=PretrainConfig(steps=3, batch=16)
    )
    whole = pretrained_body(config, None, 3, lambda s: None, "cpu")
    for _ in range(2):
        with pytest.raises(PretrainingPausedError):
            pretrained_body(config, tmp_path, 3, lambda s: None, "cpu", deadline=0.0)
    body = pretrained_body(config, tmp_path, 3, lambda s: None, "cpu", deadline=0.0)
    assert weights_sha256(body.features) == weights_sha256(whole.features)
    # Done: the body is cached and its state is gone.
    assert not list(tmp_path.glob("*.state.pt"))
    again = pretrained_body(config, tmp_path, 3, lambda s: None, "cpu")
    assert torch.equal(
        next(iter(again.features.state_dict().values())),
        next(iter(whole.features.state_dict().values())),
    )


def test_the_pool_is_generated_in_chunks_with_the_same_images(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = BodyConfig(input_shape=(1, 12, 12), pool=50)
    whole = synthetic_pool(config)
    monkeypatch.setattr(diet, "POOL_CHUNK", 7)
    assert whole.shape == (50, 1, 12, 12)
    np.testing.assert_array_equal(synthetic_pool(config), whole)
