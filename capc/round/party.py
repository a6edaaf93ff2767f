"""An answering party's side of a labelling round, as a state machine over its own ledger.

No I/O, models or clocks: the caller runs the teachers and does the sending. The
rules (docs/architecture.md, "One labelling round"; docs/privacy.md, a hospital's
own ledger):

- admit: a party votes only for a guardian it can account with (the caller says
  when it cannot: :attr:`PartyCore.refusing`). Before anything derived from its data
  leaves, it computes the round's worst case itself, from the mechanism and the
  terms the round carries (its vote weight, the queries it votes on), and reserves
  it in its own ledger; past its own cap it refuses, whatever the guardian's ledger
  says, with nothing written. A round is voted in once: a replayed round is refused.
  An encrypted round's vote is a whole one-hot on every query, so one that names
  another weight or a participation mask is refused (it would be charged for less).
- vote: only an admitted round, once, with the teachers the guardian counts: the
  teachers' votes summed (each encoded on its own), shared with a fresh seed sealed
  to the student, with a validity proof where the mechanism has a statement.
- settle: the guardian says how the round ended; the party charges itself what that
  implies, computed from the terms it kept: nothing (the vote was not used), the
  worst case (what it released is unknown), or the mechanism's event of what the
  round released on the queries it voted on. A round it is never told about keeps its
  reservation: a crash may over-count, never under-count. A settlement the caller
  does not believe (a guardian's audit head that fails its check) leaves the
  reservation in place.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from capc.mechanisms import Mechanism, MechanismError
from capc.mechanisms.registry import from_config
from capc.mpc.votes import share_proven_votes, share_votes
from capc.round.errors import (
    DuplicateRoundError,
    LedgerRefusedError,
    QuorumError,
    RoundInputError,
    VoteRefusedError,
)
from capc.round.ledger import KeptSetting, PartyLedger, RoundState
from capc.round.messages import PartyShares, RoundWork, Settlement
from capc.round.training import Attestation, TrainingCharge

log = logging.getLogger("capc.round.party")


def pack_mask(mask: NDArray[np.bool_] | None) -> bytes:
    """A (B,) mask as its bits, least significant first; None (every query) is empty."""
    return b"" if mask is None else np.packbits(mask, bitorder="little").tobytes()


def unpack_mask(data: bytes, count: int) -> NDArray[np.bool_] | None:
    """The (count,) mask in ``data`` (:func:`pack_mask`); None when empty. ValueError
    when ``data`` does not hold ``count`` bits."""
    if not data:
        return None
    bits = np.frombuffer(data, dtype=np.uint8)
    if len(bits) != (count + 7) // 8:
        raise ValueError(f"participation must carry {count} bits, got {8 * len(bits)}")
    return np.unpackbits(bits, count=count, bitorder="little").astype(bool)


@dataclass(frozen=True)
class Terms:
    """What a round asked of this party, as its own ledger keeps it (JSON): the mechanism's
    configuration and outputs, its vote weight, the batch, and the packed participation
    mask in hex (empty: every query)."""

    mechanism: dict[str, object]
    outputs: int
    weight: float
    batch: int
    participation: str

    @classmethod
    def of(cls, work: RoundWork) -> Terms:
        return cls(
            work.mechanism.to_config(),
            work.mechanism.outputs,
            float(work.vote_weight),
            work.batch,
            pack_mask(work.participation).hex(),
        )

    def to_dict(self) -> dict[str, object]:
        """As the ledger keeps them (JSON). Every round reserves with them: built field by
        field, not by ``dataclasses.asdict`` (a deep copy of the mechanism's configuration,
        which nothing changes)."""
        return {
            "mechanism": self.mechanism,
            "outputs": self.outputs,
            "weight": self.weight,
            "batch": self.batch,
            "participation": self.participation,
        }

    def voting(self) -> NDArray[np.bool_]:
        """(batch,) mask of the queries this party voted on."""
        mask = unpack_mask(bytes.fromhex(self.participation), self.batch)
        return np.ones(self.batch, dtype=bool) if mask is None else mask

    def rebuilt(self) -> Mechanism:
        """The round's mechanism, from its kept configuration."""
        return from_config(self.mechanism, self.outputs)


def ensemble_votes(
    work: RoundWork, predictions: ArrayLike, outputs: int, *, weighted: bool = True
) -> NDArray[np.uint64]:
    """The votes (B, width) uint64 ``work`` asks for: the sum over the party's teachers of
    each one's encoded vote. ``predictions``: (B, m) classes or (B, m, k) labels;
    ``outputs``: the teachers' classes or labels. ``weighted=False``: the plain counts
    (weight 1, on the mechanism's vote grid) that a validity proof is about; the
    verifiers apply the weight to their shares."""
    mech = work.mechanism
    if mech.outputs != outputs:
        raise RoundInputError(
            f"the task has {mech.outputs} outputs, this party's teachers {outputs}"
        )
    return mech.encode_ensemble_votes(
        predictions,
        weight=work.vote_weight if weighted else 1.0,
        frac_bits=work.frac_bits if weighted else mech.vote_grid_bits,
        participation=work.participation,
    )


class PartyCore:
    """Answering party ``name``'s rounds, over its own ``ledger``."""

    def __init__(self, name: str, ledger: PartyLedger) -> None:
        self.name = name
        self.ledger = ledger
        #: Why this party refuses every round for now (a guardian it cannot account with).
        self.refusing: str | None = None
        # Rounds admitted (reserved) and not yet voted: each is voted in once.
        self._admitted: dict[int, RoundWork] = {}
        #: The DP-SGD training of the teachers this party votes with, charged in its own
        #: ledger (:meth:`attest`); None: they are not (all) DP-trained.
        self.trained: TrainingCharge | None = None

    # -- DP-trained teachers -----------------------------------------------------------
    def attest(self, attestation: Attestation) -> TrainingCharge:
        """Charge the training of this party's teachers in its own ledger, once per
        attested digest, before it registers with the guardian (a crash in between
        over-counts). TrainingRefusedError, nothing charged, past its own cap: it must
        not answer with those teachers."""
        self.trained = self.ledger.charge_training(attestation)
        return self.trained

    # -- admission -------------------------------------------------------------------
    def willing(self) -> None:
        """VoteRefusedError while the party refuses every round (:attr:`refusing`)."""
        if self.refusing is not None:
            raise VoteRefusedError(self.refusing)

    def admit(self, work: RoundWork) -> None:
        """Reserve ``work``'s worst case in the party's own ledger before it votes.

        VoteRefusedError when it must not vote (``budget``: its own cap would be
        exceeded), with nothing spent.
        """
        self.willing()
        rid = work.round_id
        if work.party != self.name:
            raise VoteRefusedError(f"round {rid} asks {work.party}, not {self.name}")
        queries = work.queries
        if queries is None or work.task_config is None:
            raise VoteRefusedError(
                f"round {rid} cannot be accounted: it names no queries or no task configuration"
            )
        if work.mechanism.trained_teachers_only and self.trained is None:
            # Its answers would be charged nothing: only teachers whose training this
            # ledger charged may give them.
            raise VoteRefusedError(
                f"round {rid} uses {work.mechanism.name}, which charges nothing per answer: "
                f"only DP-trained teachers whose training {self.name}'s own ledger charged "
                "may vote in it, and this party's are not"
            )
        terms = Terms.of(work)
        if queries.encrypted and (terms.weight != 1.0 or work.participation is not None):
            # The party's encrypted vote is a whole one-hot on every query: charged at a
            # smaller weight or on fewer queries, it would be given for less.
            raise VoteRefusedError(
                f"round {rid} is encrypted: its votes are one-hot of weight 1 "
                f"on every query, but it names weight {terms.weight:g}"
                f"{' and a participation mask' if work.participation is not None else ''}"
            )
        try:
            worst = work.mechanism.worst_case(int(terms.voting().sum()), terms.weight)
            self.ledger.reserve_vote(
                rid,
                work.task,
                work.task_config,
                terms.batch,
                worst,
                mechanism=work.mechanism.name,
                terms=terms.to_dict(),
            )
        except QuorumError as err:
            left = err.remaining.get(self.name, 0.0)
            raise VoteRefusedError(
                f"{self.name}'s own ledger refuses round {rid}: its worst case would "
                f"take {self.name} past its cap of {self.ledger.cap:g} eps ({left:.4g} left)",
                budget=True,
            ) from None
        except DuplicateRoundError:
            raise VoteRefusedError(
                f"{self.name} already voted in round {rid}; a round is voted in once"
            ) from None
        except (LedgerRefusedError, MechanismError, ValueError) as err:
            raise VoteRefusedError(f"round {rid} cannot be accounted: {err}") from None
        self._admitted[rid] = work

    def forget(self, round_id: int) -> None:
        """The caller will not vote in admitted round ``round_id`` (its inference failed):
        the reservation stays until the guardian settles the round."""
        self._admitted.pop(round_id, None)

    # -- voting ----------------------------------------------------------------------
    def check_teachers(self, work: RoundWork, teachers: int) -> None:
        """RoundInputError unless the guardian counts this party with ``teachers`` teachers
        (0: it names no count)."""
        if work.teachers and work.teachers != teachers:
            raise RoundInputError(
                f"the guardian counts this party with {work.teachers} teachers, it votes "
                f"with {teachers}; reconnect so that it registers them"
            )

    def _take(self, work: RoundWork) -> None:
        if self._admitted.get(work.round_id) is not work:
            raise VoteRefusedError(
                f"round {work.round_id} was not admitted here, or was voted in already: a "
                "party votes once, after its own ledger reserved the round"
            )
        del self._admitted[work.round_id]

    def vote(self, work: RoundWork, predictions: ArrayLike, outputs: int) -> PartyShares:
        """The shares of an admitted round from the teachers' ``predictions`` ((B, m)
        classes or (B, m, k) labels over ``outputs``): with a validity proof where the
        round takes one and the mechanism has a statement for m teachers, the plain ring
        shares otherwise."""
        p = np.asarray(predictions)
        if p.ndim < 2 or p.shape[0] != work.batch:
            raise RoundInputError(
                f"round {work.round_id} has {work.batch} queries; predictions of shape "
                f"{p.shape} are not (B, teachers[, labels])"
            )
        teachers = int(p.shape[1])
        self.check_teachers(work, teachers)
        relation = work.mechanism.vote_relation(teachers) if work.proven else None
        if relation is None:
            return self._plain(work, ensemble_votes(work, p, outputs))
        counts = ensemble_votes(work, p, outputs, weighted=False)
        return self.vote_counts(work, counts.astype(np.int64), teachers)

    def vote_counts(self, work: RoundWork, counts: ArrayLike, teachers: int) -> PartyShares:
        """The shares of an admitted round from the party's counts (B, width): how many of
        its ``teachers`` teachers voted for each column, on the mechanism's vote grid at
        weight 1 (the histogram of its ensemble). Proven where the round takes a proof;
        plain ring shares take the counts only as they are (weight 1 on the vote grid)."""
        self.check_teachers(work, teachers)
        c = np.asarray(counts, dtype=np.int64)
        mech = work.mechanism
        if c.shape != (work.batch, mech.vote_width):
            raise RoundInputError(
                f"round {work.round_id} takes counts of shape "
                f"{(work.batch, mech.vote_width)}, got {c.shape}"
            )
        if (c < 0).any() or (c > teachers << mech.vote_grid_bits).any():
            raise RoundInputError(
                f"counts of {teachers} teachers lie in [0, {teachers}] on the vote grid"
            )
        if not work.proven:
            if work.vote_weight != 1.0 or work.frac_bits != mech.vote_grid_bits:
                raise RoundInputError(
                    f"round {work.round_id} weights its votes ({work.vote_weight:g} on "
                    f"{work.frac_bits} bits): give the teachers' predictions, not counts"
                )
            if work.participation is not None:
                c = c * work.participation[:, None]
            return self._plain(work, c.astype(np.uint64))
        relation = mech.vote_relation(teachers)
        if relation is None:
            raise RoundInputError(f"{teachers} teachers make a {mech.name} vote too large to prove")
        self._take(work)
        bits, proof, sealed = share_proven_votes(
            relation, c, work.participation, work.student_public_key, work.round_id, self.name
        )
        return PartyShares(work.round_id, self.name, bits, sealed, proof=proof)

    def _plain(self, work: RoundWork, votes: NDArray[np.uint64]) -> PartyShares:
        self._take(work)
        share, sealed = share_votes(votes, work.student_public_key, work.round_id, self.name)
        return PartyShares(work.round_id, self.name, share, sealed)

    def encrypted_vote(
        self, work: RoundWork, share: NDArray[np.uint64], ciphertext_hash: bytes
    ) -> PartyShares:
        """The shares of an admitted encrypted round: this party's share (B, width) of its
        one-hot vote from its 2PC with the student, and the hash of the ciphertexts it
        evaluated."""
        if share.shape != (work.batch, work.mechanism.vote_width):
            raise RoundInputError(
                f"round {work.round_id} takes a share of shape "
                f"{(work.batch, work.mechanism.vote_width)}, got {share.shape}"
            )
        self._take(work)
        return PartyShares(work.round_id, self.name, share, batch_hash=ciphertext_hash)

    # -- settlement ------------------------------------------------------------------
    def open_rounds(self) -> list[int]:
        """Rounds reserved here and not yet settled, oldest first."""
        return self.ledger.open_rounds()

    def settle(
        self,
        settled: Settlement,
        trust: Callable[[], KeptSetting | None] | None = None,
    ) -> bool:
        """Charge a round as the guardian says it ended; False when there was nothing to do
        (a round this party never reserved, or one settled already) or when the
        settlement is not believed.

        ``trust``: called once the round is known to be open here; the setting to keep
        with the settlement (the guardian's checked audit head), or None when the
        guardian is not taken at its word: the reservation then stays (an over-count,
        never an under-count) until a settlement that checks.
        """
        rid = settled.round_id
        record = self.ledger.round_record(rid)
        if record is None or record.state in (RoundState.COMMITTED, RoundState.ABORTED):
            return False
        keep = None
        if trust is not None:
            keep = trust()
            if keep is None:
                return False
        if settled.kind == "not_charged":
            if record.state == RoundState.RESERVED:
                self.ledger.abort(rid, reason="the guardian did not use this vote", keep=keep)
            else:
                self.ledger.commit(rid, None, keep=keep)
            return True
        if settled.kind == "worst_case":
            self.ledger.commit_at_reservation(rid, keep=keep)
            return True
        if record.terms is None:
            log.error("round %d holds no terms to charge it by; kept reserved", rid)
            return False
        terms = terms_of(record.terms)
        mech = terms.rebuilt()
        shape = mech.answer_shape(terms.batch)
        size = math.prod(shape)
        bits = np.frombuffer(settled.answered, dtype=np.uint8)
        if len(bits) != (size + 7) // 8:
            log.error(
                "round %d: the guardian's answered mask has %d bits, the round %d; "
                "the reservation stays charged",
                rid,
                8 * len(bits),
                size,
            )
            return False
        answered = np.unpackbits(bits, count=size, bitorder="little").astype(bool)
        event = mech.event(answered.reshape(shape)[terms.voting()], terms.weight)
        self.ledger.commit(rid, event, keep=keep)
        return True


def terms_of(record_terms: Mapping[str, object]) -> Terms:
    """The :class:`Terms` a ledger kept (JSON)."""
    return Terms(**record_terms)  # type: ignore[arg-type]


__all__ = [
    "PartyCore",
    "Terms",
    "ensemble_votes",
    "pack_mask",
    "terms_of",
    "unpack_mask",
]
