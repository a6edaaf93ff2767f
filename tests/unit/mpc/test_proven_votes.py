"""Proven vote shares as the services use them: parties share counts with validity proofs,
guardian and student check them jointly, and their ring shares reconstruct the histogram
of the valid votes only (capc.mpc.votes over capc.mpc.validity)."""

from __future__ import annotations

import secrets

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from capc.mechanisms import mechanism_class
from capc.mpc import validity
from capc.mpc.sealing import seal, seed_context
from capc.mpc.votes import (
    accepted,
    open_seeds,
    proven_vote_sum,
    share_proven_votes,
    verifier_shares,
)
from services.common import protocol, serde
from services.common.protocol import RequestError

B, K, ROUND = 32, 5, 7


def _round(
    counts: dict[str, np.ndarray],
    teachers: dict[str, int],
    weights: dict[str, int],
    participation: dict[str, np.ndarray | None],
    forged: dict[str, np.ndarray] | None = None,
) -> tuple[dict[str, bool], np.ndarray]:
    """One round between guardian and student; ``forged``: raw bits a party proves
    with the honest prover although they are no valid vote."""
    key = X25519PrivateKey.generate()
    pub = key.public_key().public_bytes_raw()
    rel = {p: validity.VoteRelation(K, m) for p, m in teachers.items()}
    g_bits, g_proof, sealed = {}, {}, {}
    for p in teachers:
        if forged and p in forged:
            seed = secrets.token_bytes(16)
            g_bits[p], g_proof[p] = validity.guardian_shares(rel[p], forged[p], seed)
            sealed[p] = seal(pub, seed, seed_context(ROUND, p))
        else:
            g_bits[p], g_proof[p], sealed[p] = share_proven_votes(
                rel[p], counts[p], participation[p], pub, ROUND, p
            )
    seeds = open_seeds(key, sealed, ROUND)
    s_bits, s_proof = {}, {}
    for p in teachers:
        s_bits[p], s_proof[p] = validity.student_shares(seeds[p], rel[p], B)
    challenge = validity.Challenge.draw(secrets.token_bytes(24))
    parties = sorted(teachers)
    votes_on = {p: np.ones(B, bool) if v is None else v for p, v in participation.items()}
    constants = {p: teachers[p] * votes_on[p].astype(np.uint64) for p in parties}
    mine = verifier_shares(rel, challenge, parties, g_bits, g_proof, constants)
    theirs = verifier_shares(rel, challenge, parties, s_bits, s_proof)
    wire = serde.vote_check_to_proto(protocol.header("t"), ROUND, parties, theirs)
    theirs = serde.vote_check_from_proto(wire, B)
    ok = accepted(rel, challenge, parties, mine, theirs)
    valid = {p: rel[p] for p in parties if ok[p]}
    g = proven_vote_sum(valid, g_bits, weights, student=False)
    s = proven_vote_sum(valid, s_bits, weights, student=True)
    return ok, g + s


def _counts(rng: np.random.Generator, m: int) -> np.ndarray:
    preds = rng.integers(0, K, (B, m))
    return np.stack([(preds == k).sum(axis=1) for k in range(K)], axis=1).astype(np.int64)


def test_honest_ensembles_with_weights_and_participation_reconstruct_the_histogram() -> None:
    rng = np.random.default_rng(3)
    teachers = {"a": 1, "b": 3, "c": 2}
    weights = {"a": 256, "b": 100, "c": 37}  # on an 8-bit grid
    sits = rng.random(B) < 0.5
    part: dict[str, np.ndarray | None] = {"a": None, "b": sits, "c": None}
    counts = {p: _counts(rng, m) for p, m in teachers.items()}
    counts["b"] = counts["b"] * sits[:, None]
    ok, hist = _round(counts, teachers, weights, part)
    assert all(ok.values())
    expected = sum(counts[p].astype(np.uint64) * np.uint64(weights[p]) for p in teachers)
    np.testing.assert_array_equal(hist, expected)


@pytest.mark.parametrize("stuffed", [400, 2])
def test_a_stuffed_vote_is_rejected_and_left_out_of_the_histogram(stuffed: int) -> None:
    rng = np.random.default_rng(4)
    teachers = {"a": 1, "b": 1, "mallory": 1}
    counts = {p: _counts(rng, 1) for p in teachers}
    bits = np.zeros((B, K), dtype=np.uint64)
    bits[:, 3] = stuffed  # class 3 gets ``stuffed`` votes instead of one
    ok, hist = _round(
        counts,
        teachers,
        dict.fromkeys(teachers, 1),
        dict.fromkeys(teachers, None),
        forged={"mallory": bits},
    )
    assert ok == {"a": True, "b": True, "mallory": False}
    np.testing.assert_array_equal(hist, (counts["a"] + counts["b"]).astype(np.uint64))


def test_a_vote_that_skips_a_query_it_must_vote_on_is_rejected() -> None:
    rng = np.random.default_rng(5)
    teachers = {"a": 1, "mallory": 1}
    counts = {p: _counts(rng, 1) for p in teachers}
    bits = validity.VoteRelation(K, 1).encode(counts["mallory"])
    bits[0] = 0  # sits out query 0 although its participation bit is 1
    ok, _ = _round(
        counts,
        teachers,
        dict.fromkeys(teachers, 1),
        dict.fromkeys(teachers, None),
        {"mallory": bits},
    )
    assert ok == {"a": True, "mallory": False}


def test_proof_shares_outside_the_field_are_refused() -> None:
    rel = validity.VoteRelation(K, 1)
    bits = np.zeros((B, rel.elements), dtype=np.uint64)
    proof = np.full((B, rel.proof_elements), np.uint64(validity.P), dtype=np.uint64)
    msg = serde.shares_to_proto(ROUND, bits, sealed_seed=b"x", proof=proof)
    with pytest.raises(RequestError, match="F_p"):
        serde.proof_from_proto(msg, (B, rel.proof_elements))
    with pytest.raises(RequestError, match="shape"):
        serde.proof_from_proto(msg, (B + 1, rel.proof_elements))


def test_which_mechanisms_have_a_proof_statement() -> None:
    one_hot = mechanism_class("robust-confident-gnmax").from_params(
        4, {"sigma": 1, "threshold": 1, "sigma1": 1}
    )
    assert one_hot.vote_relation(3) == validity.VoteRelation(4, 3)
    k_hot = mechanism_class("binary").from_params(3, {"sigma": 1})
    assert k_hot.vote_relation(2) == validity.VoteRelation(3, 2, complement=True)
    tau = mechanism_class("tau").from_params(3, {"sigma": 1, "tau": 1.5})
    assert tau.vote_relation(1) == validity.VoteRelation(
        3, 1, complement=True, grid_bits=8, tau=1.5
    )
    # 64 labels of 9 bits and their complements exceed a proof's 512 elements.
    wide = mechanism_class("tau").from_params(64, {"sigma": 1, "tau": 1.5})
    assert wide.vote_relation(1) is None
