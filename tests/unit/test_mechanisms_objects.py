"""Mechanism objects: vote encoding, the plaintext oracle against the real circuit, overrides.

For every registered mechanism, a round is run as the services run it: each
teacher encodes its votes, splits them into a student share (expanded from a
seed) and a guardian share, the guardian draws the mechanism's noise and
builds its circuit inputs, the student builds its own, the circuit is
evaluated (in the clear and garbled) and both parties decode. The oracle,
given the same noise and the reconstructed histogram, must give the same
labels and answered mask bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from capc.mechanisms import MECHANISMS, Mechanism, MechanismError, from_config, mechanism_class
from capc.mechanisms.base import MAX_PARAMETER, NOT_ANSWERED, CircuitSpec, Noise
from capc.mpc import ring
from capc.mpc.mechanism_circuits import ConfidentGNMaxCircuit, MultiLabelCircuit
from capc.mpc.session import LocalPair
from capc.privacy import events
from capc.privacy.randomness import SecureRandom

#: Small valid parameters for every registered mechanism, with and without a confidence test
#: where it is optional. Multi-label mechanisms run with k = 3 labels, single-label ones with 4
#: classes. A new mechanism fails ``test_every_mechanism_has_test_parameters`` until added.
CONFIGS: dict[str, list[dict[str, float]]] = {
    "gnmax": [{"sigma": 2.0}],
    "confident-gnmax": [{"sigma": 2.0, "threshold": 5.0, "sigma1": 3.0}],
    "robust-confident-gnmax": [{"sigma": 2.0, "threshold": 5.0, "sigma1": 3.0}],
    "binary": [{"sigma": 1.5}, {"sigma": 1.5, "threshold": 1.0, "sigma1": 1.25}],
    "tau": [
        {"sigma": 1.5, "tau": 1.2},
        {"sigma": 1.5, "tau": 1.2, "threshold": 1.0, "sigma1": 1.25},
    ],
    "powerset": [{"sigma": 2.0}, {"sigma": 2.0, "threshold": 4.0, "sigma1": 2.0}],
    # No noise and no per-query charge (post-processing of DP-SGD training): its own
    # tests are in test_dp_trained_rounds.py; the noise and event tests here do not apply.
    "dp-trained": [{}],
}
#: The mechanisms that add noise and charge per query.
NOISY = sorted(n for n in CONFIGS if not mechanism_class(n).trained_teachers_only)
CASES = [(name, params) for name in NOISY for params in CONFIGS[name]]
IDS = [f"{name}-{'confident' if 'sigma1' in p else 'plain'}" for name, p in CASES]


def outputs_of(name: str) -> int:
    return 3 if mechanism_class(name).multi_label else 4


def build(name: str, params: dict[str, float]) -> Mechanism:
    return mechanism_class(name).from_params(outputs_of(name), params)


def predictions(mech: Mechanism, batch: int, rng: np.random.Generator) -> NDArray[np.int64]:
    """One teacher's predictions: classes (B,) or 0/1 labels (B, k)."""
    if mech.multi_label:
        return (rng.random((batch, mech.outputs)) < 0.5).astype(np.int64)
    return rng.integers(0, mech.outputs, batch)


def test_every_mechanism_has_test_parameters() -> None:
    assert set(CONFIGS) == set(MECHANISMS)
    for name, cls in MECHANISMS.items():
        assert cls.name == name
        for params in CONFIGS[name]:
            mech = build(name, params)
            assert mech.confident == ("sigma1" in params)
            # A configuration round-trips through its JSON form.
            assert from_config(mech.to_config(), mech.outputs) == mech


# -- votes -------------------------------------------------------------------


@pytest.mark.parametrize(("name", "params"), CASES, ids=IDS)
def test_encode_votes_shapes_and_values(name: str, params: dict[str, float]) -> None:
    mech = build(name, params)
    rng = np.random.default_rng(0)
    b = 40
    pred = predictions(mech, b, rng)
    unit = mech.unit_votes(pred)
    assert unit.shape == (b, mech.vote_width)
    assert ((unit >= 0) & (unit <= 1)).all()
    plain = mech.encode_votes(pred)
    assert plain.dtype == np.uint64 and plain.shape == (b, mech.vote_width)
    if mech.per_label:  # one column per label, the label's (clipped) vote
        np.testing.assert_array_equal(unit > 0, pred.astype(bool))
    else:  # one-hot over the vote columns (classes, or label subsets for powerset)
        np.testing.assert_array_equal(unit.sum(axis=1), np.ones(b))
        index = pred if not mech.multi_label else (pred << np.arange(mech.outputs)).sum(axis=1)
        np.testing.assert_array_equal(unit.argmax(axis=1), index)
    if not mech.fractional_votes:  # integer votes encode exactly with no fractional bits
        np.testing.assert_array_equal(plain, unit.astype(np.uint64))
    # Weighted, in fixed point: floor(unit * w * 2**f), never above the unrounded vote.
    w, f = 1.37, 8
    weighted = mech.encode_votes(pred, weight=w, frac_bits=f)
    np.testing.assert_array_equal(weighted, np.floor(unit * w * 2**f).astype(np.uint64))
    assert (weighted.astype(np.float64) / 2**f <= unit * w).all()
    # A party sitting a query out sends zeros for it; the rest is unchanged.
    mask = rng.random(b) < 0.5
    sat = mech.encode_votes(pred, weight=w, frac_bits=f, participation=mask)
    np.testing.assert_array_equal(sat[mask], weighted[mask])
    assert not sat[~mask].any()
    # Summed votes are the plain histogram of several teachers.
    many = np.stack([predictions(mech, b, rng) for _ in range(5)], axis=1)
    np.testing.assert_allclose(
        mech.summed_votes(many),
        sum(mech.unit_votes(np.take(many, i, axis=1)) for i in range(5)),
    )
    for weight in (-1.0, math.nan, math.inf):
        with pytest.raises(MechanismError, match="weight"):
            mech.encode_votes(pred, weight=weight)
    for frac_bits in (-1, 25):
        with pytest.raises(MechanismError, match="frac_bits"):
            mech.encode_votes(pred, frac_bits=frac_bits)
    with pytest.raises(MechanismError, match="participation"):
        mech.encode_votes(pred, participation=np.ones(b + 1, dtype=bool))


# -- the oracle against the circuit -----------------------------------------


@pytest.fixture(scope="module")
def pair() -> Iterator[LocalPair]:
    yield LocalPair(timeout=60)


@dataclass
class Round:
    """One round of ``parties`` teachers as the services run it."""

    mech: Mechanism
    spec: CircuitSpec
    hist: NDArray[np.float64]
    noise: Noise
    theta: NDArray[np.float64] | None
    garbler_in: dict[str, NDArray[np.uint64]]
    evaluator_in: dict[str, NDArray[np.uint64]]


def make_round(
    mech: Mechanism,
    rng: np.random.Generator,
    batch: int,
    parties: int,
    weights: NDArray[np.float64],
    frac_bits: int,
    participation: NDArray[np.bool_] | None,
    per_query_theta: bool,
    seed: str,
) -> Round:
    guardian_sum = np.zeros((batch, mech.vote_width), dtype=np.uint64)
    student_sum = np.zeros_like(guardian_sum)
    plain_sum = np.zeros_like(guardian_sum)
    for i in range(parties):
        votes = mech.encode_votes(
            predictions(mech, batch, rng),
            weight=float(weights[i]),
            frac_bits=frac_bits,
            participation=None if participation is None else participation[i],
        )
        share_seed = rng.bytes(ring.SEED_BYTES)
        guardian_sum += ring.share(votes, share_seed)
        student_sum += ring.expand_seed(share_seed, votes.shape)
        plain_sum += votes
    np.testing.assert_array_equal(ring.reconstruct(guardian_sum, student_sum), plain_sum)
    hist = plain_sum.astype(np.float64) / (1 << frac_bits)
    if participation is None:
        voters = np.full(batch, float(weights.sum()))
    else:
        voters = (participation * weights[:, None]).sum(axis=0)
    vote_total = float(weights.sum())
    spec = mech.circuit(parties * float(weights.max()), vote_total, frac_bits)
    # The student does not know the guardian's vote total; it builds the same circuit.
    assert mech.circuit(parties * float(weights.max()), None, frac_bits).circuit().name == (
        spec.circuit().name
    )
    noise = mech.draw_noise(batch, SecureRandom.from_seed(seed))
    theta: NDArray[np.float64] | None = None
    if mech.per_label:
        theta = voters / 2.0 if per_query_theta else np.full(batch, vote_total / 2.0)
    # Each query's counts total the weight of the teachers who voted on it (the checks).
    g_in = mech.garbler_inputs(
        spec, guardian_sum, noise, theta if per_query_theta else None, voters
    )
    return Round(mech, spec, hist, noise, theta, g_in, spec.evaluator_inputs(student_sum))


def check_round(r: Round, pair: LocalPair | None) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """Evaluate ``r`` (in the clear, and garbled when ``pair`` is given); compare with the oracle."""
    batch = r.hist.shape[0]
    circuit = r.spec.circuit()
    plain = circuit.evaluate_plain(r.garbler_in, r.evaluator_in, batch)
    if pair is not None:
        garbled = pair.run(circuit, r.garbler_in, r.evaluator_in, batch)
        for outs in (garbled.evaluator, garbled.garbler):
            for key, value in outs.items():
                np.testing.assert_array_equal(value, plain[key], err_msg=key)
        evaluator_out, garbler_out = garbled.evaluator, garbled.garbler
    else:
        names = {o.name for o in circuit.outputs}
        evaluator_out = {k: plain[k] for k in names}
        garbler_out = {k: plain[k] for k in names if k == "answered"}
    labels = r.mech.decode(r.spec, evaluator_out)
    answered = r.mech.answered(r.spec, garbler_out, batch)
    want_labels, want_answered = r.mech.oracle(
        r.hist, r.noise, frac_bits=r.spec.frac_bits, decision_threshold=r.theta
    )
    np.testing.assert_array_equal(labels, want_labels)
    np.testing.assert_array_equal(answered, want_answered)
    assert answered.shape == r.mech.answer_shape(batch)
    # Labels are withheld exactly where not answered.
    shaped = answered if labels.ndim == answered.ndim else answered[:, None]
    assert ((labels == NOT_ANSWERED) == ~np.broadcast_to(shaped, labels.shape)).all()
    return labels, answered


@pytest.mark.parametrize(("name", "params"), CASES, ids=IDS)
def test_oracle_equals_the_garbled_circuit(
    name: str, params: dict[str, float], pair: LocalPair
) -> None:
    mech = build(name, params)
    rng = np.random.default_rng(sum(name.encode()))
    batch, parties = 96, 7
    frac = 8 if mech.fractional_votes else 0
    r = make_round(mech, rng, batch, parties, np.ones(parties), frac, None, False, name)
    labels, answered = check_round(r, pair)
    if mech.confident:  # the test has teeth: some answered, some not
        assert 0 < answered.sum() < answered.size
    assert (labels != NOT_ANSWERED).any()


@pytest.mark.parametrize(("name", "params"), CASES, ids=IDS)
@pytest.mark.parametrize("mode", ["weighting", "vanishing"])
def test_oracle_equals_the_circuit_under_personalized_votes(
    name: str, params: dict[str, float], mode: str
) -> None:
    """Weighted votes in fixed point (weights on the shares' grid), or parties sitting
    queries out with the per-label decision threshold following each query's voters."""
    mech = build(name, params)
    rng = np.random.default_rng(len(name) + len(params) + len(mode))
    batch, parties, frac = 200, 6, 8
    for trial in range(3):
        if mode == "weighting":
            grid = float(1 << frac)
            # Even multiples of the grid step: half the vote total stays on the grid (an odd
            # total is test_the_oracle_replays_half_an_odd_weighted_vote_total).
            weights = np.floor(rng.uniform(0.25, 3.0, parties) * grid / 2) * 2 / grid
            participation = None
        else:
            weights = np.ones(parties)
            participation = rng.random((parties, batch)) < 0.7
        r = make_round(
            mech,
            rng,
            batch,
            parties,
            weights,
            frac,
            participation,
            mode == "vanishing",
            f"{name}-{mode}-{trial}",
        )
        check_round(r, None)


def test_argmax_mechanisms_take_no_decision_threshold() -> None:
    for name, params in CASES:
        mech = build(name, params)
        spec = mech.circuit(5.0, 5.0, 0)
        noise = mech.draw_noise(2, SecureRandom.from_seed(name))
        shares = np.zeros((2, mech.vote_width), dtype=np.uint64)
        if isinstance(spec, ConfidentGNMaxCircuit):
            with pytest.raises(MechanismError, match="no decision threshold"):
                mech.garbler_inputs(spec, shares, noise, np.full(2, 2.5))
        else:
            assert isinstance(spec, MultiLabelCircuit)
            with pytest.raises(MechanismError, match="decision threshold"):
                mech.decide(np.zeros((2, mech.outputs)), noise)


def test_the_oracle_replays_a_threshold_off_the_circuit_grid() -> None:
    """A threshold that is not a multiple of the circuit's grid step (2**-frac_bits): the
    circuit compares with the threshold rounded to the grid, so the oracle must too (or the
    mechanism must refuse such a threshold). Here max(h) + eta1 = 5 < 5.01 = T."""
    mech = build("confident-gnmax", {"sigma": 2.0, "threshold": 5.01, "sigma1": 3.0})
    spec = mech.circuit(10.0, 10.0, 0)
    hist = np.array([[5.0, 0.0, 0.0, 0.0]])
    noise = {"eta2": np.zeros((1, 4)), "eta1": np.zeros(1)}
    student = np.array([[7, 0, 0, 0]], dtype=np.uint64)
    g_in = mech.garbler_inputs(spec, hist.astype(np.uint64) - student, noise)
    out = spec.circuit().evaluate_plain(g_in, spec.evaluator_inputs(student), 1)
    labels = mech.decode(spec, {k: out[k] for k in ("label", "answered")})
    want, _ = mech.oracle(hist, noise, frac_bits=spec.frac_bits)
    np.testing.assert_array_equal(labels, want)


def test_the_oracle_replays_half_an_odd_weighted_vote_total() -> None:
    """Weighted votes sit on the shares' grid (2**-8), so half their total can fall between
    two grid points; the circuit rounds it (ties to even), the oracle must decide alike.
    Here the total weight is 769/256, theta = 769/512 and the count is 1.5 = 384/256."""
    mech = build("binary", {"sigma": 1.5})
    frac = 8
    total = 769 / 256
    spec = mech.circuit(4.0, total, frac)
    count = np.array([[1.5, 0.0, 3.0]])
    noise = {"noise": np.zeros((1, 3))}
    fixed = (count * (1 << frac)).astype(np.uint64)
    student = np.array([[11, 12, 13]], dtype=np.uint64)
    g_in = mech.garbler_inputs(spec, fixed - student, noise)
    out = spec.circuit().evaluate_plain(g_in, spec.evaluator_inputs(student), 1)
    labels = mech.decode(spec, {"labels": out["labels"]})
    want, _ = mech.oracle(count, noise, frac_bits=spec.frac_bits, decision_threshold=total / 2)
    np.testing.assert_array_equal(labels, want)


# -- overrides -----------------------------------------------------------------


@pytest.mark.parametrize(("name", "params"), CASES, ids=IDS)
def test_tightened_only_raises_raisable_parameters(name: str, params: dict[str, float]) -> None:
    mech = build(name, params)
    current = mech.params.model_dump()
    assert mech.tightened({}) is mech
    assert mech.tightened({k: 0.0 for k in current}) is mech  # 0 keeps the task's value
    for key in mech.raisable:
        if key != "sigma" and not mech.confident:
            continue  # threshold and sigma1 only mean something with the test
        up = float(current[key]) + 1.5
        raised = mech.tightened({key: up})
        assert raised.params.model_dump() == {**current, key: up}
        assert type(raised) is type(mech) and raised.outputs == mech.outputs
        assert mech.params.model_dump() == current  # the task's mechanism is unchanged
        if float(current[key]) > 0:
            with pytest.raises(MechanismError, match=f"{key} = .* is below the task's"):
                mech.tightened({key: float(current[key]) / 2})
        for bad, why in (
            (math.nan, "finite"),
            (math.inf, "finite"),
            (2 * MAX_PARAMETER, "at most"),
        ):
            with pytest.raises(MechanismError, match=why):
                mech.tightened({key: bad})
        with pytest.raises(MechanismError, match="at most"):
            mech.tightened({key: MAX_PARAMETER * (1 + 1e-9)})
        assert mech.tightened({key: MAX_PARAMETER}).params.model_dump()[key] == MAX_PARAMETER
    for key, value in current.items():
        if key in mech.raisable:
            continue
        # A fixed parameter: the same value is a no-op, anything else is refused.
        assert mech.tightened({key: float(value)}) is mech
        for other in (float(value) + 1.0, float(value) / 2):
            with pytest.raises(MechanismError, match=f"the task fixes {key}"):
                mech.tightened({key: other})
    with pytest.raises(MechanismError, match="no parameter 'temperature'"):
        mech.tightened({"temperature": 3.0})


def test_tau_is_fixed_and_sigma_is_raisable() -> None:
    tau = build("tau", {"sigma": 1.5, "tau": 1.2})
    assert "tau" not in tau.raisable and "sigma" in tau.raisable
    with pytest.raises(MechanismError, match="the task fixes tau"):
        tau.tightened({"tau": 2.0})
    with pytest.raises(MechanismError, match="the task fixes tau"):
        tau.tightened({"sigma": 2.0, "tau": 0.5})
    gn = build("gnmax", {"sigma": 2.0})
    with pytest.raises(MechanismError, match="no parameter 'sigma1'"):
        gn.tightened({"sigma1": 9.0})


@pytest.mark.parametrize("name", NOISY)
def test_from_params_refuses_bad_parameters(name: str) -> None:
    good = CONFIGS[name][-1]
    cls = mechanism_class(name)
    k = outputs_of(name)
    bad: list[tuple[dict[str, Any], str]] = [
        ({**good, "temperature": 1.0}, "temperature: Extra inputs"),
        ({**good, "sigma": math.nan}, "sigma"),
        ({**good, "sigma": math.inf}, "sigma"),
        ({**good, "sigma": -1.0}, "sigma: Input should be greater than 0"),
        ({**good, "sigma": 0.0}, "sigma: Input should be greater than 0"),
        ({**good, "sigma": 2 * MAX_PARAMETER}, "sigma: Input should be less than or equal"),
        ({**good, "sigma": "loud"}, "sigma"),
        ({k: v for k, v in good.items() if k != "sigma"}, "sigma: Field required"),
    ]
    for params, why in bad:
        with pytest.raises(MechanismError, match=why):
            cls.from_params(k, params)
    for outputs in (0, -1, 1 if not cls.multi_label else 0, cls.max_outputs + 1, 2.5, True):
        with pytest.raises(MechanismError, match="takes"):
            cls.from_params(outputs, good)  # type: ignore[arg-type]
    with pytest.raises(MechanismError, match="unknown mechanism"):
        from_config({"name": name.upper(), **good}, k)
    with pytest.raises(MechanismError, match="needs a name"):
        from_config(good, k)


def test_powerset_threshold_needs_a_test() -> None:
    with pytest.raises(MechanismError, match="sigma1"):
        build("powerset", {"sigma": 2.0, "threshold": 3.0})


# -- privacy events --------------------------------------------------------------


def per_query_mu2(name: str, params: dict[str, float], k: int) -> float:
    """The worst-case mu**2 of one query at weight 1, from each mechanism's analysis."""
    sigma, sigma1 = params["sigma"], params.get("sigma1", 0.0)
    test = 0.0
    if name in ("gnmax", "confident-gnmax"):
        answer = 2.0 / sigma**2  # a vote change moves two counts by one
        test = 1.0 / sigma1**2 if sigma1 else 0.0  # the maximum moves by one
    elif name in ("robust-confident-gnmax", "powerset"):
        answer = 2.0 / sigma**2
        test = 2.0 / sigma1**2 if sigma1 else 0.0  # every count noised: two move by one
    else:
        sens2 = k if name == "binary" else min(2.0 * params["tau"] ** 2, k)
        answer = sens2 / sigma**2
        test = sens2 / sigma1**2 if sigma1 else 0.0  # the test sees all k labels
    return answer + test


@pytest.mark.parametrize(("name", "params"), CASES, ids=IDS)
def test_events_charge_what_happened(name: str, params: dict[str, float]) -> None:
    mech = build(name, params)
    q = 5
    one = per_query_mu2(name, params, mech.outputs)
    assert _mu2(mech.per_query()) == pytest.approx(one, rel=1e-12)
    worst = mech.worst_case(q)
    assert worst == mech.event(np.ones(mech.answer_shape(q), dtype=bool))
    assert _mu2(worst) == pytest.approx(q * one, rel=1e-12)
    assert all(isinstance(leaf, events.GaussianEvent) for leaf, _ in events.leaves(worst))
    # A weight w scales every sensitivity by w: mu**2 by w**2.
    assert _mu2(mech.worst_case(q, weight=1.5)) == pytest.approx(2.25 * q * one, rel=1e-12)
    assert events.is_noop(mech.worst_case(q, weight=0.0))
    assert events.is_noop(mech.worst_case(0))
    if mech.confident:
        nothing = mech.event(np.zeros(mech.answer_shape(q), dtype=bool))
        # Every test is charged, no answer is.
        tests = one - per_query_mu2(
            name, {"sigma": params["sigma"], **_no_test(params)}, mech.outputs
        )
        assert _mu2(nothing) == pytest.approx(q * tests, rel=1e-12)
    else:
        with pytest.raises(MechanismError, match="answers every query"):
            mech.event(np.zeros(mech.answer_shape(q), dtype=bool))
    with pytest.raises(MechanismError, match="shape"):
        mech.event(np.ones((q, mech.outputs + 1), dtype=bool))


def _no_test(params: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in params.items() if k not in ("sigma1", "threshold")}


def test_per_label_events_charge_the_released_labels() -> None:
    """A query releasing m of its k labels costs sensitivity sqrt(m) (binary) or
    min(sqrt(2) tau, sqrt(m)) (tau) for its answers; the test covers all k."""
    answered = np.array([[True, True, True], [True, False, False], [False, False, False]])
    for name, params in CASES:
        mech = build(name, params)
        if not (mech.per_label and mech.confident):
            continue
        sigma, sigma1, k = params["sigma"], params["sigma1"], mech.outputs

        def sens2(m: int, name: str = name, params: dict[str, float] = params) -> float:
            return float(m) if name == "binary" else min(2.0 * params["tau"] ** 2, float(m))

        want = 3 * sens2(k) / sigma1**2 + (sens2(3) + sens2(1)) / sigma**2
        assert _mu2(mech.event(answered)) == pytest.approx(want, rel=1e-12)


def _mu2(event: events.DpEvent) -> float:
    return math.fsum(
        n * leaf.mu**2 for leaf, n in events.leaves(event) if isinstance(leaf, events.GaussianEvent)
    )


def test_scaled_noise_scales_every_sigma() -> None:
    for name, params in CASES:
        mech = build(name, params)
        loud = mech.scaled_noise(2.0)
        for key, value in params.items():
            want = 2.0 * value if key.startswith("sigma") else value
            assert loud.params.model_dump()[key] == want
        assert _mu2(loud.per_query()) == pytest.approx(_mu2(mech.per_query()) / 4)


def test_a_job_cannot_switch_on_a_test_the_task_has_off() -> None:
    binary = from_config({"name": "binary", "sigma": 1.0}, 5)
    for key in ("sigma1", "threshold"):
        with pytest.raises(MechanismError, match="cannot switch it on"):
            binary.tightened({key: 0.5})
    # A threshold of 0 on a mechanism whose test is on may be raised: more private.
    confident = from_config({"name": "confident-gnmax", "sigma": 1, "threshold": 0, "sigma1": 2}, 5)
    assert confident.tightened({"threshold": 3.0}).params.model_dump()["threshold"] == 3.0
