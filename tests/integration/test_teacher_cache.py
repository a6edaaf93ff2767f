"""Local consortia share the teachers they train (``CAPC_TEACHER_CACHE``): a consortium
whose hospitals hold the same records with the same settings copies the teachers an
earlier one trained; any other setting trains its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from services import tasks
from services.local import TEACHER_CACHE_ENV, LocalConsortium
from tests import conftest


def consortium(directory: Path, epochs: int, log: list[str]) -> LocalConsortium:
    # Two teachers at hospital-0 (a checkpoint each), one at hospital-1.
    c = LocalConsortium(
        directory,
        parties=2,
        dataset="breast-cancer",
        task=tasks.load("breast-cancer"),
        teachers=[2, 1],
        epochs=epochs,
        held_out=142,
        log=log.append,
    )
    c.prepare()
    return c


def test_a_consortium_copies_the_teachers_an_earlier_one_trained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv(TEACHER_CACHE_ENV, str(cache))
    first_log: list[str] = []
    first = consortium(tmp_path / "first", 2, first_log)
    assert sum("training" in line for line in first_log) == 3
    assert len(list(cache.glob("*.pt"))) == 3

    second_log: list[str] = []
    second = consortium(tmp_path / "second", 2, second_log)
    assert not any("training" in line for line in second_log), second_log
    for i in range(2):
        for mine, theirs in zip(first.model_paths(i), second.model_paths(i), strict=True):
            assert mine != theirs and mine.read_bytes() == theirs.read_bytes()

    # Another number of epochs is another teacher: trained, not copied.
    third_log: list[str] = []
    consortium(tmp_path / "third", 3, third_log)
    assert sum("training" in line for line in third_log) == 3
    assert len(list(cache.glob("*.pt"))) == 6


def test_the_tests_set_the_cache_that_services_local_reads() -> None:
    assert conftest.TEACHER_CACHE_ENV == TEACHER_CACHE_ENV
