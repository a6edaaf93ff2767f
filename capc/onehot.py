"""The one numpy one-hot encoding every part of capc shares (votes, label-DP targets).

The garbled-circuit decoder that builds a one-hot word out of gates is a different thing:
:func:`capc.mpc.library.one_hot_word`.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray


def one_hot(
    indices: ArrayLike,
    width: int,
    *,
    what: str = "labels",
    error: type[ValueError] = ValueError,
) -> NDArray[np.float64]:
    """Class indices (N,) in [0, width) -> one-hot rows (N, width), float64 0/1.

    ``what`` names the indices in the error message; ``error`` is the ValueError subclass
    raised for anything that is not a 1-D integer array inside [0, width), so a caller
    keeps its own error type (e.g. MechanismError for a teacher's predictions).
    """
    p = np.asarray(indices)
    if p.ndim != 1 or not np.issubdtype(p.dtype, np.integer):
        raise error(f"{what} must be a 1-D integer array, got {p.dtype} {p.shape}")
    if ((p < 0) | (p >= width)).any():
        raise error(f"{what} must lie in [0, {width})")
    out = np.zeros((p.size, width), dtype=np.float64)
    out[np.arange(p.size), p] = 1.0
    return out
