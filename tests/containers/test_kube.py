"""deploy/k8s/ played for real with ``podman kube play``: the guardian, three hospitals,
the student party and the gateway each in a pod of its own on one podman network,
started by docs/usage.md's block as written; then a hospital's pod deleted and played
again, and the docs' teardown, after which nothing of it is left.

The manifests are the shipped ones, copied beside the PKI and the teachers; the one
change is the gateway's ``hostPort``, set to a port free on this host. Every name the
manifests give (pods, claims, Secrets, the ``capc`` network) must be free when the
test starts: it refuses to run over anything of the same name rather than remove it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.containers.engine import (
    BIN,
    HOSPITALS,
    ROOT,
    TOKEN,
    Gateway,
    docs_blocks,
    free_port,
    last_json,
    own_ledger,
    place_teachers,
    run,
    unchanged,
    wait_until,
)
from tests.e2e.own_models import write_onnx

pytestmark = [pytest.mark.containers, pytest.mark.slow, pytest.mark.timeout(1800)]

SECTION = "Kubernetes manifests under podman kube play"
#: The workloads, one manifest each; podman 4.3 names a Deployment's pod NAME-pod-0.
WORKLOADS = ("guardian", "student", "gateway", *HOSPITALS)
NETWORK = "capc"


def pod(workload: str) -> str:
    return f"{workload}-pod-0"


def container(workload: str) -> str:
    """The workload's container: its Deployment's one container, in its pod."""
    return f"{pod(workload)}-{'answerer' if workload in HOSPITALS else workload}"


def manifest(directory: Path, workload: str) -> list[dict[str, Any]]:
    text = (directory / "deploy" / "k8s" / f"{workload}.yaml").read_text()
    return [d for d in yaml.safe_load_all(text) if d]


def named_things(directory: Path) -> dict[str, set[str]]:
    """What the manifests and the docs' Secrets make, by kind: pods, volumes (claims, the
    ConfigMap's, each Secret's and each emptyDir's, which podman 4.3 names after them),
    secrets and the network."""
    volumes: set[str] = set()
    for workload in WORKLOADS:
        for doc in manifest(directory, workload):
            if doc["kind"] == "PersistentVolumeClaim":
                volumes.add(doc["metadata"]["name"])
            if doc["kind"] == "Deployment":
                for v in doc["spec"]["template"]["spec"]["volumes"]:
                    source = v.get("secret", {}).get("secretName") or v.get("configMap", {}).get(
                        "name"
                    )
                    volumes.add(source or v["name"])
    return {
        "pod": {pod(w) for w in WORKLOADS},
        "volume": volumes,
        "secret": {f"{w}-pki" for w in WORKLOADS},
        "network": {NETWORK},
    }


def existing(kind: str) -> set[str]:
    """The names of every podman ``kind`` (pod, volume, secret, network) on this host."""
    field = "{{.Name}}"
    args = {
        "pod": ["pod", "ls", "--format", field],
        "volume": ["volume", "ls", "--format", field],
        "secret": ["secret", "ls", "--format", field],
        "network": ["network", "ls", "--format", field],
        "container": ["container", "ls", "-a", "--format", "{{.Names}}"],
    }[kind]
    return set(run("podman", *args).stdout.split())


def left(things: dict[str, set[str]]) -> list[str]:
    """Which of ``things`` exist, and any container of their pods."""
    found = [f"{k} {n}" for k, names in things.items() for n in sorted(names & existing(k))]
    containers = existing("container")
    found += [f"container {c}" for c in sorted(containers) if c.startswith(tuple(things["pod"]))]
    return found


def remove(things: dict[str, set[str]]) -> None:
    """Remove every one of ``things`` that exists (after a failure: the docs' teardown
    is what the test checks)."""
    for kind, flags in (("pod", ["-f", "-t", "0"]), ("volume", ["-f"]), ("secret", [])):
        names = sorted(things[kind] & existing(kind))
        if names:
            subprocess.run(["podman", kind, "rm", *flags, *names], capture_output=True, check=False)
    if NETWORK in existing("network"):
        subprocess.run(["podman", "network", "rm", "-f", NETWORK], capture_output=True, check=False)


def ready(workload: str) -> bool:
    """The workload's readinessProbe (an exec in every manifest), run in its container."""
    done = subprocess.run(
        ["podman", "exec", container(workload), *PROBES[workload]],
        capture_output=True,
        timeout=60,
        check=False,
    )
    return done.returncode == 0


#: Each workload's readinessProbe command, read from the shipped manifests.
PROBES: dict[str, list[str]] = {}


@dataclass
class Kube:
    """The played manifests: their directory, environment and gateway."""

    directory: Path
    env: dict[str, str]
    gateway: Gateway
    things: dict[str, set[str]]
    started_s: float

    def wait_ready(self, *workloads: str, timeout: float = 600) -> None:
        for w in workloads or WORKLOADS:
            wait_until(f"{w} ready", partial(ready, w), timeout)


@pytest.fixture(scope="module")
def kube(teacher_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    directory = tmp_path_factory.mktemp("capck8s")
    shutil.copytree(ROOT / "deploy", directory / "deploy")
    port = free_port()
    gateway_yaml = directory / "deploy" / "k8s" / "gateway.yaml"
    text = gateway_yaml.read_text()
    assert text.count("hostPort: 8080,") == 1
    gateway_yaml.write_text(text.replace("hostPort: 8080,", f"hostPort: {port},"))
    for workload in WORKLOADS:
        spec = next(d for d in manifest(directory, workload) if d["kind"] == "Deployment")
        probe = spec["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
        PROBES[workload] = list(probe["exec"]["command"])
    things = named_things(directory)
    clash = left(things)
    if clash:
        pytest.fail(
            "this host already has what the manifests make (an earlier run's?): "
            + ", ".join(clash)
            + "; remove them with docs/usage.md's teardown block"
        )
    (directory / "containers.conf").write_text(
        docs_blocks("Running it with no registry", "toml")[0]
    )
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "PYTHONPATH": f"{ROOT}:{ROOT / 'clients'}",
        "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(directory / "containers.conf")),
    }
    patch = pytest.MonkeyPatch()
    patch.setenv("CONTAINERS_CONF", env["CONTAINERS_CONF"])
    start_block, teardown_block = docs_blocks(SECTION)
    try:
        place_teachers(teacher_file, directory)
        start = time.monotonic()
        script = "\n".join(
            ["set -euo pipefail"]
            + [line for line in start_block.splitlines() if not line.startswith("make images")]
        )
        done = run("bash", "-c", script, cwd=directory, env=env, timeout=900)
        admin = TOKEN.findall(done.stdout)
        assert admin, done.stdout + done.stderr
        gateway = Gateway(port, directory / "pki" / "ca" / "ca.pem", admin[-1])
        k = Kube(directory, env, gateway, things, 0.0)
        k.wait_ready()
        made = run(
            "podman",
            "exec",
            container("gateway"),
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
        k.started_s = time.monotonic() - start
        yield k
        # The docs' teardown, as written: what the last test checks left nothing.
        run("bash", "-c", "set -euo pipefail\n" + teardown_block, cwd=directory, env=env)
    finally:
        remaining = left(things)
        remove(things)
        patch.undo()
        assert not left(things), "left behind"
    assert not remaining, f"the docs' teardown left {remaining}"


def test_each_workload_runs_in_its_own_pod_and_hospitals_publish_no_port(kube: Kube) -> None:
    for workload in WORKLOADS:
        inspected = json.loads(run("podman", "inspect", container(workload)).stdout)[0]
        assert inspected["State"]["Running"], workload
        assert inspected["Pod"], workload
        assert inspected["Config"]["User"] in {"10001", "capc"}, (workload, inspected["Config"])
        assert inspected["HostConfig"]["ReadonlyRootfs"] is True, workload
        pod_info = json.loads(run("podman", "pod", "inspect", pod(workload)).stdout)
        pod_info = pod_info[0] if isinstance(pod_info, list) else pod_info
        assert [c["Name"] for c in pod_info["Containers"] if "infra" not in c["Name"]] == [
            container(workload)
        ]
        ports = run("podman", "port", container(workload)).stdout.strip()
        if workload == "gateway":
            assert re.fullmatch(rf"8080/tcp -> 127\.0\.0\.1:{kube.gateway.port}", ports), ports
        else:
            assert ports == "", f"{workload} publishes {ports}"
    infra = json.loads(run("podman", "pod", "inspect", pod("guardian")).stdout)
    infra = infra[0] if isinstance(infra, list) else infra
    networks = json.loads(run("podman", "inspect", infra["InfraContainerID"]).stdout)[0]
    assert list(networks["NetworkSettings"]["Networks"]) == [NETWORK]


def test_capcctl_labels_1000_queries_and_an_admin_reads_every_budget(kube: Kube) -> None:
    start = time.monotonic()
    kube.gateway.label(1000)
    print(
        f"\npods ready after {kube.started_s:.0f} s; "
        f"1,000 queries labelled in {time.monotonic() - start:.0f} s"
    )
    budgets = kube.gateway.budgets()
    assert set(HOSPITALS) <= set(budgets)
    for hospital in HOSPITALS:
        b = budgets[hospital]
        assert 0 < b["epsilon_spent"] <= b["epsilon_cap"] == 10.0, b
        own, _ = own_ledger(container(hospital), hospital)
        assert own == pytest.approx(b["epsilon_spent"], rel=1e-9), (hospital, own, b)


def test_a_deleted_hospital_pod_played_again_keeps_its_ledger_and_is_never_charged_twice(
    kube: Kube,
) -> None:
    hospital = "hospital-a"
    before, rounds = own_ledger(container(hospital), hospital)
    assert before > 0 and rounds > 0  # the labelling test's spend
    run("podman", "pod", "rm", "-f", "-t", "0", pod(hospital))
    assert f"{hospital}-ledger" in existing("volume")
    # As Kubernetes recreates a deleted pod with its claims still bound: the Deployment
    # alone played again (podman's kube play refuses to create a claim that exists).
    again = kube.directory / f"{hospital}-deployment.yaml"
    docs = [d for d in manifest(kube.directory, hospital) if d["kind"] != "PersistentVolumeClaim"]
    again.write_text(yaml.safe_dump_all(docs))
    run("podman", "kube", "play", "--network", NETWORK, str(again), env=kube.env)
    # The guardian lets it in once the old stream is gone (at most 35 s).
    kube.wait_ready(hospital)
    # The claim kept the ledger: nothing forgotten, nothing charged by the restart itself.
    assert unchanged(own_ledger(container(hospital), hospital), (before, rounds))
    kube.gateway.label(16)
    after, rounds_after = own_ledger(container(hospital), hospital)
    guardian = kube.gateway.budgets()[hospital]["epsilon_spent"]
    assert after > before and rounds_after > rounds
    # Exactly what the guardian charged it, no round twice.
    assert after == pytest.approx(guardian, rel=1e-9), (after, guardian)


def test_a_hospital_with_onnx_teachers_answers_from_the_torch_free_image(kube: Kube) -> None:
    """hospital-c moves to capc-onnx:latest (no torch) with an ONNX teacher in its claim:
    it connects, votes and is charged, its own ledger kept and agreeing with the guardian."""
    hospital = "hospital-c"
    before, rounds = own_ledger(container(hospital), hospital)
    run("podman", "pod", "rm", "-f", "-t", "0", pod(hospital))
    models = kube.directory / "onnx-teacher"
    models.mkdir()
    write_onnx(models / "teacher.onnx", seed=0)
    (models / "teacher.onnx").chmod(0o444)
    tar = subprocess.run(
        ["tar", "-C", str(models), "-c", "."], capture_output=True, check=True
    ).stdout
    imported = subprocess.run(
        ["podman", "volume", "import", f"{hospital}-teachers", "-"],
        input=tar,
        capture_output=True,
        check=False,
    )
    assert imported.returncode == 0, imported.stderr
    docs = [d for d in manifest(kube.directory, hospital) if d["kind"] != "PersistentVolumeClaim"]
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    answerer = deploy["spec"]["template"]["spec"]["containers"][0]
    answerer["image"] = "capc-onnx:latest"
    args = answerer["args"]
    args[args.index("--model") + 1] = "/models/teacher.onnx"
    again = kube.directory / f"{hospital}-onnx.yaml"
    again.write_text(yaml.safe_dump_all(docs))
    run("podman", "kube", "play", "--network", NETWORK, str(again), env=kube.env)
    kube.wait_ready(hospital)
    # The image has no torch at all: the answerer never needed it.
    probe = subprocess.run(
        ["podman", "exec", container(hospital), "python", "-c", "import torch"],
        capture_output=True,
        check=False,
    )
    assert probe.returncode != 0 and b"No module named 'torch'" in probe.stderr
    logs = run("podman", "logs", container(hospital))
    assert "(1 teacher: onnx" in logs.stdout + logs.stderr
    assert unchanged(own_ledger(container(hospital), hospital), (before, rounds))
    kube.gateway.label(16)
    after, rounds_after = own_ledger(container(hospital), hospital)
    assert after > before and rounds_after > rounds
    guardian = kube.gateway.budgets()[hospital]["epsilon_spent"]
    assert after == pytest.approx(guardian, rel=1e-9), (after, guardian)
