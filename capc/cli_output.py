"""Command-line output: with ``--json``, stdout carries the JSON object and nothing else."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator


def _print(text: str) -> None:
    print(text, flush=True)


@contextlib.contextmanager
def stdout_to_stderr(enabled: bool = True) -> Iterator[Callable[[str], None]]:
    """While ``enabled``, everything written to stdout goes to stderr: this process's
    ``print`` and what the processes it starts write to file descriptor 1. Yields the
    function that still writes a line to the real stdout (where the JSON object goes);
    when not ``enabled`` it is ``print`` and nothing is redirected."""
    if not enabled:
        yield _print
        return
    sys.stdout.flush()
    saved = os.dup(1)

    def emit(text: str) -> None:
        os.write(saved, (text + "\n").encode())

    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield emit
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
