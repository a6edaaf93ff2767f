"""What each party sees: tests that fail if a garbled-circuit round leaks.

The guardian (garbler) may learn only its outputs (answered bits); the student
(evaluator) only its outputs (labels or "not answered"). These tests record
the real transcript of a round and check it statistically and byte for byte.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np
import pytest

from capc.mechanisms import from_config
from capc.mpc import ot
from capc.mpc.blocks import FixedKeyHash, lsb
from capc.mpc.channel import HEADER_BYTES, TAG_BYTES, Channel, Kind
from capc.mpc.circuit import Circuit, Op, Party
from capc.mpc.garbling import Garbler, OutputLabelError, evaluate, garbler_output_labels
from capc.mpc.mechanism_circuits import ConfidentGNMaxCircuit
from capc.mpc.session import LocalPair

B, K, N = 512, 10, 50
SPEC = ConfidentGNMaxCircuit(K, N, sigma=8.0, threshold=40.0, sigma1=30.0)
#: Counts the votes as the parties do.
VOTING = from_config(
    {"name": "confident-gnmax", "sigma": 8.0, "threshold": 40.0, "sigma1": 30.0}, K
)


@dataclass
class Recorder:
    """A channel end that keeps every frame it receives."""

    inner: Channel
    received: list[bytes] = field(default_factory=list)

    def send(self, frame: bytes) -> None:
        self.inner.send(frame)

    def recv(self, timeout: float | None = None) -> bytes:
        frame = self.inner.recv(timeout)
        self.received.append(frame)
        return frame

    def messages(self, kind: Kind) -> bytes:
        """Payload of every frame of ``kind``, joined."""
        out = b""
        for f in self.received:
            if f[5] == kind:
                (length,) = struct.unpack_from(">I", f, HEADER_BYTES - 4)
                out += f[HEADER_BYTES : HEADER_BYTES + length]
                assert len(f) == HEADER_BYTES + length + TAG_BYTES
        return out


@dataclass
class Round:
    circuit: Circuit
    guardian_sum: np.ndarray
    student_sum: np.ndarray
    eta1: np.ndarray
    eta2: np.ndarray
    g_in: dict[str, np.ndarray]
    e_in: dict[str, np.ndarray]
    g_rec: Recorder
    e_rec: Recorder
    g_out: dict[str, np.ndarray]
    e_out: dict[str, np.ndarray]


@pytest.fixture(scope="module")
def recorded() -> Round:
    rng = np.random.default_rng(7)
    hist = VOTING.summed_votes(rng.integers(0, K, (B, N))).astype(np.uint64)
    student = rng.integers(0, 2**64 - 1, (B, K), dtype=np.uint64, endpoint=True)
    guardian = hist - student
    eta1 = rng.normal(0, SPEC.sigma1, B)
    eta2 = rng.normal(0, SPEC.sigma, (B, K))
    recorders: dict[Party, Recorder] = {}

    def wrap(ch: Channel, party: Party) -> Channel:
        recorders[party] = Recorder(ch)
        return recorders[party]

    pair = LocalPair(timeout=60, wrap=wrap)
    g_in = SPEC.garbler_inputs(guardian, eta2, eta1)
    e_in = SPEC.evaluator_inputs(student)
    res = pair.run(SPEC.circuit(), g_in, e_in, B)
    return Round(
        SPEC.circuit(),
        guardian,
        student,
        eta1,
        eta2,
        g_in,
        e_in,
        recorders[Party.GARBLER],
        recorders[Party.EVALUATOR],
        res.garbler,
        res.evaluator,
    )


def balanced(agree: np.ndarray) -> bool:
    """Agreement rate of n bits with a hidden value is 1/2 within 6 standard errors."""
    return bool(abs(float(agree.mean()) - 0.5) < 6 * 0.5 / np.sqrt(agree.size))


def test_evaluator_transcript_holds_no_garbler_input_in_plaintext(recorded: Round) -> None:
    transcript = b"".join(recorded.e_rec.received)
    for value in recorded.guardian_sum.ravel()[:64]:
        assert int(value).to_bytes(8, "little") not in transcript
    for value in np.concatenate([recorded.eta1, recorded.eta2.ravel()])[:64]:
        assert struct.pack("<d", value) not in transcript


def test_garbler_input_labels_are_unrelated_to_the_garbler_bits(recorded: Round) -> None:
    c = recorded.circuit
    payload = recorded.e_rec.messages(Kind.GARBLED)
    start = c.num_and * B * 32
    n_g = c.garbler_input_wires.size
    labels = np.frombuffer(payload[start : start + n_g * B * 16], dtype=np.uint64).reshape(
        n_g, B, 2
    )
    bits = c.input_bits(Party.GARBLER, recorded.g_in, B)
    assert balanced(lsb(labels[1:]) == bits[1:])  # wire 0 is the constant one
    # The labels themselves look uniform: every bit position balanced.
    words = labels[1:].reshape(-1)
    positions = ((words[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)).astype(np.uint8)
    rate = positions.mean(axis=0)
    assert np.all(np.abs(rate - 0.5) < 6 * 0.5 / np.sqrt(words.size))


def test_evaluator_gets_decode_bits_for_its_outputs_only(recorded: Round) -> None:
    c = recorded.circuit
    payload = recorded.e_rec.messages(Kind.GARBLED)
    n_dec = c.output_wires(Party.EVALUATOR).size
    # The masked label, the answered bit and the violation bit, nothing else.
    assert n_dec == SPEC.label_bits + 2
    expected = (
        c.num_and * B * 32
        + c.garbler_input_wires.size * B * 16
        + c.evaluator_input_wires.size * B * 32
        + -(-n_dec * B // 8)
    )
    assert len(payload) == expected


def test_unanswered_queries_reveal_no_label(recorded: Round) -> None:
    answered = recorded.e_out["answered"][:, 0].astype(bool)
    assert 0 < answered.sum() < B
    assert (recorded.e_out["label"][~answered, 0] == 0).all()
    np.testing.assert_array_equal(recorded.g_out["answered"], recorded.e_out["answered"])
    assert set(recorded.g_out) == {"answered", "violation"}
    assert set(recorded.e_out) == {"label", "answered", "violation"}
    assert not recorded.e_out["violation"].any()


def test_internal_wires_are_not_decodable_by_the_evaluator() -> None:
    """Active labels' permute bits must be independent of the wire values (histogram, noise, argmax)."""
    rng = np.random.default_rng(8)
    c = SPEC.circuit()
    b = 128
    student = rng.integers(0, 2**64 - 1, (b, K), dtype=np.uint64, endpoint=True)
    hist = VOTING.summed_votes(rng.integers(0, K, (b, N))).astype(np.uint64)
    g_in = SPEC.garbler_inputs(hist - student, rng.normal(0, 8.0, (b, K)), rng.normal(0, 30.0, b))
    e_in = SPEC.evaluator_inputs(student)
    hasher = FixedKeyHash()
    garbler = Garbler(c, b, os.urandom(16), 0, hasher)
    tables = garbler.garble()
    g_bits = c.input_bits(Party.GARBLER, g_in, b)
    e_bits = c.input_bits(Party.EVALUATOR, e_in, b)
    l0, l1 = garbler.evaluator_label_pairs()
    e_labels = np.where(e_bits[..., None].astype(bool), l1, l0)
    active = evaluate(
        c, b, 0, hasher, tables, np.concatenate([garbler.garbler_labels(g_bits), e_labels])
    )
    # The true value of every wire, by a plain pass over the same layers.
    values = np.zeros((c.num_wires, b), dtype=np.uint8)
    values[c.garbler_input_wires] = g_bits
    values[c.evaluator_input_wires] = e_bits
    for layer in c.layers:
        values[layer.out] = (
            (values[layer.a] & values[layer.b])
            if layer.op == Op.AND
            else (values[layer.a] ^ values[layer.b])
        )
    hidden = np.ones(c.num_wires, dtype=bool)
    hidden[c.output_wires(Party.EVALUATOR)] = False
    hidden[0] = False
    varying = values.min(axis=1) != values.max(axis=1)
    sel = hidden & varying
    assert sel.sum() > 1000
    assert balanced(lsb(active[sel]) == values[sel])


def test_garbler_transcript_hides_the_evaluator_input(recorded: Round) -> None:
    transcript = b"".join(recorded.g_rec.received)
    for value in recorded.student_sum.ravel()[:64]:
        assert int(value).to_bytes(8, "little") not in transcript
    c = recorded.circuit
    # After batch and circuit digest, before the answer to the OT consistency check.
    request = recorded.g_rec.messages(Kind.ROUND_REQUEST)[36 : -ot.CHECK_BYTES]
    m = c.evaluator_input_wires.size * B
    u = np.unpackbits(
        np.frombuffer(request, dtype=np.uint8).reshape(128, -1), axis=1, bitorder="little"
    )[:, :m]
    choice = c.input_bits(Party.EVALUATOR, recorded.e_in, B).ravel()
    assert balanced(u == choice[None, :])
    # The only other thing the garbler receives is one label per garbler output.
    assert (
        len(recorded.g_rec.messages(Kind.OUTPUT_LABELS))
        == c.output_wires(Party.GARBLER).size * B * 16
    )


def test_evaluator_cannot_forge_the_garblers_output() -> None:
    """The answered bit the guardian learns comes with a label the student cannot fake."""
    rng = np.random.default_rng(9)
    c = SPEC.circuit()
    b = 16
    student = rng.integers(0, 2**64 - 1, (b, K), dtype=np.uint64, endpoint=True)
    hist = VOTING.summed_votes(rng.integers(0, K, (b, N))).astype(np.uint64)
    g_in = SPEC.garbler_inputs(hist - student, rng.normal(0, 8.0, (b, K)), rng.normal(0, 30.0, b))
    hasher = FixedKeyHash()
    garbler = Garbler(c, b, os.urandom(16), 0, hasher)
    tables = garbler.garble()
    e_bits = c.input_bits(Party.EVALUATOR, SPEC.evaluator_inputs(student), b)
    l0, l1 = garbler.evaluator_label_pairs()
    labels = np.concatenate(
        [
            garbler.garbler_labels(c.input_bits(Party.GARBLER, g_in, b)),
            np.where(e_bits[..., None].astype(bool), l1, l0),
        ]
    )
    out = garbler_output_labels(c, evaluate(c, b, 0, hasher, tables, labels))
    honest = garbler.decode_garbler_outputs(out)
    flipped = out.copy()
    flipped[..., 0] ^= np.uint64(1)  # claim the other answered bit by flipping the permute bit
    with pytest.raises(OutputLabelError, match="not a valid label"):
        garbler.decode_garbler_outputs(flipped)
    assert honest.shape == (2, b)  # answered and violation bits
