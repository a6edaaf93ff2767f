"""docker-compose.yml started for real under podman-compose: the guardian, three
hospitals, the student party and the gateway each in their own container on the
project's private network, started by docs/usage.md's block as written; then faults.

One consortium serves the whole module (starting it is most of the cost): the labelling
test first, then the faults, each leaving the consortium as it found it, and the audit
across every ledger last. Nothing is left behind: the fixture removes every container,
volume and network of the project, and the last test checks that it did.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from tests.containers.engine import (
    BIN,
    HOSPITALS,
    ROOT,
    SERVICES,
    TEACHERS,
    TOKEN,
    Gateway,
    docs_blocks,
    free_port,
    healthy,
    last_json,
    leftovers,
    own_ledger,
    place_teachers,
    project_name,
    remove_project,
    run,
    unchanged,
    wait_until,
)

# The first test's time holds the module's set-up: the image built when it is missing
# (minutes on a fresh machine), the teachers, the consortium's start.
pytestmark = [pytest.mark.containers, pytest.mark.slow, pytest.mark.timeout(1800)]

HOST_CONF = """[engine]
runtime = "runc"

[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
"""


def docs_block() -> list[str]:
    """The shell lines of docs/usage.md's "Running it with no registry" block."""
    return [line for line in docs_blocks("Running it with no registry")[0].splitlines() if line]


def docs_host_conf() -> str:
    """The host settings docs/usage.md gives (its toml block), as a containers.conf."""
    return docs_blocks("Running it with no registry", "toml")[0]


@dataclass
class Consortium:
    """A running compose project: its directory, environment and gateway."""

    directory: Path
    project: str
    env: dict[str, str]
    gateway: Gateway
    started_s: float

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def compose(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return run("podman-compose", *args, cwd=self.directory, env=self.env, timeout=timeout)

    def own_ledger(self, hospital: str) -> tuple[float, int]:
        """(epsilon spent, rounds) in ``hospital``'s own ledger, read in its container."""
        return own_ledger(self.container(hospital), hospital)

    def wait_healthy(self, *services: str, timeout: float = 600) -> None:
        for service in services or SERVICES:
            container = self.container(service)
            wait_until(f"{service} healthy", partial(healthy, container), timeout)


@pytest.fixture(scope="module")
def consortium(
    teacher_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Consortium]:
    directory = tmp_path_factory.mktemp("capcct")
    project = project_name(directory)
    # The shipped files, unchanged, in a directory of their own (pki/ and models/ beside).
    shutil.copy(ROOT / "docker-compose.yml", directory)
    shutil.copytree(ROOT / "deploy", directory / "deploy")
    # The consortium's own choice, made here: a quorum of 2 of the 3 hospitals, so that
    # one hospital cut off does not stop the others (deploy/task.json asks for all 3).
    task = directory / "deploy" / "task.json"
    task.write_text(json.dumps({**json.loads(task.read_text()), "quorum": 2}, indent=2))
    (directory / "containers.conf").write_text(docs_host_conf())
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "PYTHONPATH": f"{ROOT}:{ROOT / 'clients'}",
        # The host settings docs/usage.md gives, unless this host has its own.
        "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(directory / "containers.conf")),
        "CAPC_GATEWAY_PORT": str(port),
        **{f"CAPC_TEACHERS_{h[-1].upper()}": str(TEACHERS) for h in HOSPITALS},
        # What the docs block exports for podman-compose 1.0.3, for the later commands.
        **dict.fromkeys(
            ("POSTGRES_PASSWORD", "LEDGER_DB_PASSWORD", "GATEWAY_DB_PASSWORD"), "unused"
        ),
    }
    patch = pytest.MonkeyPatch()
    # Every podman command of the module (kill, start, exec) on the same host settings.
    patch.setenv("CONTAINERS_CONF", env["CONTAINERS_CONF"])
    try:
        place_teachers(teacher_file, directory)
        start = time.monotonic()
        script = "\n".join(
            ["set -euo pipefail"]
            + [line for line in docs_block() if not line.startswith("make images")]
        )
        done = run("bash", "-c", script, cwd=directory, env=env, timeout=900)
        admin = TOKEN.findall(done.stdout)
        assert admin, done.stdout + done.stderr
        gateway = Gateway(port, directory / "pki" / "ca" / "ca.pem", admin[-1])
        consortium = Consortium(directory, project, env, gateway, 0.0)
        consortium.wait_healthy()
        made = consortium.compose(
            "exec",
            "gateway",
            "capc",
            "gateway",
            "token",
            "create",
            "--role",
            "analyst",
            "--db",
            "/var/lib/capc/gateway.db",
            "--json",
        )
        gateway.analyst = last_json(made.stdout)["token"]
        consortium.started_s = time.monotonic() - start
        yield consortium
    finally:
        subprocess.run(
            ["podman-compose", "down", "-v", "-t", "5"],
            cwd=directory,
            env=env,
            capture_output=True,
            timeout=300,
            check=False,
        )
        remove_project(project)
        patch.undo()
        assert not leftovers(project), "left behind"


def test_each_service_runs_in_its_own_container_and_hospitals_publish_no_port(
    consortium: Consortium,
) -> None:
    network = f"{consortium.project}_consortium"
    for service in SERVICES:
        name = consortium.container(service)
        inspected = json.loads(run("podman", "inspect", name).stdout)[0]
        assert inspected["State"]["Running"], service
        assert inspected["Config"]["User"] == "capc", service
        assert inspected["HostConfig"]["ReadonlyRootfs"] is True, service
        assert list(inspected["NetworkSettings"]["Networks"]) == [network], service
        ports = run("podman", "port", name).stdout.strip()
        if service == "gateway":
            assert ports == f"8080/tcp -> 127.0.0.1:{consortium.gateway.port}"
        else:
            assert ports == "", f"{service} publishes {ports}"


def test_capcctl_labels_1000_queries_and_an_admin_reads_every_budget(
    consortium: Consortium,
) -> None:
    start = time.monotonic()
    consortium.gateway.label(1000)
    print(
        f"\nconsortium healthy after {consortium.started_s:.0f} s; "
        f"1,000 queries labelled in {time.monotonic() - start:.0f} s"
    )
    budgets = consortium.gateway.budgets()
    assert set(HOSPITALS) <= set(budgets)
    for hospital in HOSPITALS:
        b = budgets[hospital]
        assert 0 < b["epsilon_spent"] <= b["epsilon_cap"] == 10.0, b
        # The hospital's own ledger agrees with the guardian's.
        own, _ = consortium.own_ledger(hospital)
        assert own == pytest.approx(b["epsilon_spent"], rel=1e-9), (hospital, own, b)


def test_a_killed_hospital_restarts_with_its_ledger_and_is_never_charged_twice(
    consortium: Consortium,
) -> None:
    hospital = "hospital-a"
    before, rounds = consortium.own_ledger(hospital)
    assert before > 0 and rounds > 0  # the labelling test's spend
    run("podman", "kill", consortium.container(hospital))
    run("podman", "start", consortium.container(hospital))
    consortium.wait_healthy(hospital)
    # The volume kept the ledger: nothing forgotten, nothing charged by the restart itself.
    assert unchanged(consortium.own_ledger(hospital), (before, rounds))
    consortium.gateway.label(16)
    after, rounds_after = consortium.own_ledger(hospital)
    guardian = consortium.gateway.budgets()[hospital]["epsilon_spent"]
    assert after > before and rounds_after > rounds
    # Exactly what the guardian charged it, no round twice.
    assert after == pytest.approx(guardian, rel=1e-9), (after, guardian)


def _guardian_rounds(consortium: Consortium) -> dict[str, int]:
    """Rounds in the guardian's ledger by state, read in its container."""
    code = (
        "import json; from services.common.ledger import Ledger; "
        "from services.common.ledger.models import RoundState; "
        "l = Ledger('/var/lib/capc/ledger.db'); "
        "print(json.dumps({s.name: l.count_rounds(s) for s in RoundState}))"
    )
    out = run("podman", "exec", consortium.container("guardian"), "python", "-c", code).stdout
    return dict(json.loads(out.splitlines()[-1]))


def test_the_guardian_restarted_mid_job_resumes_from_its_ledger(
    consortium: Consortium,
) -> None:
    before = consortium.gateway.budgets()
    # One query a round, so the job spans many rounds and the restart lands inside it.
    submitted = consortium.gateway.capcctl(
        "jobs", "submit", "--count", "48", "--batch-size", "1", "--json"
    ).stdout
    job = last_json(submitted)["id"]

    def show() -> dict[str, object]:
        return dict(last_json(consortium.gateway.capcctl("jobs", "show", job, "--json").stdout))

    wait_until("the job under way", lambda: int(str(show()["processed"])) >= 1)
    run("podman", "restart", "-t", "0", consortium.container("guardian"))
    consortium.wait_healthy("guardian")
    # The restarted container may have a new address: its callers find it when gRPC
    # resolves the name again (at most every 30 s), so wait for the gateway to reach it.
    wait_until("the gateway reaches the restarted guardian", consortium.gateway.answers, 300)
    wait_until("the job finished", lambda: show()["state"] in {"done", "failed"}, 600)
    after = consortium.gateway.budgets()
    for hospital in HOSPITALS:
        # Nothing forgotten: the restarted guardian's totals start from its ledger.
        assert after[hospital]["epsilon_spent"] >= before[hospital]["epsilon_spent"]
    # Recovery settled every round in flight: none left reserved or released.
    rounds = _guardian_rounds(consortium)
    assert rounds.get("RESERVED", 0) == 0 and rounds.get("RELEASED", 0) == 0, rounds
    # And it serves again: a new job labels in full. (Every hospital's cap fits 1,152
    # queries at the task's sigma; the module's jobs add up to at most 1,096.)
    consortium.gateway.label(8)


def _connections(consortium: Consortium, hospital: str) -> int:
    """How often ``hospital`` has connected to the guardian, by its own log."""
    logs = run("podman", "logs", consortium.container(hospital))
    return (logs.stdout + logs.stderr).count(f"{hospital} connected to the guardian")


def test_a_hospital_cut_off_leaves_the_others_going_at_quorum_then_rejoins(
    consortium: Consortium,
) -> None:
    cut, network = "hospital-c", f"{consortium.project}_consortium"
    others = [h for h in HOSPITALS if h != cut]
    before = consortium.gateway.budgets()
    connected = _connections(consortium, cut)
    run("podman", "network", "disconnect", network, consortium.container(cut))
    try:
        consortium.gateway.label(16)
        during = consortium.gateway.budgets()
        # The two others answered at quorum, and were charged; the cut-off one was not.
        for h in others:
            assert during[h]["epsilon_spent"] > before[h]["epsilon_spent"], h
        # (its total read again may differ in the last bit; one round costs ~0.1 eps)
        assert during[cut]["epsilon_spent"] == pytest.approx(before[cut]["epsilon_spent"], rel=1e-9)
    finally:
        run("podman", "network", "connect", "--alias", cut, network, consortium.container(cut))
    # It notices its stream broke, dials again and is back: it votes, and is charged.
    wait_until(f"{cut} connected again", lambda: _connections(consortium, cut) > connected, 300)
    consortium.gateway.label(8)
    assert consortium.gateway.budgets()[cut]["epsilon_spent"] > during[cut]["epsilon_spent"]


def test_audit_verify_across_every_ledger_finds_nothing_lost_or_altered(
    consortium: Consortium,
) -> None:
    # Each hospital's own ledger settles what the guardian charged it (after the faults,
    # a hospital may still be asking for the last heads): wait for agreement first.
    def agree() -> bool:
        guardian = consortium.gateway.budgets()
        return all(
            consortium.own_ledger(h)[0] == pytest.approx(guardian[h]["epsilon_spent"], rel=1e-9)
            for h in HOSPITALS
        )

    wait_until("every hospital's own ledger agrees with the guardian's", agree, 300)
    # The ledgers read where they live, in the volumes, with the host's capc.
    consortium.compose("stop", "-t", "10")

    def volume(name: str) -> str:
        mount = run(
            "podman",
            "volume",
            "inspect",
            "--format",
            "{{.Mountpoint}}",
            f"{consortium.project}_{name}-data",
        ).stdout.strip()
        return f"{mount}/ledger.db"

    parties = [f"--party-ledger={h}={volume(h)}" for h in HOSPITALS]
    done = run(
        str(BIN / "capc"),
        "audit",
        "verify",
        "--ledger",
        volume("guardian"),
        *parties,
        "--json",
        env=consortium.env,
    )
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["problems"] == [], report
    assert report["entries"] > 0 and report["heads_checked"] > 0
