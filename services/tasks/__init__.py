"""Task configurations the project ships (JSON data, not code): ``capc up``'s DIET task
(``images``), the demo's, the testbed's and the e2e tests' one-teacher task. Kept as data so that no service module names a mechanism."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any


def names() -> list[str]:
    """The shipped task configurations' names, sorted."""
    files = resources.files(__package__).iterdir()
    return sorted(f.name.removesuffix(".json") for f in files if f.name.endswith(".json"))


def load(name: str) -> dict[str, Any]:
    """The shipped task configuration ``name`` (``images``, ``demo``, ``light``,
    ``one-teacher`` or ``breast-cancer``), a fresh dict.

    Raises ValueError naming the shipped tasks when there is no such task."""
    if name not in names():
        raise ValueError(f"no task named {name!r}; known tasks: {', '.join(names())}")
    text = resources.files(__package__).joinpath(f"{name}.json").read_text(encoding="utf-8")
    config: dict[str, Any] = json.loads(text)
    return config
