"""Canaries: training records given a random wrong label, and the attack that guesses it.

For each canary the auditor draws two distinct wrong classes (y', y'') of
its true class uniformly and trains with y'. Since the pair is unordered
to the attacker and the order uniform, this is the game of
:mod:`capc.audit.bounds`: the canary's bit is whether y' or y'' was used.

The attack sees only what is released: the model (its class
probabilities on the canary's input) and, where the canary was a query
of a labelling service, the released label. It guesses y' or y'' where
the release points at one of them, and abstains otherwise:

- a released label equal to y' or y'' is taken as the guess;
- otherwise, if the model's most likely class is y' or y'', that one;
- otherwise no guess.

The rule is fixed before the attack runs and reads no true label.

Where a mechanism releases real-valued vectors (ALIBI's noisy one-hot
labels), two more attacks read them directly: :func:`guess_by_score` at the
likelihood ratio's extreme, and :func:`guess_by_support`, which reads the
floating-point representation (Mironov 2012): a float release e_y + noise
puts the label's coordinate in the image of v = fl(1.0 + x), and other
coordinates often outside it. Every rule here is a function of the release
alone, so :mod:`capc.audit.bounds` applies to it whatever its accuracy.
:func:`guess_offset` is the same attack on a release known to be one of two
values plus noise (a sanitised data-dependent epsilon of two neighbouring
vote sets): the value that produced a float release always survives the
round trip, a neighbour's often does not.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from capc.audit.bounds import EmpiricalEpsilon, empirical_epsilon

NO_LABEL = -1


@dataclass(frozen=True)
class Canaries:
    """``index`` (M,) of the canary records; ``true`` their real classes; ``planted`` the
    label they were trained with (y'); ``alternative`` the other candidate (y'')."""

    index: NDArray[np.int64]
    true: NDArray[np.int64]
    planted: NDArray[np.int64]
    alternative: NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.index)

    def to_arrays(self) -> dict[str, NDArray[np.int64]]:
        return {
            "index": self.index,
            "true": self.true,
            "planted": self.planted,
            "alternative": self.alternative,
        }


def plant(
    labels: NDArray[np.integer],
    classes: int,
    index: NDArray[np.integer],
    rng: np.random.Generator,
) -> tuple[NDArray[np.int64], Canaries]:
    """Labels with the records ``index`` turned into canaries, and the canaries.

    ``rng`` is the auditor's own generator (the canaries are the experiment's
    design, not privacy noise)."""
    y = np.asarray(labels, dtype=np.int64).copy()
    idx = np.asarray(index, dtype=np.int64)
    if classes < 3:
        raise ValueError("a canary needs two wrong classes: at least 3 classes")
    if len(np.unique(idx)) != len(idx) or (len(idx) and (idx.min() < 0 or idx.max() >= len(y))):
        raise ValueError("canary indices must be distinct indices of the labels")
    true = y[idx]
    # Two distinct offsets in 1..classes-1 give two distinct wrong classes.
    first = rng.integers(1, classes, len(idx))
    second = 1 + (first - 1 + rng.integers(1, classes - 1, len(idx))) % (classes - 1)
    planted = (true + first) % classes
    alternative = (true + second) % classes
    y[idx] = planted
    return y, Canaries(idx, true, planted.astype(np.int64), alternative.astype(np.int64))


@dataclass(frozen=True)
class Guesses:
    """Per canary: whether the attack guessed, and whether the guess was y'."""

    made: NDArray[np.bool_]
    right: NDArray[np.bool_]

    @property
    def count(self) -> int:
        return int(self.made.sum())

    @property
    def correct(self) -> int:
        return int((self.made & self.right).sum())


def guess(
    canaries: Canaries,
    probabilities: NDArray[np.floating] | None,
    released: NDArray[np.integer] | None = None,
) -> Guesses:
    """The attack of the module docstring. ``probabilities`` (M, C): the released model's
    class probabilities on the canaries' inputs (None: no model); ``released`` (M,): a
    released label per canary or :data:`NO_LABEL`."""
    m = len(canaries)
    candidates = np.stack([canaries.planted, canaries.alternative], axis=1)
    made = np.zeros(m, dtype=bool)
    pick = np.full(m, NO_LABEL, dtype=np.int64)
    if probabilities is not None:
        p = np.asarray(probabilities, dtype=np.float64)
        if p.ndim != 2 or p.shape[0] != m:
            raise ValueError(f"need (canaries, classes) probabilities, got {p.shape}")
        top = p.argmax(axis=1)
        hit = (top[:, None] == candidates).any(axis=1)
        made |= hit
        pick = np.where(hit, top, pick)
    if released is not None:
        r = np.asarray(released, dtype=np.int64)
        if r.shape != (m,):
            raise ValueError(f"need one released label per canary, got shape {r.shape}")
        hit = (r[:, None] == candidates).any(axis=1)
        made |= hit
        pick = np.where(hit, r, pick)
    return Guesses(made, made & (pick == canaries.planted))


def guess_by_score(canaries: Canaries, log_odds: NDArray[np.floating], margin: float) -> Guesses:
    """Guess y' where ``log_odds`` (M,), the release's log-likelihood ratio of y' against
    y'', is at least ``margin``, y'' where it is at most -``margin``, abstain between.

    Used on a mechanism's direct output (ALIBI's noisy vectors), where the ratio is
    known in closed form: guessing only at its extreme makes the attack exact."""
    s = np.asarray(log_odds, dtype=np.float64)
    if s.shape != (len(canaries),):
        raise ValueError(f"need one score per canary, got shape {s.shape}")
    if not margin >= 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    made = np.abs(s) >= margin
    return Guesses(made, made & (s > 0))


def after_adding_one(values: NDArray[np.floating]) -> NDArray[np.bool_]:
    """Per float64 value v: whether fl(fl(v - 1.0) + 1.0) == v, i.e. v is fl(1.0 + x) for
    the float x = fl(v - 1.0).

    Every v = fl(1.0 + x), for any double x, passes (checked in the tests on 4.5 x 10^6
    doubles across the exponent range). Why, for |v| < 2^52: such v is a multiple of
    2^-53 (1 + x is rounded to a spacing no finer than that, or is exact, by Sterbenz's
    lemma, where x is near -1), so v - 1.0 is exact and so is adding 1.0 back. A continuous noise sample x with |x| < 1/2 passes only when
    its low bits happen to be those of a multiple of 2^-53: at Laplace scale 2 about 29%
    of samples fail. Values on ALIBI's grid (multiples of 1/256) always pass."""
    return after_adding(values, 1.0)


def after_adding(
    values: NDArray[np.floating], offset: float | NDArray[np.floating]
) -> NDArray[np.bool_]:
    """Per float64 value v: whether fl(fl(v - offset) + offset) == v (``offset`` a number
    or one per value), the round trip a float release v = fl(offset + x) passes.

    :func:`after_adding_one` is the case offset 1. For other offsets, the one that
    produced v passed in every float release of a sanitised epsilon the tests draw,
    and a neighbour's offset failed on 1,442 of 6,000."""
    v = np.asarray(values, dtype=np.float64)
    c = np.asarray(offset, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(((v - c) + c == v) | ~np.isfinite(v), dtype=np.bool_)


def guess_offset(
    values: NDArray[np.floating], first: float, second: float
) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """The support attack on a release v = (one of two known values) + noise: per value,
    whether it guesses (exactly one of ``first`` and ``second`` passes
    :func:`after_adding`) and whether the guess is ``first``. Against a float release,
    every guess is right; against one on a fixed grid with exact noise, a guess is a rule
    of the release like any other, bounded by its guarantee."""
    a, b = after_adding(values, first), after_adding(values, second)
    return a != b, a & ~b


#: Ulps of x and grid steps of u searched on either side by :func:`float_laplace_support`.
_WINDOW = 4


def float_laplace_support(values: NDArray[np.floating], scale: float) -> NDArray[np.bool_]:
    """Per float64 value v: whether v is an output of the float Laplace sampler
    :meth:`capc.privacy.randomness.SecureRandom.laplace` at ``scale``, i.e.
    |v| = fl(fl(-log(u)) * scale) for some of its uniforms u = fl(j + 1/2) 2^-53.

    Searched, not enumerated: x = fl(-log u) must lie within a few ulps of |v| / scale
    for fl(x * scale) to be |v|, and u within a few grid steps of exp(-x); both windows
    are :data:`_WINDOW` wide, more than the rounding of one product, one exp and one log
    needs (the tests check that 10^6 of the sampler's outputs all pass). Needs the same
    ``log`` as the sampler: numpy's, in the process that audits."""
    w = np.abs(np.asarray(values, dtype=np.float64))
    found = np.zeros(w.shape, dtype=bool)
    up = down = w / scale
    candidates = [up]
    for _ in range(_WINDOW):
        up, down = np.nextafter(up, np.inf), np.nextafter(down, -np.inf)
        candidates += [up, down]
    for x in candidates:
        exact = x * scale == w
        with np.errstate(under="ignore", over="ignore"):
            nearest = np.floor(np.exp(-x) * 2.0**53 - 0.5)
        for step in range(-_WINDOW, _WINDOW + 1):
            j = nearest + step
            valid = exact & (j >= 0) & (j < 2.0**53)
            # The sampler's own arithmetic: (j + 0.5) * 2^-53, then -log.
            u = (np.clip(j, 0, 2.0**53 - 1) + 0.5) * 2.0**-53
            with np.errstate(divide="ignore"):
                found |= valid & (-np.log(u) == x)
    return found


def guess_by_support(
    canaries: Canaries, vectors: NDArray[np.floating], scale: float | None = None
) -> Guesses:
    """The support-set attack on released vectors (M, C) of the form e_y + float noise.

    Of the two hypotheses, "y' is the label and y'' noise" and the reverse, one is ruled
    out where the label's coordinate could not be fl(1.0 + x) (:func:`after_adding_one`)
    or, given the float Laplace sampler's ``scale``, the noise coordinate is not one of
    its outputs (:func:`float_laplace_support`). Guess where exactly one survives, abstain
    otherwise. Against a float release the true hypothesis always survives, so every
    guess is right; ``scale`` None tests only the label side (any float noise). On
    ALIBI's grid (multiples of 1/256) every coordinate could be fl(1.0 + x): without
    ``scale`` it never guesses, and with it guesses only where a grid value happens to
    be a float sampler's output, which says nothing of the label (at eps 1: 8,429
    guesses on 20,000 canaries, 48% right). Like any rule of the release, it is bounded
    by the release's epsilon whatever it reads."""
    o = np.asarray(vectors, dtype=np.float64)
    if o.ndim != 2 or o.shape[0] != len(canaries):
        raise ValueError(f"need one released vector per canary, got shape {o.shape}")
    if scale is not None and not (np.isfinite(scale) and scale > 0):
        raise ValueError(f"the float sampler's scale must be positive, got {scale}")
    rows = np.arange(len(canaries))
    a, b = o[rows, canaries.planted], o[rows, canaries.alternative]
    label_a, label_b = after_adding_one(a), after_adding_one(b)
    if scale is None:
        noise_a = noise_b = np.ones(len(canaries), dtype=bool)
    else:
        noise_a, noise_b = float_laplace_support(a, scale), float_laplace_support(b, scale)
    first, second = label_a & noise_b, label_b & noise_a
    made = first != second
    return Guesses(made, made & first)


def audit_support(
    canaries: Canaries,
    vectors: NDArray[np.floating],
    scale: float | None = None,
    *,
    delta: float = 0.0,
    confidence: float = 0.95,
) -> EmpiricalEpsilon:
    """:func:`guess_by_support`, turned into an empirical epsilon (nats)."""
    g = guess_by_support(canaries, vectors, scale)
    return empirical_epsilon(g.correct, g.count, len(canaries), delta=delta, confidence=confidence)


def audit_scores(
    canaries: Canaries,
    log_odds: NDArray[np.floating],
    margin: float,
    *,
    delta: float = 0.0,
    confidence: float = 0.95,
) -> EmpiricalEpsilon:
    """:func:`guess_by_score`, turned into an empirical epsilon (nats)."""
    g = guess_by_score(canaries, log_odds, margin)
    return empirical_epsilon(g.correct, g.count, len(canaries), delta=delta, confidence=confidence)


def audit(
    canaries: Canaries,
    probabilities: NDArray[np.floating] | None,
    released: NDArray[np.integer] | None = None,
    *,
    delta: float = 0.0,
    confidence: float = 0.95,
) -> EmpiricalEpsilon:
    """Run the attack and turn its guesses into an empirical epsilon (nats)."""
    g = guess(canaries, probabilities, released)
    return empirical_epsilon(g.correct, g.count, len(canaries), delta=delta, confidence=confidence)
