"""``capc up --loop`` as a hospital uses it: one command starts the consortium and the
hospital's own CaPC loop, and the printed ``capcctl loop run`` line improves its model.

``capc up`` runs as a subprocess (3 hospitals of 10 DIET teachers each); the test reads
the printed ``# hospital-0's CaPC loop`` block, sets the printed export line's
environment, and runs the printed command as a subprocess (its --records replaced by
a file of hospital-0's unlabelled records, --json added). Checked: the report measures
the hospital's model before and after, and hospital-0 paid nothing for its own loop.
Nothing waits on a clock: every step waits for a printed line, with generous timeouts.
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from capc.data.offline import animal_mnist
from services.common.ledger import Ledger
from services.local import ROOT

pytestmark = pytest.mark.slow

OWN, TEST, UNLABELLED = 100, 400, 200
HOSPITAL = "hospital-0"
#: Start-up fits 30 DIET teachers and the querier's first model on CPU: minutes at most.
START_TIMEOUT = 900.0


class Up:
    """A running ``capc up`` whose stdout lines arrive on a queue."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log.open("w")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "up", *argv],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def read_until(self, prefix: str) -> list[str]:
        """Stdout lines up to and including the first that starts with ``prefix``."""
        seen: list[str] = []
        while True:
            try:
                line = self.lines.get(timeout=START_TIMEOUT)
            except queue.Empty:
                pytest.fail(f"capc up printed no {prefix!r} line: {seen}")
            if line is None:
                stderr = Path(self.log.name).read_text()[-3000:]
                pytest.fail(f"capc up exited ({self.popen.poll()}): {seen}\n{stderr}")
            seen.append(line)
            if line.startswith(prefix):
                return seen

    def stop(self) -> None:
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=30)
        self.log.close()


def hospital_files(root: Path) -> tuple[Path, Path, Path, np.ndarray]:
    """Hospital 0's own labelled records, held-out test set and unlabelled records (as
    NPZ), drawn from the records every hospital's teachers are kept off (capc up's
    offline split: seed 7, the first 1000 held out); and the unlabelled ones' labels."""
    x, y = animal_mnist()
    held = np.random.default_rng(7).permutation(len(x))[:1000]
    own, test = held[:OWN], held[OWN : OWN + TEST]
    rest = held[OWN + TEST : OWN + TEST + UNLABELLED]
    files = root / "own.npz", root / "test.npz", root / "unlabelled.npz"
    np.savez(files[0], x=x[own], y=y[own])
    np.savez(files[1], x=x[test], y=y[test])
    np.savez(files[2], x=x[rest])
    return *files, y[rest]


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Up, list[str], Path]]:
    root = tmp_path_factory.mktemp("up-loop")
    own, test, records, _ = hospital_files(root)
    up = Up(
        [
            *["--parties", "3", "--teachers-per-hospital", "10", "--queries", "256"],
            *("--dir", str(root / "consortium"), "--loop", HOSPITAL),
            *("--own-data", str(own), "--own-test", str(test)),
        ],
        root / "up.log",
    )
    try:
        lines = up.read_until("capcctl loop run")
        yield up, lines, records
    finally:
        up.stop()


def environment(export: str) -> dict[str, str]:
    """The variables a printed ``export A=... B=...`` line sets."""
    words = shlex.split(export)
    assert words[0] == "export"
    return dict(word.split("=", 1) for word in words[1:])


def test_up_prints_the_loop_block(running: tuple[Up, list[str], Path]) -> None:
    _, lines, _ = running
    assert lines[-3] == f"# {HOSPITAL}'s CaPC loop: its own gateway"
    env = environment(lines[-2])
    assert set(env) == {"CAPC_URL", "CAPC_TOKEN", "CAPC_CA"}
    assert env["CAPC_URL"].startswith("https://127.0.0.1:") and Path(env["CAPC_CA"]).is_file()
    assert lines[-1] == (
        "capcctl loop run --records UNLABELLED.npz --reveal-records-to-answerers --wait"
    )
    consortium = environment(next(line for line in lines if line.startswith("export ")))
    assert consortium["CAPC_URL"] != env["CAPC_URL"]  # a second gateway


def test_the_printed_loop_command_improves_hospital_0_at_no_cost_to_it(
    running: tuple[Up, list[str], Path],
) -> None:
    _, lines, records = running
    argv = shlex.split(lines[-1])
    assert argv[:3] == ["capcctl", "loop", "run"]
    argv[argv.index("--records") + 1] = str(records)
    env = {
        **os.environ,
        **environment(lines[-2]),
        "PYTHONPATH": str(ROOT / "clients"),  # this tree's client, not an installed one
    }
    done = subprocess.run(
        [sys.executable, "-m", "capc_client.cli", *argv[1:], "--json", "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    print(
        f"capc up --loop: {HOSPITAL}'s model {report['accuracy_before']:.3f} -> "
        f"{report['accuracy_after']:.3f}, eps by party {report['epsilon_by_party']}"
    )
    assert report["hospital"] == HOSPITAL == report["bound_hospital"]
    assert 0.0 <= report["accuracy_before"] <= 1.0 and 0.0 <= report["accuracy_after"] <= 1.0
    assert report["before"]["examples"] == OWN
    assert report["after"]["examples"] == OWN + UNLABELLED
    assert report["labels_bought"] == UNLABELLED
    # The others answered and paid; hospital-0 never voted on its own records.
    assert set(report["epsilon_by_party"]) == {"hospital-1", "hospital-2"}
    assert report["epsilon_spent"] > 0
    ledger = Ledger(str(records.parent / "consortium" / "ledger.db"))
    try:
        assert not np.any(ledger.spent_loss(HOSPITAL))
        assert np.any(ledger.spent_loss("hospital-1"))
    finally:
        ledger.close()
