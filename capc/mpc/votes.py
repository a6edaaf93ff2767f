"""Vote shares as answering parties make them and the student opens them (docs/architecture.md,
"One labelling round", steps 5-7).

An answering party turns its predictions into votes, encodes them in the
ring, draws a fresh 128-bit seed, and sends the guardian ``votes - expand(seed)``
in the clear and the seed sealed to the student. The student opens every
sealed seed of the parties the guardian reports and sums the expansions.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from numpy.typing import ArrayLike, NDArray

from capc.mpc import ring, validity
from capc.mpc.sealing import SealError, open_sealed, seal, seed_context

U64 = NDArray[np.uint64]


class PartyInputError(ValueError):
    """One answering party's input to a round cannot be used; ``party`` names the party."""

    def __init__(self, party: str, round_id: int, reason: str) -> None:
        super().__init__(
            f"{party}'s input to round {round_id} cannot be used: {reason}. {party} deviated "
            f"from the protocol or its software is broken; ask its operator to check it"
        )
        self.party = party
        self.round_id = round_id


class UnopenableSeedError(PartyInputError, SealError):
    """A party's sealed seed does not open with the student's key."""


def one_hot_votes(predictions: ArrayLike, num_classes: int, weight: int = 1) -> U64:
    """Predicted classes (B,) -> one-hot votes (B, K) in the ring, ``weight`` per vote."""
    p = np.asarray(predictions)
    if p.ndim != 1 or not np.issubdtype(p.dtype, np.integer):
        raise ValueError(f"predictions must be a 1-D integer array, got {p.dtype} {p.shape}")
    if ((p < 0) | (p >= num_classes)).any():
        raise ValueError(f"predictions must lie in [0, {num_classes})")
    votes = np.zeros((p.size, num_classes), dtype=np.uint64)
    votes[np.arange(p.size), p] = np.uint64(weight)
    return votes


def share_votes(
    votes: ArrayLike, student_public_key: bytes, round_id: int, party: str
) -> tuple[U64, bytes]:
    """(guardian share, sealed seed) of ``votes`` (uint64 ring elements, any shape)."""
    v = np.asarray(votes)
    if v.dtype != np.uint64:
        raise ValueError(f"votes must be uint64 ring elements, got {v.dtype}; encode them first")
    seed = ring.new_seed()
    return ring.share(v, seed), seal(student_public_key, seed, seed_context(round_id, party))


def share_proven_votes(
    relation: validity.VoteRelation,
    counts: ArrayLike,
    participation: ArrayLike | None,
    student_public_key: bytes,
    round_id: int,
    party: str,
) -> tuple[U64, U64, bytes]:
    """(guardian bit shares (B, n), guardian proof shares (B, n + 2), sealed seed) of a
    party's ``counts`` (B, width): how many of its teachers voted for each column, zero
    where ``participation`` (B,) is False. The student expands its shares of both from
    the seed (:func:`capc.mpc.validity.student_shares`)."""
    bits = relation.encode(np.asarray(counts, dtype=np.int64), participation)
    seed = ring.new_seed()
    bit_share, proof_share = validity.guardian_shares(relation, bits, seed)
    return bit_share, proof_share, seal(student_public_key, seed, seed_context(round_id, party))


def open_seeds(
    key: X25519PrivateKey, sealed: Mapping[str, bytes], round_id: int
) -> dict[str, bytes]:
    """Every party's seed for ``round_id``; one that does not open raises
    :class:`UnopenableSeedError` naming its party."""
    seeds = {}
    for party, box in sorted(sealed.items()):
        try:
            seeds[party] = open_sealed(key, box, seed_context(round_id, party))
        except SealError as err:
            raise UnopenableSeedError(party, round_id, f"its sealed seed: {err}") from None
    return seeds


def student_share_sum(
    key: X25519PrivateKey, sealed: Mapping[str, bytes], round_id: int, shape: tuple[int, ...]
) -> U64:
    """Open every party's sealed seed for ``round_id`` and sum the expanded shares; shape ``shape``.

    A seed that does not open raises :class:`UnopenableSeedError` naming its party.
    """
    total = np.zeros(shape, dtype=np.uint64)
    for seed in open_seeds(key, sealed, round_id).values():
        total += ring.expand_seed(seed, shape)
    return total


def proven_vote_sum(
    relations: Mapping[str, validity.VoteRelation],
    bit_shares: Mapping[str, ArrayLike],
    weights: Mapping[str, int],
    student: bool,
) -> U64:
    """One verifier's share in Z_2^64 of the histogram (B, width) of the parties in
    ``relations`` (the valid votes), each party's counts times its weight on the shares'
    grid.

    Each party's counts are converted on their own with
    :func:`capc.mpc.validity.ring_shares` and weighted and summed in the ring (exact
    modulo 2^64). Converting a sum over parties instead would let a deviating student,
    which sees every party's share sum before it decides (with its verifier messages)
    which votes are left out, pick a subset whose sum lands where the conversion goes
    wrong; a party's own conversion goes wrong only with its own seed, with probability
    at most (m + 1)/p per count (:func:`capc.mpc.validity.conversion_failure`)."""
    groups: dict[validity.VoteRelation, list[str]] = {}
    for party in sorted(relations):
        if not 0 <= int(weights[party]) < validity.P:
            raise validity.ValidityError("a vote weight on the grid must lie in [0, p)")
        groups.setdefault(relations[party], []).append(party)
    if not groups:
        raise ValueError("a histogram needs at least one valid vote")
    # uint64 arithmetic wraps modulo 2^64: the weighting and the sum are exact in the ring.
    parts = []
    for relation, parties in groups.items():
        bits = np.stack([np.asarray(bit_shares[p], dtype=np.uint64) for p in parties])
        if bits.ndim != 3 or bits.shape[2] != relation.elements:
            raise validity.ValidityError(
                f"bit shares must have shape ({len(parties)}, B, {relation.elements})"
            )
        counts = validity.ring_shares(relation.counts(bits), student)  # (P, B, width)
        w = np.array([int(weights[p]) for p in parties], dtype=np.uint64)
        parts.append((counts * w[:, None, None]).sum(axis=0, dtype=np.uint64))
    return np.asarray(np.stack(parts).sum(axis=0, dtype=np.uint64), dtype=np.uint64)


def _by_relation(
    relations: Mapping[str, validity.VoteRelation], parties: list[str]
) -> dict[validity.VoteRelation, list[int]]:
    """Positions in ``parties`` grouped by relation: one vectorised check per group."""
    groups: dict[validity.VoteRelation, list[int]] = {}
    for i, p in enumerate(parties):
        groups.setdefault(relations[p], []).append(i)
    return groups


def verifier_shares(
    relations: Mapping[str, validity.VoteRelation],
    challenge: validity.Challenge,
    parties: list[str],
    bit_shares: Mapping[str, ArrayLike],
    proof_shares: Mapping[str, ArrayLike],
    constants: Mapping[str, ArrayLike] | None = None,
) -> validity.VerifierShare:
    """One verifier's shares of the checks of ``parties``, in that order: wire (P, B) and
    combined (P,). Parties of one relation (teachers) are checked together, vectorised
    over them and their queries. ``constants``: the guardian's teachers x participation
    (B,) per party; the student passes None."""
    wire: U64 | None = None
    combined = np.zeros(len(parties), dtype=np.uint64)
    for relation, idx in _by_relation(relations, parties).items():
        names = [parties[i] for i in idx]
        one = validity.verifier_share(
            relation,
            challenge,
            names,
            np.stack([np.asarray(bit_shares[p], dtype=np.uint64) for p in names]),
            np.stack([np.asarray(proof_shares[p], dtype=np.uint64) for p in names]),
            None if constants is None else np.stack([np.asarray(constants[p]) for p in names]),
        )
        if wire is None:
            wire = np.zeros((len(parties), one.wire.shape[1]), dtype=np.uint64)
        wire[idx] = one.wire
        combined[idx] = one.combined
    if wire is None:
        wire = np.zeros((0, 0), dtype=np.uint64)
    return validity.VerifierShare(wire, combined)


def accepted(
    relations: Mapping[str, validity.VoteRelation],
    challenge: validity.Challenge,
    parties: list[str],
    guardian: validity.VerifierShare,
    student: validity.VerifierShare,
) -> dict[str, bool]:
    """The guardian's decision per party (in ``parties`` order) from both verifiers' shares,
    one vectorised check per relation; a student message of the wrong shape rejects all."""
    sw = np.asarray(student.wire, dtype=np.uint64)
    sc = np.asarray(student.combined, dtype=np.uint64)
    if sw.shape != guardian.wire.shape or sc.shape != guardian.combined.shape:
        return dict.fromkeys(parties, False)
    out = dict.fromkeys(parties, False)
    for relation, idx in _by_relation(relations, parties).items():
        ok = validity.accept(
            relation,
            challenge,
            [parties[i] for i in idx],
            validity.VerifierShare(guardian.wire[idx], guardian.combined[idx]),
            validity.VerifierShare(sw[idx], sc[idx]),
        )
        for i, good in zip(idx, ok, strict=True):
            out[parties[i]] = bool(good)
    return out
