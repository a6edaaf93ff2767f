"""The wire dtypes and the one length check every decoder runs before reading bytes."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from services.common.protocol import RequestError

TensorDtype = Literal["float32", "int64"]
WIRE_DTYPES: dict[str, np.dtype[np.generic]] = {
    "float32": np.dtype("<f4"),
    "int64": np.dtype("<i8"),
}
SHARE_DTYPE = np.dtype("<u8")


def check_length(
    data: bytes, dtype: np.dtype[np.generic], shape: tuple[int, ...], what: str
) -> None:
    # math.prod on Python ints: a forged shape cannot overflow into a small byte count.
    expected = dtype.itemsize * math.prod(shape)
    if len(data) != expected:
        raise RequestError(
            f"{what} must be {expected} bytes ({shape} of {dtype.itemsize}-byte "
            f"little-endian {dtype.name}), got {len(data)}; shape and data disagree"
        )
