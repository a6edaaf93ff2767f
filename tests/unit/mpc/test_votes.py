"""Vote shares from several parties reconstruct the histogram; a relayed seed cannot be moved."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from capc.mechanisms import Mechanism, MechanismError, mechanism_class
from capc.mechanisms.tau import Tau
from capc.mpc import ring
from capc.mpc.sealing import SealError
from capc.mpc.votes import UnopenableSeedError, one_hot_votes, share_votes, student_share_sum
from capc.privacy import rdp


def test_shares_of_many_parties_sum_to_the_histogram() -> None:
    rng = np.random.default_rng(0)
    student = X25519PrivateKey.generate()
    pub = student.public_key().public_bytes_raw()
    preds = rng.integers(0, 10, (7, 64))
    guardian = np.zeros((64, 10), dtype=np.uint64)
    sealed = {}
    for i, p in enumerate(preds):
        share, box = share_votes(one_hot_votes(p, 10), pub, 3, f"h{i}")
        guardian += share
        sealed[f"h{i}"] = box
    hist = mech("gnmax", 10).summed_votes(preds.T).astype(np.uint64)
    np.testing.assert_array_equal(
        ring.reconstruct(guardian, student_share_sum(student, sealed, 3, (64, 10))), hist
    )


def test_seed_moved_to_another_party_or_round_fails() -> None:
    student = X25519PrivateKey.generate()
    _, box = share_votes(
        one_hot_votes(np.array([1]), 3), student.public_key().public_bytes_raw(), 3, "h1"
    )
    with pytest.raises(SealError):
        student_share_sum(student, {"h2": box}, 3, (1, 3))
    with pytest.raises(SealError):
        student_share_sum(student, {"h1": box}, 4, (1, 3))


def test_a_seed_that_does_not_open_names_its_party() -> None:
    student = X25519PrivateKey.generate()
    pub = student.public_key().public_bytes_raw()
    _, good = share_votes(one_hot_votes(np.array([1]), 3), pub, 3, "h1")
    _, other = share_votes(one_hot_votes(np.array([1]), 3), pub, 3, "h2")
    with pytest.raises(UnopenableSeedError) as err:
        student_share_sum(
            student, {"h1": good, "h2": other[:-1] + bytes([other[-1] ^ 1])}, 3, (1, 3)
        )
    assert err.value.party == "h2" and err.value.round_id == 3
    assert "h2" in str(err.value) and "h1" not in str(err.value)


def test_bad_predictions() -> None:
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        one_hot_votes(np.array([3]), 3)
    with pytest.raises(ValueError, match="integer"):
        one_hot_votes(np.array([0.5]), 3)
    with pytest.raises(ValueError, match="uint64"):
        share_votes(
            np.ones((2, 2)), X25519PrivateKey.generate().public_key().public_bytes_raw(), 1, "h"
        )


def mech(name: str, outputs: int, **params: float) -> Mechanism:
    return mechanism_class(name).from_params(outputs, {"sigma": 1.0, **params})


def test_encode_votes_for_every_mechanism() -> None:
    classes = np.array([2, 0, 1])
    np.testing.assert_array_equal(
        mech("gnmax", 3).encode_votes(classes, weight=1.5, frac_bits=8),
        np.eye(3, dtype=np.uint64)[classes] * np.uint64(384),
    )
    labels = np.array([[1, 0, 1], [0, 0, 0], [1, 1, 1]])
    binary = mech("binary", 3)
    encoded = binary.encode_votes(labels)
    assert encoded.dtype == np.uint64
    np.testing.assert_array_equal(encoded, labels.astype(np.uint64))
    power = mech("powerset", 3).encode_votes(labels)
    assert power.dtype == np.uint64
    assert power.shape == (3, 8) and list(power.argmax(axis=1)) == [5, 0, 7]
    assert (power.sum(axis=1) == 1).all()
    # Vanishing: a party that sits a query out sends zeros for it.
    sat_out = binary.encode_votes(labels, participation=np.array([True, True, False]))
    assert not sat_out[2].any() and (sat_out[0] == labels[0]).all()


@pytest.mark.parametrize(("tau", "weight"), [(1.0, 1.0), (1.5, 0.75), (0.6, 2.25)])
def test_tau_votes_in_fixed_point_keep_the_proven_sensitivity(tau: float, weight: float) -> None:
    """Every pair of encoded votes differs by at most weight * min(sqrt(2) tau, sqrt(k)) in l2."""
    k, frac = 5, 8
    every = ((np.arange(1 << k)[:, None] >> np.arange(k)) & 1).astype(np.int64)
    m = mech("tau", k, tau=tau)
    assert isinstance(m, Tau)
    votes = m.encode_votes(every, weight=weight, frac_bits=frac).astype(np.float64)
    votes /= 1 << frac
    assert (np.linalg.norm(votes, axis=1) <= weight * tau + 1e-12).all()
    diff = np.linalg.norm(votes[:, None, :] - votes[None, :, :], axis=2).max()
    bound = weight * rdp.tau_sensitivity(k, tau)
    # The mechanism charges exactly this sensitivity when all k labels are released.
    assert m.sensitivity(k) == pytest.approx(rdp.tau_sensitivity(k, tau))
    assert diff <= bound + 1e-12
    # The bound is nearly attained (two disjoint clipped votes), so the check has teeth.
    assert diff > 0.95 * min(bound, weight * np.sqrt(k))


def test_encode_votes_refuses_bad_input() -> None:
    with pytest.raises(MechanismError, match="0/1"):
        mech("binary", 2).encode_votes(np.array([[0, 2]]))
    with pytest.raises(MechanismError, match="shape"):
        mech("tau", 2, tau=1.0).encode_votes(np.array([1, 0]))
    with pytest.raises(MechanismError, match="tau: Field required"):
        mech("tau", 2)
    with pytest.raises(MechanismError, match="tau: Input should be greater than 0"):
        mech("tau", 2, tau=0.0)
    with pytest.raises(MechanismError, match="weight"):
        mech("gnmax", 2).encode_votes(np.array([1]), weight=-1.0)
    with pytest.raises(MechanismError, match=r"\[0, 2\)"):
        mech("gnmax", 2).encode_votes(np.array([2]))
    with pytest.raises(MechanismError, match="participation"):
        mech("binary", 2).encode_votes(np.array([[1, 0]]), participation=np.array([True, False]))
    with pytest.raises(MechanismError, match="unknown mechanism 'median'"):
        mechanism_class("median")
