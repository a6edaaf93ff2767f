"""capc.he.masking against a deviating student: what it decrypts is uniform whatever it sends.

The attacks run against the answering party's own code
(:func:`services.answerer.encrypted.evaluate_and_mask`); each has a control
without the mask that shows the attack works, so a pass means the mask
stopped it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from capc.he.batched import BatchedEvaluator, encrypt_batch
from capc.he.ckks import PublicContext, StudentKeys
from capc.he.masking import (
    SlotDecoder,
    _cos_table,
    decoder,
    lift,
    mask_batched,
    masked_batched,
    negated,
    student_values,
    to_logits,
    uniform_residues,
)
from capc.he.params import CkksParams
from capc.he.plan import Plan, compile_model
from capc.models.registry import build
from capc.mpc.mechanism_circuits import LogitsToSharesCircuit
from capc.mpc.session import LocalPair
from capc.privacy.randomness import SecureRandom
from services.answerer.encrypted import evaluate_and_mask
from tests.unit.he import probes

PARAMS = CkksParams()
DIM = 30
#: Probe scale: logits up to ~2^30, far above the old 2^26 slot mask, still decryptable.
LAM = 2.0**17


@pytest.fixture(scope="module")
def plan() -> Plan:
    torch.manual_seed(0)
    return compile_model(build("he-mlp", (DIM,), 2, width=16).eval(), (DIM,))


@pytest.fixture(scope="module")
def keys() -> StudentKeys:
    return StudentKeys(PARAMS)


@pytest.fixture(scope="module")
def party(keys: StudentKeys) -> PublicContext:
    return PublicContext.from_bytes(keys.public_bytes(), expected=PARAMS)


@pytest.fixture(scope="module")
def evaluator(party: PublicContext, plan: Plan) -> BatchedEvaluator:
    return BatchedEvaluator(party, plan)


def slots(keys: StudentKeys, outputs: list, count: int) -> np.ndarray:  # type: ignore[type-arg]
    """What a student reads from K batched ciphertexts: (count, K) real slot values."""
    return np.stack([keys.decrypt(ct)[:count].real for ct in outputs], axis=1)


def test_uniform_residues_are_exact_and_in_range() -> None:
    rng = SecureRandom.from_seed("residues")
    moduli = (3, 5, (1 << 43) - 57)
    r = uniform_residues(rng, moduli, 60_000)
    assert r.dtype == np.uint64 and r.shape == (3, 60_000)
    for row, q in enumerate(moduli):
        assert int(r[row].max()) < q
    # small moduli: each value equally often (chi-square, 2 and 4 degrees of freedom)
    for row, q in ((0, 3), (1, 5)):
        counts = np.bincount(r[row].astype(np.int64), minlength=q)
        expected = len(r[row]) / q
        assert ((counts - expected) ** 2 / expected).sum() < 25.0
    # a 43-bit prime: the top 4 bits of q are not all ones, so a biased reduction
    # (uint64 mod q) would skew them; rejection sampling does not
    top = (r[2] >> np.uint64(39)).astype(np.int64)
    counts = np.bincount(top, minlength=16)
    assert ((counts - counts.mean()) ** 2 / counts.mean()).sum() < 45.0


def test_lift_matches_big_integer_arithmetic(party: PublicContext) -> None:
    moduli = party.moduli(PARAMS.output_level)
    r = uniform_residues(SecureRandom.from_seed("lift"), moduli, 64)
    exact_total = 1
    for q in moduli:
        exact_total *= q
    got = lift(r, moduli)
    for i in range(64):
        # Garner's mixed radix, independent of lift's CRT sum
        x, radix = 0, 1
        for row, q in enumerate(moduli):
            digit = ((int(r[row, i]) - x) * pow(radix, -1, q)) % q
            x, radix = x + digit * radix, radix * q
        assert all(x % q == int(r[row, i]) for row, q in enumerate(moduli))
        assert int(got[i]) == (x << 64) // exact_total
    # x and -x lift to values that add up to 0 or -1 modulo 2^64
    both = lift(r, moduli) + lift(negated(r, moduli), moduli)
    assert set(both.tolist()) <= {0, 2**64 - 1}


def test_cosine_table_is_exact_and_the_same_everywhere() -> None:
    n = PARAMS.poly_modulus_degree
    table = _cos_table(n, 2**44, 20).astype(np.int64)
    ref = np.rint(2.0**24 * np.cos(np.pi * np.arange(2 * n) / n)).astype(np.int64)
    np.testing.assert_array_equal(table, ref)
    assert table[0] == 2**24 and table[n] == -(2**24) and table[n // 2] == 0


def test_decoding_is_linear_modulo_2_64(party: PublicContext) -> None:
    dec = SlotDecoder(PARAMS, party.moduli(PARAMS.output_level))
    dec.shift = np.uint64(0)  # look at the full 64-bit sums
    rng = SecureRandom.from_seed("linear")
    a, b = rng.uint64((2, PARAMS.poly_modulus_degree)), rng.uint64((2, PARAMS.poly_modulus_degree))
    np.testing.assert_array_equal(dec.decode(a + b, 300), dec.decode(a, 300) + dec.decode(b, 300))
    # the cached decoder is the same matrix
    np.testing.assert_array_equal(decoder(party).matrix(0, 8), dec.matrix(0, 8))


@pytest.mark.parametrize("scale", [1.0, LAM])
def test_the_decrypted_polynomial_is_uniform_whatever_the_queries(
    keys: StudentKeys, party: PublicContext, evaluator: BatchedEvaluator, scale: float
) -> None:
    x = scale * np.random.default_rng(1).normal(size=(PARAMS.slots, DIM))
    outputs = evaluator.evaluate(encrypt_batch(keys, x))
    moduli = party.moduli(PARAMS.output_level)
    clean = lift(np.stack([keys.decrypt_coefficients(ct) for ct in outputs]), moduli)
    mask_batched(party, outputs, len(x), SecureRandom())
    seen = lift(np.stack([keys.decrypt_coefficients(ct) for ct in outputs]), moduli)

    def top_byte_chi2(v: np.ndarray) -> float:
        counts = np.bincount((v >> np.uint64(56)).astype(np.int64).ravel(), minlength=256)
        return float(((counts - counts.mean()) ** 2 / counts.mean()).sum())

    # 255 degrees of freedom: a uniform sample stays below 360 except with p ~ 1e-5
    assert top_byte_chi2(seen) < 360.0
    assert top_byte_chi2(clean) > 2_000.0  # the control: unmasked logits are far from uniform
    for k in range(len(outputs)):
        assert (
            abs(np.corrcoef(seen[k].astype(np.float64), clean[k].astype(np.float64))[0, 1]) < 0.06
        )


def test_the_scaled_probe_attack_recovers_nothing(
    keys: StudentKeys, party: PublicContext, evaluator: BatchedEvaluator, plan: Plan
) -> None:
    x = probes.probe_batch(DIM, LAM)
    estimates, controls = [], []
    for _ in range(4):  # averaging rounds beats down a mask of bounded size; not this one
        cts = encrypt_batch(keys, x)
        controls.append(probes.recover(slots(keys, evaluator.evaluate(cts), len(x)), DIM, LAM))
        outputs, masks = evaluate_and_mask(party, evaluator, cts, len(x), SecureRandom())
        assert masks.shape == (len(x), plan.num_classes)
        estimates.append(probes.recover(slots(keys, outputs, len(x)), DIM, LAM))
        # a stronger reader: the exact decoding of its own share
        exact = to_logits(masked_batched(keys, outputs, len(x)), PARAMS)
        estimates.append(probes.recover(exact, DIM, LAM))
    assert probes.correlation(np.mean(controls, axis=0), plan) > 0.999
    assert abs(probes.correlation(np.mean(estimates[0::2], axis=0), plan)) < probes.chance(plan)
    assert abs(probes.correlation(np.mean(estimates[1::2], axis=0), plan)) < probes.chance(plan)


def test_a_batch_of_one_with_every_slot_filled_yields_one_query(
    keys: StudentKeys, party: PublicContext, evaluator: BatchedEvaluator, plan: Plan
) -> None:
    x = np.random.default_rng(2).normal(size=(PARAMS.slots, DIM)) * 64.0
    truth = plan.forward(x)
    cts = encrypt_batch(keys, x)
    control = slots(keys, evaluator.evaluate(cts), PARAMS.slots)
    np.testing.assert_allclose(control, truth, rtol=1e-3, atol=1.0)  # the slots do hold logits
    outputs, masks = evaluate_and_mask(party, evaluator, cts, 1, SecureRandom())
    assert masks.shape == (1, plan.num_classes)
    # the 2PC takes the declared query only, and gets its vote right
    spec = LogitsToSharesCircuit(plan.num_classes, PARAMS.share_bits)
    share = SecureRandom().uint64((1, plan.num_classes))
    y = masked_batched(keys, outputs, 1)
    res = LocalPair().run(
        spec.circuit(), spec.garbler_inputs(masks, share), spec.evaluator_inputs(y), 1
    )
    hot = res.evaluator["vote_share"] + share
    assert hot.shape == (1, plan.num_classes) and int(hot.argmax()) == int(truth[0].argmax())
    # every other slot, read either way, is independent of its query's logits
    chance = 4.4 / np.sqrt(PARAMS.slots - 1)
    read = slots(keys, outputs, PARAMS.slots)
    exact = to_logits(student_values(keys, outputs, PARAMS.slots), PARAMS).T
    for k in range(plan.num_classes):
        for seen in (read, exact):
            r = np.corrcoef(seen[1:, k], truth[1:, k])[0, 1]
            assert abs(r) < chance, (k, r)
