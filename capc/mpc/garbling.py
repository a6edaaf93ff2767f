"""Semi-honest Yao garbling over a batch: free-XOR, point-and-permute, half-gates.

Labels are 128-bit blocks; the garbler keeps the 0-label of every wire and a
global offset R (lsb 1), so the 1-label is L0 xor R and XOR gates cost nothing.
An AND gate costs two ciphertexts (Zahur, Rosulek, Evans, Eurocrypt 2015).
All B queries of a round run through one circuit, so wire arrays have shape
(wires, B, 2) and each layer of the circuit is one pass of numpy operations
plus one AES call for its hashes.

Hash tweaks: AND gate g of query q uses 2(gB + q) and 2(gB + q) + 1 in the low
word and the round's tweak in the high word; a session never reuses a round
tweak, so no tweak is used twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from capc.mpc.blocks import Blocks, FixedKeyHash, lsb, random_blocks, select
from capc.mpc.circuit import Circuit, Op, Party

Bits = NDArray[np.uint8]


class OutputLabelError(ValueError):
    """An output label the garbler received is neither of the two valid labels."""


def _tweaks(and_index: NDArray[np.int64], batch: int) -> NDArray[np.uint64]:
    base = (
        and_index.astype(np.uint64)[:, None] * np.uint64(batch)
        + np.arange(batch, dtype=np.uint64)[None, :]
    )
    return base << np.uint64(1)


@dataclass
class GarbledTables:
    """What the evaluator needs besides its own input labels.

    ``tables`` (AND gates, B, 2, 2): the two half-gate ciphertexts per gate.
    ``garbler_labels`` (garbler input wires, B, 2): labels of the garbler's bits.
    ``decode`` (evaluator output wires, B): permute bits that reveal the
    evaluator's outputs and nothing else.
    """

    tables: Blocks
    garbler_labels: Blocks
    decode: Bits


class Garbler:
    """Garbles ``circuit`` for a batch of ``batch`` queries under round tweak ``tweak``.

    ``key`` (16 bytes, fresh per round from os.urandom) seeds the input labels
    and R. The garbler's input values are used only by
    :meth:`garbler_labels`; garbling itself is independent of every input.
    """

    def __init__(
        self, circuit: Circuit, batch: int, key: bytes, tweak: int, hasher: FixedKeyHash
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.circuit = circuit
        self.batch = batch
        self._tweak = tweak
        self._hash = hasher
        g_wires = circuit.garbler_input_wires
        e_wires = circuit.evaluator_input_wires
        rnd = random_blocks(1 + (g_wires.size + e_wires.size) * batch, key)
        delta = rnd[0].copy()
        delta[0] |= np.uint64(1)
        self.delta = delta
        self._zero = np.empty((circuit.num_wires, batch, 2), dtype=np.uint64)
        inputs = rnd[1:].reshape(-1, batch, 2)
        self._zero[g_wires] = inputs[: g_wires.size]
        self._zero[e_wires] = inputs[g_wires.size :]

    def garble(self) -> Blocks:
        """Garble every gate; returns the tables (AND gates, B, 2, 2)."""
        w = self._zero
        r = self.delta
        tables = np.empty((self.circuit.num_and, self.batch, 2, 2), dtype=np.uint64)
        for layer in self.circuit.layers:
            if layer.op == Op.XOR:
                w[layer.out] = w[layer.a] ^ w[layer.b]
                continue
            a0 = w[layer.a]
            b0 = w[layer.b]
            g = a0.shape[0]
            tw = _tweaks(layer.and_index, self.batch)
            hashed = self._hash(
                np.concatenate([a0, a0 ^ r, b0, b0 ^ r]),
                np.concatenate([tw, tw, tw + np.uint64(1), tw + np.uint64(1)]),
                self._tweak,
            )
            ha0, ha1, hb0, hb1 = (
                hashed[:g],
                hashed[g : 2 * g],
                hashed[2 * g : 3 * g],
                hashed[3 * g :],
            )
            pa = lsb(a0)
            pb = lsb(b0)
            tg = ha0 ^ ha1 ^ select(pb, np.broadcast_to(r, a0.shape))
            te = hb0 ^ hb1 ^ a0
            w[layer.out] = ha0 ^ select(pa, tg) ^ hb0 ^ select(pb, te ^ a0)
            tables[layer.and_index, :, 0] = tg
            tables[layer.and_index, :, 1] = te
        return tables

    def garbler_labels(self, bits: Bits) -> Blocks:
        """Active labels of the garbler's input wires; ``bits`` from Circuit.input_bits."""
        wires = self.circuit.garbler_input_wires
        if bits.shape != (wires.size, self.batch):
            raise ValueError(
                f"garbler bits must have shape {(wires.size, self.batch)}, got {bits.shape}"
            )
        return self._zero[wires] ^ select(
            bits.astype(np.uint64), np.broadcast_to(self.delta, (*bits.shape, 2))
        )

    def evaluator_label_pairs(self) -> tuple[Blocks, Blocks]:
        """(0-labels, 1-labels) of the evaluator's input wires, each (wires, B, 2), for the OT."""
        l0 = self._zero[self.circuit.evaluator_input_wires]
        return l0, l0 ^ self.delta

    def decode_bits(self) -> Bits:
        """Permute bits of the evaluator's output wires (wires, B)."""
        return lsb(self._zero[self.circuit.output_wires(Party.EVALUATOR)]).astype(np.uint8)

    def decode_garbler_outputs(self, labels: Blocks) -> Bits:
        """The garbler's output bits from the labels the evaluator returned.

        Raises :class:`OutputLabelError` unless every label is one of the two
        valid labels of its wire: a wrong or altered label cannot pass for an output.
        """
        zero = self._zero[self.circuit.output_wires(Party.GARBLER)]
        if labels.shape != zero.shape:
            raise OutputLabelError(
                f"expected output labels of shape {zero.shape}, got {labels.shape}"
            )
        diff = labels ^ zero
        is0 = (diff == 0).all(axis=-1)
        is1 = (diff == self.delta).all(axis=-1)
        if not (is0 | is1).all():
            raise OutputLabelError(
                "an output label returned by the evaluator is not a valid label of its wire"
            )
        return is1.astype(np.uint8)


def evaluate(
    circuit: Circuit,
    batch: int,
    tweak: int,
    hasher: FixedKeyHash,
    tables: Blocks,
    input_labels: Blocks,
) -> Blocks:
    """Evaluate a garbled circuit; returns the active labels of every wire (wires, B, 2).

    ``input_labels`` holds the garbler's labels followed by the evaluator's, in
    the order of Circuit.garbler_input_wires and evaluator_input_wires.
    """
    g_wires = circuit.garbler_input_wires
    e_wires = circuit.evaluator_input_wires
    if tables.shape != (circuit.num_and, batch, 2, 2):
        raise ValueError(
            f"garbled tables must have shape {(circuit.num_and, batch, 2, 2)}, got {tables.shape}"
        )
    if input_labels.shape != (g_wires.size + e_wires.size, batch, 2):
        raise ValueError(
            f"input labels must have shape {(g_wires.size + e_wires.size, batch, 2)}, got {input_labels.shape}"
        )
    w = np.empty((circuit.num_wires, batch, 2), dtype=np.uint64)
    w[g_wires] = input_labels[: g_wires.size]
    w[e_wires] = input_labels[g_wires.size :]
    for layer in circuit.layers:
        if layer.op == Op.XOR:
            w[layer.out] = w[layer.a] ^ w[layer.b]
            continue
        wa = w[layer.a]
        wb = w[layer.b]
        g = wa.shape[0]
        tw = _tweaks(layer.and_index, batch)
        hashed = hasher(np.concatenate([wa, wb]), np.concatenate([tw, tw + np.uint64(1)]), tweak)
        tab = tables[layer.and_index]
        w[layer.out] = (
            hashed[:g]
            ^ select(lsb(wa), tab[:, :, 0])
            ^ hashed[g:]
            ^ select(lsb(wb), tab[:, :, 1] ^ wa)
        )
    return w


def decode_evaluator_outputs(circuit: Circuit, wires: Blocks, decode: Bits) -> Bits:
    """The evaluator's output bits (wires, B) from its active labels and the decode bits."""
    out = wires[circuit.output_wires(Party.EVALUATOR)]
    if decode.shape != out.shape[:2]:
        raise ValueError(f"decode bits must have shape {out.shape[:2]}, got {decode.shape}")
    return (lsb(out).astype(np.uint8) ^ decode).astype(np.uint8)


def garbler_output_labels(circuit: Circuit, wires: Blocks) -> Blocks:
    """The labels the evaluator returns so the garbler can decode its outputs."""
    return np.ascontiguousarray(wires[circuit.output_wires(Party.GARBLER)])
