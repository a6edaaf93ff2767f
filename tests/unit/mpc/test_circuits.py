"""Every circuit equals its plaintext function, in the clear and garbled."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

from capc.mechanisms import from_config
from capc.mechanisms.argmax import noisy_argmax
from capc.mpc import library as lib
from capc.mpc import ring
from capc.mpc.circuit import Circuit, CircuitBuilder, Party, Word
from capc.mpc.mechanism_circuits import (
    ConfidentGNMaxCircuit,
    LogitsToSharesCircuit,
    MultiLabelCircuit,
    round_noise,
)
from capc.mpc.session import LocalPair

L = 8
MOD = 1 << L


@pytest.fixture(scope="module")
def pair() -> Iterator[LocalPair]:
    yield LocalPair(timeout=60)


def signed(v: np.ndarray) -> np.ndarray:
    return ring.to_signed(v.astype(np.uint64), L)


def edge_words(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random words plus the edge cases: 0, 1, -1, the extremes of the signed range."""
    edges = np.array([0, 1, MOD - 1, MOD // 2 - 1, MOD // 2, MOD // 2 + 1], dtype=np.uint64)
    return np.concatenate([np.repeat(edges, len(edges)), rng.integers(0, MOD, n, dtype=np.uint64)])


def binary_circuit(
    name: str, fn: Callable[[CircuitBuilder, Word, Word], Word], out_width: int
) -> Circuit:
    c = CircuitBuilder(name)
    (x,) = c.input("x", Party.GARBLER, 1, L)
    (y,) = c.input("y", Party.EVALUATOR, 1, L)
    res = fn(c, x, y)
    assert len(res) == out_width
    c.output("z", Party.EVALUATOR, [res])
    return c.build()


def run_both(
    circuit: Circuit, pair: LocalPair, g: dict[str, np.ndarray], e: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Plain and garbled evaluation must agree; returns the outputs."""
    batch = next(iter(e.values())).shape[0]
    plain = circuit.evaluate_plain(g, e, batch)
    garbled = pair.run(circuit, g, e, batch)
    for name, value in garbled.evaluator.items():
        np.testing.assert_array_equal(
            value, plain[name], err_msg=f"{circuit.name}: evaluator output {name}"
        )
    for name, value in garbled.garbler.items():
        np.testing.assert_array_equal(
            value, plain[name], err_msg=f"{circuit.name}: garbler output {name}"
        )
    return plain


@pytest.mark.parametrize(
    ("name", "fn", "width", "reference"),
    [
        ("add", lambda c, x, y: lib.add(c, x, y), L, lambda x, y: (x + y) % MOD),
        ("sub", lambda c, x, y: lib.sub(c, x, y), L, lambda x, y: (x - y) % MOD),
        ("lt", lambda c, x, y: (lib.less_than(c, x, y),), 1, None),
        ("ge", lambda c, x, y: (lib.greater_equal(c, x, y),), 1, None),
        ("sign", lambda c, x, y: (lib.is_non_negative_sum(c, x, y),), 1, None),
    ],
)
def test_arithmetic(
    name: str,
    fn: Callable[[CircuitBuilder, Word, Word], Word],
    width: int,
    reference: Callable[[np.ndarray, np.ndarray], np.ndarray] | None,
    pair: LocalPair,
) -> None:
    rng = np.random.default_rng(0)
    x = edge_words(rng, 200)
    y = np.concatenate(
        [np.tile(x[:36].reshape(6, 6).T.ravel(), 1), rng.integers(0, MOD, 200, dtype=np.uint64)]
    )
    out = run_both(binary_circuit(name, fn, width), pair, {"x": x[:, None]}, {"y": y[:, None]})[
        "z"
    ][:, 0]
    if name in ("add", "sub"):
        assert reference is not None
        np.testing.assert_array_equal(out, reference(x, y))
        return
    sx, sy = signed(x), signed(y)
    if name == "sign":
        total = signed((x + y) % MOD)
        np.testing.assert_array_equal(out, (total >= 0).astype(np.uint64))
        return
    # Comparisons are exact wherever the difference fits in L bits.
    fits = np.abs(sx - sy) < MOD // 2
    expect = (sx < sy) if name == "lt" else (sx >= sy)
    np.testing.assert_array_equal(out[fits], expect[fits].astype(np.uint64))
    assert fits.sum() > 150


def test_argmax_ties_go_to_the_lowest_index(pair: LocalPair) -> None:
    k = 7
    c = CircuitBuilder("argmax")
    xs = c.input("x", Party.GARBLER, k, L)
    ys = c.input("y", Party.EVALUATOR, k, L)
    words = [lib.add(c, x, y) for x, y in zip(xs, ys, strict=True)]
    idx, best = lib.argmax(c, words)
    c.output("index", Party.EVALUATOR, [idx])
    c.output("max", Party.EVALUATOR, [best])
    c.output("maximum", Party.EVALUATOR, [lib.maximum(c, words)])
    circuit = c.build()
    rng = np.random.default_rng(1)
    values = rng.integers(-60, 60, (300, k))
    values[:50] = 0  # all tied
    values[50:100] = rng.integers(0, 3, (50, k))  # many ties
    values[100:110] = 63
    values[110:120] = -64
    y = rng.integers(0, MOD, values.shape, dtype=np.uint64)
    x = (values.astype(np.int64).view(np.uint64) - y) % MOD
    out = run_both(circuit, pair, {"x": x}, {"y": y})
    np.testing.assert_array_equal(out["index"][:, 0], np.argmax(values, axis=1))
    np.testing.assert_array_equal(signed(out["max"][:, 0]), values.max(axis=1))
    np.testing.assert_array_equal(out["maximum"], out["max"])


def test_mux_one_hot_and_increment(pair: LocalPair) -> None:
    c = CircuitBuilder("misc")
    (wx,) = c.input("x", Party.GARBLER, 1, L)
    (wy,) = c.input("y", Party.EVALUATOR, 1, L)
    sel = wy[0]
    c.output("mux", Party.EVALUATOR, [lib.mux(c, sel, wx, wy)])
    c.output("hot", Party.EVALUATOR, [(b,) for b in lib.one_hot_word(c, wx[:3], 6)])
    c.output("inc", Party.EVALUATOR, [lib.add_bit(c, wx, sel)])
    c.output("masked", Party.EVALUATOR, [lib.mask_word(c, sel, wx)])
    circuit = c.build()
    rng = np.random.default_rng(2)
    x = edge_words(rng, 100)
    y = rng.integers(0, MOD, x.size, dtype=np.uint64)
    out = run_both(circuit, pair, {"x": x[:, None]}, {"y": y[:, None]})
    s = (y & 1).astype(bool)
    np.testing.assert_array_equal(out["mux"][:, 0], np.where(s, y, x))
    idx = (x & 7).astype(np.int64)
    expect = np.zeros((x.size, 6), dtype=np.uint64)
    ok = idx < 6
    expect[np.flatnonzero(ok), idx[ok]] = 1
    np.testing.assert_array_equal(out["hot"], expect)
    np.testing.assert_array_equal(out["inc"][:, 0], (x + s) % MOD)
    np.testing.assert_array_equal(out["masked"][:, 0], np.where(s, x, 0))


def test_builder_folds_constants_and_drops_dead_gates() -> None:
    c = CircuitBuilder("fold")
    (x,) = c.input("x", Party.GARBLER, 1, 4)
    (y,) = c.input("y", Party.EVALUATOR, 1, 4)
    lib.add(c, x, y)  # unused
    zero = CircuitBuilder.const(0, 4)
    c.output("z", Party.EVALUATOR, [lib.add(c, x, zero)])
    circuit = c.build()
    assert circuit.num_and == 0  # adding a constant zero needs no carries
    out = circuit.evaluate_plain(
        {"x": np.array([[5]], dtype=np.uint64)}, {"y": np.array([[3]], dtype=np.uint64)}, 1
    )
    assert out["z"][0, 0] == 5


def shares_of(values: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(student, guardian) share sums of integer counts, with wrap-around in the ring."""
    student = rng.integers(0, 2**64 - 1, values.shape, dtype=np.uint64, endpoint=True)
    student[:4] = np.uint64(2**64 - 1)  # shares at the very top of the ring
    return student, values.astype(np.uint64) - student


@pytest.mark.parametrize("confident", [True, False])
def test_confident_gnmax_matches_the_plaintext_mechanism(confident: bool, pair: LocalPair) -> None:
    rng = np.random.default_rng(3)
    b, k, n = 256, 10, 50
    spec = ConfidentGNMaxCircuit(k, n, sigma=8.0, threshold=40.0, sigma1=30.0, confident=confident)
    mech = from_config(
        {"name": "confident-gnmax", "sigma": 8.0, "threshold": 40.0, "sigma1": 30.0}, k
    )
    hist = mech.summed_votes(rng.integers(0, k, (b, n)))
    hist[:8] = 0  # empty histograms: every count ties
    hist[8:16] = 0
    hist[8:16, 4] = n  # unanimous
    hist[16:24, :2] = n // 2  # exact ties between two classes
    eta1 = np.clip(rng.normal(0, spec.sigma1, b), -8 * spec.sigma1, 8 * spec.sigma1)
    eta2 = np.clip(rng.normal(0, spec.sigma, (b, k)), -8 * spec.sigma, 8 * spec.sigma)
    eta2[16:24] = 0.0  # the tie survives the noise: lowest index must win
    eta2[:4] = 8 * spec.sigma  # largest noise the circuit must hold
    student, guardian = shares_of(hist, rng)
    # Emptied rows total 0, unanimous rows n: each query's own voters' weight.
    g = spec.garbler_inputs(guardian, eta2, eta1 if confident else None, hist.sum(axis=1))
    e = spec.evaluator_inputs(student)
    out = run_both(spec.circuit(), pair, g, e)
    labels = spec.decode(out)
    if confident:
        ref, answered = mech.decide(hist, {"eta1": round_noise(eta1), "eta2": round_noise(eta2)})
        np.testing.assert_array_equal(labels, ref)
        np.testing.assert_array_equal(out["answered"][:, 0].astype(bool), answered)
        assert 0 < answered.sum() < b
    else:
        np.testing.assert_array_equal(labels, noisy_argmax(hist, round_noise(eta2)))
    # Exact two-way ties with no noise go to the lower index (when answered at all).
    assert set(labels[16:24].tolist()) <= {0, -1}
    if not confident:
        assert (labels[16:24] == 0).all()


def test_powerset_is_gnmax_over_subsets(pair: LocalPair) -> None:
    rng = np.random.default_rng(4)
    k, b, n = 3, 128, 20
    votes = (rng.random((b, n, k)) < 0.4).astype(np.float64)
    mech = from_config({"name": "powerset", "sigma": 4.0}, k)
    hist = mech.summed_votes(votes)
    spec = ConfidentGNMaxCircuit(1 << k, n, sigma=4.0, confident=False)
    noise = rng.normal(0, 4.0, hist.shape)
    student, guardian = shares_of(hist, rng)
    out = run_both(
        spec.circuit(), pair, spec.garbler_inputs(guardian, noise), spec.evaluator_inputs(student)
    )
    index = spec.decode(out)
    expect, _ = mech.decide(hist, {"eta2": round_noise(noise)})
    np.testing.assert_array_equal(((index[:, None] >> np.arange(k)) & 1).astype(np.int8), expect)


@pytest.mark.parametrize("tau_bits", [0, 8])
@pytest.mark.parametrize("confidence", [None, 6.0])
def test_multilabel_matches_the_plaintext_mechanism(
    tau_bits: int, confidence: float | None, pair: LocalPair
) -> None:
    rng = np.random.default_rng(5)
    b, k, n = 200, 6, 30
    if tau_bits:  # tau voting: clipped votes in fixed point
        counts = np.round(rng.random((b, k)) * n * 256) / 256
    else:
        counts = rng.integers(0, n + 1, (b, k)).astype(np.float64)
    counts[:5] = n / 2  # exactly at the decision threshold
    spec = MultiLabelCircuit(
        k,
        n,
        sigma=5.0,
        decision_threshold=n / 2,
        confidence_threshold=confidence,
        sigma1=4.0,
        frac_bits=max(4, tau_bits),
        share_frac_bits=tau_bits,
    )
    noise = rng.normal(0, 5.0, (b, k))
    noise[:5] = 0.0
    conf_noise = rng.normal(0, 4.0, (b, k))
    scaled = np.rint(counts * (1 << tau_bits)).astype(np.uint64)
    student, guardian = shares_of(scaled, rng)
    g = spec.garbler_inputs(guardian, noise, conf_noise if confidence is not None else None)
    out = run_both(spec.circuit(), pair, g, spec.evaluator_inputs(student))
    f = spec.frac_bits
    test = {} if confidence is None else {"threshold": confidence, "sigma1": 4.0}
    mech = from_config({"name": "binary", "sigma": 5.0, **test}, k)
    rounded = {"noise": round_noise(noise, f), "confidence": round_noise(conf_noise, f)}
    ref, _ = mech.decide(counts, rounded, n / 2)
    np.testing.assert_array_equal(spec.decode(out), ref)
    if confidence is None:  # counts exactly at the threshold with zero noise are positive
        assert (spec.decode(out)[:5] == 1).all()


def test_logits_to_shares(pair: LocalPair) -> None:
    rng = np.random.default_rng(6)
    b, k, bits = 300, 10, 24
    spec = LogitsToSharesCircuit(k, bits)
    logits = rng.integers(-(2**20), 2**20, (b, k))
    logits[:10] = 7  # all tied
    logits[10:20, 3] = 2**22 - 1  # largest positive value
    mask = rng.integers(0, 1 << bits, (b, k), dtype=np.uint64)
    share = rng.integers(0, 2**64 - 1, (b, k), dtype=np.uint64, endpoint=True)
    masked = ring.reduce(logits.astype(np.int64).view(np.uint64) + mask, bits)
    out = run_both(
        spec.circuit(), pair, spec.garbler_inputs(mask, share), spec.evaluator_inputs(masked)
    )
    hot = np.eye(k, dtype=np.uint64)[np.argmax(logits, axis=1)]
    np.testing.assert_array_equal(out["vote_share"] + share, hot)


def test_mechanism_specs_reject_bad_inputs() -> None:
    spec = ConfidentGNMaxCircuit(4, 10, sigma=2.0, threshold=5.0, sigma1=3.0)
    good = np.zeros((3, 4), dtype=np.uint64)
    with pytest.raises(ValueError, match="shape"):
        spec.garbler_inputs(good, np.zeros((3, 5)), np.zeros(3))
    with pytest.raises(ValueError, match="NaN"):
        spec.garbler_inputs(good, np.full((3, 4), np.nan), np.zeros(3))
    with pytest.raises(ValueError, match="standard deviations"):
        spec.garbler_inputs(good, np.full((3, 4), 100.0), np.zeros(3))
    with pytest.raises(ValueError, match="uint64"):
        spec.evaluator_inputs(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="eta1"):
        spec.garbler_inputs(good, np.zeros((3, 4)))
    with pytest.raises(ValueError, match="num_classes"):
        ConfidentGNMaxCircuit(1, 10, sigma=1.0)
    circuit = spec.circuit()
    with pytest.raises(ValueError, match="exactly"):
        circuit.input_bits(Party.EVALUATOR, {"wrong": good}, 3)
    with pytest.raises(ValueError, match="wider"):
        circuit.input_bits(Party.EVALUATOR, {"shares": np.full((3, 4), 2**40, dtype=np.uint64)}, 3)


def test_multilabel_per_query_thresholds_for_vanishing(pair: LocalPair) -> None:
    """Who votes varies by query: the majority threshold follows the voters of each query."""
    rng = np.random.default_rng(9)
    b, k, n = 120, 4, 10
    voters = rng.integers(1, n + 1, b)
    counts = np.minimum(rng.integers(0, n + 1, (b, k)), voters[:, None]).astype(np.float64)
    theta = voters / 2.0
    spec = MultiLabelCircuit(k, n, sigma=2.0, decision_threshold=n / 2)
    noise = rng.normal(0, 2.0, (b, k))
    student, guardian = shares_of(counts.astype(np.uint64), rng)
    g = spec.garbler_inputs(guardian, noise, decision_threshold=theta)
    out = run_both(spec.circuit(), pair, g, spec.evaluator_inputs(student))
    expect = (counts + round_noise(noise) >= theta[:, None]).astype(np.int8)
    np.testing.assert_array_equal(spec.decode(out), expect)
    # The student's spec (any threshold within max_votes) builds the same circuit.
    assert MultiLabelCircuit(k, n, sigma=2.0, decision_threshold=0.0).bits == spec.bits
    with pytest.raises(ValueError, match="decision thresholds"):
        spec.garbler_inputs(guardian, noise, decision_threshold=np.full(b, n + 1.0))
    with pytest.raises(ValueError, match="decision_threshold"):
        MultiLabelCircuit(k, n, sigma=2.0, decision_threshold=n + 1.0)
