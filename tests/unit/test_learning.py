"""DIET learning pieces: augmentations, NT-Xent, pretraining, last-layer fits, head ensembles."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch
from torch.nn import functional

from capc.learning.augment import Augmentation, augment
from capc.learning.cli import _body_config, add_parser
from capc.learning.diet import (
    DATA_INDEPENDENT,
    BodyConfig,
    DietConfig,
    format_table,
    goals,
    noise_stream,
    pretrained_body,
    query_recipe,
    split_hospitals,
    summarise,
)
from capc.learning.last_layer import (
    finetune_last_layer,
    finetune_teacher,
    fit_batch_standardised,
    fit_linear,
    fit_linear_many,
)
from capc.learning.pate import ConfidentParams
from capc.learning.semi_supervised import self_train_linear
from capc.learning.simclr import PretrainConfig, nt_xent, pretrain
from capc.learning.supervised import accuracy
from capc.learning.teachers import fit_head_ensemble
from capc.models import build
from capc.models.checkpoint import weights_sha256
from capc.models.inference import features, logits, run_batches


def blobs(n: int = 300, d: int = 8, k: int = 3, seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    centres = rng.normal(0, 4, (k, d))
    return torch.from_numpy((centres[y] + rng.normal(0, 1, (n, d))).astype(np.float32)), y


def test_fit_linear_separates_blobs_and_takes_raw_features() -> None:
    f, y = blobs()
    shifted = f * 7 + 100  # standardisation is folded into the layer
    layer = fit_linear(shifted, y, 3)
    assert (layer(shifted).argmax(1).numpy() == y).mean() > 0.97


def test_fit_linear_multi_label_and_balanced() -> None:
    f, y = blobs(k=2)
    labels = np.stack([y, 1 - y], axis=1)
    layer = fit_linear(f, labels, 2)
    assert ((layer(f) > 0).numpy() == labels).mean() > 0.97
    # 95% of one class: the balanced fit recovers more of the rare class.
    rng = np.random.default_rng(3)
    rare = np.flatnonzero(y == 1)[:8]
    keep = np.concatenate([np.flatnonzero(y == 0), rare])
    noisy = torch.from_numpy(f.numpy()[keep] + rng.normal(0, 3, (len(keep), 8)).astype(np.float32))
    plain = fit_linear(noisy, y[keep], 2, l2=0.1)
    fair = fit_linear(noisy, y[keep], 2, l2=0.1, balanced=True)
    recall = [(m(f[y == 1]).argmax(1) == 1).float().mean().item() for m in (plain, fair)]
    assert recall[1] > recall[0]


def test_fit_linear_many_fits_what_fit_linear_fits_on_each_part() -> None:
    f, y = blobs(n=330, k=3)
    cuts = [(0, 40), (40, 120), (120, 330)]  # unequal parts: padded rows must weigh nothing
    parts = [(f[a:b] * (i + 1) + 10 * i, y[a:b]) for i, (a, b) in enumerate(cuts)]
    weights, biases = fit_linear_many([p[0] for p in parts], [p[1] for p in parts], 3, l2=0.01)
    assert weights.shape == (3, 3, 8) and biases.shape == (3, 3)
    for t, (x, labels) in enumerate(parts):
        alone = fit_linear(x, labels, 3, l2=0.01)
        # One convex objective per part: both optimisers reach its minimiser.
        torch.testing.assert_close(weights[t], alone.weight.detach(), atol=2e-3, rtol=2e-2)
        torch.testing.assert_close(biases[t], alone.bias.detach(), atol=2e-3, rtol=2e-2)
    multi = [
        (x, np.stack([labels == 0, labels == 1], axis=1).astype(np.int64)) for x, labels in parts
    ]
    weights, biases = fit_linear_many([p[0] for p in multi], [p[1] for p in multi], 2, l2=0.01)
    for t, (x, labels) in enumerate(multi):
        alone = fit_linear(x, labels, 2, l2=0.01)
        torch.testing.assert_close(weights[t], alone.weight.detach(), atol=2e-3, rtol=2e-2)
    with pytest.raises(ValueError, match="one label set"):
        fit_linear_many([f], [y, y], 3)
    with pytest.raises(ValueError, match="same width"):
        fit_linear_many([f, f[:, :4]], [y, y], 3)


def test_fit_linear_refuses_bad_input() -> None:
    f, y = blobs()
    with pytest.raises(ValueError, match="one label each"):
        fit_linear(f, y[:10], 3)
    with pytest.raises(ValueError, match="NaN"):
        fit_linear(torch.full_like(f, math.nan), y, 3)
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        fit_linear(f, y, 2)
    with pytest.raises(ValueError, match="columns"):
        fit_linear(f, np.zeros((len(f), 4), dtype=np.int64), 3)


def test_batch_standardised_head_is_fit_linear_until_a_batch_shifts() -> None:
    both, labels = blobs(n=600)
    f, y, g, y2 = both[:300], labels[:300], both[300:], labels[300:]
    head = fit_batch_standardised(f, y, 3, l2=0.01)
    plain = fit_linear(f, y, 3, l2=0.01)
    with torch.no_grad():
        # Evaluation mode: the stored statistics of the fitted features, as fit_linear folds them.
        assert torch.allclose(head(f), plain(f), atol=1e-3)
    # Real images whose features sit elsewhere, per feature, than the queries' did:
    # their own statistics bring them back, the stored ones cannot.
    scale = torch.linspace(0.3, 3.0, g.shape[1])
    shifted = (g - g.mean(0)) * scale + g.mean(0) + 10.0
    mine = run_batches(head, head, shifted, current_statistics=True, batch=100)
    reference = run_batches(head, head, g, current_statistics=True, batch=100)
    assert torch.allclose(mine, reference, atol=1e-3)
    with torch.no_grad():
        folded = (plain(shifted).argmax(1).numpy() == y2).mean()
    assert (mine.argmax(1).numpy() == y2).mean() > 0.97 > folded + 0.2
    # The stored statistics stay those of the fitted features.
    assert torch.allclose(head.state_dict()["0.running_mean"], f.mean(0))
    with pytest.raises(ValueError, match="NaN"):
        fit_batch_standardised(torch.full_like(f, math.nan), y, 3)


def test_self_training_keeps_the_released_labels_and_the_batch_standardisation() -> None:
    f, y = blobs(n=400)
    labels = np.where(np.arange(len(y)) % 4 == 0, y, -1)  # a quarter answered
    head = self_train_linear(f, labels, 3, l2=0.01)
    assert isinstance(head[0], torch.nn.BatchNorm1d)
    # Fitted on released and pseudo-labels: its statistics are those of more than the answered rows.
    assert not torch.allclose(head.state_dict()["0.running_mean"], f[labels >= 0].mean(0))
    with torch.no_grad():
        assert (head(f).argmax(1).numpy() == y).mean() > 0.95
    with pytest.raises(ValueError, match="no answered"):
        self_train_linear(f, np.full(len(y), -1), 3)


def test_augment_is_seeded_and_stays_in_range() -> None:
    x = torch.rand(16, 1, 12, 12)
    a = augment(x, torch.Generator().manual_seed(5))
    b = augment(x, torch.Generator().manual_seed(5))
    c = augment(x, torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == x.shape and a.min() >= 0 and a.max() <= 1
    with pytest.raises(ValueError, match="B, C, H, W"):
        augment(torch.rand(3, 12, 12), torch.Generator())
    with pytest.raises(ValueError, match="min_scale"):
        Augmentation(min_scale=0)


def test_nt_xent_matches_its_definition() -> None:
    torch.manual_seed(0)
    z1, z2 = torch.randn(5, 4), torch.randn(5, 4)
    t = 0.3
    z = functional.normalize(torch.cat([z1, z2]), dim=1)
    total = 0.0
    for i in range(10):
        j = (i + 5) % 10
        num = math.exp(float(z[i] @ z[j]) / t)
        den = sum(math.exp(float(z[i] @ z[k]) / t) for k in range(10) if k != i)
        total += -math.log(num / den)
    assert float(nt_xent(z1, z2, t)) == pytest.approx(total / 10, rel=1e-5)
    # Two identical, well separated views are the easy case.
    eye = torch.eye(5, 8) * 10
    assert float(nt_xent(eye, eye, 0.1)) < 1e-3


def test_pretraining_trains_the_body_only() -> None:
    model = build("resnet10", (1, 12, 12), 3, width=4)
    head = model.head.weight.detach().clone()
    body = [p.detach().clone() for p in model.features.parameters()]
    pool = np.random.default_rng(0).random((64, 1, 12, 12)).astype(np.float32)
    losses = pretrain(model, pool, PretrainConfig(steps=4, batch=16, seed=1))
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses)
    assert torch.equal(model.head.weight, head)
    assert any(
        not torch.equal(a, b) for a, b in zip(body, model.features.parameters(), strict=True)
    )
    assert not model.training
    with pytest.raises(ValueError, match="at least one batch"):
        pretrain(model, pool[:8], PretrainConfig(steps=1, batch=16))


def test_bf16_pretraining_trains_a_float32_body_close_to_the_fp32_one() -> None:
    pool = np.random.default_rng(0).random((64, 1, 12, 12)).astype(np.float32)
    runs = {}
    seen: dict[str, set[tuple[torch.dtype, bool]]] = {}
    for precision in ("fp32", "bf16"):
        model = build("resnet10", (1, 12, 12), 3, width=4, seed=0)
        # The second convolution, whose input has several channels (a one-channel image is
        # contiguous in both layouts): bf16 outputs computed from channels-last inputs.
        conv = [m for m in model.features.modules() if isinstance(m, torch.nn.Conv2d)][1]
        seen[precision] = set()
        conv.register_forward_hook(
            lambda _m, inputs, out, s=seen[precision]: s.add(
                (out.dtype, inputs[0].is_contiguous(memory_format=torch.channels_last))
            )
        )
        config = PretrainConfig(steps=3, batch=16, seed=1, precision=precision)
        runs[precision] = (pretrain(model, pool, config), model)
    assert seen == {"fp32": {(torch.float32, False)}, "bf16": {(torch.bfloat16, True)}}
    (fp32_losses, fp32_body), (bf16_losses, bf16_body) = runs["fp32"], runs["bf16"]
    # Same batches and views, arithmetic within bfloat16's 3 significant digits.
    assert bf16_losses[0] == pytest.approx(fp32_losses[0], abs=0.05)
    assert weights_sha256(bf16_body.features) != weights_sha256(fp32_body.features)
    for p in bf16_body.features.parameters():
        assert p.dtype == torch.float32 and p.is_contiguous()
    assert not bf16_body.training
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16"):
        PretrainConfig(precision="fp16")


def test_body_cache_names_keep_their_value_and_tell_precisions_apart() -> None:
    # The fp32 name is the one bodies were cached under before bf16 existed.
    assert BodyConfig().key == "b911575b2668e89c"
    assert BodyConfig(pretrain=PretrainConfig(precision="bf16")).key != BodyConfig().key


def test_a_pretrained_body_is_a_function_of_its_configuration() -> None:
    # Once the body's initial weights came from whatever state torch's global
    # generator was in, so two pretrainings of one configuration differed.
    config = BodyConfig(
        width=4, input_shape=(1, 12, 12), pool=64, pretrain=PretrainConfig(steps=2, batch=16)
    )
    digests = []
    for draw in (0, 1000):
        torch.rand(draw)  # a caller that drew from the generator before
        digests.append(
            weights_sha256(pretrained_body(config, None, 3, lambda s: None, "cpu").features)
        )
    assert digests[0] == digests[1]
    other = BodyConfig(
        width=4,
        input_shape=(1, 12, 12),
        pool=64,
        pretrain=PretrainConfig(steps=2, batch=16, seed=1),
    )
    body = pretrained_body(other, None, 3, lambda s: None, "cpu")
    assert weights_sha256(body.features) != digests[0]


def digit_like(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Bright-left vs bright-right 8x8 images."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    x = rng.random((n, 1, 8, 8)).astype(np.float32) * 0.3
    x[y == 0, :, :, :4] += 0.7
    x[y == 1, :, :, 4:] += 0.7
    return x, y


def test_last_layer_fine_tuning_keeps_the_body() -> None:
    torch.manual_seed(0)
    model = build("small-cnn", (1, 8, 8), 2, width=4)
    body = {k: v.clone() for k, v in model.features.state_dict().items()}
    x, y = digit_like(200, 0)
    finetune_last_layer(model, x, y)
    for k, v in model.features.state_dict().items():
        assert torch.equal(v, body[k]), k
    assert (logits(model, x).argmax(1).numpy() == y).mean() > 0.95
    teacher = finetune_teacher(model, x * 2, y)
    # Statistics of the teacher's own data, so its inputs at twice the scale still work.
    assert (logits(teacher, x * 2).argmax(1).numpy() == y).mean() > 0.95


def test_head_ensemble_teachers_match_stand_alone_models() -> None:
    torch.manual_seed(0)
    body = build("small-cnn", (1, 8, 8), 2, width=4)
    x, y = digit_like(240, 1)
    before = {k: v.clone() for k, v in body.state_dict().items()}
    parts = [np.arange(i, 240, 3) for i in range(3)]
    ens = fit_head_ensemble(body, x, y, parts, architecture="small-cnn", width=4)
    for k, v in body.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} changed in the shared body"
    q, _ = digit_like(50, 2)
    orig = ens.predict(q, current_statistics=False, batch=50)
    cur = ens.predict(q, current_statistics=True, batch=50)
    assert orig.shape == cur.shape == (50, 3)
    # callers that hold a batch's features already get the same votes without a second pass
    f = features(body, q, current_statistics=True, batch=50)
    np.testing.assert_array_equal(ens.predict_features(f), cur)
    for i in range(3):
        t = ens.teacher(i)
        np.testing.assert_array_equal(logits(t, q).argmax(1).numpy(), orig[:, i])
        np.testing.assert_array_equal(
            logits(t, q, current_statistics=True, batch=50).argmax(1).numpy(), cur[:, i]
        )
    # Each teacher carries its own hospital's statistics.
    assert not torch.equal(
        ens.statistics[0]["features.1.running_mean"], ens.statistics[1]["features.1.running_mean"]
    )
    with pytest.raises(ValueError, match="two examples"):
        fit_head_ensemble(body, x, y, [np.array([0])], architecture="small-cnn", width=4)


def test_query_sets_and_noise_draws_are_distinct_and_draw_zero_is_the_experiments() -> None:
    config = DietConfig(generators=("gaussian", "fractal"), queries=8)
    first = query_recipe(config, 3, 1)
    assert (first.generator, first.seed, first.count) == ("fractal", 3001, 8)
    names = {
        query_recipe(config, s, g, d).seed for s in range(3) for g in range(2) for d in range(3)
    }
    assert len(names) == 18  # no two (seed, generator, draw) share a query set
    with pytest.raises(ValueError, match="no generator 2"):
        query_recipe(config, 0, 2)
    draws = [noise_stream(1, d).normal(4) for d in range(3)] + [noise_stream(2).normal(4)]
    assert len({tuple(d) for d in draws}) == 4
    np.testing.assert_array_equal(noise_stream(1).normal(4), draws[0])


def _cell(generator: str, statistics: str, eps: float, acc: float) -> dict[str, object]:
    return {
        "method": "diet",
        "generator": generator,
        "statistics": statistics,
        "epsilon": eps,
        "answered": 0 if acc != acc else 100,
        "label_accuracy": 0.9,
        "student_accuracy": acc,
        "student_accuracy_std": 0.0,
        "student_accuracy_self_trained": float("nan"),
        "student_accuracy_self_trained_std": float("nan"),
        "stopping": DATA_INDEPENDENT,
    }


def test_diet_goals_read_the_table() -> None:
    nan = float("nan")
    table = [
        _cell("gaussian", "current", 10.0, 0.6),
        _cell("gaussian", "original", 10.0, nan),  # nothing answered: no student at all
        _cell("spectral", "current", 10.0, 0.5),
        _cell("spectral", "original", 10.0, 0.45),
        _cell("fractal", "current", 20.0, 0.9),  # above eps 10: not a candidate
    ]
    g = goals(table, (10.0, 20.0))
    assert g["current_beats_original_on_noise"]["holds"]
    assert g["best_student_at_eps_10"]["accuracy"] == 0.6
    assert not g["reaches_75_percent"]
    table[3]["student_accuracy"] = 0.55  # original statistics win one pair
    assert not goals(table, (10.0,))["current_beats_original_on_noise"]["holds"]
    table[0]["student_accuracy"] = nan  # neither answered: current does not beat original
    pairs = goals(table, (10.0,))["current_beats_original_on_noise"]["pairs"]
    assert [p["beats"] for p in pairs] == [False, False]


def test_diet_rows_of_two_accountants_stay_apart_and_either_can_meet_the_goal() -> None:
    def row(accountant: str, seed: int, acc: float) -> dict[str, object]:
        cell = _cell("gaussian", "current", 10.0, acc)
        side = {"sanitised_data_dependent_epsilon": 9.0} if accountant == "rdp" else {}
        return {**cell, "accountant": accountant, "seed": seed, **side}

    rows = [row("rdp", 0, 0.74), row("rdp", 1, 0.75), row("gdp", 0, 0.76), row("gdp", 1, 0.75)]
    table = summarise(rows)
    means = {t["accountant"]: t["student_accuracy"] for t in table}
    assert means == {"rdp": pytest.approx(0.745), "gdp": pytest.approx(0.755)}
    g = goals(table, (10.0,))
    assert g["best_student_at_eps_10"]["accountant"] == "gdp" and g["reaches_75_percent"]
    text = format_table({"table": table, "references": {}, "goals": g})
    assert "gdp accountant" in text and "rdp" in text.splitlines()[1] + text.splitlines()[2]
    assert "9.00" in text and "data-dependent" not in text  # the side column, nothing superseded
    # Current against original statistics is compared within one accountant only.
    table += summarise([{**row("gdp", 0, 0.2), "statistics": "original"}])
    (pair,) = goals(table, (10.0,))["current_beats_original_on_noise"]["pairs"]
    assert pair["accountant"] == "gdp" and pair["original"] == pytest.approx(0.2)
    # Results saved before there was a choice read as rdp; before the data-independent
    # filter, rdp rows stopped on the data-dependent epsilon: shown marked, never a goal.
    old_rows = [
        {**{k: v for k, v in r.items() if k not in ("accountant", "stopping")}, "answered": 90}
        for r in rows[:2]
    ]
    old = summarise(old_rows)
    assert old[0]["accountant"] == "rdp" and "stopping" not in old[0]
    assert goals(old, (10.0,))["best_student_at_eps_10"] is None
    shown = format_table({"table": old, "references": {}, "goals": goals(old, (10.0,))})
    assert "rdp*" in shown and "not a DP release" in shown
    mixed = summarise([*old_rows, *rows[2:]])
    assert goals(mixed, (10.0,))["best_student_at_eps_10"]["accountant"] == "gdp"
    assert {t.get("stopping") for t in mixed} == {None, DATA_INDEPENDENT}


def test_diet_config_and_command_line_take_plain_gnmax_and_its_accountant() -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["diet", "run", "--threshold", "none", "--accountants", "rdp,gdp"])
    assert args.threshold is None and args.accountants == ("rdp", "gdp")
    plain = ConfidentParams(None, 1.0, 16.0)
    config = DietConfig(mechanism=plain, accountants=("rdp", "gdp"), teachers=250)
    assert config.params == ConfidentParams(None, 2.5, 40.0)
    # Exact Gaussian DP is a filter for Confident-GNMax too (its tests and answers are Gaussian).
    assert DietConfig(accountants=("gdp",)).accountants == ("gdp",)
    with pytest.raises(ValueError, match="unknown accountants"):
        DietConfig(mechanism=plain, accountants=("pld",))
    for bad in (["--threshold", "-1"], ["--threshold", "many"], ["--accountants", "pld"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["diet", "run", *bad])


def test_diet_table_says_when_statistics_were_not_compared() -> None:
    table = [_cell("gaussian", "current", 10.0, 0.6), _cell("fractal", "current", 10.0, 0.7)]
    result = {"table": table, "references": {}, "goals": goals(table, (10.0,))}
    assert "noise-like queries: not measured" in format_table(result)
    table.append(_cell("gaussian", "original", 10.0, 0.65))
    result["goals"] = goals(table, (10.0,))
    assert "noise-like queries: no" in format_table(result)


class _SignOfNormalised(torch.nn.Module):
    """Class 1 iff the input is above its BatchNorm mean: only batch statistics separate."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(1)  # scale 1, shift 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.norm(x)
        return torch.cat([-z, z], dim=1)


def test_current_statistics_accuracy_does_not_depend_on_a_class_sorted_file() -> None:
    # Sorted by class, every batch of 100 holds one class, whose own statistics would
    # centre it on the boundary: about half right. Mixed batches put the classes apart.
    x = np.concatenate([np.zeros((200, 1)), np.ones((200, 1))]).astype(np.float32)
    x += np.random.default_rng(0).normal(0, 0.05, x.shape).astype(np.float32)
    y = np.repeat([0, 1], 200)
    model = _SignOfNormalised()
    assert accuracy(model, x, y, current_statistics=True, batch=100) > 0.95
    shuffled = np.random.default_rng(1).permutation(len(x))
    assert accuracy(model, x[shuffled], y[shuffled], current_statistics=True, batch=100) > 0.95


def test_diet_test_set_is_not_sorted() -> None:
    y = np.repeat(np.arange(10), 100)
    test, parts, train = split_hospitals(y, DietConfig(teachers=4, test_size=200), seed=0)
    first = y[test[:100]]
    assert len(np.unique(first)) == 10  # a batch of the test set mixes the classes
    assert len(set(test) | set(np.concatenate(parts))) == len(y)
    assert sorted(train) == sorted(np.concatenate(parts))


@pytest.mark.parametrize("split", ["iid", "skewed"])
def test_diet_reference_batches_mix_the_hospitals(split: str) -> None:
    # The non-private reference reads all hospitals in batches with their own statistics:
    # each batch must hold the classes about as often as the whole training set does.
    y = np.repeat(np.arange(10), 1000)
    config = DietConfig(teachers=100, test_size=1000, split=split, batch=512)
    _, parts, train = split_hospitals(y, config, seed=0)
    assert sorted(train) == sorted(np.concatenate(parts))
    overall = np.bincount(y[train], minlength=10) / len(train)
    if split == "skewed":  # the hospitals themselves are far from that mix
        worst = max(np.abs(np.bincount(y[p], minlength=10) / len(p) - overall).max() for p in parts)
        assert worst > 0.3
    # Mixed, the largest gap is at most 0.05 on seeds 0-4; in hospital order 0.16-0.23.
    for start in range(0, len(train) - 512 + 1, 512):
        share = np.bincount(y[train[start : start + 512]], minlength=10) / 512
        assert np.abs(share - overall).max() < 0.08


def test_diet_command_line_defaults_are_the_config_defaults() -> None:
    # The cached body is found by its config's hash: a drifting default would pretrain anew.
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["diet", "run"])
    default = DietConfig()
    assert _body_config(args) == default.body
    assert ConfidentParams(args.threshold, args.sigma1, args.sigma2) == default.mechanism
    assert (args.teachers, args.queries, args.batch, args.epsilons, args.delta) == (
        default.teachers,
        default.queries,
        default.batch,
        default.epsilons,
        default.delta,
    )
    assert tuple(range(args.first_seed, args.first_seed + args.seeds)) == default.seeds
    assert args.student_l2 == default.student_l2
    assert args.accountants == default.accountants


@pytest.mark.parametrize("field", ["teacher_l2", "student_l2", "reference_l2"])
@pytest.mark.parametrize("value", [-1e-3, float("nan"), float("inf")])
def test_diet_config_refuses_bad_head_penalties(field: str, value: float) -> None:
    with pytest.raises(ValueError, match="L2 penalties"):
        penalty: dict[str, Any] = {field: value}
        DietConfig(**penalty)


@pytest.mark.parametrize("seeds", [(), (-1, 0), (3, 3)])
def test_diet_config_refuses_missing_negative_or_repeated_seeds(seeds: tuple[int, ...]) -> None:
    # A repeated seed would count one split and one noise draw twice in the mean.
    with pytest.raises(ValueError, match="seed"):
        DietConfig(seeds=seeds)


def test_diet_config_refuses_an_empty_test_set() -> None:
    with pytest.raises(ValueError, match="test_size >= 1"):
        DietConfig(test_size=0)
    # A last test batch of one image is no error: the student's head standardises it by
    # its stored statistics (tests/unit/test_models.py checks that fallback).
    DietConfig(test_size=1025, batch=512)


def test_python_m_capc_learning_needs_no_service_code() -> None:
    # ``python -m capc.learning`` is for a training box without the services: capc has
    # no network code, so neither the services nor gRPC may be imported on the way.
    code = (
        "import sys, capc.learning.__main__ as m; "
        "print(sorted({n.split('.')[0] for n in sys.modules} & {'services', 'grpc'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
