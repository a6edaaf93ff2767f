"""A current-statistics model with a stored reference batch predicts each record on its own."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from capc.learning.last_layer import fit_batch_standardised
from capc.models import build
from capc.models.inference import features, logits, reference_statistics


def _images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Bright-left, bright-right and bright-top 12x12 images, labels 0-2."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = rng.random((n, 1, 12, 12)).astype(np.float32) * 0.4
    x[y == 0, :, :, :6] += 0.6
    x[y == 1, :, :, 6:] += 0.6
    x[y == 2, :, :6, :] += 0.6
    return x, y


def _student() -> tuple[torch.nn.Module, np.ndarray, np.ndarray, np.ndarray]:
    torch.manual_seed(0)
    model = build("resnet10", (1, 12, 12), 3, width=4, seed=0)
    x, y = _images(300, 0)
    f = features(model, x, current_statistics=True, batch=100)
    model.head = fit_batch_standardised(f, y, 3)  # type: ignore[assignment]
    test_x, test_y = _images(256, 1)
    reference, _ = _images(64, 2)
    return model, reference, test_x, test_y


def test_stored_reference_statistics_are_the_reference_batchs_current_statistics() -> None:
    model, reference, _, _ = _student()
    current = logits(model, reference, current_statistics=True, batch=len(reference))
    reference_statistics(model, reference)
    stored = logits(model, reference)
    assert torch.allclose(stored, current, atol=1e-4)
    assert not model.training


def test_one_record_is_predicted_alike_in_any_request() -> None:
    model, reference, test_x, test_y = _student()
    reference_statistics(model, reference)
    batched = logits(model, test_x, batch=256)
    alone = torch.cat([logits(model, test_x[i : i + 1]) for i in range(len(test_x))])
    assert torch.equal(batched.argmax(1), alone.argmax(1))
    assert torch.allclose(batched, alone, atol=1e-5)
    # The same record among other records: the first 10 of a request, or in a shuffled one.
    order = np.random.default_rng(3).permutation(len(test_x))
    shuffled = logits(model, test_x[order], batch=256)
    assert torch.allclose(shuffled[np.argsort(order)], batched, atol=1e-5)
    acc_1 = float((alone.argmax(1).numpy() == test_y).mean())
    acc_256 = float((batched.argmax(1).numpy() == test_y).mean())
    assert acc_1 == acc_256 > 0.6


def test_without_a_reference_a_batch_of_one_is_not_safe() -> None:
    # What the stored statistics fix: under current statistics a record's prediction
    # moves with the rest of its request, and a batch of one reads other statistics.
    model, _, test_x, _ = _student()
    alone = torch.cat(
        [logits(model, test_x[i : i + 1], current_statistics=True) for i in range(32)]
    )
    batched = logits(model, test_x[:32], current_statistics=True, batch=32)
    assert not torch.allclose(alone, batched, atol=1e-2)
    first = logits(model, test_x[:32], current_statistics=True, batch=32)[0]
    other = logits(model, test_x[[0, *range(32, 63)]], current_statistics=True, batch=32)[0]
    assert not torch.allclose(first, other, atol=1e-3)


def test_a_reference_batch_must_be_a_batch_of_finite_records() -> None:
    model, reference, _, _ = _student()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="at least 2 records"):
        reference_statistics(model, reference[:1])
    bad = reference.copy()
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        reference_statistics(model, bad)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
