"""Adding seeds to a saved networked experiment: one configuration, one body, no seed twice."""

from __future__ import annotations

import json
from typing import Any

import pytest

from experiments.diet_services import merged, summarise


def _run(seeds: list[int], body: str = "b", teachers: int = 50) -> dict[str, Any]:
    rows = [
        {
            "seed": seed,
            "epsilon": eps,
            "hospitals": 5,
            "teachers": 250,
            "answered": 512 * (1 + i),
            "epsilon_spent": {"h": eps - 0.1},
            "student_accuracy": 0.7 + 0.01 * seed,
        }
        for seed in seeds
        for i, eps in enumerate((5.0, 10.0))
    ]
    return {
        "config": {"seeds": tuple(seeds), "teachers": teachers, "budgets": (5.0, 10.0)},
        "body_sha256": body,
        "rows": rows,
        "summary": summarise(rows),
        "seconds": 10.0,
    }


def test_added_seeds_extend_the_rows_and_the_summary() -> None:
    saved = json.loads(json.dumps(_run([1, 2])))  # as read back: lists, not tuples
    both = merged(saved, _run([3]))
    assert both["config"]["seeds"] == [1, 2, 3]
    assert [r["seed"] for r in both["rows"]] == [1, 1, 2, 2, 3, 3]
    assert both["summary"] == summarise(both["rows"])
    assert both["summary"][0]["seeds"] == 3 and both["seconds"] == 20.0


@pytest.mark.parametrize(
    "other",
    [_run([2]), _run([3], body="another"), _run([3], teachers=10)],
    ids=["a seed twice", "another body", "another configuration"],
)
def test_runs_that_do_not_belong_together_are_refused(other: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        merged(_run([1, 2]), other)
