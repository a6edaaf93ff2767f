"""One thread for torch's operations in every test process and in the services they
start (the harness passes ``OMP_NUM_THREADS`` on to its children).

``make test`` runs three pytest workers on two cores, and each starts service
processes: torch's default of one thread per core oversubscribes the cores, and
its threads then spin against each other. One epoch of a small CNN on 2,700
images took 1.6 s of CPU with one thread and 13 s with two on the loaded 2-core
machine; a consortium fixture that trains three hospitals' teachers took 372 s
before and 22 s after.

The workers are dealt whole files, longest first (tests/file_seconds.py).
"""

from __future__ import annotations

import os

import pytest

from tests.file_seconds import longest_first, measured

# Before any test module imports torch: OpenMP reads it when it starts its threads.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config: pytest.Config) -> None:
    import torch

    config.addinivalue_line(
        "markers",
        "containers: the shipped images, compose file and manifests run under podman "
        "(root; skipped without podman except under CI=true, where they must run)",
    )

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first (:func:`tests.file_seconds.longest_first`)."""
    items[:] = longest_first(items, measured())
