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


class Progress:
    """Progress of a long step on stderr, with a rate and an estimate of the time left:
    "  fitting hospital-0's teachers: 12/50 (0.8/s, about 48 s left)".

    ``total`` items; ``say`` writes one line (default: stderr), ``quiet`` writes none
    (``--json``: stdout must hold only the JSON, and a quiet command says nothing
    else). At most about ``lines`` lines are written, at evenly spaced counts (the
    last always), so a long step neither floods the terminal nor stays silent; which
    counts are written depends on ``total`` alone, never on timing. ``clock``: seconds.
    """

    def __init__(
        self,
        what: str,
        total: int,
        *,
        say: Callable[[str], None] | None = None,
        quiet: bool = False,
        lines: int = 20,
        clock: Callable[[], float] | None = None,
    ) -> None:
        import time

        self.what, self.total, self.quiet = what, max(int(total), 0), quiet
        self.say = say or (lambda text: print(text, file=sys.stderr, flush=True))
        self.every = max(1, -(-self.total // max(lines, 1)))
        self.clock = clock or time.perf_counter
        self.start = self.clock()
        self.done = 0

    def line(self, done: int) -> str:
        """The line for ``done`` of ``total`` items finished so far."""
        seconds = max(self.clock() - self.start, 1e-9)
        rate = done / seconds
        text = f"  {self.what}: {done}/{self.total}"
        if done <= 0:
            return text
        left = (self.total - done) / rate
        unit = f"{rate:.2f}/s" if rate >= 0.1 else f"{seconds / done:.1f} s each"
        return text + f" ({unit}, about {left:.0f} s left)"

    def advance(self, count: int = 1) -> None:
        """``count`` more items are finished."""
        before, self.done = self.done, min(self.done + count, self.total)
        if self.quiet or self.done == before:
            return
        if self.done == self.total or self.done // self.every > before // self.every:
            self.say(self.line(self.done))
