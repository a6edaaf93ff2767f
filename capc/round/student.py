"""The student's side of a labelling round, as pure state.

No transport, sessions or clocks: the caller sends the requests, relays the vote
check and runs the 2PC. The rules (docs/architecture.md, "One labelling round"):

- request: every round has a fresh key, the student's public key (seeds are sealed
  to it), and leaves out the parties the student always leaves out (a hospital
  querying the consortium: itself) and, on a retry, the party it retries without.
- opened: the guardian's reply must name a sealed seed for every party it used (an
  encrypted round has none: each party's share comes from its own 2PC with the
  student). A seed that does not open names its party
  (:class:`~capc.mpc.votes.UnopenableSeedError`); the round is then abandoned before
  its 2PC and retried once without that party, never on a retry or an encrypted round.
- vote check (proven votes): the student's verifier shares of the parties with a
  statement, in the reply's order; the guardian's verdict may only keep parties the
  round had, and gives a weight for each proven party it kept, no other.
- 2PC: the student's input is its share (B, width) of the histogram of the votes that
  count, or (encrypted) every party's share (B, P, width) for the circuit to check one
  by one; the circuit counts each party's teachers; its outputs decode to labels.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from numpy.typing import NDArray

from capc.mechanisms.base import CircuitSpec
from capc.mpc import ring, validity
from capc.mpc.votes import (
    PartyInputError,
    UnopenableSeedError,
    open_seeds,
    proven_vote_sum,
    verifier_shares,
)
from capc.round.errors import RoundInputError
from capc.round.messages import Opened, QueryBatch, Retry, RoundRequest, VoteVerdict
from capc.round.task import RoundTask

U64 = NDArray[np.uint64]
#: Characters of a party's error the student sends with a retry (the guardian audits it).
MAX_REASON = 1000


@dataclass
class StudentRound:
    """One round at the student between the guardian's reply and the 2PC.

    ``task``: the round's task, running the job's mechanism; ``included`` and
    ``teachers``: the parties whose votes count and their teachers (after the vote
    check, the valid ones); ``invalid``: parties whose vote failed its check, with the
    guardian's reason.
    """

    round_id: int
    task: RoundTask
    batch: int
    included: tuple[str, ...]
    teachers: dict[str, int]
    excluded: dict[str, float]
    encrypted: bool = False
    invalid: dict[str, str] = field(default_factory=dict)
    challenge: validity.Challenge | None = None
    seeds: dict[str, bytes] = field(default_factory=dict)
    relations: dict[str, validity.VoteRelation] = field(default_factory=dict)
    bits: dict[str, U64] = field(default_factory=dict)
    proofs: dict[str, U64] = field(default_factory=dict)
    # Parties whose statement is too large for a proof: plain ring shares.
    plain: list[str] = field(default_factory=list)
    checked: bool = False

    @property
    def proven(self) -> list[str]:
        """The parties with a vote statement, in the reply's order."""
        return [p for p in self.included if p in self.relations]

    @property
    def width(self) -> int:
        return self.task.vote_width


class StudentCore:
    """Student ``name``'s rounds, with its X25519 ``key`` (the parties seal seeds to it).

    ``exclude``: answering parties every round leaves out.
    """

    def __init__(self, name: str, key: X25519PrivateKey, exclude: Sequence[str] = ()) -> None:
        self.name = name
        self.key = key
        self.exclude = tuple(exclude)

    @property
    def public_key(self) -> bytes:
        return self.key.public_key().public_bytes_raw()

    def request(
        self, queries: QueryBatch, retry: Retry | None = None, session_id: bytes = b""
    ) -> RoundRequest:
        """A request for a round over ``queries`` under a fresh round key; ``retry``: the
        round it retries, leaving its party out."""
        exclude = {*self.exclude, *([retry.party] if retry is not None else [])}
        return RoundRequest(
            uuid.uuid4().hex,
            self.name,
            queries,
            self.public_key,
            session_id,
            frozenset(exclude),
            retry=retry,
        )

    def retry_without(
        self, err: PartyInputError, *, retried: bool, encrypted: bool
    ) -> Retry | None:
        """The retry of a round abandoned for ``err``: once, without the party whose seed
        did not open; None (give up) on a retry, an encrypted round or any other error."""
        if retried or encrypted or not isinstance(err, UnopenableSeedError):
            return None
        return Retry(err.round_id, err.party, str(err)[:MAX_REASON])

    # -- the guardian's reply --------------------------------------------------------
    def opened(
        self, task: RoundTask, opened: Opened, batch: int, *, encrypted: bool = False
    ) -> StudentRound:
        """The round the guardian opened for ``batch`` queries of ``task``. Opens every
        sealed seed (PartyInputError naming a party whose seed does not open) and, for
        proven votes, expands each party's bit and proof shares."""
        rnd = StudentRound(
            opened.round_id,
            task,
            batch,
            tuple(opened.included),
            {p: int(opened.teachers.get(p, 1)) for p in opened.included},
            dict(opened.excluded_remaining),
            encrypted,
        )
        if encrypted:
            return rnd
        if set(opened.seeds) != set(opened.included):
            raise RoundInputError("the guardian's seeds do not match the parties it reports")
        rnd.seeds = open_seeds(self.key, dict(opened.seeds), opened.round_id)
        if opened.challenge:
            rnd.challenge = validity.Challenge.from_bytes(opened.challenge)
            for p in rnd.included:
                relation = task.mechanism.vote_relation(rnd.teachers[p])
                if relation is None:
                    rnd.plain.append(p)
                    continue
                rnd.relations[p] = relation
                rnd.bits[p], rnd.proofs[p] = validity.student_shares(rnd.seeds[p], relation, batch)
        return rnd

    def share_sum(self, rnd: StudentRound) -> U64:
        """The student's share (B, width) of an unproven plain round's histogram: every
        party's expanded seed, summed."""
        if rnd.challenge is not None or rnd.encrypted:
            raise RoundInputError(
                f"round {rnd.round_id} is proven or encrypted: its share is not a seed sum"
            )
        total = np.zeros((rnd.batch, rnd.width), dtype=np.uint64)
        for p in rnd.included:
            total += ring.expand_seed(rnd.seeds[p], (rnd.batch, rnd.width))
        return total

    # -- the vote check ----------------------------------------------------------------
    def vote_check(self, rnd: StudentRound) -> tuple[list[str], validity.VerifierShare]:
        """The student's verifier shares of the round's proven parties, in the reply's
        order: wire (P, B) and combined (P,)."""
        if rnd.challenge is None or rnd.checked:
            raise RoundInputError(
                f"round {rnd.round_id} has no vote validity proofs to check, or they were "
                "checked already"
            )
        parties = rnd.proven
        return parties, verifier_shares(rnd.relations, rnd.challenge, parties, rnd.bits, rnd.proofs)

    def checked(self, rnd: StudentRound, verdict: VoteVerdict) -> U64:
        """The student's share (B, width) in Z_2^64 of the valid votes' histogram, from the
        guardian's ``verdict``; RoundInputError when the verdict names a party the round
        did not have, or weights other than the valid proven parties'."""
        if rnd.challenge is None or rnd.checked:
            raise RoundInputError(f"round {rnd.round_id} has no vote check to take")
        valid = [p for p in verdict.included if p in rnd.relations]
        if (
            verdict.round_id != rnd.round_id
            or not set(verdict.included) <= set(rnd.included)
            or set(verdict.vote_weights) != set(valid)
        ):
            raise RoundInputError("the guardian's vote check names parties the round did not have")
        rnd.checked = True
        total = np.zeros((rnd.batch, rnd.width), dtype=np.uint64)
        if valid:
            total += proven_vote_sum(
                {p: rnd.relations[p] for p in valid},
                rnd.bits,
                dict(verdict.vote_weights),
                student=True,
            )
        for p in rnd.plain:
            total += ring.expand_seed(rnd.seeds[p], (rnd.batch, rnd.width))
        rnd.included = tuple(verdict.included)
        rnd.teachers = {p: int(verdict.teachers.get(p, 1)) for p in verdict.included}
        rnd.invalid = dict(verdict.excluded)
        return total

    def encrypted_sum(self, rnd: StudentRound, shares: U64) -> U64:
        """Every party's share (B, P, width) of its one-hot vote, in the round's party
        order, checked for shape: the circuit checks each vote on its own."""
        want = (rnd.batch, len(rnd.included), rnd.width)
        got = np.asarray(shares)
        if not rnd.encrypted or got.shape != want or got.dtype != np.uint64:
            raise RoundInputError(
                f"round {rnd.round_id} takes the parties' shares as uint64 of shape {want}, "
                f"got {got.dtype} {got.shape}"
            )
        return got

    # -- the 2PC -----------------------------------------------------------------------
    def circuit(self, rnd: StudentRound) -> CircuitSpec:
        """The round's circuit: every counted party's teachers (a party with m teachers
        adds up to m votes to a count); in encrypted mode, one vote check a party."""
        voters = sum(rnd.teachers.get(p, 1) for p in rnd.included)
        return rnd.task.circuit_spec(voters, None, len(rnd.included) if rnd.encrypted else 0)

    def evaluator_inputs(
        self, rnd: StudentRound, student_sum: U64
    ) -> tuple[CircuitSpec, dict[str, U64]]:
        """The circuit and the student's inputs from its share ``student_sum``: (B, width),
        or (B, P, width) in encrypted mode. RoundInputError for a share of another shape."""
        s = np.asarray(student_sum)
        want = (
            (rnd.batch, len(rnd.included), rnd.width) if rnd.encrypted else (rnd.batch, rnd.width)
        )
        if s.shape != want or s.dtype != np.uint64:
            raise RoundInputError(
                f"round {rnd.round_id}'s circuit takes the student's share as uint64 of "
                f"shape {want}, got {s.dtype} {s.shape}"
            )
        spec = self.circuit(rnd)
        return spec, spec.evaluator_inputs(s)

    def labels(
        self, rnd: StudentRound, spec: CircuitSpec, outputs: Mapping[str, U64]
    ) -> NDArray[np.int64]:
        """The student's circuit outputs -> labels: (B,) classes, or (B, k) 0/1 for
        multi-label; -1 where the mechanism declined."""
        return rnd.task.mechanism.decode(spec, dict(outputs))


__all__ = ["MAX_REASON", "StudentCore", "StudentRound"]
