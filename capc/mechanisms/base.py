"""What every labelling mechanism is: one object that owns everything about it.

A :class:`Mechanism` is built from a task's configuration (validated
parameters, one name per parameter everywhere) and the size of the label
space. It owns:

- the vote encoding an answering party applies to its predictions;
- the garbled circuit the guardian and the student run, and both parties'
  circuit inputs, the guardian's noise included;
- decoding the student's outputs into labels, and the guardian's into the
  answered mask;
- the rule for tightening a job's overrides (only ever more private);
- a plaintext oracle that, given the same noise, gives the same labels as
  the circuit (what the end-to-end tests replay);
- its privacy cost, as an event described by parameters
  (:mod:`capc.privacy.events`), worst case and actual.

Services are generic over this interface: they never name a mechanism.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, ValidationError

from capc.mpc.mechanism_circuits import (
    CIRCUIT_FRAC_BITS,
    ConfidentGNMaxCircuit,
    MultiLabelCircuit,
    round_noise,
)

# Re-exported: the label of a declined query is the circuits', and every mechanism's.
from capc.mpc.mechanism_circuits import NOT_ANSWERED as NOT_ANSWERED
from capc.mpc.validity import MAX_ELEMENTS, ValidityError, VoteRelation, max_width
from capc.privacy import discrete_gaussian, events, rounded_gaussian
from capc.privacy import validation as check
from capc.privacy.randomness import SecureRandom

U64 = NDArray[np.uint64]
FloatArray = NDArray[np.float64]
Labels = NDArray[np.int64]
Noise = dict[str, FloatArray]
CircuitSpec = ConfidentGNMaxCircuit | MultiLabelCircuit

#: Largest noise scale or threshold (votes) a configuration or override may name: beyond
#: it nothing is ever answered, and the circuit's word width would grow without purpose.
MAX_PARAMETER = 1e6


def gaussian_noise(
    shape: tuple[int, ...], sigma: float, rng: SecureRandom, discrete: bool = False
) -> FloatArray:
    """Noise N(0, sigma**2) (votes) per entry of ``shape``, from the secure source ``rng``,
    exactly: the continuous Gaussian rounded to multiples of 2**-24
    (:mod:`capc.privacy.rounded_gaussian`, Karney's exact sampler). For counts on that
    grid (integer counts; the services' fixed-point shares, at most 24 fractional bits)
    h + round(eta) = round(h + eta), so every answer is a post-processing of the
    continuous Gaussian mechanism and keeps its Renyi-DP and Gaussian-DP guarantees
    exactly. Counts off the grid (arbitrary float weights) are not covered exactly:
    weight votes on a grid (rounded down, as :meth:`Mechanism.encode_votes` does).
    ``discrete=True`` draws the integer discrete Gaussian instead (Canonne, Kamath and
    Steinke 2020): the same Renyi DP on integer counts, not the same Gaussian-DP curve.
    """
    sd = check.positive(sigma, "sigma")
    if discrete:
        return discrete_gaussian.discrete_gaussian_noise(shape, sd, rng).astype(np.float64)
    return rounded_gaussian.rounded_gaussian_noise(shape, sd, rng)


class MechanismError(ValueError):
    """A mechanism's configuration, override or input is invalid; the message says which."""


class Params(BaseModel):
    """A mechanism's parameters: validated, immutable, no unknown fields, no NaN or infinity."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class NoisyParams(Params):
    """Parameters of a mechanism whose answer adds Gaussian noise of std ``sigma`` (votes)."""

    sigma: float


class Mechanism(ABC):
    """A vote-aggregation mechanism over ``outputs`` classes (single label) or labels (multi-label)."""

    #: The name tasks, protos and the REST API use for it.
    name: ClassVar[str]
    #: Votes and labels are k-bit vectors rather than one class.
    multi_label: ClassVar[bool] = False
    #: Votes are not integers (need fixed-point shares).
    fractional_votes: ClassVar[bool] = False
    #: Fractional bits of one teacher's unit vote on the grid that vote validity proofs
    #: are about (0: integer votes); the party's weight is applied on the rest of the
    #: shares' fractional bits.
    vote_grid_bits: ClassVar[int] = 0
    #: Parameters a job may raise (more noise, a higher threshold); the rest are fixed.
    raisable: ClassVar[tuple[str, ...]] = ()
    #: Largest label space this mechanism's circuit handles.
    max_outputs: ClassVar[int] = 4096
    #: Why :attr:`max_outputs` is the limit and what to do above it, where it is not
    #: the circuit's size ("" for none): said when a larger label space is refused.
    max_outputs_why: ClassVar[str] = ""
    params_model: ClassVar[type[Params]]
    #: Only parties whose every voting teacher was trained with DP-SGD (and charged
    #: once for it) may vote: each answer is post-processing of their training, so the
    #: mechanism adds no noise and charges nothing per query (docs/privacy.md,
    #: "DP-trained teachers"). Services check this flag, never a name.
    trained_teachers_only: ClassVar[bool] = False

    def __init__(self, outputs: int, params: Params) -> None:
        lo = 1 if self.multi_label else 2
        if (
            isinstance(outputs, bool)
            or int(outputs) != outputs
            or not lo <= outputs <= self.max_outputs
        ):
            raise MechanismError(
                f"{self.name} takes {lo} to {self.max_outputs} "
                f"{'labels' if self.multi_label else 'classes'}, got {outputs!r}"
                + (f": {self.max_outputs_why}" if self.max_outputs_why else "")
            )
        self.outputs = int(outputs)
        self.params = params

    # -- configuration -------------------------------------------------------
    @classmethod
    def from_params(cls, outputs: int, params: Mapping[str, Any]) -> Mechanism:
        """Validate ``params`` (a JSON object) for ``outputs`` classes or labels."""
        try:
            p = cls.params_model.model_validate(dict(params))
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(str(x) for x in e['loc']) or 'parameters'}: {e['msg']}"
                for e in err.errors()
            )
            raise MechanismError(f"{cls.name} parameters: {problems}") from None
        return cls(outputs, p)

    def to_config(self) -> dict[str, Any]:
        """The mechanism as a task configuration names it: {"name": ..., params...}."""
        return {"name": self.name, **self.params.model_dump()}

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Mechanism)
            and other.name == self.name
            and other.outputs == self.outputs
            and other.params == self.params
        )

    def __hash__(self) -> int:
        return hash((self.name, self.outputs, self.params))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(outputs={self.outputs}, {self.params!r})"

    def tightened(self, overrides: Mapping[str, float]) -> Mechanism:
        """This mechanism with a job's overrides, which may only make it more private.

        ``overrides``: parameter -> value; 0 or absent keeps the task's value.
        Only :attr:`raisable` parameters may change, and only upwards (more
        noise, a higher threshold). Raises MechanismError naming the field.
        """
        current = self.params.model_dump()
        changes: dict[str, float] = {}
        for key, value in overrides.items():
            v = float(value)
            if v == 0.0:
                continue
            if key not in current:
                raise MechanismError(f"{self.name} has no parameter {key!r}")
            # A zero noise std (or a threshold without its test) means that part is off.
            off = float(current[key]) == 0.0 and (key.startswith("sigma") or not self.confident)
            if key not in self.raisable or off:
                if v == current[key]:
                    continue
                if off and key in self.raisable:
                    raise MechanismError(
                        f"{key} is 0 in the task: that part of {self.name} is off, and a job "
                        "cannot switch it on"
                    )
                raise MechanismError(
                    f"the task fixes {key} = {current[key]!r} for {self.name}; a job cannot change it"
                )
            if not math.isfinite(v) or v > MAX_PARAMETER:
                raise MechanismError(f"{key} must be finite and at most {MAX_PARAMETER:g}")
            if v < float(current[key]):
                raise MechanismError(
                    f"{key} = {v:g} is below the task's {float(current[key]):g}: "
                    "overrides may only add noise or raise the threshold"
                )
            changes[key] = v
        if not changes:
            return self
        return type(self).from_params(self.outputs, {**current, **changes})

    def admits(self, other: Mechanism) -> None:
        """Check that ``other`` is this mechanism or a tightening of it by :meth:`tightened`'s
        rule (the same name and outputs; only raisable parameters, only upwards): what a
        job may run under this task's policy. Raises MechanismError saying what differs."""
        if other.name != self.name or other.outputs != self.outputs:
            raise MechanismError(
                f"the task runs {self.name} over {self.outputs} outputs; a job cannot run "
                f"{other.name} over {other.outputs}"
            )
        if self.tightened(other.params.model_dump()) != other:
            raise MechanismError(
                f"{other.params.model_dump()} is not the task's {self.name} "
                f"{self.params.model_dump()} or a tightening of it"
            )

    # -- votes ---------------------------------------------------------------
    @property
    def vote_width(self) -> int:
        """Columns of one party's vote matrix."""
        return self.outputs

    @abstractmethod
    def unit_votes(self, predictions: ArrayLike) -> FloatArray:
        """One teacher's votes (B, vote_width) for its ``predictions``, before any weight."""

    def encode_votes(
        self,
        predictions: ArrayLike,
        *,
        weight: float = 1.0,
        frac_bits: int = 0,
        participation: ArrayLike | None = None,
    ) -> U64:
        """A party's votes in the ring with ``frac_bits`` fractional bits: (B, vote_width) uint64.

        Every entry is scaled by ``weight`` and rounded *down* on the grid, so a
        vote never grows past its unrounded value and the sensitivities hold.
        ``participation`` (B,) bool: rows where the party sits out are all zero.
        """
        if not (math.isfinite(weight) and weight >= 0):
            raise MechanismError(f"weight must be finite and >= 0, got {weight}")
        if not 0 <= frac_bits <= 24:
            raise MechanismError(f"frac_bits must lie in [0, 24], got {frac_bits}")
        unit = self.unit_votes(predictions)
        if participation is not None:
            mask = np.asarray(participation, dtype=bool)
            if mask.shape != (unit.shape[0],):
                raise MechanismError(
                    f"participation must have shape ({unit.shape[0]},), got {mask.shape}"
                )
            unit = unit * mask[:, None]
        return np.floor(unit * (weight * (1 << frac_bits))).astype(np.uint64)

    def vote_norm(self) -> float | None:
        """The L2 norm bound of one teacher's unit vote that a proof holds a party to
        (tau voting), or None where the per-column bounds are the whole statement."""
        return None

    def vote_relation(self, teachers: int) -> VoteRelation | None:
        """What a valid vote of a party with ``teachers`` teachers is, for vote validity
        proofs (:mod:`capc.mpc.validity`): one vote per teacher over ``vote_width``
        columns (one-hot; one-hot over label subsets for Powerset), per-label counts
        bounded by the teachers (k-hot), or for tau voting per-label sums of the
        teachers' votes on a grid of :attr:`vote_grid_bits` fractional bits, each at
        most the teachers, with L2 norm at most the teachers x tau. None where the
        statement would exceed MAX_ELEMENTS elements per query: a task needs one at one
        teacher per party (:meth:`require_vote_statement`), and a party whose teacher
        count has none is left out of its rounds."""
        try:
            return VoteRelation(
                self.vote_width,
                teachers,
                complement=self.per_label,
                grid_bits=self.vote_grid_bits,
                tau=self.vote_norm(),
            )
        except ValidityError:
            return None

    def outputs_for_width(self, width: int) -> int:
        """The most outputs (classes or labels) whose votes span at most ``width`` columns
        (the inverse of :attr:`vote_width`, which is the outputs themselves here)."""
        return width

    def proven_outputs(self) -> int:
        """The most outputs this mechanism, with its parameters, has a vote statement for,
        at one teacher per party (0 where none): from :func:`capc.mpc.validity.max_width`,
        the relation's own size rule."""
        width = max_width(
            1, complement=self.per_label, grid_bits=self.vote_grid_bits, tau=self.vote_norm()
        )
        return self.outputs_for_width(width)

    def require_vote_statement(self) -> None:
        """Refuse this mechanism for rounds whose votes only a proof checks (plaintext
        queries): without a statement a hospital's invalid vote (+9a on a target, -a
        elsewhere) stays inside the circuit's range checks and decides labels.

        Raises MechanismError naming the limit and what to do."""
        if self.vote_relation(1) is not None:
            return
        most = self.proven_outputs()
        unit = "labels" if self.multi_label else "classes"
        at = "" if self.vote_norm() is None else f" at tau {self.vote_norm():g}"
        fix = (
            f"split the labels into tasks of at most {most}"
            if self.multi_label
            else "use encrypted queries, whose circuit checks each party's vote"
        )
        raise MechanismError(
            f"{self.name} voting over {self.outputs} {unit} has no vote-validity statement "
            f"(at most {most} {unit} fit one proof per query{at}, MAX_ELEMENTS "
            f"{MAX_ELEMENTS}): a hospital could decide labels with an invalid vote. "
            f"Use at most {most} {unit}, or {fix}"
        )

    def encode_ensemble_votes(
        self,
        predictions: ArrayLike,
        *,
        weight: float = 1.0,
        frac_bits: int = 0,
        participation: ArrayLike | None = None,
    ) -> U64:
        """One party's votes for the predictions of its m teachers: (B, m) classes, or
        (B, m, k) labels for a multi-label mechanism -> (B, vote_width) uint64.

        The sum of each teacher's :meth:`encode_votes`: every teacher's vote is
        encoded (scaled, clipped, rounded down) on its own, so a record, which
        sits in one teacher's data, moves the party's counts by at most one
        teacher's vote, and the party's privacy event is that of one teacher
        (:meth:`event` at the party's weight). On the circuit's side the party's
        counts of a query total m times its weight, at most.
        """
        p = np.asarray(predictions)
        lo = 3 if self.multi_label else 2
        if p.ndim != lo or p.shape[1] < 1:
            shape = "(B, m, k) labels" if self.multi_label else "(B, m) classes"
            raise MechanismError(
                f"{self.name} takes an ensemble's predictions as {shape} (m >= 1), got "
                f"shape {p.shape}"
            )
        total = np.zeros((p.shape[0], self.vote_width), dtype=np.uint64)
        for t in range(p.shape[1]):
            total += self.encode_votes(
                p[:, t], weight=weight, frac_bits=frac_bits, participation=participation
            )
        return total

    def summed_votes(self, predictions: ArrayLike) -> FloatArray:
        """Plain histogram of several teachers' predictions: (B, teachers[, k]) -> (B, vote_width)."""
        p = np.asarray(predictions)
        axis = 1
        return np.asarray(
            sum(self.unit_votes(np.take(p, i, axis=axis)) for i in range(p.shape[axis])),
            dtype=np.float64,
        )

    # -- circuit ---------------------------------------------------------------
    @abstractmethod
    def circuit(
        self,
        max_votes: float,
        vote_total: float | None = None,
        share_frac_bits: int = 0,
        vote_parties: int = 0,
    ) -> CircuitSpec:
        """The round's circuit. ``max_votes``: the largest possible count (voters x largest
        weight); ``vote_total``: the voters' total weight (the guardian's, may be None for
        the student); ``share_frac_bits``: fractional bits of the vote shares.
        ``vote_parties`` > 0: that many parties' one-hot votes are checked and counted in
        the circuit, which then takes every party's shares, not their sums (encrypted-query
        mode; single-label mechanisms only)."""

    @abstractmethod
    def draw_noise(self, batch: int, rng: SecureRandom) -> Noise:
        """The guardian's noise for a round of ``batch`` queries, from its secure source."""

    @abstractmethod
    def garbler_inputs(
        self,
        spec: CircuitSpec,
        guardian_sum: ArrayLike,
        noise: Noise,
        decision_threshold: ArrayLike | None = None,
        vote_total: ArrayLike | None = None,
    ) -> dict[str, U64]:
        """The guardian's circuit inputs: its share sum folded with its noise and the thresholds.

        ``vote_total``: the voters' total weight W (votes), a number or (B,) per query, which
        the histogram checks hold every query's counts to (single label: they total W;
        per label: each lies in [0, W] = [0, 2 x decision threshold])."""

    @abstractmethod
    def decode(self, spec: CircuitSpec, evaluator_out: dict[str, U64]) -> Labels:
        """Student's outputs -> labels (B,) or (B, k); NOT_ANSWERED (-1) where declined."""

    def answered(
        self, spec: CircuitSpec, garbler_out: dict[str, U64], batch: int
    ) -> NDArray[np.bool_]:
        """Guardian's outputs -> answered mask of :meth:`answer_shape`."""
        if not self.confident:
            return np.ones(self.answer_shape(batch), dtype=bool)
        return np.asarray(garbler_out["answered"], dtype=bool).reshape(self.answer_shape(batch))

    # -- plaintext -----------------------------------------------------------
    @abstractmethod
    def decide(
        self, histograms: ArrayLike, noise: Noise, decision_threshold: ArrayLike | None = None
    ) -> tuple[Labels, NDArray[np.bool_]]:
        """The mechanism in the clear with explicit noise: (labels, answered)."""

    def oracle(
        self,
        histograms: ArrayLike,
        noise: Noise,
        frac_bits: int = CIRCUIT_FRAC_BITS,
        decision_threshold: ArrayLike | None = None,
    ) -> tuple[Labels, NDArray[np.bool_]]:
        """What the circuit releases for ``histograms`` given the guardian's raw ``noise``:
        the noise and every threshold rounded to the circuit's fixed-point grid (as the
        circuit encodes them), then :meth:`decide`."""
        rounded = {k: round_noise(v, frac_bits) for k, v in noise.items()}
        params = self.params.model_dump()
        on_grid = {
            k: float(round_noise(v, frac_bits)) if k == "threshold" else v
            for k, v in params.items()
        }
        mech = self if on_grid == params else type(self).from_params(self.outputs, on_grid)
        theta = None if decision_threshold is None else round_noise(decision_threshold, frac_bits)
        return mech.decide(histograms, rounded, theta)

    # -- privacy -------------------------------------------------------------
    @property
    def confident(self) -> bool:
        """A noisy test decides which queries (or labels) are answered."""
        return False

    @property
    def offset_robust(self) -> bool:
        """Every released output stays a post-processing of Gaussian mechanisms on the honest
        counts whatever offset a deviating party adds to the histogram: independent noise on
        every coordinate of every test. Distributed rounds refuse a mechanism that is not."""
        return True

    @property
    def per_label(self) -> bool:
        """Answers are decided label by label."""
        return False

    def answer_shape(self, queries: int) -> tuple[int, ...]:
        """Shape of an answered mask: (queries,) or (queries, k) for per-label mechanisms."""
        return (queries, self.outputs) if self.per_label else (queries,)

    def _answered(self, answered: ArrayLike) -> NDArray[np.bool_]:
        a = np.asarray(answered, dtype=bool)
        want = self.answer_shape(a.shape[0] if a.ndim else 0)
        if a.shape != want:
            raise MechanismError(f"answered must have shape {want}, got {a.shape}")
        if not self.confident and not a.all():
            raise MechanismError(f"{self.name} answers every query; answered must be all True")
        return a

    @abstractmethod
    def _event(self, answered: NDArray[np.bool_]) -> events.DpEvent:
        """Cost for one teacher of weight 1 of a round whose outcome is ``answered``."""

    def event(self, answered: ArrayLike, weight: float = 1.0) -> events.DpEvent:
        """Privacy cost, for one party of vote weight ``weight``, of a round whose outcome is
        ``answered`` (mask of :meth:`answer_shape`, only the queries the party voted on).

        Charged what happened: the tests on every query, the answers on what was released.
        """
        return events.scaled(self._event(self._answered(answered)), weight)

    def worst_case(self, queries: int, weight: float = 1.0) -> events.DpEvent:
        """Cost to reserve before ``queries`` queries run: every query (and label) answered."""
        return self.event(np.ones(self.answer_shape(queries), dtype=bool), weight)

    def per_query(self) -> events.DpEvent:
        """Worst-case cost of one query at weight 1 (for planning)."""
        return self.worst_case(1)

    def scaled_noise(self, factor: float) -> Mechanism:
        """This mechanism with every noise std (parameters named sigma*) times ``factor``."""
        p = self.params.model_dump()
        return type(self).from_params(
            self.outputs,
            {k: v * factor if k.startswith("sigma") and v else v for k, v in p.items()},
        )

    # -- central mode: data-dependent analysis of clear histograms -------------
    def data_dependent_event(
        self, histogram: ArrayLike, answered: bool, orders: ArrayLike
    ) -> events.RdpCurveEvent:
        """Data-dependent RDP of one query on the clear ``histogram`` (K,) (Papernot et al.
        2018). Central mode only, and never a release rule: report it sanitised."""
        raise MechanismError(f"no data-dependent analysis of {self.name}")

    def log_pr_answered(self, histogram: ArrayLike) -> float:
        """log Pr[the query is answered] on the clear ``histogram`` (0 when always answered)."""
        return 0.0


class NoisyMechanism(Mechanism):
    """A mechanism whose answer adds Gaussian noise of std ``sigma`` (votes), optionally
    behind a noisy threshold test (``threshold`` votes, its noise std ``sigma1`` votes)."""

    params: NoisyParams

    @property
    def sigma(self) -> float:
        """Noise standard deviation of the answer (votes)."""
        return float(self.params.sigma)

    @property
    def threshold(self) -> float:
        return float(getattr(self.params, "threshold", 0.0))

    @property
    def sigma1(self) -> float:
        return float(getattr(self.params, "sigma1", 0.0))

    @property
    def confident(self) -> bool:
        return self.sigma1 > 0
