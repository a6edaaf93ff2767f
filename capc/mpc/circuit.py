"""A typed Boolean circuit builder and the compiled, layered circuit.

Circuits are written once per query; the garbling engine runs the same
circuit over a batch of B queries, one layer at a time. A layer is a set of
gates of one kind (AND or XOR) whose inputs are all ready, so every layer is a
handful of numpy operations over arrays of shape (gates, B, 2).

Wires are integers. Two sentinels stand for constants and are folded away
while building (AND with 0 is 0, XOR with 0 is the wire, ...); NOT is an XOR
with the garbler's constant-one input wire, so it is free under free-XOR.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

Bit = int
Word = tuple[Bit, ...]  # little-endian bits

ZERO: Bit = -1
ONE: Bit = -2
#: The garbler's input wire that always carries 1 (wire 0 of every circuit).
ONE_WIRE: Bit = 0

IntArray = NDArray[np.int64]
U64 = NDArray[np.uint64]


class Party(enum.IntFlag):
    """Who provides an input or receives an output."""

    GARBLER = 1
    EVALUATOR = 2
    BOTH = 3


class Op(enum.IntEnum):
    XOR = 0
    AND = 1


@dataclass(frozen=True)
class IOSpec:
    """A named group of ``count`` words of ``width`` bits; ``wires`` has shape (count, width).

    Output wires may hold the constants ZERO / ONE after folding.
    """

    name: str
    party: Party
    wires: IntArray

    @property
    def count(self) -> int:
        return int(self.wires.shape[0])

    @property
    def width(self) -> int:
        return int(self.wires.shape[1])


@dataclass(frozen=True)
class Layer:
    """Gates of one kind that can run together: wire start + i = a[i] op b[i].

    For AND layers ``and_index`` numbers the gates across the whole circuit;
    it fixes where their garbled tables sit and the hash tweaks they use.
    """

    op: Op
    a: IntArray
    b: IntArray
    start: int
    stop: int
    and_index: IntArray

    @property
    def out(self) -> slice:
        """The contiguous wires this layer writes."""
        return slice(self.start, self.stop)


@dataclass(frozen=True)
class Circuit:
    """A compiled circuit; see :class:`CircuitBuilder`."""

    name: str
    num_wires: int
    garbler_inputs: tuple[IOSpec, ...]
    evaluator_inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    layers: tuple[Layer, ...]
    num_and: int
    num_xor: int
    digest: bytes = field(repr=False)

    @property
    def garbler_input_wires(self) -> IntArray:
        """All garbler input wires in order, the constant-one wire first."""
        parts = [np.array([ONE_WIRE], dtype=np.int64)]
        parts += [spec.wires.ravel() for spec in self.garbler_inputs]
        return np.concatenate(parts)

    @property
    def evaluator_input_wires(self) -> IntArray:
        """All evaluator input wires in order."""
        if not self.evaluator_inputs:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([spec.wires.ravel() for spec in self.evaluator_inputs])

    def outputs_for(self, party: Party) -> tuple[IOSpec, ...]:
        """The output groups ``party`` receives."""
        return tuple(o for o in self.outputs if o.party & party)

    def output_wires(self, party: Party) -> IntArray:
        """The non-constant output wires ``party`` decodes, in order."""
        specs = self.outputs_for(party)
        if not specs:
            return np.zeros(0, dtype=np.int64)
        w = np.concatenate([o.wires.ravel() for o in specs])
        return w[w >= 0]

    def input_bits(
        self, party: Party, values: Mapping[str, NDArray[np.uint64]], batch: int
    ) -> NDArray[np.uint8]:
        """Bits for ``party``'s input wires from word values; (wires, batch) uint8.

        ``values[name]`` has shape (batch, count) with words already reduced to
        their width. The garbler's constant-one wire is included first.
        """
        specs = self.garbler_inputs if party == Party.GARBLER else self.evaluator_inputs
        rows: list[NDArray[np.uint8]] = []
        if party == Party.GARBLER:
            rows.append(np.ones((1, batch), dtype=np.uint8))
        expected = {s.name for s in specs}
        if set(values) != expected:
            raise ValueError(
                f"{self.name}: inputs must be exactly {sorted(expected)}, got {sorted(values)}"
            )
        for spec in specs:
            arr = np.asarray(values[spec.name])
            if arr.dtype != np.uint64 or arr.shape != (batch, spec.count):
                raise ValueError(
                    f"{self.name}: input {spec.name!r} must be uint64 of shape {(batch, spec.count)}, "
                    f"got {arr.dtype} {arr.shape}"
                )
            if spec.width < 64 and (arr >> np.uint64(spec.width)).any():
                raise ValueError(
                    f"{self.name}: input {spec.name!r} has values wider than {spec.width} bits"
                )
            shifts = np.arange(spec.width, dtype=np.uint64)
            bits = ((arr[:, :, None] >> shifts) & np.uint64(1)).astype(
                np.uint8
            )  # (B, count, width)
            rows.append(bits.reshape(batch, -1).T)
        if not rows:
            return np.zeros((0, batch), dtype=np.uint8)
        return np.ascontiguousarray(np.concatenate(rows, axis=0))

    def decode_outputs(
        self, party: Party, bits: NDArray[np.uint8]
    ) -> dict[str, NDArray[np.uint64]]:
        """Words from the decoded bits of ``party``'s output wires: (wires, B) -> {name: (B, count)}."""
        batch = bits.shape[1]
        result: dict[str, NDArray[np.uint64]] = {}
        pos = 0
        for spec in self.outputs_for(party):
            flat = spec.wires.ravel()
            full = np.zeros((flat.size, batch), dtype=np.uint64)
            live = flat >= 0
            n_live = int(live.sum())
            full[live] = bits[pos : pos + n_live]
            full[flat == ONE] = 1
            pos += n_live
            words = full.reshape(spec.count, spec.width, batch)
            shifts = np.arange(spec.width, dtype=np.uint64)[None, :, None]
            result[spec.name] = np.bitwise_or.reduce(words << shifts, axis=1).T.copy()
        return result

    def evaluate_plain(
        self,
        garbler: Mapping[str, NDArray[np.uint64]],
        evaluator: Mapping[str, NDArray[np.uint64]],
        batch: int,
    ) -> dict[str, NDArray[np.uint64]]:
        """Run the circuit in the clear on a batch: the reference for the garbled run.

        Returns every output group, {name: (batch, count) uint64}.
        """
        w = np.zeros((self.num_wires, batch), dtype=np.uint8)
        w[self.garbler_input_wires] = self.input_bits(Party.GARBLER, garbler, batch)
        w[self.evaluator_input_wires] = self.input_bits(Party.EVALUATOR, evaluator, batch)
        for layer in self.layers:
            if layer.op == Op.AND:
                w[layer.out] = w[layer.a] & w[layer.b]
            else:
                w[layer.out] = w[layer.a] ^ w[layer.b]
        out: dict[str, NDArray[np.uint64]] = {}
        for party in (Party.GARBLER, Party.EVALUATOR):
            out.update(self.decode_outputs(party, w[self.output_wires(party)]))
        return out


class CircuitBuilder:
    """Builds a circuit gate by gate with constant folding and hash-consing."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._next = 1  # wire 0 is the constant-one input
        self._gates: list[tuple[int, int, int, int]] = []
        self._memo: dict[tuple[int, int, int], int] = {}
        self._inputs: list[tuple[str, Party, IntArray]] = []
        self._outputs: list[IOSpec] = []

    # -- inputs and outputs -------------------------------------------------
    def input(self, name: str, party: Party, count: int, width: int) -> list[Word]:
        """Declare ``count`` words of ``width`` bits owned by ``party``."""
        if party not in (Party.GARBLER, Party.EVALUATOR):
            raise ValueError("an input belongs to exactly one party")
        if any(n == name for n, _, _ in self._inputs):
            raise ValueError(f"input {name!r} declared twice")
        if count < 1 or not 1 <= width <= 64:
            raise ValueError(f"input {name!r}: need count >= 1 and 1 <= width <= 64")
        wires = np.arange(self._next, self._next + count * width, dtype=np.int64).reshape(
            count, width
        )
        self._next += count * width
        self._inputs.append((name, party, wires))
        return [tuple(int(x) for x in row) for row in wires]

    def output(self, name: str, party: Party, words: Sequence[Word]) -> None:
        """Declare an output group; all words must have one width."""
        widths = {len(w) for w in words}
        if len(widths) != 1:
            raise ValueError(f"output {name!r}: words of one width expected, got {sorted(widths)}")
        self._outputs.append(
            IOSpec(name, party, np.array(words, dtype=np.int64).reshape(len(words), -1))
        )

    # -- gates ----------------------------------------------------------------
    def _gate(self, op: Op, a: Bit, b: Bit) -> Bit:
        key = (int(op), min(a, b), max(a, b))
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        out = self._next
        self._next += 1
        self._gates.append((int(op), a, b, out))
        self._memo[key] = out
        return out

    def xor(self, a: Bit, b: Bit) -> Bit:
        if a == ZERO:
            return b
        if b == ZERO:
            return a
        if a == ONE:
            return self.not_(b)
        if b == ONE:
            return self.not_(a)
        if a == b:
            return ZERO
        return self._gate(Op.XOR, a, b)

    def not_(self, a: Bit) -> Bit:
        if a == ZERO:
            return ONE
        if a == ONE:
            return ZERO
        return self._gate(Op.XOR, a, ONE_WIRE)

    def and_(self, a: Bit, b: Bit) -> Bit:
        if a == ZERO or b == ZERO:
            return ZERO
        if a == ONE:
            return b
        if b == ONE:
            return a
        if a == b:
            return a
        return self._gate(Op.AND, a, b)

    def or_(self, a: Bit, b: Bit) -> Bit:
        return self.xor(self.xor(a, b), self.and_(a, b))

    @staticmethod
    def const(value: int, width: int) -> Word:
        """A constant word (two's complement modulo 2^width)."""
        v = value % (1 << width)
        return tuple(ONE if (v >> i) & 1 else ZERO for i in range(width))

    # -- compilation ----------------------------------------------------------
    def build(self) -> Circuit:
        """Drop gates no output needs, renumber wires densely and schedule layers."""
        if not self._outputs:
            raise ValueError(f"circuit {self.name!r} has no outputs")
        needed = np.zeros(self._next, dtype=bool)
        for o in self._outputs:
            live = o.wires[o.wires >= 0]
            needed[live] = True
        kept: list[tuple[int, int, int, int]] = []
        for op, a, b, out in reversed(self._gates):
            if needed[out]:
                kept.append((op, a, b, out))
                needed[a] = True
                needed[b] = True
        kept.reverse()

        # Inputs keep their numbers' order: one-wire, garbler inputs, evaluator inputs.
        remap = np.full(self._next, -1, dtype=np.int64)
        remap[ONE_WIRE] = 0
        nxt = 1
        ordered = [i for i in self._inputs if i[1] == Party.GARBLER]
        ordered += [i for i in self._inputs if i[1] == Party.EVALUATOR]
        for _, _, wires in ordered:
            flat = wires.ravel()
            remap[flat] = np.arange(nxt, nxt + flat.size)
            nxt += flat.size

        # Level = (AND depth, XOR chain length since the last AND): AND gates at
        # (d, 0) need only wires of depth < d, XOR gates at (d, x) only wires
        # before them in that order, so each level is one vectorised step.
        level: dict[int, tuple[int, int]] = {}
        gates_by_level: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
        for op, a, b, out in kept:
            la = level.get(a, (0, 0))
            lb = level.get(b, (0, 0))
            if op == Op.AND:
                lv = (max(la[0], lb[0]) + 1, 0)
            else:
                d = max(la[0], lb[0])
                x = max(la[1] if la[0] == d else 0, lb[1] if lb[0] == d else 0) + 1
                lv = (d, x)
            level[out] = lv
            gates_by_level.setdefault(lv, []).append((op, a, b, out))

        # New wire numbers follow the layer order, so a layer writes one
        # contiguous slice of the wire array instead of scattering.
        layers: list[Layer] = []
        and_count = 0
        xor_count = 0
        for lv in sorted(gates_by_level):
            gs = np.array(gates_by_level[lv], dtype=np.int64)
            op = Op(int(gs[0, 0]))
            remap[gs[:, 3]] = np.arange(nxt, nxt + len(gs))
            if op == Op.AND:
                idx = np.arange(and_count, and_count + len(gs), dtype=np.int64)
                and_count += len(gs)
            else:
                idx = np.zeros(0, dtype=np.int64)
                xor_count += len(gs)
            layers.append(Layer(op, remap[gs[:, 1]], remap[gs[:, 2]], nxt, nxt + len(gs), idx))
            nxt += len(gs)

        def spec(name: str, party: Party, wires: IntArray) -> IOSpec:
            mapped = np.where(wires >= 0, remap[np.maximum(wires, 0)], wires)
            return IOSpec(name, party, mapped)

        g_in = tuple(spec(n, p, w) for n, p, w in self._inputs if p == Party.GARBLER)
        e_in = tuple(spec(n, p, w) for n, p, w in self._inputs if p == Party.EVALUATOR)
        outs = tuple(spec(o.name, o.party, o.wires) for o in self._outputs)
        h = hashlib.sha256(self.name.encode())
        for io in (*g_in, *e_in, *outs):
            h.update(f"{io.name}:{int(io.party)}:{io.wires.shape}".encode())
            h.update(io.wires.tobytes())
        for layer in layers:
            h.update(bytes([layer.op]))
            h.update(layer.a.tobytes() + layer.b.tobytes() + f"{layer.start}:{layer.stop}".encode())
        return Circuit(
            name=self.name,
            num_wires=nxt,
            garbler_inputs=g_in,
            evaluator_inputs=e_in,
            outputs=outs,
            layers=tuple(layers),
            num_and=and_count,
            num_xor=xor_count,
            digest=h.digest(),
        )
