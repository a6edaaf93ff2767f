"""Vote validity proofs: honest votes pass, every kind of invalid vote is caught, and the
proven shares reconstruct the counts in the circuit's ring."""

from __future__ import annotations

import os

import numpy as np
import pytest

from capc.mechanisms import mechanism_class
from capc.mpc import validity as vp


def counts_of(preds: np.ndarray, width: int) -> np.ndarray:
    return np.stack([(preds == j).sum(axis=1) for j in range(width)], axis=1)


def check(rel: vp.VoteRelation, bits: list[np.ndarray], constant: np.ndarray) -> np.ndarray:
    """Share, prove and verify every party's bits; the guardian's accept mask."""
    names = [f"hospital-{i}" for i in range(len(bits))]
    batch = bits[0].shape[0]
    g_x, g_p, s_x, s_p = [], [], [], []
    for b in bits:
        seed = os.urandom(16)
        xg, pg = vp.guardian_shares(rel, b, seed)
        xs, ps = vp.student_shares(seed, rel, batch)
        g_x.append(xg)
        g_p.append(pg)
        s_x.append(xs)
        s_p.append(ps)
    ch = vp.Challenge.draw(os.urandom(24))
    g = vp.verifier_share(rel, ch, names, np.stack(g_x), np.stack(g_p), constant)
    s = vp.verifier_share(rel, ch, names, np.stack(s_x), np.stack(s_p))
    return vp.accept(rel, ch, names, g, s)


def test_field_multiplication_is_exact() -> None:
    rng = np.random.default_rng(1)
    a = rng.integers(0, vp.P, 2000, dtype=np.uint64)
    b = rng.integers(0, vp.P, 2000, dtype=np.uint64)
    a[:2] = vp.P - 1
    b[:2] = vp.P - 1
    want = [int(x) * int(y) % vp.P for x, y in zip(a, b, strict=True)]
    assert vp.field_mul(a, b).tolist() == want


@pytest.mark.parametrize("teachers", [1, 3])
def test_honest_ensembles_pass_and_deviations_are_caught(teachers: int) -> None:
    rng = np.random.default_rng(teachers)
    rel = vp.VoteRelation(10, teachers)
    batch = 64
    honest = [rel.encode(counts_of(rng.integers(0, 10, (batch, teachers)), 10)) for _ in range(3)]
    stuffed = np.zeros((batch, rel.elements), dtype=np.uint64)
    stuffed[:, 7 * rel.nbits] = 400  # "400 votes for class 7": not a bit
    short = honest[0].copy()
    short[5] = 0  # a query with no vote at all: the counts do not total the teachers
    double = honest[1].copy()
    double[9, 3 * rel.nbits] = 1  # one teacher votes twice
    double[9, 4 * rel.nbits] = 1
    constant = np.full((6, batch), teachers, dtype=np.uint64)
    ok = check(rel, [*honest, stuffed, short, double], constant)
    assert ok.tolist() == [True, True, True, False, False, False]


def test_a_party_sitting_out_must_vote_zero() -> None:
    rel = vp.VoteRelation(4, 1)
    participation = np.array([1, 0, 1, 0])
    counts = np.zeros((4, 4), dtype=np.int64)
    counts[[0, 2], [1, 3]] = 1
    good = rel.encode(counts, participation)
    sneaky = rel.encode(np.eye(4, dtype=np.int64))  # votes where it sits out
    ok = check(rel, [good, sneaky], np.stack([participation, participation]).astype(np.uint64))
    assert ok.tolist() == [True, False]


def test_multilabel_counts_are_bounded_by_the_teachers() -> None:
    rel = vp.VoteRelation(5, 2, complement=True)
    rng = np.random.default_rng(4)
    counts = rng.integers(0, 2, (32, 2, 5)).sum(axis=1)
    good = rel.encode(counts)
    over = good.copy()
    over[0, : rel.nbits] = 1  # count 3 > 2 teachers, complement bits unchanged
    ok = check(rel, [good, over], np.full((2, 32), 2, dtype=np.uint64))
    assert ok.tolist() == [True, False]


def test_a_forged_student_message_fails_the_check() -> None:
    rel = vp.VoteRelation(3, 1)
    bits = rel.encode(np.eye(3, dtype=np.int64)[[0, 1, 2, 0]])
    seed = os.urandom(16)
    xg, pg = vp.guardian_shares(rel, bits, seed)
    xs, ps = vp.student_shares(seed, rel, 4)
    ch = vp.Challenge.from_bytes(vp.Challenge.draw(os.urandom(24)).to_bytes())
    g = vp.verifier_share(rel, ch, ["h"], xg[None], pg[None], np.ones((1, 4), dtype=np.uint64))
    s = vp.verifier_share(rel, ch, ["h"], xs[None], ps[None])
    assert vp.accept(rel, ch, ["h"], g, s).all()
    forged = vp.VerifierShare(s.wire, vp.field_add(s.combined, 1))
    assert not vp.accept(rel, ch, ["h"], g, forged).any()
    # A check computed for another party's name does not carry over.
    assert not vp.accept(rel, ch, ["other"], g, s).any()


def test_proven_shares_reconstruct_the_histogram_in_the_ring() -> None:
    rng = np.random.default_rng(7)
    rel = vp.VoteRelation(6, 2)
    batch, parties, weight = 128, 5, 3
    guardian = np.zeros((batch, 6), dtype=np.uint64)
    student = np.zeros((batch, 6), dtype=np.uint64)
    hist = np.zeros((batch, 6), dtype=np.int64)
    for _ in range(parties):
        counts = counts_of(rng.integers(0, 6, (batch, 2)), 6)
        hist += weight * counts
        seed = os.urandom(16)
        xg, _ = vp.guardian_shares(rel, rel.encode(counts), seed)
        xs, _ = vp.student_shares(seed, rel, batch)
        guardian = vp.field_add(guardian, vp.vote_shares(rel, xg, weight))
        student = vp.field_add(student, vp.vote_shares(rel, xs, weight))
    ring = vp.ring_shares(guardian, student=False) + vp.ring_shares(student, student=True)
    np.testing.assert_array_equal(ring.view(np.int64), hist)


def test_invalid_encodings_are_refused() -> None:
    rel = vp.VoteRelation(3, 2)
    with pytest.raises(vp.ValidityError, match="total"):
        rel.encode(np.array([[1, 0, 0]]))
    with pytest.raises(vp.ValidityError, match="lie in"):
        rel.encode(np.array([[3, -1, 0]]))
    with pytest.raises(vp.ValidityError, match="exceeds"):
        vp.VoteRelation(4096, 1)
    with pytest.raises(vp.ValidityError, match="24 bytes"):
        vp.Challenge.from_bytes(b"short")


@pytest.mark.parametrize("n", [1, 7, 513])
def test_dot_rows_is_exact_modulo_p(n: int) -> None:
    """Every row of the one float64 product equals exact integer arithmetic mod p."""
    rng = np.random.default_rng(n)
    c = rng.integers(0, vp.P, (5, n), dtype=np.uint64)
    x = rng.integers(0, vp.P, (9, n), dtype=np.uint64)
    exact = [
        [sum(int(a) * int(b) for a, b in zip(ck, xr, strict=True)) % vp.P for ck in c] for xr in x
    ]
    np.testing.assert_array_equal(vp.dot_rows(c, x), np.array(exact, dtype=np.uint64))
    np.testing.assert_array_equal(vp.dot(c[0], x), np.array(exact, dtype=np.uint64)[:, 0])


# -- tau voting: per-label counts on a grid, with an L2 norm bound ------------------------
TAU_LABELS = 5


def tau_relation(teachers: int, tau: float = 1.5) -> vp.VoteRelation:
    mech = mechanism_class("tau").from_params(TAU_LABELS, {"sigma": 1, "tau": tau})
    rel = mech.vote_relation(teachers)
    if rel is None:
        raise AssertionError("tau voting has a proof statement")
    return rel


def tau_counts(predictions: np.ndarray, tau: float = 1.5) -> np.ndarray:
    """An honest party's counts: its teachers' (B, m, k) 0/1 predictions encoded on the grid
    the way the answering service encodes them."""
    mech = mechanism_class("tau").from_params(TAU_LABELS, {"sigma": 1, "tau": tau})
    votes = mech.encode_ensemble_votes(predictions, frac_bits=mech.vote_grid_bits)
    return votes.astype(np.int64)


def elements(rel: vp.VoteRelation, counts: np.ndarray, slack: np.ndarray) -> np.ndarray:
    """A deviating party's shared elements for ``counts`` (which may break the statement),
    with the complements that satisfy the per-label constraints and the given ``slack``:
    what it would share to pass every check it can pass."""
    shifts = np.arange(rel.nbits)
    cols = [counts, rel.max_count - counts]
    bits = [((v[:, :, None] >> shifts) & 1).reshape(len(counts), -1) for v in cols]
    sl = (slack[:, None] >> np.arange(rel.slack_bits)) & 1
    return np.concatenate([*bits, sl, counts * counts], axis=1).astype(np.uint64)


@pytest.mark.parametrize("teachers", [1, 2])
def test_every_honest_tau_vote_is_a_valid_one(teachers: int) -> None:
    """All 2^k label patterns of every teacher: the statement never refuses an honest party."""
    patterns = (np.arange(1 << TAU_LABELS)[:, None] >> np.arange(TAU_LABELS)) & 1
    idx = np.stack(np.meshgrid(*[np.arange(len(patterns))] * teachers), -1).reshape(-1, teachers)
    preds = patterns[idx]  # (B, m, k)
    rel = tau_relation(teachers)
    counts = tau_counts(preds)
    x = rel.encode(counts)
    constant = np.full((1, len(x)), teachers, dtype=np.uint64)
    assert check(rel, [x], constant).all()


def test_a_tau_vote_that_skews_one_label_is_caught() -> None:
    """The attack of issue 41 (+9a on the target label, -a on the others: the total of an
    honest vote) and its variants that stay inside the field: every one fails."""
    rel = tau_relation(2)
    batch = 16
    rng = np.random.default_rng(41)
    honest = rel.encode(tau_counts(rng.integers(0, 2, (batch, 2, TAU_LABELS))))
    a = 128
    # Negative counts: written as field elements, -a is p - a, which is no bit pattern.
    skew = np.zeros((batch, rel.elements), dtype=np.uint64)
    skew[:, : rel.nbits] = honest[:, : rel.nbits]
    for j in range(1, TAU_LABELS):
        skew[:, j * rel.nbits] = np.uint64(vp.P - a)
    skew[:, 0] = np.uint64(9 * a)
    # Every label at the teachers' full count: per label valid, the norm not (2 x 256
    # on each of 5 labels is 2 x 256 x sqrt(5) > 2 x 256 x 1.5); the party lies about
    # the squares so that they fit the bound.
    full = np.full((batch, TAU_LABELS), rel.max_count, dtype=np.int64)
    lying = elements(rel, full, np.zeros(batch, dtype=np.int64))
    lying[:, rel.bits :] = 0
    lying[:, rel.bits] = rel.norm_bound
    # ... or states the squares honestly and a slack that wraps modulo p.
    squares = (full * full).sum(axis=1)
    wrapped = elements(rel, full, np.zeros(batch, dtype=np.int64))
    sbits = slice(2 * TAU_LABELS * rel.nbits, rel.bits)
    wrapped[:, sbits] = 0
    wrapped[:, rel.bits - 1] = np.uint64((rel.norm_bound - int(squares[0])) % vp.P)
    # A count above the teachers' (3 x 256 for 2 teachers) on one label, the others zero,
    # norm within the bound: the per-label bound catches it.
    over = np.zeros((batch, TAU_LABELS), dtype=np.int64)
    over[:, 0] = rel.max_count + a
    tall = elements(rel, np.minimum(over, rel.max_count), np.zeros(batch, dtype=np.int64))
    tall[:, : rel.nbits] = ((over[:, :1] >> np.arange(rel.nbits)) & 1).astype(np.uint64)
    constant = np.full((5, batch), 2, dtype=np.uint64)
    ok = check(rel, [honest, skew, lying, wrapped, tall], constant)
    assert ok.tolist() == [True, False, False, False, False]


def test_tau_counts_past_the_norm_are_refused_by_an_honest_encoder() -> None:
    rel = tau_relation(1, tau=1.0)
    with pytest.raises(vp.ValidityError, match="L2 norm"):
        rel.encode(np.array([[256, 256, 0, 0, 0]]))
    with pytest.raises(vp.ValidityError, match="lie in"):
        rel.encode(np.array([[257, 0, 0, 0, 0]]))
    with pytest.raises(vp.ValidityError, match="per-label"):
        vp.VoteRelation(5, 1, grid_bits=8, tau=1.0)


def test_a_tau_party_sitting_out_must_vote_zero() -> None:
    rel = tau_relation(1)
    participation = np.array([1, 0, 1, 0])
    counts = np.zeros((4, TAU_LABELS), dtype=np.int64)
    counts[[0, 2], [1, 3]] = 256
    good = rel.encode(counts, participation)
    sneaky = rel.encode(counts + 100 * (1 - participation[:, None]))
    ok = check(rel, [good, sneaky], np.stack([participation, participation]).astype(np.uint64))
    assert ok.tolist() == [True, False]


def test_proven_tau_shares_reconstruct_the_votes_in_the_ring() -> None:
    rng = np.random.default_rng(3)
    rel = tau_relation(2)
    batch, parties, weight = 64, 4, 1
    guardian = np.zeros((batch, TAU_LABELS), dtype=np.uint64)
    student = np.zeros((batch, TAU_LABELS), dtype=np.uint64)
    hist = np.zeros((batch, TAU_LABELS), dtype=np.int64)
    for _ in range(parties):
        counts = tau_counts(rng.integers(0, 2, (batch, 2, TAU_LABELS)))
        hist += counts
        seed = os.urandom(16)
        xg, _ = vp.guardian_shares(rel, rel.encode(counts), seed)
        xs, _ = vp.student_shares(seed, rel, batch)
        guardian = vp.field_add(guardian, vp.vote_shares(rel, xg, weight))
        student = vp.field_add(student, vp.vote_shares(rel, xs, weight))
    ring = vp.ring_shares(guardian, student=False) + vp.ring_shares(student, student=True)
    np.testing.assert_array_equal(ring.view(np.int64), hist)


@pytest.mark.parametrize(
    ("teachers", "kwargs"),
    [
        (1, {}),
        (7, {}),
        (1, {"complement": True}),
        (1, {"complement": True, "grid_bits": 8, "tau": 3.0}),
        (1, {"complement": True, "grid_bits": 8, "tau": 1.0}),
        (4, {"complement": True, "grid_bits": 8, "tau": 2.0}),
    ],
)
def test_max_width_is_where_a_relation_stops_fitting(
    teachers: int, kwargs: dict[str, object]
) -> None:
    w = vp.max_width(teachers, **kwargs)  # type: ignore[arg-type]
    assert 1 <= w <= vp.MAX_ELEMENTS
    assert vp.VoteRelation(w, teachers, **kwargs).elements <= vp.MAX_ELEMENTS  # type: ignore[arg-type]
    with pytest.raises(vp.ValidityError, match="exceeds 512"):
        vp.VoteRelation(w + 1, teachers, **kwargs)  # type: ignore[arg-type]


def test_max_width_of_the_shipped_statements() -> None:
    # One-hot over 512 classes (Powerset's 2**9 subsets), k-hot over 256 labels, tau over
    # 25 labels at tau 3 and 26 at tau 1 (issue 41's limits).
    assert vp.max_width(1) == 512
    assert vp.max_width(1, complement=True) == 256
    assert vp.max_width(1, complement=True, grid_bits=8, tau=3.0) == 25
    assert vp.max_width(1, complement=True, grid_bits=8, tau=1.0) == 26
    assert vp.max_width(1, complement=True, grid_bits=8, tau=float("nan")) == 0
