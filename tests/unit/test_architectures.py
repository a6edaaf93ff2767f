"""Every architecture builds at its input shape, has a linear head, and checkpoints its width."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from capc.models import ARCHITECTURES, Teacher, build, load_teacher, save_teacher
from capc.models.inference import features, logits, norm_layers, recalibrate, statistics


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("small-cnn", (1, 28, 28)),
        ("mlp", (30,)),
        ("resnet10", (1, 28, 28)),
        ("resnet18", (3, 32, 32)),
        ("linear", (1, 28, 28)),
        ("linear", (30,)),
    ],
)
def test_shapes_and_head(name: str, shape: tuple[int, ...]) -> None:
    model = build(name, shape, 10, width=8 if name.startswith("resnet") else None)
    x = torch.rand(4, *shape)
    with statistics(model, current=False):
        out = model(x)
        f = model.features(x)
    assert out.shape == (4, 10)
    assert f.shape == (4, model.dim) and model.head.in_features == model.dim
    assert name in ARCHITECTURES


def test_resnet_depths_and_width() -> None:
    def convs(name: str) -> int:
        return sum(
            isinstance(m, torch.nn.Conv2d) for m in build(name, (1, 28, 28), 10, 8).modules()
        )

    # stem + 2 per block + 1x1 projections where a stage changes width
    assert convs("resnet10") == 1 + 2 * 4 + 3
    assert convs("resnet18") == 1 + 2 * 8 + 3
    assert build("resnet10", (1, 28, 28), 10, width=4).dim == 32
    assert build("resnet10", (1, 28, 28), 10).dim == 512


def test_bad_architecture_requests() -> None:
    with pytest.raises(ValueError, match="unknown architecture 'vgg'"):
        build("vgg", (1, 28, 28), 10)
    with pytest.raises(ValueError, match="channels, height, width"):
        build("resnet10", (30,), 2)
    with pytest.raises(ValueError, match="features,"):
        build("mlp", (1, 28, 28), 2)
    with pytest.raises(ValueError, match="width"):
        build("resnet10", (1, 28, 28), 10, width=0)


def test_checkpoint_keeps_the_width(tmp_path: Path) -> None:
    model = build("resnet10", (1, 16, 16), 3, width=4)
    teacher = Teacher("resnet10", (1, 16, 16), 3, model, {"data": "none"}, device="cpu", width=4)
    save_teacher(tmp_path / "r.pt", teacher)
    back = load_teacher(tmp_path / "r.pt")
    assert back.width == 4 and back.model_hash == teacher.model_hash
    x = np.random.default_rng(0).random((6, 1, 16, 16)).astype(np.float32)
    np.testing.assert_array_equal(back.predict(x), teacher.predict(x))


def test_current_statistics_normalise_each_batch_on_its_own() -> None:
    torch.manual_seed(0)
    model = build("resnet10", (1, 16, 16), 4, width=4)
    x = np.random.default_rng(1).random((64, 1, 16, 16)).astype(np.float32)
    shifted = x * 3
    # With current statistics scaling the whole batch leaves the features alone (the stem
    # conv has no bias, so the first BatchNorm absorbs the scale); with stored statistics
    # it does not.
    cur = features(model, x, current_statistics=True, batch=64)
    cur_shifted = features(model, shifted, current_statistics=True, batch=64)
    stored = features(model, x)
    stored_shifted = features(model, shifted)
    assert torch.allclose(cur, cur_shifted, atol=1e-3)
    assert (stored_shifted - stored).norm() > 0.5 * stored.norm()
    # Batch size is part of the result under current statistics.
    halves = features(model, x, current_statistics=True, batch=32)
    assert not torch.allclose(cur, halves, atol=1e-4)
    # Nothing stored changed.
    assert all(int(torch.as_tensor(m.num_batches_tracked)) == 0 for m in norm_layers(model))


def test_recalibrate_sets_exact_statistics() -> None:
    model = build("small-cnn", (1, 8, 8), 2, width=4)
    x = (np.random.default_rng(2).random((100, 1, 8, 8)) * 4 + 1).astype(np.float32)
    recalibrate(model, x, batch=100)
    conv, first = list(model.features.children())[:2]
    assert isinstance(first, torch.nn.BatchNorm2d) and first.running_mean is not None
    with torch.no_grad():
        pre = conv(torch.from_numpy(x))
    np.testing.assert_allclose(
        first.running_mean.numpy(), pre.mean(dim=(0, 2, 3)).numpy(), rtol=1e-5
    )
    assert first.momentum == 0.1  # restored
    assert not model.training
    out = logits(model, x)
    assert out.shape == (100, 2)


def test_a_seeded_build_ignores_and_keeps_the_global_generator() -> None:
    def weights(model: torch.nn.Module) -> list[torch.Tensor]:
        return [p.detach().clone() for p in model.parameters()]

    first = weights(build("small-cnn", (1, 8, 8), 3, seed=5))
    torch.rand(100)  # a caller that drew from the generator in between
    state = torch.random.get_rng_state()
    second = weights(build("small-cnn", (1, 8, 8), 3, seed=5))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    other = weights(build("small-cnn", (1, 8, 8), 3, seed=6))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))
