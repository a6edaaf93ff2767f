"""Task configurations the project ships (JSON data, not code): ``capc up``'s DIET task
(``images``), the demo's, the testbed's and the e2e tests' one-teacher task. Kept as data so that no service module names a mechanism."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any


def load(name: str) -> dict[str, Any]:
    """The shipped task configuration ``name`` (``images``, ``demo``, ``light`` or
    ``one-teacher``), a fresh dict."""
    text = resources.files(__package__).joinpath(f"{name}.json").read_text(encoding="utf-8")
    config: dict[str, Any] = json.loads(text)
    return config
