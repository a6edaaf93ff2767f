"""A deviating OT-extension receiver (the student), built from the real receiver code."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pytest
from numpy.typing import NDArray

from capc.mpc import ot

HONEST_PRG = ot._prg_columns


def deviate(
    monkeypatch: pytest.MonkeyPatch,
    receiver: ot.ExtensionReceiver,
    columns: Iterable[int],
    row: int,
) -> None:
    """From now on ``receiver`` encodes choice r_row xor 1 in the given columns of u.

    Column i of the request is u^i = G(k0_i) ^ G(k1_i) ^ r; the receiver
    flips bit ``row`` of its own expansion G(k1_i), which is the same as using
    the choice vector r ^ e_row in column i only. The sender then computes
    q_row = t_row ^ r_row s ^ s_i e_i, so OT ``row`` decrypts to the chosen
    message exactly when s_i = 0: the classic selective-failure attack, which
    learns one bit of the sender's secret s per deviating column. Everything
    else, the consistency check's answer included, is the honest code's.
    """
    k1 = receiver._k1
    flip = np.uint8(1 << (row % 8))
    cols = list(columns)

    def expand(seeds: list[bytes], position: int, nbytes: int) -> NDArray[np.uint8]:
        out = HONEST_PRG(seeds, position, nbytes)
        if seeds is k1:  # only this receiver's own G(k1_i); the sender's calls pass through
            out[cols, row // 8] ^= flip
        return out

    monkeypatch.setattr(ot, "_prg_columns", expand)
