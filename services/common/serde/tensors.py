"""Tensors on the wire: float32 queries and int64 labels (C order, little-endian)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from services.common.limits import count_refusal
from services.common.protocol import RequestError
from services.common.serde.wire import WIRE_DTYPES, TensorDtype, check_length
from services.proto.capc.v1 import common_pb2


def tensor_to_proto(array: ArrayLike, dtype: TensorDtype) -> common_pb2.Tensor:
    """``array`` as a Tensor of ``dtype``, converted if it is of another."""
    x = np.ascontiguousarray(array, dtype=WIRE_DTYPES[dtype])
    return common_pb2.Tensor(shape=list(x.shape), dtype=dtype, data=x.tobytes())


def tensor_from_proto(
    t: common_pb2.Tensor, dtype: TensorDtype, what: str = "the tensor"
) -> NDArray[np.generic]:
    """The array of a Tensor that must be of ``dtype``; read in place, so read-only."""
    if t.dtype != dtype:
        raise RequestError(f"{what} must be {dtype}, got {t.dtype!r}")
    shape = tuple(int(n) for n in t.shape)
    check_length(t.data, WIRE_DTYPES[dtype], shape, what)
    return np.frombuffer(t.data, dtype=WIRE_DTYPES[dtype]).reshape(shape)


def queries_to_proto(queries: ArrayLike) -> common_pb2.Tensor:
    """Queries (N, *input_shape) as a float32 Tensor."""
    return tensor_to_proto(queries, "float32")


def queries_from_proto(
    t: common_pb2.Tensor, input_shape: tuple[int, ...], max_count: int, what: str = "a batch"
) -> NDArray[np.float32]:
    """The queries of a Tensor, (N, *input_shape) float32 with 1 <= N <= ``max_count``, all finite.

    ``what`` names the request in the count refusal ("a batch", "a job").
    """
    if t.dtype != "float32":
        raise RequestError(f"queries must be float32, got {t.dtype!r}; convert them before sending")
    shape = tuple(int(n) for n in t.shape)
    if len(shape) != 1 + len(input_shape) or shape[1:] != input_shape:
        raise RequestError(
            f"queries must have shape (N, {', '.join(map(str, input_shape))}), got {shape}"
        )
    refusal = count_refusal(shape[0], max_count, what)
    if refusal is not None:
        raise RequestError(refusal)
    check_length(t.data, WIRE_DTYPES["float32"], shape, "queries")
    x: NDArray[np.float32] = np.frombuffer(t.data, dtype="<f4").reshape(shape)
    bad = ~np.isfinite(x).reshape(len(x), -1).all(axis=1)
    if bad.any():
        raise RequestError(
            f"{int(bad.sum())} queries contain NaN or infinity; clean them and send them again"
        )
    return x


def labels_to_proto(labels: ArrayLike) -> common_pb2.Tensor:
    """Labels (N,) or (N, k), -1 where not answered, as an int64 Tensor."""
    return tensor_to_proto(labels, "int64")


def labels_from_proto(t: common_pb2.Tensor) -> NDArray[np.int64]:
    labels: NDArray[np.int64] = tensor_from_proto(t, "int64", "labels").astype(np.int64, copy=False)
    return labels
