"""Single-query encrypted inference: one query in a handful of ciphertexts, with rotations.

Layout (all vectors are periodic over the N/2 slots, so a rotation of the
whole ciphertext is a cyclic rotation of each period):

- a convolution first: the student sends the query im2col-encoded.
  Each period-``block`` block of a ciphertext holds one kernel tap, repeated
  for every output channel: slot ``c * windows + w`` of the block for tap
  ``k`` holds input pixel ``windows[w, k]``. The party multiplies by the
  matching kernel weights, and rotations by ``block``, ``2 * block``...
  sum the taps; the feature map comes out in (C, H, W) order with period
  ``block``.
- a dense layer: the hybrid diagonal method (Juvekar et al., GAZELLE, 2018)
  with baby-step giant-step rotations (Halevi and Shoup, 2018): an (m, n)
  matrix on a vector of period P >= n costs m' = 2^ceil(log2 m) plaintext
  products and about 2 sqrt(m') + log2(P / m') rotations, and the result
  has period m'.
- a square: one ciphertext multiplication.

The logits end in slots ``0..K-1`` (and every copy ``j * period + k``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tenseal.sealapi as seal
from numpy.typing import NDArray

from capc.he.ckks import HeError, PublicContext, StudentKeys
from capc.he.plan import Conv, Dense, Plan, SquareLayer


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass(frozen=True)
class _ConvStage:
    conv: Conv
    block: int
    per_ct: int
    cts: int


@dataclass(frozen=True)
class _DenseStage:
    dense: Dense
    period: int  # P: period of the input vector
    rows: int  # m': padded output count, the output period
    baby: int  # B


Stage = _ConvStage | _DenseStage | SquareLayer


@dataclass(frozen=True)
class SingleLayout:
    """How one query is packed and which rotations its evaluation needs."""

    plan: Plan
    slots: int
    stages: tuple[Stage, ...]

    @classmethod
    def for_plan(cls, plan: Plan, slots: int) -> SingleLayout:
        stages: list[Stage] = []
        period = 0
        for i, layer in enumerate(plan.layers):
            if isinstance(layer, SquareLayer):
                stages.append(layer)
            elif isinstance(layer, Conv):
                if i != 0:
                    raise HeError("single-query evaluation supports a convolution only first")
                c_out = layer.weight.shape[0]
                taps = int(np.prod(layer.weight.shape[1:]))
                block = _pow2(layer.out_dim)
                if block > slots:
                    raise HeError(f"the feature map ({layer.out_dim}) exceeds {slots} slots")
                per_ct = slots // block
                stages.append(_ConvStage(layer, block, per_ct, -(-taps // per_ct)))
                del c_out
                period = block
            else:
                out, inp = layer.weight.shape
                rows = _pow2(out)
                period = max(period if i else _pow2(inp), rows, _pow2(inp))
                if period > slots:
                    raise HeError(f"a dense layer of {inp} inputs exceeds {slots} slots")
                baby = 1 << ((rows.bit_length() - 1 + 1) // 2)
                stages.append(_DenseStage(layer, period, rows, baby))
                period = rows
        return cls(plan, slots, tuple(stages))

    @property
    def input_ciphertexts(self) -> int:
        """Ciphertexts per query."""
        first = self.stages[0]
        return first.cts if isinstance(first, _ConvStage) else 1

    @property
    def rotations(self) -> tuple[int, ...]:
        """Every left rotation (in slots) the evaluation uses: the Galois keys to publish."""
        steps: set[int] = set()
        for st in self.stages:
            if isinstance(st, _ConvStage):
                s = st.block
                while s < self.slots:
                    steps.add(s)
                    s *= 2
            elif isinstance(st, _DenseStage):
                steps.update(range(1, st.baby))
                steps.update(range(st.baby, st.rows, st.baby))
                s = st.period // 2
                while s >= st.rows:
                    steps.add(s)
                    s //= 2
        return tuple(sorted(steps))

    def encode(self, x: NDArray[np.float64]) -> list[NDArray[np.float64]]:
        """One query (input_shape) -> the slot vectors the student encrypts."""
        v = np.asarray(x, dtype=np.float64).reshape(-1)
        if v.size != self.plan.input_dim or not np.isfinite(v).all():
            raise HeError(f"a query needs {self.plan.input_dim} finite values, got {v.size}")
        first = self.stages[0]
        if isinstance(first, _DenseStage):
            period = np.zeros(first.period)
            period[: v.size] = v
            return [np.tile(period, self.slots // first.period)]
        if not isinstance(first, _ConvStage):
            raise HeError("a model must start with a convolution or a dense layer")
        conv = first.conv
        win = conv.windows()  # (windows, taps)
        c_out = conv.weight.shape[0]
        nwin, taps = win.shape
        out = []
        for t in range(first.cts):
            slots = np.zeros(self.slots)
            for b in range(first.per_ct):
                k = t * first.per_ct + b
                if k < taps:
                    lo = b * first.block
                    slots[lo : lo + c_out * nwin] = np.tile(v[win[:, k]], c_out)
            out.append(slots)
        return out


class SingleEvaluator:
    """An answering party's evaluation of one query at a time."""

    def __init__(self, context: PublicContext, plan: Plan) -> None:
        self.ctx = context
        self.layout = SingleLayout.for_plan(plan, context.params.slots)
        if plan.depth - 1 > context.params.depth:
            raise HeError(
                f"the model needs {plan.depth - 1} levels, the context has {context.params.depth}"
            )
        context.require_rotations(self.layout.rotations)
        self._vectors = [self._stage_vectors(st) for st in self.layout.stages]

    def _tile(self, period: NDArray[np.float64]) -> list[float]:
        return np.tile(period, self.layout.slots // len(period)).tolist()  # type: ignore[no-any-return]

    def _stage_vectors(self, st: Stage) -> tuple[list[list[float]], list[float]] | None:
        """(weight vectors, bias vector) of a stage, as slot lists; None for a square."""
        if isinstance(st, SquareLayer):
            return None
        if isinstance(st, _ConvStage):
            conv = st.conv
            c_out = conv.weight.shape[0]
            kernels = conv.weight.reshape(c_out, -1)
            nwin = conv.out_dim // c_out
            weights = []
            for t in range(st.cts):
                slots = np.zeros(self.layout.slots)
                for b in range(st.per_ct):
                    k = t * st.per_ct + b
                    if k < kernels.shape[1]:
                        lo = b * st.block
                        slots[lo : lo + c_out * nwin] = np.repeat(kernels[:, k], nwin)
                weights.append(slots.tolist())
            bias = np.zeros(st.block)
            bias[: conv.out_dim] = np.repeat(conv.bias, nwin)
            return weights, self._tile(bias)
        w = np.zeros((st.rows, st.period))
        out, inp = st.dense.weight.shape
        w[:out, :inp] = st.dense.weight
        j = np.arange(st.period)
        giants = st.rows // st.baby
        weights = []
        for g in range(giants):
            for b in range(st.baby):
                i = g * st.baby + b
                diag = w[j % st.rows, (j + i) % st.period]
                weights.append(self._tile(np.roll(diag, g * st.baby)))
        bias = np.zeros(st.rows)
        bias[:out] = st.dense.bias
        return weights, self._tile(bias)

    def evaluate(self, inputs: list[seal.Ciphertext]) -> seal.Ciphertext:
        """The query's ciphertexts -> one ciphertext with the logits in slots 0..K-1."""
        if len(inputs) != self.layout.input_ciphertexts:
            raise HeError(
                f"a query takes {self.layout.input_ciphertexts} ciphertexts, got {len(inputs)}"
            )
        ctx, ev = self.ctx, self.ctx.evaluator
        last = len(self.layout.stages) - 1
        ct: seal.Ciphertext | None = None
        for i, (st, vectors) in enumerate(zip(self.layout.stages, self._vectors, strict=True)):
            if vectors is None:
                assert ct is not None
                ev.square_inplace(ct)
                ev.relinearize_inplace(ct, ctx.relin_keys)
                ev.rescale_to_next_inplace(ct)
                continue
            weights, bias = vectors
            if isinstance(st, _ConvStage):
                ct = self._conv(inputs, weights, st, final=i == last)
            else:
                assert isinstance(st, _DenseStage)
                ct = self._dense(inputs[0] if ct is None else ct, weights, st, final=i == last)
            pt = ctx.encode(bias, ctx.level(ct), float(ct.scale))
            ev.add_plain_inplace(ct, pt)
        assert ct is not None
        ev.mod_switch_to_inplace(ct, ctx.parms_id(ctx.params.output_level))
        return ct

    def _weight_scale(self, ct: seal.Ciphertext, final: bool) -> float:
        level = self.ctx.level(ct)
        if final:
            return float(2.0**self.ctx.params.output_scale_bits / ct.scale)
        return float(self.ctx.prime(level))

    def _rotated(self, ct: seal.Ciphertext, step: int) -> seal.Ciphertext:
        out = seal.Ciphertext(self.ctx.context)
        self.ctx.evaluator.rotate_vector(ct, step, self.ctx.galois_keys, out)
        return out

    def _rotate_add(self, ct: seal.Ciphertext, step: int) -> None:
        self.ctx.evaluator.add_inplace(ct, self._rotated(ct, step))

    def _conv(
        self, inputs: list[seal.Ciphertext], weights: list[list[float]], st: _ConvStage, final: bool
    ) -> seal.Ciphertext:
        ctx, ev = self.ctx, self.ctx.evaluator
        scale = self._weight_scale(inputs[0], final)
        level = ctx.level(inputs[0])
        acc = seal.Ciphertext(ctx.context)
        tmp = seal.Ciphertext(ctx.context)
        for t, (x, w) in enumerate(zip(inputs, weights, strict=True)):
            pt = ctx.encode(w, level, scale)
            ev.multiply_plain(x, pt, acc if t == 0 else tmp)
            if t:
                ev.add_inplace(acc, tmp)
        # rotate before rescaling: key switching adds noise of a fixed size (with
        # outliers in single slots), 2^26 times smaller against values at scale 2^52
        s = st.block
        while s < self.layout.slots:
            self._rotate_add(acc, s)
            s *= 2
        if not final:
            ev.rescale_to_next_inplace(acc)
        return acc

    def _dense(
        self, v: seal.Ciphertext, weights: list[list[float]], st: _DenseStage, final: bool
    ) -> seal.Ciphertext:
        ctx, ev, gk = self.ctx, self.ctx.evaluator, self.ctx.galois_keys
        scale = self._weight_scale(v, final)
        level = ctx.level(v)
        babies = [v] + [self._rotated(v, b) for b in range(1, st.baby)]
        total: seal.Ciphertext | None = None
        tmp = seal.Ciphertext(ctx.context)
        for g in range(st.rows // st.baby):
            inner = seal.Ciphertext(ctx.context)
            for b, x in enumerate(babies):
                pt = ctx.encode(weights[g * st.baby + b], level, scale)
                ev.multiply_plain(x, pt, inner if b == 0 else tmp)
                if b:
                    ev.add_inplace(inner, tmp)
            if g:  # unrescaled, as in _conv: the key-switching noise stays negligible
                ev.rotate_vector_inplace(inner, g * st.baby, gk)
                assert total is not None
                ev.add_inplace(total, inner)
            else:
                total = inner
        assert total is not None
        s = st.period // 2
        while s >= st.rows:
            self._rotate_add(total, s)
            s //= 2
        if not final:
            ev.rescale_to_next_inplace(total)
        return total


def encrypt_query(
    keys: StudentKeys, layout: SingleLayout, x: NDArray[np.float64]
) -> list[seal.Ciphertext]:
    """The student's ciphertexts for one query."""
    return [keys.encrypt(v) for v in layout.encode(x)]
