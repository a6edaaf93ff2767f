"""Central mode: the protocol's three roles driven in one process.

The same cores as the networked services (:class:`~capc.round.guardian.GuardianCore`,
:class:`~capc.round.party.PartyCore`, :class:`~capc.round.student.StudentCore`), the
guardian's ledger in memory and each party's own in-memory ledger, joined by
function calls instead of streams. Each round goes the whole way: the guardian
reserves every party's worst case, each party reserves its own and votes (ring
shares, its seed sealed to the student), the guardian sums its shares, the student
opens the seeds, and then either

- ``"2pc"``: the real garbled circuit between the guardian and the student over an
  in-memory channel (:class:`capc.mpc.session.LocalPair`, base OTs once per driver),
  the guardian's noise folded into its inputs as over the network; or
- ``"oracle"``: the mechanism's plaintext oracle on the reconstructed histogram with
  the same noise draw (what the circuit releases, bit for bit: tests/unit).

Then the guardian charges what was released, and each party settles its own ledger
from the guardian's settlement. Every role runs here, so none can deviate: the votes
travel unproven (``GuardianCore(central=True)``) and any mechanism runs.

:func:`label_histograms` labels a whole ensemble's vote histograms in one round, with
the guardian's noise from the caller's stream: central labelling
(:mod:`capc.learning.pate`, PATE-FM, the experiments) run through the protocol itself.
:func:`oracle_release` is the oracle mode's release on a histogram alone. This module is
the only caller of a mechanism's ``oracle`` or ``decide`` outside the mechanisms
(tests/unit/test_central_paths.py), and where a run stops is
:func:`capc.round.central_budget.budget_filter`'s to say.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Generic, Literal

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from numpy.typing import ArrayLike, NDArray

from capc.mechanisms import Mechanism
from capc.mpc.mechanism_circuits import CIRCUIT_FRAC_BITS
from capc.mpc.session import LocalPair
from capc.privacy import accountants
from capc.privacy.accountants import Accounting
from capc.privacy.randomness import SecureRandom
from capc.round import circuit
from capc.round.errors import RoundRefusedError, VoteRefusedError
from capc.round.guardian import GuardianCore
from capc.round.memory_ledger import MemoryLedger
from capc.round.memory_party_ledger import MemoryPartyLedger
from capc.round.messages import Computed, PartyShares, QueryBatch, RoundWork
from capc.round.party import PartyCore
from capc.round.settlement import settlement
from capc.round.state import RoundView, TaskT
from capc.round.student import StudentCore, StudentRound
from capc.round.task import MechanismTask

Mode = Literal["2pc", "oracle"]
MODES: tuple[Mode, ...] = ("2pc", "oracle")
#: The student's name and 2PC session in the guardian's ledger.
STUDENT, SESSION = "student", b"central-session!"
#: A cap (epsilon) no round reaches, for a driver whose caller keeps its own budget filter;
#: within the accountants' float arithmetic (their conversions overflow near 1e300).
UNCAPPED = 1e12


@dataclass(frozen=True)
class CentralRound:
    """One round's outcome: ``labels`` (B,) or (B, k), -1 where not answered; ``answered``
    the guardian's mask (the mechanism's answer shape); the parties whose votes counted;
    those the guardian's ledger left out (epsilon left) and those whose own ledger
    refused (why); and how the guardian settled it."""

    round_id: int
    labels: NDArray[np.int64]
    answered: NDArray[np.bool_]
    parties: tuple[str, ...]
    excluded: Mapping[str, float]
    refused: Mapping[str, str]
    computed: Computed


def histogram(shares: NDArray[np.uint64], frac_bits: int) -> NDArray[np.float64]:
    """The vote histogram (votes) from the sum of both shares in Z_2^64, read as signed
    fixed point with ``frac_bits`` fractional bits."""
    return np.asarray(shares, dtype=np.uint64).view(np.int64).astype(np.float64) / (1 << frac_bits)


class CentralDriver(Generic[TaskT]):
    """The guardian, the answering parties of ``caps`` (epsilon each, in the guardian's
    ledger) and a student, for rounds of ``task``.

    ``own_caps``: each party's own cap (default: its cap in the guardian's ledger);
    ``rng``: the guardian's randomness (its noise; seeded, it replays); ``mode``:
    ``"2pc"`` or ``"oracle"`` (see the module); ``config``: the task's configuration as
    the parties' own ledgers register it (default: the task's mechanism and quorum);
    ``timeout``: seconds either side of the 2PC waits for the other.
    """

    def __init__(
        self,
        task: TaskT,
        caps: Mapping[str, float],
        *,
        own_caps: Mapping[str, float] | None = None,
        rng: SecureRandom | None = None,
        mode: Mode = "2pc",
        accounting: Accounting | None = None,
        delta: float = 1e-5,
        config: Mapping[str, object] | None = None,
        timeout: float = 300.0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        acct = accounting or accountants.make(accountants.DEFAULT_ACCOUNTANT)
        self.task = task
        self.mode = mode
        self.timeout = timeout
        self.ledger = MemoryLedger(accounting=acct, delta=delta)
        for name, cap in caps.items():
            self.ledger.register(name, cap)
        own = dict(caps) if own_caps is None else {**caps, **own_caps}
        self.parties = {
            name: PartyCore(name, MemoryPartyLedger(name, own[name], accounting=acct, delta=delta))
            for name in caps
        }
        self.guardian: GuardianCore[TaskT] = GuardianCore(
            self.ledger, round_timeout=math.inf, rng=rng, central=True
        )
        self.student = StudentCore(STUDENT, X25519PrivateKey.generate())
        self.config = (
            dict(config)
            if config is not None
            else {
                "mechanism": task.mechanism.to_config(),
                "outputs": task.mechanism.outputs,
                "quorum": task.quorum,
            }
        )
        self._pair: LocalPair | None = None
        self._clock = itertools.count()

    # -- rounds ------------------------------------------------------------------------
    def label(self, predictions: Mapping[str, ArrayLike]) -> CentralRound:
        """One round over the parties of ``predictions``: each party's teachers' predictions
        (B, m) classes or (B, m, k) labels on the same B queries."""
        arrays = {p: np.asarray(x) for p, x in predictions.items()}
        batch = self._batch({p: x.shape[0] if x.ndim else 0 for p, x in arrays.items()})
        teachers = {p: int(x.shape[1]) if x.ndim >= 2 else 0 for p, x in arrays.items()}
        outputs = self.task.mechanism.outputs
        return self._round(
            batch, teachers, lambda party, w: party.vote(w, arrays[w.party], outputs)
        )

    def label_counts(
        self, counts: Mapping[str, ArrayLike], teachers: Mapping[str, int]
    ) -> CentralRound:
        """One round over the parties of ``counts``: each party's histogram (B, width) of its
        ``teachers`` teachers' votes, on the mechanism's vote grid at weight 1."""
        arrays = {p: np.asarray(c) for p, c in counts.items()}
        batch = self._batch({p: c.shape[0] if c.ndim else 0 for p, c in arrays.items()})
        votes = {p: int(teachers[p]) for p in arrays}
        return self._round(
            batch, votes, lambda party, w: party.vote_counts(w, arrays[w.party], votes[w.party])
        )

    def _batch(self, sizes: Mapping[str, int]) -> int:
        unknown = sorted(set(sizes) - set(self.parties))
        if unknown:
            raise ValueError(
                f"no answering party named {unknown}; the driver has {sorted(self.parties)}"
            )
        batch = set(sizes.values())
        if len(batch) != 1 or min(batch) < 1:
            raise ValueError(f"every party votes on the same B >= 1 queries, got {dict(sizes)}")
        return batch.pop()

    def _round(
        self,
        batch: int,
        teachers: Mapping[str, int],
        vote: Callable[[PartyCore, RoundWork], PartyShares],
    ) -> CentralRound:
        request = self.student.request(QueryBatch("tensor", batch), session_id=SESSION)
        rnd, work = self.guardian.open(
            self.task, request, sorted(teachers), teachers, float(next(self._clock))
        )
        refused: dict[str, str] = {}
        try:
            for w in work:
                party = self.parties[w.party]
                w = replace(w, task_config=self.config)
                try:
                    party.admit(w)
                except VoteRefusedError as err:
                    refused[w.party] = str(err)
                    self.guardian.party_failed(rnd.round_id, w.party)
                    continue
                self.guardian.receive(vote(party, w))
            opened = self.guardian.close(rnd.round_id)
            mine = self.student.opened(self.task, opened, batch)
            student_sum = self.student.share_sum(mine)
            ready = self.guardian.to_compute(rnd.round_id)
            if self.mode == "2pc":
                labels, answered, computed = self._two_party(ready, mine, student_sum)
            else:
                labels, answered, computed = self._oracle(ready, student_sum)
        except Exception as err:
            # A round that will not finish: aborted before its release (charged its
            # reservation after), and every party's own ledger told so.
            self.guardian.settle(rnd.round_id, f"the central driver stopped: {err}")
            for p in rnd.included:
                self.parties[p].forget(rnd.round_id)
            self._settle_parties(rnd.round_id, rnd.included)
            raise
        self._settle_parties(rnd.round_id, rnd.included)
        return CentralRound(
            rnd.round_id,
            labels,
            answered,
            ready.used,
            dict(rnd.excluded),
            refused,
            computed,
        )

    def _two_party(
        self, rnd: RoundView[TaskT], mine: StudentRound, student_sum: NDArray[np.uint64]
    ) -> tuple[NDArray[np.int64], NDArray[np.bool_], Computed]:
        """The round's garbled circuit between the guardian and the student."""
        spec, garbler = self.guardian.garbler_inputs(rnd)
        # Released before the first garbled input leaves, as over the network.
        self.guardian.release(rnd.round_id)
        student_spec, evaluator = self.student.evaluator_inputs(mine, student_sum)
        if self._pair is None:
            self._pair = LocalPair(timeout=self.timeout)
        out = self._pair.run(spec.circuit(), garbler, evaluator, rnd.batch)
        computed = self.guardian.computed(rnd.round_id, spec, out.garbler)
        answered = self.task.mechanism.answered(spec, out.garbler, rnd.batch)
        return self.student.labels(mine, student_spec, out.evaluator), answered, computed

    def _oracle(
        self, rnd: RoundView[TaskT], student_sum: NDArray[np.uint64]
    ) -> tuple[NDArray[np.int64], NDArray[np.bool_], Computed]:
        """The mechanism's oracle on the reconstructed histogram, with the noise the
        guardian would fold into its circuit inputs."""
        if rnd.guardian_sum is None:
            raise RoundRefusedError(f"round {rnd.round_id} has no share sum to compute on")
        plan = circuit.round_circuit(rnd)
        hist = histogram(rnd.guardian_sum + student_sum, self.task.frac_bits)
        theta = plan.theta
        if theta is None and self.task.mechanism.per_label:
            # The circuit's own: half the voters' total weight (every query's here).
            theta = plan.vote_total / 2.0
        labels, answered = oracle_release(
            hist, self.task.mechanism, self.guardian.rng, plan.spec.frac_bits, theta
        )
        self.guardian.release(rnd.round_id)
        return labels, answered, self.guardian.charge(rnd.round_id, answered)

    def _settle_parties(self, round_id: int, parties: tuple[str, ...]) -> None:
        """Each party settles its own ledger from the guardian's word on the round."""
        record = self.ledger.round_record(round_id)
        for p in parties:
            settled = settlement(record, p)
            if settled is not None:
                self.parties[p].settle(settled)


def oracle_release(
    histograms: ArrayLike,
    mechanism: Mechanism,
    rng: SecureRandom,
    frac_bits: int = CIRCUIT_FRAC_BITS,
    decision_threshold: ArrayLike | None = None,
) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """What a round releases on (N, width) ``histograms`` (votes): the guardian's noise
    for N queries from ``rng`` (``mechanism.draw_noise``, its order, nothing else) and
    the mechanism's oracle on the circuit's grid of ``frac_bits`` fractional bits,
    ``decision_threshold`` (votes; one, or (N,)) for a per-label mechanism. Returns
    (labels, answered).

    The driver's oracle mode computes with it; so does a caller whose histogram no
    party's plain counts can carry (votes weighted per teacher, :mod:`experiments`'
    personalized budgets)."""
    h = np.asarray(histograms, dtype=np.float64)
    if h.ndim != 2 or h.shape[1] != mechanism.vote_width:
        raise ValueError(
            f"histograms must be (N, {mechanism.vote_width}) for {mechanism.name}, got {h.shape}"
        )
    noise = mechanism.draw_noise(len(h), rng)
    return mechanism.oracle(h, noise, frac_bits, decision_threshold)


def label_histograms(
    histograms: ArrayLike,
    mechanism: Mechanism,
    teachers: int,
    rng: SecureRandom,
    *,
    mode: Mode = "2pc",
) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """Label (N, width) vote ``histograms`` of an ensemble of ``teachers`` teachers in one
    round through the three roles: one party holds the ensemble, the guardian draws its
    noise from ``rng`` (``mechanism.draw_noise(N, rng)``, nothing else), and no ledger
    caps the round (the caller keeps its budget filter, :mod:`capc.round.central_budget`).
    Returns (labels, answered), those of :func:`oracle_release` on the same noise (the
    circuit's grid; a per-label mechanism decides at half the teachers).

    Every count lies in [0, teachers] on the mechanism's vote grid (integers, or
    multiples of 2**-vote_grid_bits for tau voting); for a single-label mechanism each
    row totals ``teachers`` (every teacher votes once), as the circuit checks.
    """
    h = np.asarray(histograms, dtype=np.float64)
    if h.ndim != 2 or h.shape[0] < 1 or h.shape[1] != mechanism.vote_width:
        raise ValueError(
            f"histograms must be (N, {mechanism.vote_width}) for {mechanism.name}, got {h.shape}"
        )
    grid = float(1 << mechanism.vote_grid_bits)
    counts = np.rint(h * grid)
    if not np.array_equal(counts, h * grid) or (h < 0).any() or (h > teachers).any():
        on = f" on the grid of 2**-{mechanism.vote_grid_bits}" if mechanism.vote_grid_bits else ""
        raise ValueError(f"vote counts are integers{on} in [0, {teachers}]")
    if not mechanism.per_label and not (h.sum(axis=1) == teachers).all():
        raise ValueError(f"every query's votes total the {teachers} teachers")
    task = MechanismTask("central", mechanism)
    driver = CentralDriver(task, {"ensemble": UNCAPPED}, rng=rng, mode=mode)
    done = driver.label_counts({"ensemble": counts.astype(np.int64)}, {"ensemble": teachers})
    if done.computed.violations:
        raise RoundRefusedError(
            f"{len(done.computed.violations)} histograms broke their vote total in the circuit"
        )
    return done.labels, done.answered


__all__ = [
    "MODES",
    "UNCAPPED",
    "CentralDriver",
    "CentralRound",
    "Mode",
    "histogram",
    "label_histograms",
    "oracle_release",
]
