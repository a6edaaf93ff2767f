"""``capc demo`` as a newcomer runs it, timed and saved (issue 35, item 5).

Runs ``capc demo --json --no-serve`` in a fresh folder as a subprocess (the
same consortium of separate processes ``make demo`` starts), and saves its
closing JSON object with the wall time, the machine's cores and the digest of
the body it used, so that ``tests/unit/test_saved_demo.py`` can hold the
shipped body to what was measured on it.

Run on a quiet machine:
    python -m experiments.demo_run --out experiments/results/demo.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.report import save
from services.commands.demo import SHIPPED_BODY

#: The demo as ``make demo`` runs it, ending with its JSON object and not serving on.
DEMO_CMD = (sys.executable, "-m", "services.commands.cli", "demo", "--json", "--no-serve")


def run(directory: Path, timeout: float) -> dict[str, Any]:
    """One demo run in ``directory``: its JSON result beside the wall time (seconds)."""
    start = time.perf_counter()
    out = subprocess.run(
        [*DEMO_CMD, "--dir", str(directory)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"capc demo failed ({out.returncode}): {out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "experiment": "demo_run",
        "command": "capc demo --json --no-serve",
        "result": result,
        "seconds": seconds,
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "body_file_sha256": hashlib.sha256(SHIPPED_BODY.read_bytes()).hexdigest(),
        "date": time.strftime("%Y-%m-%d"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds")
    args = ap.parse_args(argv)
    if not SHIPPED_BODY.exists():
        print(f"error: no shipped body at {SHIPPED_BODY}: run `make demo-body`", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        saved = run(Path(tmp), args.timeout)
    save(saved, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
