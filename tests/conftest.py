"""Every test leaves the logging configuration as it found it.

Services configure logging when their ``main`` runs, and some tests run a ``main`` in
this process under pytest's output capture: a handler left behind would write to a
capture stream closed after that test, and a later log line would fail on it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    names = [None, *logging.root.manager.loggerDict]
    saved = {
        name: (lg.handlers[:], lg.level, lg.propagate)
        for name in names
        if isinstance(lg := logging.getLogger(name), logging.Logger)
    }
    yield
    for name, lg in [(n, logging.getLogger(n)) for n in [None, *logging.root.manager.loggerDict]]:
        if not isinstance(lg, logging.Logger):
            continue
        handlers, level, propagate = saved.get(name, ([], logging.NOTSET, True))
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate
