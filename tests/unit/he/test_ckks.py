"""capc.he: parameters, contexts, ciphertext checks, both evaluation paths, masking."""

from __future__ import annotations

import numpy as np
import pytest
import tenseal.sealapi as seal
import torch

from capc.he.batched import BatchedEvaluator, decrypt_batch, encrypt_batch
from capc.he.ckks import MAGIC, HeError, PublicContext, StudentKeys, to_bytes
from capc.he.masking import mask_batched, mask_single, masked_batched, masked_single, to_logits
from capc.he.params import CkksParams
from capc.he.plan import compile_model
from capc.he.single import SingleEvaluator, SingleLayout, encrypt_query
from capc.models.registry import build
from capc.mpc.mechanism_circuits import LogitsToSharesCircuit
from capc.mpc.session import LocalPair
from capc.privacy.randomness import SecureRandom

PARAMS = CkksParams()
SHAPE = (30,)


@pytest.fixture(scope="module")
def plan():  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = build("he-mlp", SHAPE, 3, width=16).eval()
    with torch.no_grad():  # larger logits than at initialisation, as after training
        model.head.weight.mul_(8.0)
    return compile_model(model, SHAPE)


@pytest.fixture(scope="module")
def layout(plan):  # type: ignore[no-untyped-def]
    return SingleLayout.for_plan(plan, PARAMS.slots)


@pytest.fixture(scope="module")
def keys(layout):  # type: ignore[no-untyped-def]
    return StudentKeys(PARAMS, layout.rotations)


@pytest.fixture(scope="module")
def party(keys):  # type: ignore[no-untyped-def]
    return PublicContext.from_bytes(keys.public_bytes(), expected=PARAMS)


def queries(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, *SHAPE))


def test_params_follow_the_128_bit_table() -> None:
    assert PARAMS.total_bits <= 218
    assert PARAMS.decoding_gain_bits == 14 and PARAMS.max_logit == 2**13
    with pytest.raises(ValueError, match="128-bit bound"):
        CkksParams(poly_modulus_degree=4096)
    with pytest.raises(ValueError, match="poly_modulus_degree"):
        CkksParams(poly_modulus_degree=1000)
    # too little room between the output scale and the output modulus for an exact decoding
    with pytest.raises(ValueError, match="slot-decoding gain of 2\\^10"):
        CkksParams(output_scale_bits=45)
    with pytest.raises(ValueError, match="frac_bits < share_bits"):
        CkksParams(share_bits=10, frac_bits=10)
    with pytest.raises(ValueError, match="unknown CKKS parameters"):
        CkksParams.from_dict({"poly_modulus_degree": 8192, "secret": 1})
    # the old magnitude-bounded mask is gone; a task that still names it is told so
    with pytest.raises(ValueError, match="mask_bits is no longer a CKKS parameter"):
        CkksParams.from_dict({"mask_bits": 26})
    assert CkksParams.from_dict(PARAMS.to_dict()) == PARAMS


def test_compile_refuses_layers_without_an_encrypted_form() -> None:
    with pytest.raises(ValueError, match="BatchNorm1d has no encrypted evaluation"):
        compile_model(build("mlp", SHAPE, 3), SHAPE)
    with pytest.raises(ValueError, match="no padding"):
        compile_model(build("small-cnn", (1, 28, 28), 10), (1, 28, 28))


def test_plan_matches_torch() -> None:
    torch.manual_seed(1)
    model = build("he-cnn", (1, 28, 28), 10).eval()
    plan = compile_model(model, (1, 28, 28))
    x = np.random.default_rng(1).random((4, 1, 28, 28))
    ref = model(torch.tensor(x, dtype=torch.float32)).detach().double().numpy()
    np.testing.assert_allclose(plan.forward(x), ref, atol=1e-4)
    layout = SingleLayout.for_plan(plan, PARAMS.slots)
    assert layout.input_ciphertexts == 4
    assert len(layout.rotations) <= 32


def test_public_context_carries_no_secret_key(keys, party) -> None:  # type: ignore[no-untyped-def]
    data = keys.public_bytes()
    assert to_bytes(keys._secret)[-4096:] not in data
    assert party.context_id == keys.context_id
    assert not hasattr(party, "decryptor")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: b"garbage" + d, "bad header"),
        (lambda d: d[: len(d) // 2], "truncated"),
        (lambda d: d + b"x", "trailing"),
    ],
)
def test_malformed_contexts_are_refused(keys, mutate, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(HeError, match=message):
        PublicContext.from_bytes(mutate(keys.public_bytes()))


def test_context_limits_and_parameters(keys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(HeError, match="over the limit"):
        PublicContext.from_bytes(keys.public_bytes(), max_bytes=1000)
    with pytest.raises(HeError, match="differ from the task"):
        PublicContext.from_bytes(keys.public_bytes(), expected=CkksParams(share_bits=23))
    header = b'{"params": {"poly_modulus_degree": 8192}, "rotations": "x"}'
    forged = MAGIC + b"".join(len(p).to_bytes(8, "little") + p for p in (header, b"", b"", b""))
    with pytest.raises(HeError, match="malformed"):
        PublicContext.from_bytes(forged)


def test_bad_ciphertexts_are_refused(keys, party) -> None:  # type: ignore[no-untyped-def]
    good = to_bytes(keys.encrypt(np.ones(4)))
    with pytest.raises(HeError, match="does not belong"):
        party.load_ciphertext(b"\x00" * 100)
    with pytest.raises(HeError, match="at most"):
        party.load_ciphertext(good + b"\x00" * (5 * 2**20))
    with pytest.raises(HeError, match="level"):
        party.load_ciphertext(good, level=PARAMS.output_level)
    pt = keys.encode([1.0], PARAMS.input_level, 2.0**40)
    far = seal.Ciphertext(keys.context)
    keys.encryptor.encrypt_symmetric(pt, far)
    with pytest.raises(HeError, match="scale"):
        party.load_ciphertext(to_bytes(far), scale=2.0**PARAMS.scale_bits)
    other = StudentKeys(
        CkksParams(poly_modulus_degree=16384, coeff_bits=(60, 40, 40, 60), output_scale_bits=60)
    )
    with pytest.raises(HeError, match="does not belong"):
        party.load_ciphertext(to_bytes(other.encrypt(np.ones(4))))
    with pytest.raises(HeError, match="finite"):
        keys.encrypt(np.array([np.nan]))


def test_batched_path_matches_plaintext(keys, party, plan) -> None:  # type: ignore[no-untyped-def]
    x = queries(200)
    ev = BatchedEvaluator(party, plan)
    with pytest.raises(HeError, match="input ciphertexts"):
        ev.evaluate([])
    out = ev.evaluate(encrypt_batch(keys, x))
    assert all(party.level(ct) == PARAMS.output_level for ct in out)
    got = decrypt_batch(keys, out, len(x))
    ref = plan.forward(x)
    np.testing.assert_allclose(got, ref, atol=1e-2)
    assert (got.argmax(1) == ref.argmax(1)).mean() >= 0.99


def test_single_path_matches_plaintext(keys, party, plan, layout) -> None:  # type: ignore[no-untyped-def]
    ev = SingleEvaluator(party, plan)
    x = queries(8, seed=2)
    # Key switching adds noise with outliers in single slots, and its size varies
    # with the keys. Rotating before each rescale keeps the largest logit error at
    # 0.0081 and the mean per key set at 0.0048 (30 key sets x 8 queries); rescaling
    # first gave up to 0.039 and means up to 0.020, failing these bounds in 9 of 20.
    errors = []
    for q in x:
        out = ev.evaluate(encrypt_query(keys, layout, q))
        got = keys.decrypt(out)[: plan.num_classes].real
        want = plan.forward(q[None])[0]
        np.testing.assert_allclose(got, want, atol=2.5e-2)
        errors.append(np.abs(got - want).max())
    assert np.mean(errors) < 1e-2
    with pytest.raises(HeError, match="ciphertexts"):
        ev.evaluate([])


def test_zero_and_tiny_weights_evaluate_on_both_paths(keys, party) -> None:  # type: ignore[no-untyped-def]
    # weights that encode to the zero plaintext (a zero row, a zero block, values far
    # below one step of the scale) would make SEAL refuse the product as transparent
    torch.manual_seed(1)
    model = build("he-mlp", SHAPE, 3, width=16).eval()
    first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    with torch.no_grad():
        first.weight[0].zero_()
        first.weight[1].fill_(1e-12)
        first.weight[2:, :8].zero_()
        first.weight[2:, 8:10].fill_(1e-13)
    sparse = compile_model(model, SHAPE)
    x = queries(8, seed=5)
    ref = sparse.forward(x)
    got = decrypt_batch(keys, BatchedEvaluator(party, sparse).evaluate(encrypt_batch(keys, x)), 8)
    np.testing.assert_allclose(got, ref, atol=1e-2)
    layout = SingleLayout.for_plan(sparse, PARAMS.slots)
    out = SingleEvaluator(party, sparse).evaluate(encrypt_query(keys, layout, x[0]))
    np.testing.assert_allclose(keys.decrypt(out)[:3].real, ref[0], atol=5e-2)


def test_single_path_needs_the_rotation_keys(plan) -> None:  # type: ignore[no-untyped-def]
    bare = StudentKeys(PARAMS)
    with pytest.raises(HeError, match="lacks rotation keys"):
        SingleEvaluator(PublicContext.from_bytes(bare.public_bytes()), plan)


def test_masked_logits_recombine_in_2pc_on_both_layouts(keys, party, plan, layout) -> None:  # type: ignore[no-untyped-def]
    x = queries(PARAMS.slots, seed=3)
    ref = plan.forward(x)
    out = BatchedEvaluator(party, plan).evaluate(encrypt_batch(keys, x))
    masks = mask_batched(party, out, len(x), SecureRandom())
    seen = masked_batched(keys, out, len(x))
    # student value - party mask is the logit in fixed point, for every query
    np.testing.assert_allclose(to_logits(seen - masks, PARAMS), ref, atol=5e-3)
    # ... and the student's values alone are uniform in the share ring
    assert abs(seen.astype(np.float64).mean() / 2**PARAMS.share_bits - 0.5) < 0.02
    for k in range(ref.shape[1]):
        assert abs(np.corrcoef(seen[:, k].astype(np.float64), ref[:, k])[0, 1]) < 0.07
    # the logits-to-shares circuit removes the mask inside the 2PC
    spec = LogitsToSharesCircuit(plan.num_classes, PARAMS.share_bits)
    share = SecureRandom().uint64((64, plan.num_classes))
    res = LocalPair().run(
        spec.circuit(),
        spec.garbler_inputs(masks[:64], share),
        spec.evaluator_inputs(seen[:64]),
        64,
    )
    hot = res.evaluator["vote_share"] + share
    assert (hot.sum(axis=1) == 1).all()
    np.testing.assert_array_equal(hot.argmax(axis=1), ref[:64].argmax(axis=1))
    # single-query layout: slots 0..K-1 of each query's output
    ev = SingleEvaluator(party, plan)
    outs = [ev.evaluate(encrypt_query(keys, layout, q)) for q in x[:4]]
    single_masks = mask_single(party, outs, 3, SecureRandom())
    got = to_logits(masked_single(keys, outs, 3) - single_masks, PARAMS)
    np.testing.assert_allclose(got, ref[:4], atol=2.5e-2)


def test_masks_are_fresh_per_answer(keys, party, plan, layout) -> None:  # type: ignore[no-untyped-def]
    ev = SingleEvaluator(party, plan)
    q = queries(1, seed=4)[0]
    seen = []
    for _ in range(2):
        out = ev.evaluate(encrypt_query(keys, layout, q))
        mask = mask_single(party, [out], plan.num_classes, SecureRandom())
        got = masked_single(keys, [out], plan.num_classes)
        np.testing.assert_allclose(
            to_logits(got - mask, PARAMS)[0], plan.forward(q[None])[0], atol=5e-2
        )
        seen.append(keys.decrypt_coefficients(out))
    # the same query answered twice decrypts to unrelated polynomials
    assert (seen[0] != seen[1]).mean() > 0.99


def test_to_logits_reads_signed_fixed_point() -> None:
    p = CkksParams()
    unit = 1 << p.frac_bits
    v = np.array(
        [0, unit, (1 << p.share_bits) - unit, (1 << (p.share_bits - 1)) - 1], dtype=np.uint64
    )
    np.testing.assert_allclose(to_logits(v, p), [0.0, 1.0, -1.0, p.max_logit - 1 / unit])
    # bits above the share ring are ignored, as the ring reduction does
    np.testing.assert_allclose(to_logits(v + np.uint64(1 << 40), p), to_logits(v, p))
