"""The wire protocol's version and the checks every service applies to requests.

The protocol version lives here once; every message header carries it. Query
batches are validated the same way wherever they arrive (guardian rounds,
student jobs): an uploaded float32 tensor of the task's input shape, or a
programmatic recipe for that shape.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from capc.data.generators import Recipe
from services.common.recipes import RecipeError, recipe_from_proto
from services.proto.capc.v1 import common_pb2

PROTOCOL_VERSION = 1


class RequestError(ValueError):
    """A request is malformed; the message says what to fix (INVALID_ARGUMENT)."""


def header(task: str = "", config_hash: str = "") -> common_pb2.Header:
    return common_pb2.Header(protocol_version=PROTOCOL_VERSION, task=task, config_hash=config_hash)


def check_version(h: common_pb2.Header, who: str) -> None:
    if h.protocol_version != PROTOCOL_VERSION:
        raise RequestError(
            f"protocol version {h.protocol_version} is not supported; this {who} speaks {PROTOCOL_VERSION}"
        )


def query_tensor(
    t: common_pb2.Tensor, input_shape: tuple[int, ...], max_count: int
) -> NDArray[np.float32]:
    """The queries of an uploaded tensor, (N, *input_shape) float32, after every check."""
    shape = tuple(t.shape)
    if t.dtype != "float32":
        raise RequestError(f"queries must be float32, got {t.dtype!r}")
    if len(shape) != 1 + len(input_shape) or shape[1:] != input_shape:
        raise RequestError(
            f"queries must have shape (N, {', '.join(map(str, input_shape))}), got {shape}"
        )
    if not 1 <= shape[0] <= max_count:
        raise RequestError(f"at most {max_count} and at least 1 query per request, got {shape[0]}")
    expected = 4 * int(np.prod(shape))
    if len(t.data) != expected:
        raise RequestError(
            f"query data must be {expected} bytes for shape {shape}, got {len(t.data)}"
        )
    x = np.frombuffer(t.data, dtype="<f4").reshape(shape)
    if not np.isfinite(x).all():
        raise RequestError("queries contain NaN or infinity")
    return x


def query_recipe(msg: common_pb2.Recipe, input_shape: tuple[int, ...], max_count: int) -> Recipe:
    """A recipe for the task's input shape and at most ``max_count`` queries."""
    try:
        recipe = recipe_from_proto(msg)
    except RecipeError as err:
        raise RequestError(str(err)) from err
    if recipe.shape != input_shape:
        raise RequestError(
            f"recipe shape {recipe.shape} is not the task's input shape {input_shape}"
        )
    if recipe.count > max_count:
        raise RequestError(f"at most {max_count} queries per request, got {recipe.count}")
    return recipe
