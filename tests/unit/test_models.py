"""Teacher checkpoints and inference with training or current BatchNorm statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from capc.learning.last_layer import fit_batch_standardised
from capc.learning.supervised import accuracy, fit
from capc.models import Teacher, build, load_teacher, save_teacher
from capc.models.inference import EVAL_CHUNK, features, logits


def trained(tmp_path: Path) -> Teacher:
    rng = np.random.default_rng(0)
    x = rng.random((64, 1, 8, 8)).astype(np.float32)
    y = (x.mean(axis=(1, 2, 3)) > 0.5).astype(np.int64)
    return Teacher(
        "small-cnn",
        (1, 8, 8),
        2,
        fit(build("small-cnn", (1, 8, 8), 2), x, y, epochs=2),
        {"data": "toy"},
    )


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    t = trained(tmp_path)
    save_teacher(tmp_path / "t.pt", t)
    back = load_teacher(tmp_path / "t.pt")
    x = np.random.default_rng(1).random((10, 1, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(back.predict(x), t.predict(x))
    assert back.model_hash == t.model_hash and back.card == {"data": "toy"}
    with pytest.raises(ValueError, match="no model checkpoint"):
        load_teacher(tmp_path / "missing.pt")


def test_a_student_with_a_batch_standardised_head_round_trips(tmp_path: Path) -> None:
    t = trained(tmp_path)
    rng = np.random.default_rng(3)
    x = rng.random((64, 1, 8, 8)).astype(np.float32)
    f = features(t.model, x, current_statistics=True)
    t.model.head = fit_batch_standardised(f, rng.integers(0, 2, 64), 2)  # type: ignore[assignment]
    before = t.model_hash
    save_teacher(tmp_path / "s.pt", t)
    back = load_teacher(tmp_path / "s.pt")
    assert back.model_hash == before
    shifted = (x * 3 + 1).astype(np.float32)
    for current in (False, True):
        np.testing.assert_array_equal(
            back.predict(shifted, current_statistics=current),
            t.predict(shifted, current_statistics=current),
        )
    # A batch of one has no statistics of its own: the stored ones serve, nothing fails.
    one = features(back.model, shifted[:1], current_statistics=True)
    with torch.no_grad():
        stored = back.model.head.eval()(one).argmax(1).numpy()
    np.testing.assert_array_equal(back.predict(shifted[:1], current_statistics=True), stored)
    assert t.model_hash == before  # current statistics leave the head's stored ones alone


def test_current_statistics_leave_the_model_unchanged(tmp_path: Path) -> None:
    t = trained(tmp_path)
    before = t.model_hash
    shifted = (np.random.default_rng(2).random((32, 1, 8, 8)) * 5 + 3).astype(np.float32)
    t.predict(shifted, current_statistics=True)
    assert t.model_hash == before  # running statistics and their counters untouched
    assert not t.model.training


def test_bad_queries(tmp_path: Path) -> None:
    t = trained(tmp_path)
    with pytest.raises(ValueError, match="shape"):
        t.predict(np.zeros((2, 1, 4, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="NaN"):
        t.predict(np.full((2, 1, 8, 8), np.nan, dtype=np.float32))


def test_multi_label_teacher_learns_and_round_trips(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    x = rng.random((256, 1, 8, 8)).astype(np.float32)
    # Label 0: bright left half; label 1: bright top half; label 2: always off.
    y = np.stack(
        [
            x[:, 0, :, :4].mean(axis=(1, 2)) > 0.5,
            x[:, 0, :4].mean(axis=(1, 2)) > 0.5,
            np.zeros(256, bool),
        ],
        axis=1,
    ).astype(np.int64)
    model = fit(build("small-cnn", (1, 8, 8), 3), x, y, epochs=15, lr=3e-3)
    assert accuracy(model, x, y) > 0.85
    t = Teacher("small-cnn", (1, 8, 8), 3, model, multi_label=True)
    pred = t.predict(x)
    assert pred.shape == (256, 3) and set(np.unique(pred)) <= {0, 1}
    save_teacher(tmp_path / "m.pt", t)
    back = load_teacher(tmp_path / "m.pt")
    assert back.multi_label
    np.testing.assert_array_equal(back.predict(x), pred)


def test_current_statistics_normalise_the_whole_query_batch_at_once(tmp_path: Path) -> None:
    # A query batch's statistics are part of its answer: splitting it into chunks would
    # normalise each chunk on its own and change the labels.
    torch.manual_seed(0)  # a fixed untrained model with ten classes: labels vary
    t = Teacher("small-cnn", (1, 8, 8), 10, build("small-cnn", (1, 8, 8), 10), {"data": "none"})
    rng = np.random.default_rng(3)
    x = rng.random((32, 1, 8, 8)).astype(np.float32)
    x[:16] = x[:16] * 4 + 2  # two halves whose statistics differ
    whole = logits(t.model, x, current_statistics=True, batch=len(x)).argmax(dim=1).numpy()
    split = logits(t.model, x, current_statistics=True, batch=16).argmax(dim=1).numpy()
    assert (whole != split).any(), "the check needs a batch where chunking changes labels"
    np.testing.assert_array_equal(t.predict(x, current_statistics=True, chunk=16), whole)


def test_a_pass_with_stored_statistics_goes_in_chunks_with_the_same_outputs(
    tmp_path: Path,
) -> None:
    """With stored statistics each input's output is its own: the pass runs in chunks of
    EVAL_CHUNK (faster on the CPU) and gives what one input at a time gives; with the
    batch's own statistics the batch is never cut."""
    torch.manual_seed(0)
    t = Teacher("small-cnn", (1, 8, 8), 10, build("small-cnn", (1, 8, 8), 10), {"data": "none"})
    x = np.random.default_rng(4).random((EVAL_CHUNK + 40, 1, 8, 8)).astype(np.float32)
    x[:EVAL_CHUNK] = x[:EVAL_CHUNK] * 4 + 2  # the first chunk's statistics differ
    seen: list[int] = []
    stored = features(t.model, x, batch=1024, on_batch=seen.append)
    assert seen == [EVAL_CHUNK, len(x)]
    alone = torch.cat([features(t.model, x[i : i + 1]) for i in range(0, len(x), 37)])
    torch.testing.assert_close(stored[::37], alone, rtol=1e-5, atol=1e-5)
    whole = logits(t.model, x, current_statistics=True, batch=1024)
    first = logits(t.model, x[:EVAL_CHUNK], current_statistics=True)
    assert not torch.allclose(whole[:EVAL_CHUNK], first, atol=1e-4), "one batch, one set"
