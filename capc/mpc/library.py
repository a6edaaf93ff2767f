"""Arithmetic and selection circuits over l-bit two's complement words.

AND gates are what garbling pays for (two ciphertexts each); XOR is free. The
counts below are per word of l bits:

- add / subtract modulo 2^l: l - 1 AND;
- sign of a sum, hence signed comparison: l - 1 AND (no sum bits are kept);
- multiplexer: l AND;
- argmax over K words: (K - 1) comparisons and multiplexers, ties to the
  lowest index (a pairwise tournament keeps the left word unless the right one
  is strictly larger, and left subtrees hold lower indices).

Signed comparisons assume the difference fits in l bits; the mechanism
circuits choose l so that it does.
"""

from __future__ import annotations

from collections.abc import Sequence

from capc.mpc.circuit import ONE, ZERO, Bit, CircuitBuilder, Word


def _same_width(x: Word, y: Word) -> int:
    if len(x) != len(y):
        raise ValueError(f"words of different widths: {len(x)} and {len(y)}")
    return len(x)


def add(c: CircuitBuilder, x: Word, y: Word, carry_in: Bit = ZERO) -> Word:
    """x + y + carry_in modulo 2^l (ripple carry; l - 1 AND gates)."""
    n = _same_width(x, y)
    out: list[Bit] = []
    carry = carry_in
    for i in range(n):
        axc = c.xor(x[i], carry)
        out.append(c.xor(axc, y[i]))
        if i < n - 1:
            # carry' = majority(x, y, carry) with one AND
            carry = c.xor(c.and_(axc, c.xor(y[i], carry)), carry)
    return tuple(out)


def negate_bits(c: CircuitBuilder, x: Word) -> Word:
    """Bitwise NOT (free)."""
    return tuple(c.not_(b) for b in x)


def sub(c: CircuitBuilder, x: Word, y: Word) -> Word:
    """x - y modulo 2^l."""
    return add(c, x, negate_bits(c, y), ONE)


def sum_sign(c: CircuitBuilder, x: Word, y: Word, carry_in: Bit = ZERO) -> Bit:
    """The top bit of x + y + carry_in: 1 iff the (non-overflowing) sum is negative."""
    n = _same_width(x, y)
    carry = carry_in
    for i in range(n - 1):
        axc = c.xor(x[i], carry)
        carry = c.xor(c.and_(axc, c.xor(y[i], carry)), carry)
    return c.xor(c.xor(x[n - 1], y[n - 1]), carry)


def less_than(c: CircuitBuilder, x: Word, y: Word) -> Bit:
    """1 iff x < y as signed integers (|x - y| < 2^(l-1))."""
    return sum_sign(c, x, negate_bits(c, y), ONE)


def greater_equal(c: CircuitBuilder, x: Word, y: Word) -> Bit:
    """1 iff x >= y as signed integers."""
    return c.not_(less_than(c, x, y))


def is_non_negative_sum(c: CircuitBuilder, x: Word, y: Word, carry_in: Bit = ZERO) -> Bit:
    """1 iff x + y + carry_in >= 0 (signed): the threshold test against a folded constant."""
    return c.not_(sum_sign(c, x, y, carry_in))


def mux(c: CircuitBuilder, select: Bit, x: Word, y: Word) -> Word:
    """``y`` where ``select`` is 1, else ``x`` (l AND gates)."""
    _same_width(x, y)
    return tuple(c.xor(a, c.and_(select, c.xor(a, b))) for a, b in zip(x, y, strict=True))


def index_width(count: int) -> int:
    """Bits needed to write indices 0..count-1 (at least 1)."""
    return max(1, (count - 1).bit_length())


def argmax(c: CircuitBuilder, words: Sequence[Word]) -> tuple[Word, Word]:
    """(index of the largest word, that word); ties go to the lowest index."""
    if not words:
        raise ValueError("argmax of no words")
    width = index_width(len(words))
    nodes: list[tuple[Word, Word]] = [
        (CircuitBuilder.const(i, width), w) for i, w in enumerate(words)
    ]
    while len(nodes) > 1:
        nxt: list[tuple[Word, Word]] = []
        for i in range(0, len(nodes) - 1, 2):
            (il, vl), (ir, vr) = nodes[i], nodes[i + 1]
            take_right = less_than(c, vl, vr)
            nxt.append((mux(c, take_right, il, ir), mux(c, take_right, vl, vr)))
        if len(nodes) % 2:
            nxt.append(nodes[-1])
        nodes = nxt
    return nodes[0]


def maximum(c: CircuitBuilder, words: Sequence[Word]) -> Word:
    """The largest word (signed)."""
    return argmax(c, words)[1]


def any_bit(c: CircuitBuilder, bits: Sequence[Bit]) -> Bit:
    """OR of all bits (one AND per extra bit, as a balanced tree)."""
    if not bits:
        return ZERO
    level = list(bits)
    while len(level) > 1:
        level = [
            c.or_(level[i], level[i + 1]) if i + 1 < len(level) else level[i]
            for i in range(0, len(level), 2)
        ]
    return level[0]


def mask_word(c: CircuitBuilder, bit: Bit, x: Word) -> Word:
    """x where ``bit`` is 1, all zeros where it is 0 (one AND per bit)."""
    return tuple(c.and_(bit, b) for b in x)


def one_hot_word(c: CircuitBuilder, index: Word, count: int) -> Word:
    """The one-hot vector of ``index`` over ``count`` positions (a binary decoder)."""
    rows: list[Bit] = [ONE]
    for bit in index:
        nbit = c.not_(bit)
        rows = [c.and_(r, nbit) for r in rows] + [c.and_(r, bit) for r in rows]
    return tuple(rows[:count])


def add_bit(c: CircuitBuilder, x: Word, bit: Bit) -> Word:
    """x + bit modulo 2^l (an incrementer: l - 1 AND gates)."""
    out: list[Bit] = []
    carry = bit
    for i, xi in enumerate(x):
        out.append(c.xor(xi, carry))
        if i < len(x) - 1:
            carry = c.and_(xi, carry)
    return tuple(out)
