"""Full-batch DP-SGD (capc.learning.dp_sgd): one record's influence is bounded by the clip,
the noise has the scale the record states, BatchNorm is refused, and the trained model is
a plain module again."""

from __future__ import annotations

import copy
import io
import math
import pickle

import numpy as np
import pytest
import torch
from numpy.typing import NDArray
from torch import nn

from capc.learning import dp_sgd
from capc.privacy.dp_training import DpTraining, plan_training
from capc.privacy.randomness import SecureRandom

N, D, K = 40, 6, 3


def _data(seed: int = 0) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, D))
    # Every record of norm 1: the smoothness bound below uses ||x||.
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32), rng.integers(0, K, size=N).astype(np.int64)


def _record(noise: float, steps: int, clip: float) -> DpTraining:
    return DpTraining(noise_multiplier=noise, steps=steps, clip=clip, epsilon=1.0, delta=1e-5)


def _params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _trained(
    x: NDArray[np.float32], y: NDArray[np.int64], record: DpTraining, lr: float, noise_seed: int
) -> torch.Tensor:
    torch.manual_seed(0)
    model = nn.Linear(D, K)
    dp_sgd.train(model, x, y, record, lr=lr, rng=SecureRandom.from_seed(noise_seed))
    return _params(model)


def _replacement_bound(lr: float, clip: float, steps: int) -> float:
    """How far replacing one of N records can move plain full-batch SGD's parameters, with
    the same initial weights and the same noise.

    A step moves theta by -lr/N (sum of clipped per-record gradients + noise). With theta
    and theta' the two runs' parameters and Delta = theta - theta', the replaced record's
    clipped gradients differ by at most 2 clip; every other record's by at most
    beta ||Delta||, since clipping (a projection onto a ball) is 1-Lipschitz and softmax
    cross-entropy of a linear layer is beta-smooth with beta = (||x||**2 + 1) / 2 (the
    logits' Hessian has norm <= 1/2; the bias adds the 1). So
    ||Delta_{t+1}|| <= (1 + lr beta) ||Delta_t|| + 2 lr clip / N, from Delta_0 = 0:
    2 lr clip / N * ((1 + lr beta)**T - 1) / (lr beta); for T = 1, 2 lr clip / N.
    """
    beta = (1.0 + 1.0) / 2.0
    growth = lr * beta
    return 2.0 * lr * clip / N * ((1.0 + growth) ** steps - 1.0) / growth


@pytest.mark.parametrize("steps", [1, 5])
def test_one_record_moves_the_parameters_at_most_the_clip_allows(steps: int) -> None:
    x, y = _data()
    lr, clip = 0.1, 0.5
    record = _record(1e-6, steps, clip)
    adversarial = x.copy()
    adversarial[7] = 1e6  # one record replaced by a huge one
    other_label = y.copy()
    other_label[7] = (y[7] + 1) % K
    base = _trained(x, y, record, lr, noise_seed=3)
    moved = max(
        float(torch.linalg.vector_norm(base - _trained(xx, yy, record, lr, noise_seed=3)))
        for xx, yy in ((adversarial, y), (adversarial, other_label))
    )
    bound = _replacement_bound(lr, clip, steps)
    assert moved <= bound * (1 + 1e-4)
    # The bound is not vacuous: the huge record does move the model by most of it.
    assert moved > 0.2 * _replacement_bound(lr, clip, 1)
    # And it is the clipping that holds it there: without it the record moves far more.
    unclipped = _record(1e-6, steps, 1e9)
    far = float(
        torch.linalg.vector_norm(
            _trained(x, y, unclipped, lr, 3) - _trained(adversarial, y, unclipped, lr, 3)
        )
    )
    assert far > 100 * bound


def test_the_noise_has_the_scale_the_record_states() -> None:
    x, y = _data()
    lr, clip, sigma = 0.5, 0.25, 3.0
    record = _record(sigma, 1, clip)
    # Same data and start, two noise draws: the difference is lr / N times the difference
    # of two N(0, (sigma clip)**2) vectors, one per parameter (D*K + K of them).
    diff = _trained(x, y, record, lr, noise_seed=11) - _trained(x, y, record, lr, noise_seed=12)
    expected = math.sqrt(2.0) * lr * sigma * clip / N
    measured = float(diff.std())
    # 21 draws, fixed seeds (not flaky): their spread lies within a factor of 1.6 of the
    # stated one; a noise missing the clip (x4) or the 1/N (x40) falls far outside.
    assert expected / 1.6 < measured < expected * 1.6
    assert abs(float(diff.mean())) < 3 * expected / math.sqrt(diff.numel())


def test_the_noise_scale_over_many_parameters() -> None:
    # A wider layer, for a tight statistical check: 2,570 draws.
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, 256)).astype(np.float32)
    y = rng.integers(0, 10, size=50).astype(np.int64)
    lr, clip, sigma = 0.2, 2.0, 5.0
    record = _record(sigma, 1, clip)

    def run(seed: int) -> torch.Tensor:
        torch.manual_seed(0)
        model = nn.Linear(256, 10)
        dp_sgd.train(model, x, y, record, lr=lr, rng=SecureRandom.from_seed(seed))
        return _params(model)

    diff = run(1) - run(2)
    expected = math.sqrt(2.0) * lr * sigma * clip / len(x)
    assert float(diff.std()) == pytest.approx(expected, rel=0.1)
    # The same seed gives the same noise: the draws come from the rng passed in.
    assert torch.equal(run(1), run(1))


def test_batchnorm_is_refused() -> None:
    x, y = _data()
    model = nn.Sequential(nn.Linear(D, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, K))
    with pytest.raises(ValueError, match="BatchNorm"):
        dp_sgd.train(
            model, x, y, plan_training(1.0, 1e-5, 2, 1.0), lr=0.1, rng=SecureRandom.from_seed(0)
        )


def test_mismatched_or_empty_data_is_refused() -> None:
    x, y = _data()
    with pytest.raises(ValueError, match="labels"):
        dp_sgd.train(
            nn.Linear(D, K), x, y[:-1], plan_training(1.0, 1e-5, 2, 1.0), lr=0.1, rng=SecureRandom()
        )
    with pytest.raises(ValueError, match="labels"):
        dp_sgd.train(
            nn.Linear(D, K),
            x[:0],
            y[:0],
            plan_training(1.0, 1e-5, 2, 1.0),
            lr=0.1,
            rng=SecureRandom(),
        )


OPACUS_ATTRIBUTES = ("grad_sample", "_forward_counter", "_current_grad_sample", "_norm_sample")


def test_the_trained_model_is_a_plain_module() -> None:
    x, y = _data()
    model = nn.Sequential(nn.Linear(D, 8), nn.ReLU(), nn.Linear(8, K))
    before = {k: set(vars(m)) for k, m in model.named_modules()}
    trained = dp_sgd.train(
        model, x, y, plan_training(5.0, 1e-5, 3, 1.0), lr=0.1, rng=SecureRandom()
    )
    assert trained is model and type(trained) is nn.Sequential and not trained.training
    for name, m in trained.named_modules():
        assert set(vars(m)) == before[name], name
        for hooks in (
            m._forward_hooks,
            m._forward_pre_hooks,
            m._backward_hooks,
            m._backward_pre_hooks,
        ):
            assert len(hooks) == 0, name
    for p in trained.parameters():
        assert p.grad is None
        assert not any(hasattr(p, a) for a in OPACUS_ATTRIBUTES)
    # It pickles, copies and saves like any module, and computes the same afterwards.
    probe = torch.from_numpy(x)
    with torch.no_grad():
        want = trained(probe)
        assert torch.equal(pickle.loads(pickle.dumps(trained))(probe), want)
        assert torch.equal(copy.deepcopy(trained)(probe), want)
    buffer = io.BytesIO()
    torch.save(trained.state_dict(), buffer)
    buffer.seek(0)
    fresh = nn.Sequential(nn.Linear(D, 8), nn.ReLU(), nn.Linear(8, K))
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    with torch.no_grad():
        assert torch.equal(fresh(probe), want)
