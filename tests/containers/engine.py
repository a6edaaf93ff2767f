"""The shipped deployments run for real: images from ``make images``, containers under
podman (the engine these machines have), each service in its own container.

Containers, networks and volumes carry the compose project's label (the temporary
directory's name), so :func:`remove_project` finds and removes every one of them,
whatever a test left running. Waits are on observable state (a healthcheck passing, a
job's status) with generous bounds, never on a sleep.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
HOSPITALS = ("hospital-a", "hospital-b", "hospital-c")
SERVICES = ("guardian", *HOSPITALS, "student", "gateway")
#: Teachers per hospital in these tests (CAPC_TEACHERS_*): five small DIET heads each
#: fit in seconds; the task's sigma does not depend on the count.
TEACHERS = 5


def require_podman() -> None:
    """Skip where the container tests cannot run, except under CI, where they must."""
    missing = [tool for tool in ("podman", "podman-compose") if shutil.which(tool) is None]
    reason = ""
    if os.geteuid() != 0:
        reason = "the container tests run rootful podman: run them as root"
    elif missing:
        reason = f"{', '.join(missing)} not installed (apt-get install podman runc podman-compose)"
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the container tests: {reason}")
        pytest.skip(reason)


def run(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """A command that must succeed; its output is in the failure message."""
    done = subprocess.run(
        list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        )
    return done


def wait_until(what: str, check: Callable[[], bool], timeout: float = 300.0) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1.0)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def healthy(container: str) -> bool:
    """The container's own healthcheck (the compose file's), run now.

    Podman runs healthchecks on systemd timers; with no systemd (a CI container) they
    never fire by themselves, so the test runs the same check itself.
    """
    done = subprocess.run(
        ["podman", "healthcheck", "run", container], capture_output=True, timeout=60, check=False
    )
    return done.returncode == 0


def remove_project(project: str) -> None:
    """Every container, pod, network and volume of compose project ``project``."""
    label = f"label=io.podman.compose.project={project}"
    for kind in ("container", "volume"):
        listed = subprocess.run(
            [
                "podman",
                kind,
                "ls",
                "-a" if kind == "container" else "-q",
                "--filter",
                label,
                *(["-q"] if kind == "container" else []),
            ],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        if listed:
            flags = ["-f", "-t", "0"] if kind == "container" else ["-f"]
            subprocess.run(
                ["podman", kind, "rm", *flags, *listed], capture_output=True, check=False
            )
    for network in subprocess.run(
        ["podman", "network", "ls", "-q", "--filter", f"name=^{project}_"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split():
        subprocess.run(["podman", "network", "rm", "-f", network], capture_output=True, check=False)


def leftovers(project: str) -> list[str]:
    """What of ``project`` is still there (containers, volumes, networks), by name."""
    label = f"label=io.podman.compose.project={project}"
    found = []
    for args in (
        ["container", "ls", "-a", "--filter", label, "--format", "{{.Names}}"],
        ["volume", "ls", "--filter", label, "--format", "{{.Name}}"],
        ["network", "ls", "--filter", f"name=^{project}_", "--format", "{{.Name}}"],
    ):
        found += subprocess.run(
            ["podman", *args], capture_output=True, text=True, check=False
        ).stdout.split()
    return found


def last_json(text: str) -> Any:
    """The last line of ``text`` that is a JSON object (podman-compose prints its own lines)."""
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no JSON object in: {text[-2000:]}")


def project_name(directory: Path) -> str:
    """The compose project podman-compose names after ``directory``."""
    return re.sub(r"[^-_a-z0-9]", "", directory.name.lower())
