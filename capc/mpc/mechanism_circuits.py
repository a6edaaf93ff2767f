"""The mechanism circuits the guardian (garbler) and student (evaluator) run.

Each spec fixes the circuit and both parties' local input encodings:

- the student's input is its share sum, scaled to the circuit's fixed point
  and reduced modulo 2^l;
- the guardian folds everything it owns into its words before garbling: its
  share sum, its noise (rounded to the fixed-point grid) and the public
  thresholds. Adding to one's own share is linear, so the circuit only has to
  add two words and test a sign, which keeps the AND count low.

Rounding the noise to the grid is post-processing of the Gaussian mechanism:
counts are on the grid already, so h + round(eta) = round(h + eta): the
rounding takes ties upward (:func:`ring.round_half_up`), which commutes with
adding any count on the grid (half-to-even rounding did not, for odd counts
and noise on a half). The noise is the exact continuous Gaussian rounded to
2^-24 (:mod:`capc.privacy.rounded_gaussian`), so its tails are unbounded: the
width l leaves room for ``NOISE_BOUND_SIGMAS`` and encoding refuses anything
beyond it, which fails the round before anything is computed. That happens
with probability 2 Phi(-9) = 2.3e-19 per noise value whatever the votes are,
so the failure itself says nothing; the rounds that run release the exact
Gaussian mechanism conditioned on an event of probability 1 - p, with p the
chance that any of their noise values left the range (at most
``MAX_NOISE_VALUES`` a round, which the guardian enforces):
(eps, (delta + e^eps p) / (1 - p)) for its (eps, delta) (:func:`cutoff_delta`,
part of every party's ``full_delta``).

Outputs: the student receives labels (or "not answered"); the guardian
receives only the answered bits. Both receive one ``violation`` bit per query.

Histogram checks (no reachable wrap). Either party may deviate: a hospital
may vote anything, the student may add any offset to its share sum. The
circuit checks the reconstructed histogram h' (= h + offset) on the *noised*
counts z_j = h'_j + e_j that the mechanism's first test already releases
(the threshold test's noise when there is one, else the answer noise): each
must lie in [-R, W + R] with R = ``NOISE_BOUND_SIGMAS`` x that noise's std
and W the voters' total weight (the guardian's input). Where a multi-label
confidence test releases a function of |c_j - theta| + e_j (theta = W / 2),
the checks use that same statistic: |c_j - theta| + e_j <= theta + R (so
c_j + e_j <= W + R and c_j - e_j >= -R); checking c_j + e_j from below beside
the test would compare c_j + e_j and -c_j + e_j under one noise, i.e. c_j
without noise. For single-label mechanisms the counts must also total W
exactly. A query that fails sets its
violation bit; the round then aborts, charged at its reservation. Checking
noised counts keeps the violation bit a post-processing of an already
charged Gaussian mechanism (checking h' itself would release a noiseless
comparison of the honest counts); the total is data-independent once every
vote is valid (capc.mpc.validity), so it reveals nothing either. On the
accepted branch every word the circuit compares lies in
[-(2R + 9 sigma), W + 2R + 9 sigma], and ``bits`` leaves room for twice that:
no comparison can wrap. An honest round never violates: noise beyond
``NOISE_BOUND_SIGMAS`` never reaches the circuit.

One-hot votes filtered in the circuit (``vote_parties``; encrypted-query
mode, where each party's shares come out of a 2PC that the party garbles, so
no proof can be made about them: the party never sees its own vote). The
inputs are each party's shares, not their sums, and only their lowest bits:
v_pj = low bit of the student's share XOR low bit of the guardian's, which
is the vote itself for an honest party (0 or 1). A party's vote counts iff
exactly one of its K bits is set; otherwise it counts as no vote at all.
Whatever a party or the student feeds in, each party's contribution is then
a one-hot vector or zero, a function of that party's vote alone (the
student's deviations are bit flips fixed before it sees anything), so any
two of them differ by at most sqrt(2) in L2: the sensitivity the ledger
charges. Nothing about which votes counted leaves the circuit: the counts
lie in [0, W] by construction, so the range checks cannot fire, and the
total check, which a left-out vote would trip, is not made. Cost: 3K + 1 AND
gates per party and query, and an incrementer per party and class.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from capc.mpc import library as lib
from capc.mpc import ring
from capc.mpc.circuit import ONE, ZERO, Bit, Circuit, CircuitBuilder, Party, Word

U64 = NDArray[np.uint64]
Inputs = dict[str, U64]

#: Label value for a query (or label) a mechanism declined to answer: what the circuits
#: release, so every mechanism and driver takes it from here (capc.mechanisms re-exports it).
NOT_ANSWERED = -1

#: Noise is confined to this many standard deviations (a draw beyond fails the round).
NOISE_BOUND_SIGMAS = 9.0
#: P(|Z| > NOISE_BOUND_SIGMAS) for a standard normal Z: 2 Phi(-9) = 2.26e-19, the chance
#: that one noise value fails its round, whatever the votes.
NOISE_TAIL = math.erfc(NOISE_BOUND_SIGMAS / math.sqrt(2.0))
#: Most noise values one round may draw (the guardian refuses a larger round before
#: anything is reserved): it bounds the cut-off's failure per round by MAX_CUTOFF_FAILURE.
MAX_NOISE_VALUES = 1 << 18
#: 1 - (1 - NOISE_TAIL)^MAX_NOISE_VALUES = 5.9e-14 (about 2^-44): the most probability
#: with which one round's noise leaves the circuit's range.
MAX_CUTOFF_FAILURE = -math.expm1(MAX_NOISE_VALUES * math.log1p(-NOISE_TAIL))


def cutoff_failure(rounds: int) -> float:
    """p: the probability that some noise value of ``rounds`` rounds (each at most
    MAX_NOISE_VALUES values) leaves +-NOISE_BOUND_SIGMAS, failing its round; 0 for none."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"a round count is a whole number >= 0, got {rounds!r}")
    return -math.expm1(rounds * MAX_NOISE_VALUES * math.log1p(-NOISE_TAIL))


def cutoff_delta(delta: float, epsilon: float, rounds: int) -> float:
    """The delta of the rounds that ran for an exact Gaussian mechanism that is
    (``epsilon``, ``delta``)-DP over ``rounds`` rounds: (delta + e^epsilon p) / (1 - p),
    with p = :func:`cutoff_failure`.

    Why: a round whose noise leaves the range fails before its circuit runs, an event
    of probability p whatever the votes, so what the rounds release is the exact
    mechanism conditioned on an event A of probability 1 - p. For any outputs S,
    P[S | A] <= P[S] / (1 - p) <= (e^eps P'[S] + delta) / (1 - p) and
    P'[S] <= (1 - p) P'[S | A] + p, so P[S | A] <= e^eps P'[S | A] + (delta + e^eps p) / (1 - p).
    Returns 1 when that reaches 1 (no guarantee)."""
    p = cutoff_failure(rounds)
    if p == 0.0:
        return delta
    if epsilon > 700.0:  # e^epsilon overflows a float: nothing is left to state
        return 1.0
    return min(1.0, (delta + math.exp(epsilon) * p) / (1.0 - p))


#: Fixed-point fractional bits inside the circuits unless a task says otherwise.
CIRCUIT_FRAC_BITS = 4


def width_for(max_abs: float, frac_bits: int) -> int:
    """Smallest l such that every signed value and difference up to ``max_abs`` fits.

    ``max_abs`` is in real units (votes); the result leaves one spare bit so
    that a - b never wraps for |a|, |b| <= max_abs.
    """
    if not math.isfinite(max_abs) or max_abs < 0:
        raise ValueError(f"max_abs must be finite and >= 0, got {max_abs}")
    scaled = math.ceil(2.0 * max_abs * (1 << frac_bits)) + 1
    bits = scaled.bit_length() + 1
    if bits > 64:
        raise ValueError(
            f"values up to {max_abs:g} with {frac_bits} fractional bits need more than 64 bits"
        )
    return bits


def _shares_word(
    share_sum: ArrayLike, count: int, share_frac_bits: int, frac_bits: int, bits: int
) -> U64:
    """A party's share sum (B, count) uint64, scaled to ``frac_bits`` and reduced mod 2^bits."""
    s = np.asarray(share_sum)
    if s.dtype != np.uint64:
        raise ValueError(f"share sums must be uint64 ring elements, got {s.dtype}")
    if s.ndim != 2 or s.shape[1] != count:
        raise ValueError(f"share sums must have shape (queries, {count}), got {s.shape}")
    return ring.reduce(s << np.uint64(frac_bits - share_frac_bits), bits)


def _noise_word(
    noise: ArrayLike, sigma: float, frac_bits: int, shape: tuple[int, ...], name: str
) -> U64:
    n = np.asarray(noise, dtype=np.float64)
    if n.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {n.shape}")
    if not np.isfinite(n).all():
        raise ValueError(f"{name} contains NaN or infinity")
    if (np.abs(n) > NOISE_BOUND_SIGMAS * sigma).any():
        raise ValueError(
            f"{name} exceeds {NOISE_BOUND_SIGMAS} standard deviations; the circuit has no room for it"
        )
    return ring.encode_fixed(n, frac_bits)


class HistogramViolationError(RuntimeError):
    """The reconstructed histogram failed the circuit's checks on some queries.

    Some party's input was not a valid vote (or the student offset its share
    sum): the round is aborted and stays charged at its reservation.
    ``queries`` lists the failing query indices.
    """

    def __init__(self, queries: NDArray[np.int64]) -> None:
        shown = ", ".join(str(int(q)) for q in queries[:10])
        more = f" and {len(queries) - 10} more" if len(queries) > 10 else ""
        super().__init__(
            f"the reconstructed vote histogram is out of range on {len(queries)} queries "
            f"({shown}{more}): a count outside [0, voters' total weight] or a total that is "
            "not the voters' weight. A party deviated from the protocol; the round is aborted "
            "and stays charged at its reservation. Check the guardian's audit log, and "
            "exclude the party that deviated"
        )
        self.queries = queries


def violations(outputs: dict[str, U64]) -> NDArray[np.int64]:
    """Indices of the queries whose ``violation`` output bit is set (either party's outputs)."""
    v = outputs.get("violation")
    if v is None:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.asarray(v).reshape(len(v), -1).any(axis=1)).astype(np.int64)


def check_outputs(outputs: dict[str, U64]) -> None:
    """Raise :class:`HistogramViolationError` if any query's ``violation`` bit is set."""
    bad = violations(outputs)
    if bad.size:
        raise HistogramViolationError(bad)


def _check_words(
    guardian_base: U64,
    check_noise: U64,
    vote_total: U64,
    bound: U64,
    bits: int,
) -> Inputs:
    """The guardian's words for the range checks: ``low`` = g + e + R, ``high`` = W + R - g - e.

    ``guardian_base`` (B, n) the guardian's share sum on the circuit grid; ``check_noise`` (B, n)
    the checked noise on the grid; ``vote_total`` (B, 1) W on the grid; ``bound`` R on the grid.
    """
    return {
        "low": ring.reduce(guardian_base + check_noise + bound, bits),
        "high": ring.reduce(vote_total + bound - guardian_base - check_noise, bits),
    }


def _totals(vote_total: ArrayLike | None, default: float, batch: int, frac_bits: int) -> U64:
    """W per query on the circuit grid, (B, 1): ``vote_total`` (votes; scalar or (B,)) or ``default``."""
    t = np.asarray(default if vote_total is None else vote_total, dtype=np.float64)
    if t.ndim == 0:
        t = np.full(batch, float(t))
    if t.shape != (batch,) or not np.isfinite(t).all() or (t < 0).any():
        raise ValueError(f"vote_total must be finite, >= 0, a number or of shape ({batch},)")
    return ring.encode_fixed(t, frac_bits)[:, None]


def _range_violation(
    c: CircuitBuilder, shares: list[Word], low: list[Word], high: list[Word]
) -> list[Bit]:
    """Per word: 1 iff s + low < 0 or high - s < 0 (the noised count leaves [-R, W + R])."""
    out = []
    for s, lo, hi in zip(shares, low, high, strict=True):
        out.append(lib.sum_sign(c, s, lo))
        out.append(lib.sum_sign(c, lib.negate_bits(c, s), hi, ONE))
    return out


def _total_violation(c: CircuitBuilder, shares: list[Word], total: Word) -> Bit:
    """1 iff the student's words do not sum to ``total`` (= W - sum of the guardian's) mod 2^l."""
    acc = shares[0]
    for s in shares[1:]:
        acc = lib.add(c, acc, s)
    return lib.any_bit(c, [c.xor(a, b) for a, b in zip(acc, total, strict=True)])


def round_noise(noise: ArrayLike, frac_bits: int = CIRCUIT_FRAC_BITS) -> NDArray[np.float64]:
    """The noise exactly as the circuit applies it: rounded to multiples of 2**-frac_bits,
    ties upward (as :func:`ring.encode_fixed`)."""
    scaled = np.asarray(noise, dtype=np.float64) * (1 << frac_bits)
    return ring.round_half_up(scaled) / (1 << frac_bits)


@dataclass(frozen=True)
class ConfidentGNMaxCircuit:
    """Confident-GNMax (or plain GNMax with ``confident=False``) over K classes.

    Query answered iff max(h) + eta1 >= threshold; label argmax(h + eta2).
    ``max_votes`` bounds any count (parties x largest vote weight). Powerset
    voting is this circuit over K = 2**k subsets.
    """

    num_classes: int
    max_votes: float
    sigma: float
    threshold: float = 0.0
    sigma1: float = 1.0
    confident: bool = True
    frac_bits: int = CIRCUIT_FRAC_BITS
    share_frac_bits: int = 0
    #: > 0: each of that many parties' one-hot votes is checked and counted in the circuit
    #: (module docstring); both sides then input every party's shares (B, P, K), not sums.
    vote_parties: int = 0

    def __post_init__(self) -> None:
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {self.num_classes}")
        if self.vote_parties < 0:
            raise ValueError(f"vote_parties must be >= 0, got {self.vote_parties}")
        if self.vote_parties and self.share_frac_bits:
            raise ValueError("votes filtered in the circuit are one-hot, without fractional bits")
        if self.vote_parties > self.max_votes:
            raise ValueError(
                f"{self.vote_parties} one-hot votes exceed max_votes {self.max_votes:g}"
            )
        if self.share_frac_bits > self.frac_bits:
            raise ValueError("share_frac_bits must not exceed the circuit's frac_bits")
        for name in ("max_votes", "sigma", "sigma1", "threshold"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {v}")

    @property
    def check_sigma(self) -> float:
        """Std of the noise the histogram checks see: the test's, else the answer's."""
        return self.sigma1 if self.confident else self.sigma

    @property
    def bits(self) -> int:
        """Circuit word width l: on the checks' accepted branch no word or difference wraps.

        Accepted: h' + e_check in [-R, W + R], so h' in [-2R, W + 2R] and every argmax word
        in [-(2R + 9 sigma), W + 2R + 9 sigma]; the test words lie in [-(R + T), W + R].
        """
        r = NOISE_BOUND_SIGMAS * self.check_sigma
        arg = self.max_votes + 2 * r + NOISE_BOUND_SIGMAS * self.sigma
        thr = self.max_votes + r + self.threshold if self.confident else 0.0
        return width_for(max(arg, thr), self.frac_bits)

    @property
    def label_bits(self) -> int:
        return lib.index_width(self.num_classes)

    def circuit(self) -> Circuit:
        return _confident_circuit(
            self.num_classes, self.bits, self.confident, self.vote_parties, self.frac_bits
        )

    def evaluator_inputs(self, student_sum: ArrayLike) -> Inputs:
        """Student side: its share sum (B, K) uint64 -> circuit words; with ``vote_parties``,
        its share of every party's vote (B, P, K) uint64 -> their lowest bits."""
        if self.vote_parties:
            return {"vote_bits": _party_bits(student_sum, self.vote_parties, self.num_classes)}
        return {
            "shares": _shares_word(
                student_sum, self.num_classes, self.share_frac_bits, self.frac_bits, self.bits
            )
        }

    def garbler_inputs(
        self,
        guardian_sum: ArrayLike,
        eta2: ArrayLike,
        eta1: ArrayLike | None = None,
        vote_total: ArrayLike | None = None,
    ) -> Inputs:
        """Guardian side: share sum (B, K), eta2 (B, K) and, if confident, eta1: (B,) for one
        test noise per query, or (B, K) for independent test noise on every class.

        ``vote_total``: the voters' total weight W (votes), a number or (B,) per query;
        default ``max_votes``. Every query's counts must total it (the histogram checks).
        With ``vote_parties``, ``guardian_sum`` is the guardian's share of every party's
        vote (B, P, K), and the counts are the circuit's own (no total check).
        """
        party_bits = None
        if self.vote_parties:
            party_bits = _party_bits(guardian_sum, self.vote_parties, self.num_classes)
            base = np.zeros((party_bits.shape[0], self.num_classes), dtype=np.uint64)
        else:
            base = _shares_word(
                guardian_sum, self.num_classes, self.share_frac_bits, self.frac_bits, 64
            )
        batch = base.shape[0]
        shape = (batch, self.num_classes)
        e2 = _noise_word(eta2, self.sigma, self.frac_bits, shape, "eta2")
        out = {"argmax": ring.reduce(base + e2, self.bits)}
        check = e2
        if self.confident:
            if eta1 is None:
                raise ValueError("Confident-GNMax needs eta1 for the threshold test")
            per_class = np.ndim(eta1) == 2
            e1 = _noise_word(
                eta1, self.sigma1, self.frac_bits, shape if per_class else (batch,), "eta1"
            )
            check = e1 if per_class else np.broadcast_to(e1[:, None], shape)
            t = ring.encode_fixed(self.threshold, self.frac_bits)
            out["threshold"] = ring.reduce(base + check - t, self.bits)
        totals = _totals(vote_total, self.max_votes, batch, self.frac_bits)
        bound = ring.encode_fixed(NOISE_BOUND_SIGMAS * self.check_sigma, self.frac_bits)
        out.update(_check_words(base, check, totals, bound, self.bits))
        if party_bits is not None:
            out["guardian_bits"] = party_bits
            return out
        out["total"] = ring.reduce(totals[:, 0] - base.sum(axis=1, dtype=np.uint64), self.bits)[
            :, None
        ]
        return out

    def decode(self, evaluator_out: dict[str, U64]) -> NDArray[np.int64]:
        """Student's outputs -> labels (B,), NOT_ANSWERED where the threshold test failed.

        Raises :class:`HistogramViolationError` if any query failed the histogram checks."""
        check_outputs(evaluator_out)
        label = evaluator_out["label"][:, 0].astype(np.int64)
        if not self.confident:
            return label
        answered = evaluator_out["answered"][:, 0].astype(bool)
        return np.where(answered, label, NOT_ANSWERED)


def _party_bits(shares: ArrayLike, parties: int, width: int) -> U64:
    """Every party's shares (B, P, K) uint64 -> their lowest bits (B, P x K), 0 or 1."""
    s = np.asarray(shares)
    if s.dtype != np.uint64 or s.shape[1:] != (parties, width):
        raise ValueError(
            f"per-party shares must be uint64 of shape (queries, {parties}, {width}), got "
            f"{s.dtype} {s.shape}"
        )
    return (s & np.uint64(1)).reshape(len(s), parties * width)


def _one_hot_counts(
    c: CircuitBuilder, parties: int, width: int, bits: int, frac_bits: int
) -> list[Word]:
    """Per class, the number of parties whose vote (student's low bit XOR guardian's) has
    exactly one bit set and that bit at this class, on the circuit's grid (l-bit words)."""
    student = c.input("vote_bits", Party.EVALUATOR, parties * width, 1)
    guardian = c.input("guardian_bits", Party.GARBLER, parties * width, 1)
    count_bits = max(1, parties.bit_length())
    counts: list[Word] = [CircuitBuilder.const(0, count_bits)] * width
    for p in range(parties):
        vote = [c.xor(student[p * width + j][0], guardian[p * width + j][0]) for j in range(width)]
        one, two = ZERO, ZERO  # "at least one bit seen", "at least two"
        for b in vote:
            both = c.and_(one, b)
            two = c.or_(two, both)
            one = c.xor(c.xor(one, b), both)
        valid = c.and_(one, c.not_(two))
        counts = [lib.add_bit(c, n, c.and_(valid, b)) for n, b in zip(counts, vote, strict=True)]
    # count x 2^frac_bits, zero-extended: every count lies in [0, parties].
    pad = bits - frac_bits - count_bits
    return [
        (*CircuitBuilder.const(0, frac_bits), *n, *CircuitBuilder.const(0, pad)) for n in counts
    ]


@functools.lru_cache(maxsize=32)
def _confident_circuit(
    num_classes: int, bits: int, confident: bool, vote_parties: int = 0, frac_bits: int = 0
) -> Circuit:
    filtered = f"/one-hot-of-{vote_parties}" if vote_parties else ""
    c = CircuitBuilder(
        f"{'confident-' if confident else ''}gnmax/K={num_classes}/l={bits}/checked{filtered}"
    )
    if vote_parties:
        shares = _one_hot_counts(c, vote_parties, num_classes, bits, frac_bits)
    else:
        shares = c.input("shares", Party.EVALUATOR, num_classes, bits)
    if confident:
        thr = c.input("threshold", Party.GARBLER, num_classes, bits)
    arg = c.input("argmax", Party.GARBLER, num_classes, bits)
    low = c.input("low", Party.GARBLER, num_classes, bits)
    high = c.input("high", Party.GARBLER, num_classes, bits)
    checks = _range_violation(c, shares, low, high)
    if not vote_parties:  # filtered counts total the valid votes by construction
        (total,) = c.input("total", Party.GARBLER, 1, bits)
        checks.append(_total_violation(c, shares, total))
    violation = lib.any_bit(c, checks)
    c.output("violation", Party.BOTH, [(violation,)])
    noisy = [lib.add(c, s, a) for s, a in zip(shares, arg, strict=True)]
    index, _ = lib.argmax(c, noisy)
    if confident:
        answered = lib.any_bit(
            c, [lib.is_non_negative_sum(c, s, t) for s, t in zip(shares, thr, strict=True)]
        )
        c.output("label", Party.EVALUATOR, [lib.mask_word(c, answered, index)])
        c.output("answered", Party.BOTH, [(answered,)])
    else:
        c.output("label", Party.EVALUATOR, [index])
    return c.build()


@dataclass(frozen=True)
class MultiLabelCircuit:
    """Binary or tau voting over k labels, optionally with a per-label confidence test.

    Label j is 1 iff c_j + n_j >= theta_j; with a confidence test it is released
    only if |c_j - theta_j| + n1_j >= t_j (see capc.privacy multilabel_decide).
    For tau voting the shares carry ``share_frac_bits`` fractional bits.
    """

    num_labels: int
    max_votes: float
    sigma: float
    decision_threshold: float
    confidence_threshold: float | None = None
    sigma1: float = 1.0
    frac_bits: int = CIRCUIT_FRAC_BITS
    share_frac_bits: int = 0

    def __post_init__(self) -> None:
        if self.num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {self.num_labels}")
        if self.share_frac_bits > self.frac_bits:
            raise ValueError("share_frac_bits must not exceed the circuit's frac_bits")

        if not 0 <= self.decision_threshold <= self.max_votes:
            raise ValueError(
                f"decision_threshold must lie in [0, max_votes={self.max_votes}], got {self.decision_threshold}"
            )

    @property
    def confident(self) -> bool:
        return self.confidence_threshold is not None

    @property
    def bits(self) -> int:
        """Circuit word width l; bounds the decision threshold by ``max_votes`` so that
        the student, which does not know the guardian's exact threshold, gets the same l."""
        r = NOISE_BOUND_SIGMAS * self.check_sigma
        m = 2 * self.max_votes + 2 * r + NOISE_BOUND_SIGMAS * self.sigma
        if self.confidence_threshold is not None:
            m = max(m, 2 * self.max_votes + 3 * r + self.confidence_threshold)
        return width_for(m, self.frac_bits)

    @property
    def check_sigma(self) -> float:
        """Std of the noise the histogram checks see: the confidence test's, else the decision's."""
        return self.sigma1 if self.confident else self.sigma

    def circuit(self) -> Circuit:
        return _multilabel_circuit(self.num_labels, self.bits, self.confident)

    def evaluator_inputs(self, student_sum: ArrayLike) -> Inputs:
        return {
            "shares": _shares_word(
                student_sum, self.num_labels, self.share_frac_bits, self.frac_bits, self.bits
            )
        }

    def garbler_inputs(
        self,
        guardian_sum: ArrayLike,
        noise: ArrayLike,
        confidence_noise: ArrayLike | None = None,
        decision_threshold: ArrayLike | None = None,
    ) -> Inputs:
        """Guardian side: share sum (B, k), decision noise (B, k), confidence noise (B, k).

        ``decision_threshold`` (B,): per-query thresholds in votes, in [0, max_votes], in place
        of the spec's (when who votes varies by query); rounded to the fixed-point grid.
        """
        base = _shares_word(guardian_sum, self.num_labels, self.share_frac_bits, self.frac_bits, 64)
        shape = base.shape
        if decision_threshold is None:
            theta = ring.encode_fixed(self.decision_threshold, self.frac_bits)
        else:
            t = np.asarray(decision_threshold, dtype=np.float64)
            if t.shape != (shape[0],) or not np.isfinite(t).all():
                raise ValueError(f"decision_threshold must be finite with shape ({shape[0]},)")
            if ((t < 0) | (t > self.max_votes)).any():
                raise ValueError(f"decision thresholds must lie in [0, {self.max_votes}]")
            theta = ring.encode_fixed(t, self.frac_bits)[:, None]
        n = _noise_word(noise, self.sigma, self.frac_bits, shape, "noise")
        out = {"decision": ring.reduce(base + n - theta, self.bits)}
        # The threshold is half the voters' total weight: every count lies in [0, 2 theta].
        totals = np.broadcast_to(theta + theta, (shape[0], 1))
        bound = ring.encode_fixed(NOISE_BOUND_SIGMAS * self.check_sigma, self.frac_bits)
        check = n
        if self.confidence_threshold is not None:
            if confidence_noise is None:
                raise ValueError("a confidence test needs confidence_noise")
            check = _noise_word(
                confidence_noise, self.sigma1, self.frac_bits, shape, "confidence_noise"
            )
            e = check - ring.encode_fixed(self.confidence_threshold, self.frac_bits)
            # |d| + e >= 0  <=>  d + e >= 0  or  -d + e >= 0, with d = c - theta.
            out["confidence_pos"] = ring.reduce(base - theta + e, self.bits)
            # -s_S = NOT(s_S) + 1: the circuit complements the student's word for free.
            out["confidence_neg"] = ring.reduce(np.uint64(1) + e - base + theta, self.bits)
            checks = _check_words(base, check, totals, bound, self.bits)
            # The test releases a function of |d| + n1 (d = c - theta), so the checks must
            # too: checking c + n1 from below beside it would compare c + n1 and -c + n1
            # under one noise, i.e. c without noise. With W = 2 theta, "high" is already
            # d + n1 <= theta + R; the low side becomes -d + n1 <= theta + R, c - n1 >= -R.
            # Violation iff |d| + n1 > theta + R; accepted counts still lie in
            # [-2R, W + 2R], and honest ones never violate (|n1| < R).
            checks["low"] = ring.reduce(base - check + bound, self.bits)
            out.update(checks)
            return out
        out.update(_check_words(base, check, totals, bound, self.bits))
        return out

    def decode(self, evaluator_out: dict[str, U64]) -> NDArray[np.int8]:
        """Student's outputs -> (B, k) labels in {1, 0, NOT_ANSWERED}.

        Raises :class:`HistogramViolationError` if any query failed the histogram checks."""
        check_outputs(evaluator_out)
        labels = evaluator_out["labels"].astype(np.int8)
        if self.confidence_threshold is None:
            return labels
        answered = evaluator_out["answered"].astype(bool)
        return np.where(answered, labels, np.int8(NOT_ANSWERED)).astype(np.int8)


@functools.lru_cache(maxsize=32)
def _multilabel_circuit(num_labels: int, bits: int, confident: bool) -> Circuit:
    c = CircuitBuilder(f"multilabel/k={num_labels}/l={bits}/confident={confident}/checked")
    shares = c.input("shares", Party.EVALUATOR, num_labels, bits)
    dec = c.input("decision", Party.GARBLER, num_labels, bits)
    low = c.input("low", Party.GARBLER, num_labels, bits)
    high = c.input("high", Party.GARBLER, num_labels, bits)
    c.output("violation", Party.BOTH, [(lib.any_bit(c, _range_violation(c, shares, low, high)),)])
    positive = [lib.is_non_negative_sum(c, s, d) for s, d in zip(shares, dec, strict=True)]
    if not confident:
        c.output("labels", Party.EVALUATOR, [(p,) for p in positive])
        return c.build()
    pos = c.input("confidence_pos", Party.GARBLER, num_labels, bits)
    neg = c.input("confidence_neg", Party.GARBLER, num_labels, bits)
    answered = [
        c.or_(
            lib.is_non_negative_sum(c, s, p), lib.is_non_negative_sum(c, lib.negate_bits(c, s), n)
        )
        for s, p, n in zip(shares, pos, neg, strict=True)
    ]
    c.output(
        "labels",
        Party.EVALUATOR,
        [(c.and_(p, a),) for p, a in zip(positive, answered, strict=True)],
    )
    c.output("answered", Party.BOTH, [(a,) for a in answered])
    return c.build()


@dataclass(frozen=True)
class LogitsToSharesCircuit:
    """Encrypted-query mode: (masked logits, mask) -> additive shares of onehot(argmax).

    The evaluator (student) holds y = z + m mod 2^bits after decrypting; the
    garbler (answering party) holds the mask m and draws a fresh share r. The
    evaluator learns onehot(argmax z) - r modulo 2^64 and the garbler keeps r:
    the same two additive shares of the vote as in plain mode.
    """

    num_classes: int
    bits: int

    def __post_init__(self) -> None:
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {self.num_classes}")
        if not 2 <= self.bits <= 64:
            raise ValueError(f"bits must lie in [2, 64], got {self.bits}")

    def circuit(self) -> Circuit:
        return _logits_circuit(self.num_classes, self.bits)

    def evaluator_inputs(self, masked_logits: ArrayLike) -> Inputs:
        y = np.asarray(masked_logits)
        if y.dtype != np.uint64 or y.ndim != 2 or y.shape[1] != self.num_classes:
            raise ValueError(
                f"masked logits must be uint64 of shape (B, {self.num_classes}), got {y.dtype} {y.shape}"
            )
        return {"masked_logits": ring.reduce(y, self.bits)}

    def garbler_inputs(self, mask: ArrayLike, share: ArrayLike) -> Inputs:
        """Answering party: mask (B, K) mod 2^bits and its fresh output share (B, K) mod 2^64."""
        m = np.asarray(mask)
        r = np.asarray(share)
        for name, arr in (("mask", m), ("share", r)):
            if arr.dtype != np.uint64 or arr.ndim != 2 or arr.shape[1] != self.num_classes:
                raise ValueError(
                    f"{name} must be uint64 of shape (B, {self.num_classes}), got {arr.dtype} {arr.shape}"
                )
        return {"neg_mask": ring.reduce(np.uint64(0) - m, self.bits), "neg_share": np.uint64(0) - r}


@functools.lru_cache(maxsize=32)
def _logits_circuit(num_classes: int, bits: int) -> Circuit:
    c = CircuitBuilder(f"logits-to-shares/K={num_classes}/l={bits}")
    masked = c.input("masked_logits", Party.EVALUATOR, num_classes, bits)
    neg_mask = c.input("neg_mask", Party.GARBLER, num_classes, bits)
    neg_share = c.input("neg_share", Party.GARBLER, num_classes, 64)
    logits = [lib.add(c, y, m) for y, m in zip(masked, neg_mask, strict=True)]
    index, _ = lib.argmax(c, logits)
    hot = lib.one_hot_word(c, index, num_classes)
    c.output(
        "vote_share",
        Party.EVALUATOR,
        [lib.add_bit(c, r, h) for r, h in zip(neg_share, hot, strict=True)],
    )
    return c.build()
