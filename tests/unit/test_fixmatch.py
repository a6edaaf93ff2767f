"""FixMatch and its augmentations: shapes, ranges, seeds, the loss's masking, heads that learn."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from capc.learning import fixmatch, randaugment
from capc.learning.fixmatch import FixMatchConfig, ViewBank
from capc.learning.randaugment import StrongAugmentation, WeakAugmentation
from capc.models.ensemble import head_predictions


def images(b: int = 16, c: int = 1, side: int = 12) -> torch.Tensor:
    return torch.rand((b, c, side, side), generator=torch.Generator().manual_seed(3))


def test_views_keep_shape_and_range_and_repeat_with_their_seed() -> None:
    x = images()
    for view in (randaugment.weak, randaugment.strong):
        a = view(x, torch.Generator().manual_seed(1))
        b = view(x, torch.Generator().manual_seed(1))
        c = view(x, torch.Generator().manual_seed(2))
        assert a.shape == x.shape and float(a.min()) >= 0.0 and float(a.max()) <= 1.0
        assert torch.equal(a, b) and not torch.equal(a, c)


def test_every_randaugment_operation_runs_and_changes_some_image() -> None:
    x = images(8)
    m = torch.full((8,), 0.9)
    gen = torch.Generator().manual_seed(0)
    for name, op in randaugment.COLOUR.items():
        y = op(x, m, gen)
        assert y.shape == x.shape and torch.isfinite(y).all()
        assert name == "identity" or not torch.allclose(y, x), name
    for name, make in randaugment.GEOMETRIC.items():
        theta = make(m, gen)
        assert theta.shape == (8, 2, 3)
        assert not torch.allclose(theta, torch.eye(2, 3).expand(8, 2, 3)), name


def test_weak_shift_moves_a_dot_by_at_most_the_shift() -> None:
    x = torch.zeros((64, 1, 16, 16))
    x[:, 0, 8, 8] = 1.0
    y = randaugment.weak(x, torch.Generator().manual_seed(0), WeakAugmentation(shift=0.125))
    peak = y.flatten(1).argmax(1)
    rows, cols = peak // 16, peak % 16
    assert (rows - 8).abs().max() <= 2 and (cols - 8).abs().max() <= 2
    assert ((rows != 8) | (cols != 8)).any()


def test_cutout_greys_one_square() -> None:
    x = torch.zeros((4, 1, 20, 20))
    y = randaugment.cutout(x, 0.5, torch.Generator().manual_seed(0))
    grey = (y == 0.5).flatten(1).sum(1)
    assert (grey > 0).all() and (grey <= 100).all()
    with pytest.raises(ValueError, match=r"cutout in \[0, 1\)"):
        StrongAugmentation(cutout=1.5)


def test_loss_masks_unconfident_pseudo_labels_and_stops_their_gradient() -> None:
    labelled = torch.zeros((2, 3), requires_grad=True)
    weak_logits = torch.tensor([[10.0, 0.0, 0.0], [0.1, 0.0, 0.0]], requires_grad=True)
    strong_logits = torch.zeros((2, 3), requires_grad=True)
    loss, rate = fixmatch.fixmatch_loss(
        labelled, torch.tensor([0, 1]), weak_logits, strong_logits, 0.95, 1.0
    )
    assert float(rate) == 0.5
    # supervised log 3 plus half (one of two confident) of log 3
    assert float(loss.detach()) == pytest.approx(np.log(3) * 1.5)
    torch.autograd.backward(loss)
    assert weak_logits.grad is None or float(weak_logits.grad.abs().sum()) == 0.0
    assert strong_logits.grad is not None and float(strong_logits.grad[1].abs().sum()) == 0.0
    assert float(strong_logits.grad[0].abs().sum()) > 0.0


def test_soft_targets_reduce_to_hard_ones() -> None:
    logits = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    hard = torch.tensor([0, 1, 2, 3, 0])
    soft = torch.nn.functional.one_hot(hard, 4).float()
    assert torch.allclose(
        fixmatch.soft_cross_entropy(logits, hard), fixmatch.soft_cross_entropy(logits, soft)
    )


def blobs(n: int, d: int = 6, classes: int = 3, seed: int = 0) -> tuple[ViewBank, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    centres = 4.0 * rng.standard_normal((classes, d))
    clean = centres[y] + rng.standard_normal((n, d))

    def views(k: int, spread: float) -> torch.Tensor:
        return torch.tensor(
            clean[:, None] + spread * rng.standard_normal((n, k, d)), dtype=torch.float32
        )

    bank = ViewBank(torch.tensor(clean, dtype=torch.float32), views(2, 0.3), views(2, 1.0))
    return bank, y


def test_heads_learn_from_few_labels_and_the_pool() -> None:
    bank, y = blobs(600)
    index = [np.arange(i, i + 2) for i in range(0, 40, 2)]  # 20 heads, 2 labels each
    config = FixMatchConfig(steps=150, batch=16, unlabelled_ratio=8, threshold=0.9, lr=0.05)
    w, b = fixmatch.fit_heads(bank, index, [y[i] for i in index], 3, config)
    assert w.shape == (20, 3, 6) and b.shape == (20, 3)
    votes = head_predictions(bank.clean, w, b)
    plurality = np.array([np.bincount(v, minlength=3).argmax() for v in votes])
    assert (plurality == y).mean() > 0.9
    # A head is its own: one trained on flipped labels disagrees with the rest.
    flipped = [y[i] for i in index]
    flipped[0] = (flipped[0] + 1) % 3
    w2, _ = fixmatch.fit_heads(bank, index, flipped, 3, config)
    assert not torch.allclose(w2[0], w[0]) and torch.allclose(w2[5], w[5], atol=1e-5)


def test_heads_refuse_bad_input() -> None:
    bank, y = blobs(50)
    with pytest.raises(ValueError, match="one label"):
        fixmatch.fit_heads(bank, [np.arange(3)], [y[:2]], 3)
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        fixmatch.fit_heads(bank, [np.arange(3)], [np.array([0, 1, 3])], 3)
    with pytest.raises(ValueError, match="threshold"):
        FixMatchConfig(threshold=0.0)


def test_train_fits_a_small_model_on_images() -> None:
    from capc.models import build

    gen = np.random.default_rng(0)
    x = gen.random((64, 1, 8, 8)).astype(np.float32) * 0.2
    y = gen.integers(0, 2, 64)
    x[y == 1, :, :4] += 0.7  # class 1 is bright on top
    model = build("small-cnn", (1, 8, 8), 2, width=4, seed=0)
    stats = fixmatch.train_fixmatch(
        model,
        x[:16],
        y[:16],
        x,
        FixMatchConfig(steps=60, batch=16, unlabelled_ratio=2, lr=0.05),
    )
    assert len(stats.losses) == 60 and not model.training
    pred = model(torch.from_numpy(x)).argmax(1).numpy()
    assert (pred == y).mean() > 0.8
