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

import functools

import numpy as np
from numpy.typing import NDArray

from capc.mpc.blocks import Blocks, FixedKeyHash, lsb, random_blocks, select, sigma
from capc.mpc.circuit import Circuit, Op, Party

Bits = NDArray[np.uint8]


def _mask(labels: Blocks) -> Blocks:
    """All-ones blocks where the label's point-and-permute bit is 1, else zero; same shape."""
    bit = labels[..., :1] & np.uint64(1)
    return np.repeat(np.uint64(0) - bit, 2, axis=-1)


class OutputLabelError(ValueError):
    """An output label the garbler received is neither of the two valid labels."""


@functools.lru_cache(maxsize=8)
def _tweaks(num_and: int, batch: int) -> NDArray[np.uint64]:
    """Low tweak words 2 (g B + q) for every AND gate g and query q: (gates, B).

    The same for every round of a circuit and batch size (the round goes in the
    high word), so it is built once and shared read-only.
    """
    t = (np.arange(num_and * batch, dtype=np.uint64) << np.uint64(1)).reshape(num_and, batch)
    t.flags.writeable = False
    return t


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
        """Garble every gate; returns the tables (2, AND gates, B, 2)."""
        w = self._zero
        batch = self.batch
        # Full-shape copies: numpy is slow when a size-2 axis is broadcast.
        r = np.ascontiguousarray(np.broadcast_to(self.delta, (batch, 2)))
        sig_r = sigma(r)
        half4 = np.array([0, 0, 1, 1], dtype=np.uint64)[:, None, None]
        tweaks = _tweaks(self.circuit.num_and, batch)
        tables = np.empty((2, self.circuit.num_and, batch, 2), dtype=np.uint64)
        for layer in self.circuit.layers:
            out = w[layer.out]
            if layer.op == Op.XOR:
                np.bitwise_xor(w[layer.a], w[layer.b], out=out)
                continue
            a0 = w[layer.a]
            b0 = w[layer.b]
            g = a0.shape[0]
            gates = slice(int(layer.and_index[0]), int(layer.and_index[-1]) + 1)
            # sigma is linear: sigma(A1) = sigma(A0) ^ sigma(R), one XOR instead of three passes.
            sig = np.empty((4, g, batch, 2), dtype=np.uint64)
            sigma(a0, out=sig[0])
            np.bitwise_xor(sig[0], sig_r, out=sig[1])
            sigma(b0, out=sig[2])
            np.bitwise_xor(sig[2], sig_r, out=sig[3])
            h = self._hash.hash_sigma(sig, tweaks[gates] + half4, self._tweak)
            mask_b = _mask(b0)
            tg = tables[0, gates]
            te = tables[1, gates]
            # Garbler half: TG = H(A0) ^ H(A1) ^ pb R, WG0 = H(A0) ^ pa TG.
            np.bitwise_xor(h[0], h[1], out=tg)
            tmp = np.bitwise_and(mask_b, r)
            tg ^= tmp
            mask_a = _mask(a0)
            mask_a &= tg
            np.bitwise_xor(h[0], mask_a, out=out)
            # Evaluator half: TE = H(B0) ^ H(B1) ^ A0, WE0 = H(B0) ^ pb (TE ^ A0).
            np.bitwise_xor(h[2], h[3], out=te)
            out ^= h[2]
            mask_b &= te
            out ^= mask_b
            te ^= a0
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
        return np.asarray(is1, dtype=np.uint8)


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
    if tables.shape != (2, circuit.num_and, batch, 2):
        raise ValueError(
            f"garbled tables must have shape {(2, circuit.num_and, batch, 2)}, got {tables.shape}"
        )
    if input_labels.shape != (g_wires.size + e_wires.size, batch, 2):
        raise ValueError(
            f"input labels must have shape {(g_wires.size + e_wires.size, batch, 2)}, got {input_labels.shape}"
        )
    w = np.empty((circuit.num_wires, batch, 2), dtype=np.uint64)
    w[g_wires] = input_labels[: g_wires.size]
    w[e_wires] = input_labels[g_wires.size :]
    tweaks = _tweaks(circuit.num_and, batch)
    for layer in circuit.layers:
        out = w[layer.out]
        if layer.op == Op.XOR:
            np.bitwise_xor(w[layer.a], w[layer.b], out=out)
            continue
        wa = w[layer.a]
        wb = w[layer.b]
        g = wa.shape[0]
        gates = slice(int(layer.and_index[0]), int(layer.and_index[-1]) + 1)
        tw = tweaks[gates]
        h = hasher(np.concatenate([wa, wb]), np.concatenate([tw, tw + np.uint64(1)]), tweak)
        np.bitwise_xor(h[:g], h[g:], out=out)
        mask = _mask(wa)
        mask &= tables[0, gates]
        out ^= mask
        te = tables[1, gates] ^ wa
        te &= _mask(wb)
        out ^= te
    return w


def decode_evaluator_outputs(circuit: Circuit, wires: Blocks, decode: Bits) -> Bits:
    """The evaluator's output bits (wires, B) from its active labels and the decode bits."""
    out = wires[circuit.output_wires(Party.EVALUATOR)]
    if decode.shape != out.shape[:2]:
        raise ValueError(f"decode bits must have shape {out.shape[:2]}, got {decode.shape}")
    return np.asarray(lsb(out).astype(np.uint8) ^ decode, dtype=np.uint8)


def garbler_output_labels(circuit: Circuit, wires: Blocks) -> Blocks:
    """The labels the evaluator returns so the garbler can decode its outputs."""
    return np.ascontiguousarray(wires[circuit.output_wires(Party.GARBLER)])
