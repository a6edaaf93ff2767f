"""Where experiment results go: one JSON object, saved and printed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def save(result: dict[str, Any], path: Path) -> None:
    """Write ``result`` to ``path`` (creating its folder) and print it."""
    text = json.dumps(result, indent=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    print(text)
