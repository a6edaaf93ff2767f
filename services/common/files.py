"""Writing output files whole or not at all."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_atomically(path: Path, write: Callable[[Path], Any]) -> None:
    """Call ``write`` on a temporary file in ``path``'s folder, then rename it to ``path``.

    A reader (or a user after a failure) sees the old file or the whole new
    one, never half of it; on any error the temporary file is removed and
    ``path`` is left as it was. The same folder keeps the rename atomic.
    """
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
