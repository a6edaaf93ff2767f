"""The shipped deployments run for real: images from ``make images``, containers under
podman (the engine these machines have), each service in its own container.

Containers, networks and volumes carry the compose project's label (the temporary
directory's name), so :func:`remove_project` finds and removes every one of them,
whatever a test left running. Waits are on observable state (a healthcheck passing, a
job's status) with generous bounds, never on a sleep.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
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


def free_port() -> int:
    """A TCP port free on the host's loopback now (for the gateway's published port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def fit_teacher(directory: Path) -> Path:
    """One hospital's teachers, ``directory``/teacher.pt: TEACHERS DIET heads fitted on
    200 animal-mnist images.

    One fit serves every hospital of every deployment test: what these tests check is
    the deployment (containers, network, volumes, ledgers), not what the votes learn,
    and each fit costs tens of seconds of the suite's two cores.
    """
    from capc.data.offline import animal_mnist

    x, y = animal_mnist()
    data = directory / "records.npz"
    np.savez(data, x=x[:200], y=y[:200])
    fitted = directory / "teacher.pt"
    run(
        str(BIN / "capc"),
        "teacher",
        "fit",
        "--task",
        str(ROOT / "deploy" / "task.json"),
        "--data",
        str(data),
        "--teachers",
        str(TEACHERS),
        "--out",
        str(fitted),
        "--json",
        cwd=directory,
    )
    return fitted


def place_teachers(fitted: Path, directory: Path) -> None:
    """``fitted`` as every hospital's ``directory``/models/hospital-X/teacher.pt."""
    for hospital in HOSPITALS:
        out = directory / "models" / hospital
        out.mkdir(parents=True)
        shutil.copy(fitted, out / "teacher.pt")
        # Read by the image's user (uid 10001), as the certificates are.
        (out / "teacher.pt").chmod(0o444)


@dataclass
class Gateway:
    """The gateway as an analyst and an admin reach it from the host, with ``capcctl``:
    its published ``port``, the consortium's CA and the two tokens."""

    port: int
    ca: Path
    admin: str
    analyst: str = ""

    def env(self, admin: bool) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": str(ROOT / "clients"),
            "CAPC_URL": f"https://localhost:{self.port}",
            "CAPC_CA": str(self.ca),
            "CAPC_TOKEN": self.admin if admin else self.analyst,
        }

    def capcctl(self, *args: str, admin: bool = False) -> subprocess.CompletedProcess[str]:
        return run(sys.executable, "-m", "capc_client.cli", *args, env=self.env(admin), timeout=900)

    def budgets(self) -> dict[str, dict[str, float]]:
        """Every party's budget as the guardian reports it to an admin."""
        out = self.capcctl("budget", "--json", admin=True).stdout
        return {b["party"]: b for b in json.loads(out)["budgets"]}

    def answers(self) -> bool:
        """Whether the gateway reaches the guardian (an admin's budget read succeeds)."""
        done = subprocess.run(
            [sys.executable, "-m", "capc_client.cli", "budget", "--json"],
            env=self.env(admin=True),
            capture_output=True,
            timeout=120,
            check=False,
        )
        return done.returncode == 0

    def label(self, count: int) -> str:
        """A job of ``count`` queries, waited for: every one must be answered."""
        done = self.capcctl("jobs", "submit", "--count", str(count), "--wait").stdout
        assert f"{count}/{count} processed, {count} answered" in done, done
        return done


def own_ledger(container: str, hospital: str) -> tuple[float, int]:
    """(epsilon spent, rounds) in ``hospital``'s own ledger, read in its ``container``."""
    code = (
        "from services.common.ledger import Ledger; "
        f"b = Ledger('/var/lib/capc/ledger.db').budget('{hospital}'); "
        "print(b.spent, b.rounds)"
    )
    out = run("podman", "exec", container, "python", "-c", code).stdout
    spent, rounds = out.split()[-2:]
    return float(spent), int(rounds)


def unchanged(now: tuple[float, int], before: tuple[float, int]) -> bool:
    """Whether an own ledger's (epsilon spent, rounds) is ``before`` again: the rounds
    exactly, the spend to float rounding. A round whose settlement arrives after a restart
    swaps its reservation for an equal charge (total - r + c with c = r), which moves the
    running total in its last bits (9.165976827341972 against ...964 seen); a round
    charged twice would add a whole round's epsilon."""
    return now[1] == before[1] and math.isclose(now[0], before[0], rel_tol=1e-12, abs_tol=0.0)


#: Admin tokens as ``capc gateway token create`` prints them.
TOKEN = re.compile(r"capc_[0-9a-f]+_[A-Za-z0-9_-]+")


def docs_section(heading: str) -> str:
    """The text of docs/usage.md under ``heading`` (a ``###`` line), to the next heading."""
    text = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    section = text.split(f"### {heading}\n", 1)[1]
    return re.split(r"^#{2,3} ", section, maxsplit=1, flags=re.M)[0]


def docs_blocks(heading: str, language: str = "sh") -> list[str]:
    """Every ``language`` fenced block of docs/usage.md's section ``heading``, in order."""
    section = docs_section(heading)
    return [part.split("```", 1)[0] for part in section.split(f"```{language}\n")[1:]]
