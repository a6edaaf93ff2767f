"""The guardian's side of a labelling round, as a state machine over a ledger port.

No I/O, threads or clocks: the caller passes "now", holds one lock around every
call, and does the sending. The rules (docs/architecture.md, "One labelling round"):

- open: a request names parties to leave out (at most :data:`MAX_EXCLUDED`); each
  querier holds at most ``max_open`` rounds; a round's proven votes must convert to
  the circuit's ring safely (:func:`check_conversion`); every candidate's worst case
  is reserved in one ledger step *before* anything is sent, parties it would take
  past their cap are left out, and below quorum the ledger refuses with nothing
  reserved. A party whose vote statement is too large to prove is left out.
- collect: each included party sends its shares once, of the round's layout, with
  its sealed seed (plain) or the hash of the ciphertexts it evaluated (encrypted);
  a party that fails or is left out sends nothing more.
- close: below quorum the round is aborted (nothing charged); otherwise the proofs'
  challenge is drawn (proven votes), or the guardian's share sum is ready.
- vote check: once per round, from the student's verifier shares; a vote that fails
  is left out (a dispute is audited naming both sides), below quorum the round is
  aborted, otherwise the sum of the valid votes is ready for the 2PC.
- compute: the ledger marks the round released before the first garbled input
  leaves; afterwards each party is charged what its votes released (a histogram
  that breaks the vote total: the reservation, the worst case).
- settle: a round that will not finish is aborted before its release and charged
  at its reservation after it (over-count, never under-count).
- retry: the student may retry a recent round of its own once without a party whose
  sealed seed it says did not open, only if the old round released nothing.
- reap: a round not released within ``round_timeout`` s of its opening is aborted.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic

import numpy as np
from numpy.typing import NDArray

from capc.mechanisms.base import CircuitSpec, Noise
from capc.mpc import validity
from capc.mpc.mechanism_circuits import violations
from capc.mpc.votes import accepted, proven_vote_sum, verifier_shares
from capc.privacy.randomness import SecureRandom
from capc.round import circuit, personalization
from capc.round.admission import (
    MAX_EXCLUDED,
    check_conversion,
    check_excluded,
    check_noise_values,
    check_task,
)
from capc.round.errors import (
    LimitError,
    RoundInputError,
    RoundRefusedError,
    RoundRequestError,
    RoundStateError,
)
from capc.round.ledger import RoundLedger, RoundState
from capc.round.messages import (
    Computed,
    Opened,
    PartyShares,
    RoundRequest,
    RoundWork,
    ShareLayout,
    VoteVerdict,
)
from capc.round.settlement import outcome
from capc.round.state import GuardianRound, Phase, RoundView, TaskT
from capc.round.task import RoundTask

log = logging.getLogger("capc.round.guardian")

#: The audit action of a failed check between a querier and a party.
DISPUTE = "dispute"
#: Rounds remembered for a retry without a party.
RECENT_ROUNDS = 4096


@dataclass
class _Recent:
    """A round whose sealed seeds went to its student, for a retry without a party."""

    querier: str
    seeded: frozenset[str]
    retried: bool = False


class GuardianCore(Generic[TaskT]):
    """The guardian's rounds in flight, over ``ledger``.

    ``rng``: the guardian's secure randomness (noise, participation); ``entropy``:
    where the proofs' challenges come from (the OS by default, so a seeded noise
    stream replays unchanged); ``round_timeout``: seconds a round may stay
    unreleased; ``max_open``: rounds one querier may hold open.

    ``central``: every party and the student run in this process, driven by
    :mod:`capc.round.central`, so none can deviate: their votes travel as plain ring
    shares (no validity proof, so no bound on a proof's ring conversion either), and
    a mechanism that is not offset-robust may run. Never for a networked guardian.
    """

    def __init__(
        self,
        ledger: RoundLedger,
        *,
        round_timeout: float,
        rng: SecureRandom | None = None,
        max_open: int = 16,
        entropy: Callable[[int], bytes] = secrets.token_bytes,
        central: bool = False,
    ) -> None:
        self.ledger = ledger
        self.round_timeout = round_timeout
        self.max_open = max_open
        self.rng = rng or SecureRandom()
        self._entropy = entropy
        self.central = central
        self._rounds: dict[int, GuardianRound[TaskT]] = {}
        self.recent: OrderedDict[int, _Recent] = OrderedDict()

    # -- personalized budgets ----------------------------------------------------
    def rates(
        self, task: RoundTask, parties: Sequence[str] | None = None
    ) -> dict[str, tuple[float, float]]:
        """(vote weight, participation rate) per party (default: every answering party)
        from the parties' caps; (1, 1) without personalization."""
        caps = self.ledger.caps()
        names = list(caps) if parties is None else list(parties)
        return personalization.rates(task, caps, names, self.ledger.accounting, self.ledger.delta)

    # -- opening -----------------------------------------------------------------
    def open(
        self,
        task: TaskT,
        request: RoundRequest,
        candidates: Sequence[str],
        teachers: Mapping[str, int],
        now: float,
        trained: Collection[str] = (),
    ) -> tuple[RoundView[TaskT], list[RoundWork]]:
        """Admit, reserve and open a round over ``candidates`` (the reachable parties),
        voting with ``teachers`` each; returns its view and the work for every party asked.
        ``trained``: the parties that registered an attestation of DP-trained teachers,
        the only ones a mechanism for DP-trained teachers asks.

        Raises RoundRequestError, LimitError, or the ledger's QuorumError (nothing
        reserved). Call :meth:`retry_without` first for a retry.
        """
        if not self.central:
            check_task(task)
        excluded = check_excluded(request.exclude) | request.left_out
        querier, batch, encrypted = request.querier, request.batch, request.queries.encrypted
        held = sum(1 for r in self._rounds.values() if r.querier == querier)
        if held >= self.max_open:
            raise LimitError(
                f"{querier} holds {held} rounds opened but not yet computed, the most one "
                f"querier may (MAX_OPEN_ROUNDS_PER_QUERIER); this round is refused and "
                "nothing was reserved. Run the 2PC of the open rounds first; a round "
                f"never computed is aborted {self.round_timeout:g} s after its opening"
            )
        candidates = [p for p in candidates if p not in excluded]
        if task.mechanism.trained_teachers_only:
            candidates = self._trained_only(task, candidates, trained)
        proven = not (encrypted or self.central)
        if proven:
            check_conversion(task, batch, teachers, candidates)
        if not self.central:  # the circuits' range: what bounds the cut-off's delta
            check_noise_values(task, batch)
        weights, votes_on = personalization.draw(
            task, self.rates(task, candidates), batch, self.rng
        )
        for mask in votes_on.values():
            # What each party is charged for: shared read-only with the views and the work
            # adapters get, so none of them can narrow it after the reservation.
            mask.flags.writeable = False
        # Each party's own worst case: every query it votes on answered, at its weight.
        worst = {
            p: task.mechanism.worst_case(
                int(votes_on[p].sum()) if p in votes_on else batch, weights.get(p, 1.0)
            )
            for p in candidates
        }
        reservation = self.ledger.reserve(
            request.round_key,
            task.name,
            querier,
            batch,
            worst,
            mechanism=task.mechanism.name,
            quorum=task.quorum,
            disclosure=request.disclosure,
        )
        rnd: GuardianRound[TaskT] = GuardianRound(
            reservation.round_id,
            task,
            querier,
            batch,
            reservation.included,
            dict(reservation.excluded),
            now,
            session_id=request.session_id,
            ciphertext_hash=request.queries.digest if encrypted else None,
            weights=weights,
            votes_on=votes_on,
            teachers={p: teachers[p] for p in reservation.included if p in teachers},
        )
        self._rounds[rnd.round_id] = rnd
        work = []
        for p in rnd.included:
            if p not in rnd.teachers:  # its stream went away meanwhile
                rnd.failed.add(p)
                continue
            if proven:
                # Every plaintext vote carries its proof; a party whose teacher count makes
                # the statement too large to prove would vote unchecked: left out instead.
                relation = task.mechanism.vote_relation(rnd.voters(p))
                if relation is None:
                    self._unprovable(rnd, p)
                    continue
                rnd.relations[p] = relation
            work.append(
                RoundWork(
                    rnd.round_id,
                    p,
                    task.mechanism,
                    request.student_public_key,
                    rnd.weight(p),
                    task.frac_bits,
                    rnd.voters(p),
                    votes_on.get(p),
                    request.queries,
                    task.name,
                    proven=proven,
                )
            )
        return rnd.view(), work

    # -- what adapters may see ---------------------------------------------------------
    def view(self, round_id: int) -> RoundView[TaskT] | None:
        """Round ``round_id`` as it stands now, or None when it is not open (never
        opened, or ended: committed, aborted, settled)."""
        rnd = self._rounds.get(round_id)
        return None if rnd is None else rnd.view()

    def is_open(self, round_id: int) -> bool:
        """Whether round ``round_id`` is open here (a lookup, no copy)."""
        return round_id in self._rounds

    def collected(self, round_id: int) -> bool:
        """Whether every included party of open round ``round_id`` answered or failed
        (False when it is not open)."""
        rnd = self._rounds.get(round_id)
        return rnd is not None and rnd.collected

    def open_ids(self) -> list[int]:
        """The ids of the rounds open here."""
        return list(self._rounds)

    def _trained_only(
        self, task: TaskT, candidates: Sequence[str], trained: Collection[str]
    ) -> list[str]:
        """The candidates whose every voting teacher is attested DP-trained: a round of a
        mechanism that charges nothing per answer asks no other (their votes would be
        released without noise or charge). Below quorum RoundRequestError, nothing reserved."""
        kept = [p for p in candidates if p in trained]
        if len(kept) >= task.quorum:
            if len(kept) < len(candidates):
                log.info(
                    "%s: left out %s, which registered no DP-trained teachers",
                    task.mechanism.name,
                    ", ".join(p for p in candidates if p not in trained),
                )
            return kept
        others = [p for p in candidates if p not in trained][:10]
        raise RoundRequestError(
            f"task {task.name} uses {task.mechanism.name}, which adds no noise and charges "
            "nothing per answer: only hospitals whose every voting teacher was trained with "
            f"DP-SGD (attested when they registered) may vote in it. {len(kept)} of the "
            f"{len(candidates)} reachable parties did"
            + (f" ({', '.join(others)} did not)" if others else "")
            + f", below the task's quorum of {task.quorum}; nothing was reserved. Start "
            "those hospitals with DP-trained teachers (capc teacher fit --dp-epsilon), or "
            "label with a noisy mechanism"
        )

    def _unprovable(self, rnd: GuardianRound[TaskT], party: str) -> None:
        rnd.failed.add(party)
        rnd.invalid[party] = (
            f"{rnd.voters(party)} teachers make its {rnd.task.mechanism.name} vote too large to "
            f"prove valid; it was left out of round {rnd.round_id}: register fewer teachers "
            "(split the ensemble over several answering parties)"
        )
        self.ledger.record(
            party,
            "unprovable_vote",
            {"round": rnd.round_id, "querier": rnd.querier, "teachers": rnd.voters(party)},
        )
        log.warning("round %d: %s %s", rnd.round_id, party, rnd.invalid[party])

    def retry_without(self, request: RoundRequest) -> None:
        """The student retries a recent round of its own without a party whose sealed seed
        it says it could not open: check the claim, settle the old round if it is still
        open, and audit a dispute (either side can cause a seed that does not open).

        Refused (RoundRequestError) unless the round sent it that party's seed, was not
        retried before, and released nothing.
        """
        retry = request.retry
        if retry is None:
            return
        party, old, querier = retry.party, retry.round_id, request.querier
        if party not in request.exclude:
            raise RoundRequestError(
                f"a retry without {party or 'no party'} must leave it out: name it in exclude"
            )
        seen = self.recent.get(old)
        if seen is None or seen.querier != querier or party not in seen.seeded:
            raise RoundRequestError(
                f"round {old} is not a recent round of {querier} that sent it {party}'s "
                "sealed seed: a retry names the round it retries and the party it leaves out"
            )
        if seen.retried:
            raise RoundRequestError(f"round {old} was retried already; a round is retried once")
        rnd = self._rounds.get(old)
        if rnd is not None and rnd.released:
            raise RoundRequestError(
                f"round {old} was computed: its seeds opened, so it cannot be retried"
            )
        seen.retried = True
        why = f"the student retries it without {party}"
        if rnd is not None:
            self._settle(rnd, why)
        else:
            # Out of the open rounds but maybe not settled yet (an ending session settles
            # it a moment later): nobody can release it any more, so settle it here.
            with contextlib.suppress(RoundStateError):
                if self.ledger.round_state(old) == RoundState.RESERVED:
                    self.ledger.abort(old, reason=why)
        # Only a round aborted before its 2PC released nothing: only that one is answered again.
        state = self.ledger.round_state(old)
        if state != RoundState.ABORTED:
            raise RoundRequestError(
                f"round {old} was computed or is still open ({state}): its seeds opened, "
                "so it cannot be retried; open a new round"
            )
        detail = {"round": old, "querier": querier, "party": party, "check": "sealed_seed"}
        self.ledger.record("guardian", DISPUTE, detail, note=retry.reason)
        log.warning("round %d: %s retries it without %s: %s", old, querier, party, retry.reason)

    # -- collecting shares ---------------------------------------------------------
    def party_failed(self, round_id: int, party: str) -> bool:
        """``party`` cannot answer round ``round_id``; False when the round did not ask it."""
        rnd = self._rounds.get(round_id)
        if rnd is None or party not in rnd.included:
            return False
        rnd.failed.add(party)
        return True

    def layout(self, round_id: int, party: str) -> ShareLayout:
        """The shares round ``round_id`` takes from ``party``; RoundInputError when it takes
        none (not asked, left out, or a plain share where a proof is due)."""
        rnd = self._rounds.get(round_id)
        if rnd is None or party not in rnd.included:
            raise RoundInputError(f"round {round_id} did not ask {party} for shares")
        if rnd.left_out(party):  # unproven shares would count
            raise RoundInputError(
                f"{party} was left out of round {round_id}: its shares are refused"
            )
        relation = rnd.relations.get(party)
        if relation is None:
            if rnd.relations and rnd.ciphertext_hash is None:
                raise RoundInputError(
                    f"round {round_id} takes proven votes only; {party} has no proof statement"
                )
            return ShareLayout(rnd.batch, rnd.task.vote_width)
        return ShareLayout(rnd.batch, relation.elements, True, relation.proof_elements)

    def receive(self, msg: PartyShares) -> bool:
        """Accept one party's shares (of :meth:`layout`); returns whether every included
        party has now answered or failed. RoundInputError for replays and mismatches."""
        layout = self.layout(msg.round_id, msg.party)
        rnd = self._rounds[msg.round_id]
        proven = layout.proof_width is not None
        if msg.share.shape != (layout.batch, layout.width) or (
            proven and (msg.proof is None or msg.proof.shape != (layout.batch, layout.proof_width))
        ):
            raise RoundInputError(f"shares for round {msg.round_id} are not of its layout")
        if rnd.ciphertext_hash is not None:
            if msg.batch_hash != rnd.ciphertext_hash:
                raise RoundInputError(
                    f"{msg.party} evaluated other ciphertexts than round {msg.round_id} "
                    "named: refused"
                )
        elif not msg.sealed_seed:
            raise RoundInputError("shares without a sealed seed cannot be used")
        rnd.expect(
            Phase.COLLECTING,
            why=f"round {msg.round_id} closed: {msg.party}'s late shares are refused",
        )
        if msg.party in rnd.shares:
            raise RoundInputError(
                f"{msg.party} already sent shares for round {msg.round_id}: duplicate refused"
            )
        rnd.shares[msg.party] = msg.share
        if proven and msg.proof is not None:
            rnd.proofs[msg.party] = msg.proof
        rnd.seeds[msg.party] = msg.sealed_seed
        return rnd.collected

    def close(self, round_id: int) -> Opened:
        """The shares are in, or the caller stopped waiting: abort below quorum
        (RoundRefusedError, nothing charged); else draw the proofs' challenge or sum the
        guardian shares (then the round is :attr:`~GuardianRound.ready`)."""
        rnd = self._rounds.get(round_id)
        if rnd is None:
            raise RoundRefusedError(
                f"round {round_id} is no longer open: it was aborted; nothing was charged"
            )
        task, batch = rnd.task, rnd.batch
        rnd.expect(Phase.COLLECTING, why=f"round {round_id} was closed already")
        used = tuple(sorted(rnd.shares))
        if len(used) < task.quorum:
            self._abort(rnd, f"only {len(used)} parties answered, quorum {task.quorum}")
            missing = sorted(set(rnd.included) - set(used))
            raise RoundRefusedError(
                f"round aborted: {len(used)} of {len(rnd.included)} parties answered (quorum "
                f"{task.quorum}); missing {missing}; nothing was charged"
            )
        rnd.used = used
        challenge = b""
        if any(p in rnd.relations for p in used):
            # Drawn now that every share is in, so no party could adapt its proof to it.
            rnd.challenge = validity.Challenge.draw(self._entropy(24))
            challenge = rnd.challenge.to_bytes()
            rnd.advance(Phase.CHECKING)
        elif rnd.ciphertext_hash is not None:
            # Encrypted mode: no proof is possible (a party never sees its vote), so the
            # circuit checks each party's one-hot vote: it takes every share, in ``used`` order.
            rnd.guardian_sum = np.stack([rnd.shares[p] for p in used], axis=1)
            rnd.shares.clear()
            rnd.advance(Phase.READY)
        else:
            total = np.zeros((batch, task.vote_width), dtype=np.uint64)
            for p in used:
                total += rnd.shares[p]
            rnd.guardian_sum = total
            rnd.shares.clear()
            rnd.advance(Phase.READY)
        self.recent[round_id] = _Recent(rnd.querier, frozenset(p for p in used if p in rnd.seeds))
        while len(self.recent) > RECENT_ROUNDS:
            self.recent.popitem(last=False)
        return Opened(
            round_id,
            used,
            dict(rnd.excluded),
            {p: rnd.seeds[p] for p in used if p in rnd.seeds},
            {p: rnd.voters(p) for p in used},
            challenge,
        )

    # -- the vote check ------------------------------------------------------------------
    def vote_check_batch(
        self, round_id: int, querier: str, session_id: bytes, parties: Sequence[str]
    ) -> int:
        """Check that a vote check for ``parties`` may be taken for round ``round_id`` from
        this student session; returns the round's batch, for reading the check."""
        rnd = self._rounds.get(round_id)
        if rnd is None or (rnd.querier, rnd.session_id) != (querier, session_id):
            raise RoundRefusedError(
                f"round {round_id} is not open for this student session: it was never "
                "opened here, was aborted, or belongs to another session"
            )
        rnd.expect(
            Phase.CHECKING,
            why=f"round {round_id} has no vote validity proofs to check, or they were "
            "checked already",
        )
        proven = [p for p in rnd.used if p in rnd.relations]
        if list(parties) != proven:
            raise RoundInputError(
                f"the vote check must name the round's proven parties in the reply's order {proven}"
            )
        return rnd.batch

    def check_votes(self, round_id: int, student: validity.VerifierShare) -> VoteVerdict:
        """Verify round ``round_id``'s vote validity proofs with the student's verifier
        shares (P, B) and (P,), once (after :meth:`vote_check_batch`). An invalid vote
        is left out and charged nothing; below quorum the round is aborted
        (RoundRefusedError); otherwise the valid votes' sum is ready for the 2PC."""
        rnd = self._rounds[round_id]
        challenge = rnd.challenge
        rnd.expect(Phase.CHECKING, why=f"round {round_id} was checked already")
        if challenge is None:
            raise RoundInputError(f"round {round_id} has no vote validity proofs to check")
        # Once: a well-formed check is the only one (below quorum the round is ended).
        rnd.advance(Phase.READY)
        parties = [p for p in rnd.used if p in rnd.relations]
        plain = [p for p in rnd.used if p not in rnd.relations]
        constants = {p: rnd.voters(p) * rnd.voting(p).astype(np.uint64) for p in parties}
        try:
            mine = verifier_shares(
                rnd.relations, challenge, parties, rnd.shares, rnd.proofs, constants
            )
            valid = accepted(rnd.relations, challenge, parties, mine, student)
        except Exception as err:
            # The round already left CHECKING (one check only); a check that cannot be
            # verified must not leave it READY without a share sum for the reaper: it is
            # aborted now, before anything was released.
            self._abort(rnd, f"its vote check could not be verified: {err}")
            raise RoundRefusedError(
                f"round {round_id} aborted: the student's vote check could not be verified "
                f"({err}); nothing was charged. Open a new round"
            ) from None
        for p in parties:
            if not valid[p]:
                self._exclude_vote(rnd, p)
        proven = [p for p in parties if valid[p]]
        used = tuple(sorted([*proven, *plain]))
        weights = {p: rnd.weight_on_grid(p) for p in proven}
        if len(used) < rnd.task.quorum:
            invalid = sorted(rnd.invalid)
            self._abort(
                rnd, f"{len(used)} valid votes, quorum {rnd.task.quorum}; invalid: {invalid}"
            )
            raise RoundRefusedError(
                f"round {round_id} aborted: {len(used)} of {len(parties)} votes are valid "
                f"(quorum {rnd.task.quorum}); invalid: {invalid}; nothing was charged"
            )
        rnd.used = used
        total = np.zeros((rnd.batch, rnd.task.vote_width), dtype=np.uint64)
        if proven:
            relations = {p: rnd.relations[p] for p in proven}
            total += proven_vote_sum(relations, rnd.shares, weights, student=False)
        for p in plain:
            total += rnd.shares[p]
        rnd.guardian_sum = total
        rnd.shares.clear()
        rnd.proofs.clear()
        return VoteVerdict(
            round_id,
            used,
            dict(sorted(rnd.invalid.items())),
            weights,
            {p: rnd.voters(p) for p in used},
        )

    def _exclude_vote(self, rnd: GuardianRound[TaskT], party: str) -> None:
        rnd.invalid[party] = (
            f"its vote validity proof did not check with {rnd.querier}'s verifier message: "
            f"not a valid {rnd.task.mechanism.name} vote of {rnd.voters(party)} teachers, or a "
            f"wrong message from the student; its vote was left out of round {rnd.round_id}"
        )
        # Either side can fail the check (the student by changing its verifier message), so
        # the guardian, which saw it fail, records a dispute naming both, not a culprit.
        detail = {
            "round": rnd.round_id,
            "querier": rnd.querier,
            "party": party,
            "check": "vote_validity",
            "mechanism": rnd.task.mechanism.name,
        }
        self.ledger.record("guardian", DISPUTE, detail)
        log.warning("round %d: %s %s", rnd.round_id, party, rnd.invalid[party])

    # -- the 2PC -----------------------------------------------------------------------
    def to_compute(self, round_id: int) -> RoundView[TaskT]:
        """The round to garble next, as a snapshot holding its share sum (read-only);
        RoundRefusedError when it is gone (reaped)."""
        rnd = self._rounds.get(round_id)
        if rnd is None or not rnd.ready or rnd.guardian_sum is None:
            raise RoundRefusedError(
                f"round {round_id} is no longer open: it was not computed within "
                f"{self.round_timeout:g} s of opening and was aborted; nothing was charged. "
                "Open a new round"
            )
        return rnd.view()

    def draw_noise(self, rnd: RoundView[TaskT]) -> Noise:
        """``rnd``'s fresh noise from :attr:`rng`. Call it under the caller's lock on this
        core, as every other use of :attr:`rng`: the source is shared by every session."""
        return circuit.draw_noise(rnd, self.rng)

    def garbler_inputs(
        self, rnd: RoundView[TaskT], noise: Noise | None = None
    ) -> tuple[CircuitSpec, dict[str, NDArray[np.uint64]]]:
        """The circuit and the guardian's inputs for ``rnd`` (:func:`circuit.garbler_inputs`)
        with ``noise`` (:meth:`draw_noise`; None: drawn now, under the caller's lock). Reads
        only the snapshot: it may run outside the caller's lock."""
        return circuit.garbler_inputs(rnd, self.rng, noise)

    def _open_round(self, round_id: int, why: str) -> GuardianRound[TaskT]:
        rnd = self._rounds.get(round_id)
        if rnd is None:
            raise RoundRefusedError(f"round {round_id} is no longer open: {why}")
        return rnd

    def release(self, round_id: int) -> None:
        """Record round ``round_id`` released, before the first garbled input leaves;
        RoundRefusedError when it was aborted first (the reaper): nothing may leave for
        it. PhaseError unless it is READY (released once, and only with its share sum)."""
        aborted = (
            f"round {round_id} was aborted before its 2PC: it was not computed within "
            f"{self.round_timeout:g} s of opening; nothing was charged. Open a new round"
        )
        rnd = self._open_round(round_id, aborted)
        rnd.expect(Phase.READY, why=f"round {round_id} is {rnd.phase.value}, not ready")
        try:
            self.ledger.release(round_id)
        except RoundStateError as err:
            raise RoundRefusedError(f"{aborted} ({err})") from None
        rnd.advance(Phase.RELEASED)

    def computed(
        self, round_id: int, spec: CircuitSpec, out: Mapping[str, NDArray[np.uint64]]
    ) -> Computed:
        """Settle released round ``round_id`` from the guardian's circuit outputs: each
        party is charged what the queries it voted on released, at its weight; a histogram
        that broke the vote total charges every party its reservation (the worst case,
        never less)."""
        rnd = self._released(round_id)
        b, mech = rnd.batch, rnd.task.mechanism
        bad = violations(dict(out))
        if bad.size:
            self.ledger.commit_at_reservation(round_id)
            self._rounds.pop(round_id, None)
            self.ledger.record(
                "guardian",
                "histogram_violation",
                {
                    "round": round_id,
                    "queries": [int(q) for q in bad[:20]],
                    "violations": int(bad.size),
                    "parties": list(rnd.used),
                },
            )
            log.warning("round %d: %d histograms broke their vote total", round_id, bad.size)
            return Computed(round_id, 0, b, rnd.used, tuple(int(q) for q in bad))
        return self.charge(round_id, mech.answered(spec, dict(out), b))

    def _released(self, round_id: int) -> GuardianRound[TaskT]:
        rnd = self._open_round(round_id, "it was settled before its outputs were counted")
        rnd.expect(Phase.RELEASED, why=f"round {round_id} is {rnd.phase.value}, not released")
        return rnd

    def charge(self, round_id: int, answered: NDArray[np.bool_]) -> Computed:
        """Settle released round ``round_id`` from what it released, ``answered`` (the
        mechanism's answer shape): each party is charged the queries it voted on, at its
        weight. The circuit's outputs give ``answered`` (:meth:`computed`); a central
        driver running the mechanism's oracle gives it directly. The round stays open
        until the ledger took the charge, so a failed write is still settled (at its
        reservation) by :meth:`settle`."""
        rnd = self._released(round_id)
        b, mech = rnd.batch, rnd.task.mechanism
        charges = {p: mech.event(answered[rnd.voting(p)], rnd.weight(p)) for p in rnd.used}
        self.ledger.commit(round_id, charges, outcome=outcome(answered))
        self._rounds.pop(round_id, None)
        count = int(answered.reshape(b, -1).any(axis=1).sum())
        return Computed(round_id, count, b, rnd.used)

    # -- ending ------------------------------------------------------------------------
    def _abort(self, rnd: GuardianRound[TaskT], why: str) -> None:
        self._rounds.pop(rnd.round_id, None)
        with contextlib.suppress(RoundStateError):  # the reaper may have been first
            self.ledger.abort(rnd.round_id, reason=why)

    def settle(self, round_id: int, why: str) -> None:
        """Open round ``round_id`` will not finish: aborted before its release, charged its
        reservation after. A round no longer open (committed, reaped) is left as it is."""
        rnd = self._rounds.get(round_id)
        if rnd is not None:
            self._settle(rnd, why)

    def _settle(self, rnd: GuardianRound[TaskT], why: str) -> None:
        self._rounds.pop(rnd.round_id, None)
        try:
            if rnd.released:
                self.ledger.commit_at_reservation(rnd.round_id)
                log.warning("round %d charged at its reservation: %s", rnd.round_id, why)
            else:
                self.ledger.abort(rnd.round_id, reason=why)
                log.warning("round %d aborted, nothing charged: %s", rnd.round_id, why)
        except RoundStateError:
            pass

    def end_session(self, querier: str, session_id: bytes, why: str) -> list[int]:
        """The student's 2PC session ended: its rounds awaiting their vote check can never
        run; settle them. Returns their ids."""
        unchecked = [
            r
            for r in self._rounds.values()
            if (r.querier, r.session_id) == (querier, session_id)
            and r.challenge is not None
            and not r.checked
        ]
        for r in unchecked:
            self._settle(r, f"{why}, before the round's vote check")
        return [r.round_id for r in unchecked]

    def reap(self, now: float) -> list[int]:
        """Abort every round not released within ``round_timeout`` s of its opening (by the
        caller's clock ``now``); returns their ids. A round released meanwhile stays."""
        stale = [
            r
            for r in self._rounds.values()
            if not r.released and now - r.opened_at > self.round_timeout
        ]
        reaped = []
        for rnd in stale:
            try:
                self.ledger.abort(
                    rnd.round_id,
                    reason=f"not computed within {self.round_timeout:g} s of opening "
                    "(--round-timeout); nothing was released",
                )
            except RoundStateError:
                continue  # settled meanwhile: whoever holds it finishes it
            self._rounds.pop(rnd.round_id, None)
            log.warning(
                "round %d of %s aborted: not computed within %g s; reservations returned",
                rnd.round_id,
                rnd.querier,
                self.round_timeout,
            )
            reaped.append(rnd.round_id)
        return reaped


__all__ = [
    "DISPUTE",
    "MAX_EXCLUDED",
    "GuardianCore",
    "RoundView",
    "check_conversion",
    "check_excluded",
    "check_task",
]
