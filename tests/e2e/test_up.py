"""``capc up`` as a user runs it: start it, copy the printed ``export`` line and run the
printed ``capcctl`` command; labels come back and no hospital passes its cap. Then a
second ``capc up`` on the same directory reuses it and, with ``--json``, prints one JSON
object. Small sizes: 3 hospitals with 5 DIET teachers each, 64 planned queries."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALL = ("--parties", "3", "--teachers-per-hospital", "5", "--queries", "64")


class Up:
    """A running ``capc up``: its stdout lines as they come, stderr kept for failures."""

    def __init__(self, directory: Path | None, *args: str, cwd: Path = ROOT) -> None:
        where = () if directory is None else ("--dir", str(directory))
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "services.commands.cli", "up", *where, *args],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        assert self.popen.stdout is not None and self.popen.stderr is not None
        for stream, sink in ((self.popen.stdout, self.out), (self.popen.stderr, self.err)):
            threading.Thread(target=lambda s=stream, k=sink: k.extend(s), daemon=True).start()

    def wait_for_line(self, start: str, timeout: float = 1500.0, nth: int = 0) -> str:
        """The ``nth`` (0: first) stdout line that begins with ``start``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for line in list(self.out) if line.startswith(start)]
            if len(found) > nth:
                return found[nth].strip()
            if self.popen.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"capc up printed no {start!r} line: {self.log()}")

    def log(self) -> str:
        return "".join(self.out)[-3000:] + "".join(self.err)[-3000:]

    def stop(self) -> None:
        """Ctrl-C, as a user stops it; every child process ends with it."""
        self.popen.send_signal(signal.SIGINT)
        try:
            self.popen.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)
        assert self.popen.returncode == 0, self.log()


def exported(line: str) -> dict[str, str]:
    """The variables an ``export A=1 B=2`` line sets, as the shell reads it."""
    words = shlex.split(line)
    assert words[0] == "export"
    return dict(w.split("=", 1) for w in words[1:])


def capcctl(
    command: str, env: dict[str, str], cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """Run a printed ``capcctl ...`` line with the client from clients/, in ``cwd``."""
    words = shlex.split(command)
    assert words[0] == "capcctl"
    full = {**os.environ, **env, "PYTHONPATH": str(ROOT / "clients")}
    return subprocess.run(
        [sys.executable, "-m", "capc_client.cli", *words[1:]],
        env=full,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("up")


@pytest.mark.slow
@pytest.mark.timeout(1800)  # fitting the teachers and starting six processes, on a busy CI
def test_the_printed_lines_label_queries_within_every_cap(directory: Path) -> None:
    up = Up(directory, *SMALL)
    try:
        command = up.wait_for_line("capcctl ")
        task = up.wait_for_line("task images (1x28x28 images):")
        env = exported(up.wait_for_line("export "))
        admin = up.wait_for_line("# admin token").rsplit("CAPC_TOKEN=", 1)[1]
        assert set(env) == {"CAPC_URL", "CAPC_TOKEN", "CAPC_CA"}
        assert "queries fit each hospital's cap of eps 10" in task
        assert command == "capcctl jobs submit --count 64 --wait"
        done = capcctl(command, env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert " done " in done.stdout and "64/64 processed, 64 answered" in done.stdout
        budget = capcctl("capcctl budget --json", {**env, "CAPC_TOKEN": admin})
        assert budget.returncode == 0, budget.stderr
        spent = {b["party"]: b for b in json.loads(budget.stdout)["budgets"]}
        hospitals = [f"hospital-{i}" for i in range(3)]
        for h in hospitals:
            assert 0 < spent[h]["epsilon_spent"] <= spent[h]["epsilon_cap"] == 10.0
    finally:
        up.stop()


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_second_run_reuses_the_directory_and_prints_one_json_object(directory: Path) -> None:
    up = Up(directory, *SMALL, "--json")
    try:
        line = up.wait_for_line("{")
        summary = json.loads(line)
        assert summary["reused"] is True and summary["task"] == "images"
        assert "reusing" in "".join(up.err)
        # The first test's 64 queries were charged (sigma was planned for 64): nothing
        # is left, and no command is offered.
        left = summary["queries_left"]
        assert set(left) == {"hospital-0", "hospital-1", "hospital-2"}
        assert max(left.values()) < summary["queries_fit"]
        if min(left.values()) == 0:
            assert summary["command"] is None
        assert summary["export"].startswith("export CAPC_URL=https://")
    finally:
        up.stop()
    assert len([x for x in up.out if x.strip()]) == 1, up.out
