"""One thread for torch's operations in every test process and in the services they
start (the harness passes ``OMP_NUM_THREADS`` on to its children).

``make test`` runs two pytest workers on two cores, and each starts service
processes: torch's default of one thread per core oversubscribes the cores, and
its threads then spin against each other. One epoch of a small CNN on 2,700
images took 1.6 s of CPU with one thread and 13 s with two on the loaded 2-core
machine; a consortium fixture that trains three hospitals' teachers took 372 s
before and 22 s after.

The two workers are dealt whole files, longest first (tests/file_seconds.py).

Local consortia share the teachers they train within one run
(``CAPC_TEACHER_CACHE``, services.local): several files start the same hospitals,
and each hospital's teacher is trained once in the run instead of once a file. The
folder is made before the workers start, so that they inherit it, and removed after.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests.file_seconds import longest_first, measured

# Before any test module imports torch: OpenMP reads it when it starts its threads.
os.environ.setdefault("OMP_NUM_THREADS", "1")


#: The run's teacher cache, when this process made it (the controller, or a run
#: without workers) and so removes it.
_made_cache: list[str] = []
#: services.local.TEACHER_CACHE_ENV, named here without importing services.local.
TEACHER_CACHE_ENV = "CAPC_TEACHER_CACHE"


def pytest_configure(config: pytest.Config) -> None:
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    # A worker inherits the controller's; one that is set already is the operator's.
    if not hasattr(config, "workerinput") and TEACHER_CACHE_ENV not in os.environ:
        _made_cache.append(tempfile.mkdtemp(prefix="capc-teachers-"))
        os.environ[TEACHER_CACHE_ENV] = _made_cache[0]


def pytest_unconfigure() -> None:
    for folder in _made_cache:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first (:func:`tests.file_seconds.longest_first`)."""
    items[:] = longest_first(items, measured())
