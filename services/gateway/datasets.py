"""Uploaded unlabelled datasets: an .npy array or an .npz holding ``x`` (N, C, H, W).

Parsed without pickle (a file cannot run code); anything else gets a
:class:`DatasetError` that says what the file should look like.
"""

from __future__ import annotations

import io
import zipfile

import numpy as np
from numpy.typing import NDArray

EXPECTED = "an .npy array or an .npz with array 'x', shaped (N, channels, height, width)"


class DatasetError(ValueError):
    """An upload is not a usable dataset; the message says why and what to send."""


def parse_dataset(data: bytes) -> NDArray[np.float32]:
    """The queries of an upload as float32 (N, C, H, W); raises DatasetError."""
    if not data:
        raise DatasetError(f"the upload is empty; send {EXPECTED}")
    try:
        loaded = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise DatasetError(f"could not read the upload ({err}); send {EXPECTED}") from None
    if isinstance(loaded, np.lib.npyio.NpzFile):
        with loaded:
            names = list(loaded.files)
            key = "x" if "x" in names else names[0] if len(names) == 1 else None
            if key is None:
                raise DatasetError(
                    f"the .npz holds {names}; name the queries array 'x' ({EXPECTED})"
                )
            try:
                arr = np.asarray(loaded[key])
            except (ValueError, OSError, zipfile.BadZipFile) as err:
                raise DatasetError(f"could not read array {key!r}: {err}") from None
    else:
        arr = np.asarray(loaded)
    if arr.dtype.kind not in "fiu":
        raise DatasetError(f"queries must be numbers, got dtype {arr.dtype}")
    if arr.ndim != 4 or arr.shape[0] == 0:
        raise DatasetError(f"got an array of shape {arr.shape}; send {EXPECTED}")
    x = arr.astype(np.float32)
    if not np.isfinite(x).all():
        bad = int((~np.isfinite(x)).reshape(len(x), -1).any(axis=1).sum())
        raise DatasetError(f"{bad} queries contain NaN or infinity; clean them and upload again")
    return x
