"""Deviating hospitals for the availability and attack tests (the light consortium is
services.testbed.light). Each speaks the protocol over its own certificate (real gRPC,
mutual TLS) and deviates only in what it sends as its vote."""

from __future__ import annotations

import queue
import secrets
import threading
from collections.abc import Callable

import grpc
import numpy as np

from capc.mpc import ring, validity
from capc.mpc.sealing import OVERHEAD, seal, seed_context
from capc.mpc.votes import share_proven_votes
from services.common import protocol, serde
from services.common.serde import mechanism_from_proto
from services.proto.capc.v1 import guardian_pb2
from services.testbed.light import LightConsortium

#: What a deviating party sends for one round: its shares message.
Vote = Callable[[guardian_pb2.RoundWork, str], guardian_pb2.Shares]


def _rows(work: guardian_pb2.RoundWork) -> int:
    return int(work.queries.tensor.shape[0])


def unopenable_seed(work: guardian_pb2.RoundWork, name: str) -> guardian_pb2.Shares:
    """Well-formed shares whose sealed seed opens for nobody (random bytes of its length)."""
    b = _rows(work)
    mech = mechanism_from_proto(work.mechanism)
    relation = mech.vote_relation(1)
    sealed = secrets.token_bytes(OVERHEAD + 16)
    if relation is None:
        zeros = np.zeros((b, mech.vote_width), dtype=np.uint64)
        return serde.shares_to_proto(work.round_id, zeros, sealed_seed=sealed)
    bits = np.zeros((b, relation.elements), dtype=np.uint64)
    proof = np.zeros((b, relation.proof_elements), dtype=np.uint64)
    return serde.shares_to_proto(work.round_id, bits, sealed_seed=sealed, proof=proof)


def ballot_stuffing(cls: int, count: int) -> Vote:
    """A party that votes ``count`` for class ``cls`` on every query, its shares made as
    an honest party makes them (a seed sealed to the student). Where the round takes
    validity proofs it runs the honest prover on this invalid vote (the count sits in
    the class's lowest bit); otherwise it sends plain ring shares of it."""

    def vote(work: guardian_pb2.RoundWork, name: str) -> guardian_pb2.Shares:
        b = _rows(work)
        mech = mechanism_from_proto(work.mechanism)
        key = bytes(work.student_public_key)
        seed = ring.new_seed()
        sealed = seal(key, seed, seed_context(work.round_id, name))
        # A guardian without validity proofs (no proof field) takes plain ring shares.
        proofs = "proof" in guardian_pb2.Shares.DESCRIPTOR.fields_by_name
        relation = mech.vote_relation(1) if proofs else None
        if relation is None:
            votes = np.zeros((b, mech.vote_width), dtype=np.uint64)
            votes[:, cls] = count
            return serde.shares_to_proto(work.round_id, ring.share(votes, seed), sealed_seed=sealed)
        bits = np.zeros((b, relation.elements), dtype=np.uint64)
        bits[:, cls * relation.nbits] = count
        bit_share, proof_share = validity.guardian_shares(relation, bits, seed)
        return serde.shares_to_proto(
            work.round_id, bit_share, sealed_seed=sealed, proof=proof_share
        )

    return vote


def label_skew(target: int, amount: int) -> Vote:
    """Issue 41's attack under tau voting: +``amount`` on label ``target`` and -``amount``
    on every other label (grid units, 2^vote_grid_bits a vote), inside the circuit's
    range window, which on its own would decide every label. Where the round takes
    validity proofs the party runs the honest prover on it (each count, modulo p, in its
    label's lowest bit); otherwise it sends plain ring shares (modulo 2^64)."""

    def vote(work: guardian_pb2.RoundWork, name: str) -> guardian_pb2.Shares:
        b = _rows(work)
        mech = mechanism_from_proto(work.mechanism)
        counts = np.full((b, mech.vote_width), -amount, dtype=np.int64)
        counts[:, target] = amount
        seed = ring.new_seed()
        sealed = seal(bytes(work.student_public_key), seed, seed_context(work.round_id, name))
        relation = mech.vote_relation(1)
        if relation is None:
            votes = counts.astype(np.uint64)  # two's complement: -a is 2^64 - a
            return serde.shares_to_proto(work.round_id, ring.share(votes, seed), sealed_seed=sealed)
        elements = np.zeros((b, relation.elements), dtype=np.uint64)
        for j in range(mech.vote_width):
            elements[:, j * relation.nbits] = np.asarray(counts[:, j] % validity.P, np.uint64)
        bit_share, proof_share = validity.guardian_shares(relation, elements, seed)
        return serde.shares_to_proto(
            work.round_id, bit_share, sealed_seed=sealed, proof=proof_share
        )

    return vote


def strongest_valid(target: int) -> Vote:
    """A deviating party's strongest *valid* tau vote for label ``target``: its one
    teacher's full vote there, nothing elsewhere, proven honestly."""

    def vote(work: guardian_pb2.RoundWork, name: str) -> guardian_pb2.Shares:
        b = _rows(work)
        mech = mechanism_from_proto(work.mechanism)
        relation = mech.vote_relation(1)
        if relation is None:
            raise AssertionError(f"{mech.name} has no proof statement")
        counts = np.zeros((b, mech.vote_width), dtype=np.int64)
        counts[:, target] = relation.max_count
        bits, proof, sealed = share_proven_votes(
            relation, counts, None, bytes(work.student_public_key), work.round_id, name
        )
        return serde.shares_to_proto(work.round_id, bits, sealed_seed=sealed, proof=proof)

    return vote


class DeviatingParty:
    """An answering party that registers ``teachers`` teachers (one by default) and
    answers every round with ``vote`` (by default shares whose sealed seed opens for
    nobody). grpc.RpcError if the guardian refuses its Register."""

    def __init__(
        self, c: LightConsortium, name: str, vote: Vote = unopenable_seed, teachers: int = 1
    ) -> None:
        self.rounds: list[int] = []
        self._out: queue.Queue[guardian_pb2.PartyMessage | None] = queue.Queue()
        # A stream opens with the party's Register: its teachers, the cap it sets itself.
        self._out.put(
            guardian_pb2.PartyMessage(
                header=protocol.header(),
                register=guardian_pb2.Register(
                    teachers=[guardian_pb2.TeacherInfo(architecture="mlp")] * teachers,
                    epsilon_cap=c.cap,
                ),
            )
        )
        self._responses = c.stub(name).Connect(iter(self._out.get, None))
        first = next(self._responses)
        if first.WhichOneof("body") != "registered":
            raise RuntimeError(f"{name} was not registered: {first}")

        def answer() -> None:
            try:
                for msg in self._responses:
                    if msg.WhichOneof("body") != "work":
                        continue
                    self._out.put(
                        guardian_pb2.PartyMessage(
                            header=protocol.header(msg.header.task),
                            shares=vote(msg.work, name),
                        )
                    )
                    self.rounds.append(msg.work.round_id)
            except grpc.RpcError:
                pass

        threading.Thread(target=answer, daemon=True).start()

    def leave(self) -> None:
        self._out.put(None)
        self._responses.cancel()
