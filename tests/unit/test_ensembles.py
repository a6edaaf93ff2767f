"""Teacher ensembles: one party, m teachers, the sum of their votes, one teacher's privacy cost."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from capc.learning.teachers import fit_head_ensemble
from capc.mechanisms import MechanismError
from capc.models import Teacher, build
from capc.models.ensemble import TeacherEnsemble, Voters, load_members, save_ensemble
from tests.unit.test_mechanisms_objects import CASES, IDS, predictions
from tests.unit.test_mechanisms_objects import build as build_mechanism


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = rng.random((n, 1, 12, 12)).astype(np.float32) * 0.4
    x[y == 0, :, :, :6] += 0.6
    x[y == 1, :, :, 6:] += 0.6
    x[y == 2, :, :6, :] += 0.6
    return x, y


def _ensemble(m: int = 4) -> TeacherEnsemble:
    body = build("resnet10", (1, 12, 12), 3, width=4, seed=0)
    x, y = _data(40 * m, 0)
    parts = [np.arange(40 * i, 40 * (i + 1)) for i in range(m)]
    return fit_head_ensemble(
        body, x, y, parts, architecture="resnet10", width=4, card={"teachers": m}
    )


@pytest.mark.parametrize("current", [True, False])
def test_an_ensemble_predicts_what_its_teachers_predict_alone(current: bool) -> None:
    ens = _ensemble()
    x, _ = _data(32, 1)
    preds = ens.predict(x, current_statistics=current)
    assert preds.shape == (32, 4)
    body = ens.body
    for i in range(len(ens)):
        alone = copy.deepcopy(body)
        alone.load_state_dict(ens.statistics[i], strict=False)
        alone.head = torch.nn.Linear(ens.weights.shape[2], 3)
        with torch.no_grad():
            alone.head.weight.copy_(ens.weights[i])
            alone.head.bias.copy_(ens.biases[i])
        teacher = Teacher("resnet10", (1, 12, 12), 3, alone, width=4, device="cpu")
        np.testing.assert_array_equal(teacher.predict(x, current_statistics=current), preds[:, i])


def test_an_ensemble_checkpoint_round_trips(tmp_path: Path) -> None:
    ens = _ensemble(3)
    save_ensemble(tmp_path / "e.pt", ens)
    back = load_members(tmp_path / "e.pt")
    assert isinstance(back, TeacherEnsemble) and len(back) == 3
    x, _ = _data(16, 2)
    for current in (True, False):
        np.testing.assert_array_equal(
            back.predict(x, current_statistics=current), ens.predict(x, current_statistics=current)
        )
    hashes = back.model_hashes
    assert hashes == ens.model_hashes and len(set(hashes)) == 3
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a capc"):
        load_members(tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="no model file at"):
        load_members(tmp_path / "missing.pt")


def test_a_party_votes_with_teachers_and_ensembles_alike() -> None:
    ens = _ensemble(3)
    single = Teacher("resnet10", (1, 12, 12), 3, ens.body, width=4, device="cpu")
    voters = Voters([single, ens])
    assert len(voters) == 4 and voters.single is None and Voters([single]).single is single
    assert len(voters.infos()) == 4
    x, _ = _data(8, 3)
    out = voters.predict(x, current_statistics=True)
    assert out.shape == (8, 4)
    np.testing.assert_array_equal(out[:, 1:], ens.predict(x, current_statistics=True))
    other = Teacher("mlp", (5,), 3, build("mlp", (5,), 3), device="cpu")
    with pytest.raises(ValueError, match="same inputs"):
        Voters([single, other])
    with pytest.raises(ValueError, match="at least one"):
        Voters([])


@pytest.mark.parametrize(("name", "params"), CASES, ids=IDS)
def test_a_record_moves_an_ensembles_counts_by_one_teachers_vote(
    name: str, params: dict[str, float]
) -> None:
    mech = build_mechanism(name, params)
    rng = np.random.default_rng(7)
    m, b = 5, 16
    preds = np.stack([predictions(mech, b, rng) for _ in range(m)], axis=1)
    for weight, frac in ((1.0, 8), (0.75, 8)):
        counts = mech.encode_ensemble_votes(preds, weight=weight, frac_bits=frac)
        each = sum(mech.encode_votes(preds[:, t], weight=weight, frac_bits=frac) for t in range(m))
        np.testing.assert_array_equal(counts, each)
        # A record sits in one teacher's data: retraining that teacher may change its
        # vote on every query to anything, and nothing else changes.
        changed = preds.copy()
        changed[:, 2] = predictions(mech, b, rng)
        moved = mech.encode_ensemble_votes(changed, weight=weight, frac_bits=frac).astype(
            np.float64
        ) - counts.astype(np.float64)
        one = mech.encode_votes(changed[:, 2], weight=weight, frac_bits=frac).astype(
            np.float64
        ) - mech.encode_votes(preds[:, 2], weight=weight, frac_bits=frac).astype(np.float64)
        np.testing.assert_array_equal(moved, one)
    # Vanishing: a party that sits a query out gives no vote from any of its teachers.
    mask = np.arange(b) % 2 == 0
    sat = mech.encode_ensemble_votes(preds, participation=mask)
    assert (sat[~mask] == 0).all() and (sat[mask] == mech.encode_ensemble_votes(preds)[mask]).all()
    # The party's cost for a round is one teacher's, at its weight, whatever m.
    answered = np.ones(mech.answer_shape(b), dtype=bool)
    assert mech.event(answered, 0.75) == mech.event(answered, 0.75)
    with pytest.raises(MechanismError, match="ensemble's predictions"):
        mech.encode_ensemble_votes(preds[:, 0])
