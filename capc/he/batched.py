"""Batched encrypted inference: one input feature per ciphertext, one query per slot.

A batch of B <= N/2 queries of D features travels as D ciphertexts; slot b
of ciphertext j holds feature j of query b. Every layer is then a linear
map or a square applied slot-wise, so no rotation (and no Galois key) is
needed: a dense or convolutional output is a sum of ciphertext-by-scalar
products, a square is one ciphertext multiplication. The cost is one
multiply-add per nonzero weight, whatever B is, so the throughput grows
with the batch.

Scales: intermediate weights are encoded at exactly the prime the product
is rescaled by, so every hidden layer comes out at the input scale; the
last layer is not rescaled and its weights are encoded so that the logits
land at the output scale (:class:`~capc.he.params.CkksParams`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tenseal.sealapi as seal
from numpy.typing import NDArray

from capc.he.ckks import HeError, PublicContext, StudentKeys
from capc.he.plan import Conv, Dense, Plan, SquareLayer

Rows = tuple[NDArray[np.int64], NDArray[np.float64]]


def _rows(layer: Conv | Dense) -> tuple[Rows, NDArray[np.float64]]:
    if isinstance(layer, Dense):
        out, inp = layer.weight.shape
        index = np.broadcast_to(np.arange(inp), (out, inp))
        return (np.asarray(index), layer.weight), layer.bias
    index, weight = layer.as_dense_rows()
    return (index, weight), np.repeat(layer.bias, layer.out_dim // len(layer.bias))


def encrypt_batch(keys: StudentKeys, x: NDArray[np.float64]) -> list[seal.Ciphertext]:
    """(B, D) queries -> D ciphertexts at the top level; B <= slots."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or not 1 <= len(x) <= keys.params.slots:
        raise HeError(f"need (B, D) queries with 1 <= B <= {keys.params.slots}, got {x.shape}")
    return [keys.encrypt(x[:, j]) for j in range(x.shape[1])]


def decrypt_batch(
    keys: StudentKeys, logits: Sequence[seal.Ciphertext], batch: int
) -> NDArray[np.float64]:
    """K logit ciphertexts -> (batch, K) real slot values."""
    return np.stack([keys.decrypt(ct)[:batch].real for ct in logits], axis=1)


class BatchedEvaluator:
    """An answering party's evaluation of one compiled model on batched ciphertexts."""

    def __init__(self, context: PublicContext, plan: Plan) -> None:
        if plan.depth - 1 > context.params.depth:
            raise HeError(
                f"the model needs {plan.depth - 1} levels, the context has {context.params.depth}"
            )
        self.ctx = context
        self.plan = plan
        self.layers: list[tuple[Rows, NDArray[np.float64]] | None] = [
            None if isinstance(layer, SquareLayer) else _rows(layer) for layer in plan.layers
        ]
        self._pt = seal.Plaintext()
        self._tmp = seal.Ciphertext(context.context)

    @property
    def input_level(self) -> int:
        return self.ctx.params.input_level

    @property
    def input_scale(self) -> float:
        return float(2**self.ctx.params.scale_bits)

    def evaluate(self, inputs: Sequence[seal.Ciphertext]) -> list[seal.Ciphertext]:
        """D input ciphertexts -> K logit ciphertexts at the output level and scale."""
        if len(inputs) != self.plan.input_dim:
            raise HeError(
                f"the model takes {self.plan.input_dim} input ciphertexts, got {len(inputs)}"
            )
        h = list(inputs)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            if layer is None:
                h = [self._square(ct) for ct in h]
            else:
                h = self._linear(h, layer, final=i == last)
        for ct in h:
            self.ctx.evaluator.mod_switch_to_inplace(
                ct, self.ctx.parms_id(self.ctx.params.output_level)
            )
        return h

    def _square(self, ct: seal.Ciphertext) -> seal.Ciphertext:
        ev = self.ctx.evaluator
        ev.square_inplace(ct)
        ev.relinearize_inplace(ct, self.ctx.relin_keys)
        ev.rescale_to_next_inplace(ct)
        return ct

    def _linear(
        self, h: list[seal.Ciphertext], layer: tuple[Rows, NDArray[np.float64]], final: bool
    ) -> list[seal.Ciphertext]:
        (index, weight), bias = layer
        ctx, ev, pt, tmp = self.ctx, self.ctx.evaluator, self._pt, self._tmp
        level = ctx.level(h[0])
        s_in = float(h[0].scale)
        w_scale = 2.0**ctx.params.output_scale_bits / s_in if final else float(ctx.prime(level))
        pid = ctx.parms_id(level)
        out = []
        for o in range(len(index)):
            # a weight below half a step at this scale encodes to the zero plaintext,
            # whose product SEAL refuses (transparent); leaving it out is the same rounding
            nz = np.flatnonzero(np.abs(weight[o]) * w_scale >= 0.5)
            if nz.size == 0:
                # a row of zeros still needs a ciphertext: multiply one input by the
                # smallest encodable step instead
                nz = np.array([0])
            acc: seal.Ciphertext | None = None
            for j in nz:
                w = float(weight[o, j])
                ctx.encoder.encode(
                    w if abs(w) * w_scale >= 0.5 else 1.0 / w_scale, pid, w_scale, pt
                )
                if acc is None:
                    acc = seal.Ciphertext(ctx.context)
                    ev.multiply_plain(h[index[o, j]], pt, acc)
                else:
                    ev.multiply_plain(h[index[o, j]], pt, tmp)
                    ev.add_inplace(acc, tmp)
            assert acc is not None
            if not final:
                ev.rescale_to_next_inplace(acc)
            ctx.encoder.encode(float(bias[o]), acc.parms_id(), acc.scale, pt)
            ev.add_plain_inplace(acc, pt)
            out.append(acc)
        return out
