"""docker-compose.yml and deploy/ checked for structure, in the suite's seconds:
tests/containers starts them for real under podman (the compose file with
podman-compose, deploy/k8s with podman kube play), and the same topology runs as local
processes in tests/e2e."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from capc.task_config import TaskConfig, config_hash
from services.commands.cli import build_parser
from services.guardian.main import parse_register

ROOT = Path(__file__).resolve().parents[2]
HOSPITALS = ("hospital-a", "hospital-b", "hospital-c")


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def test_compose_has_every_role_with_healthchecks_and_no_hospital_ports() -> None:
    services = compose()["services"]
    assert {"guardian", "student", "gateway", "postgres", *HOSPITALS} <= set(services)
    for name, svc in services.items():
        assert "healthcheck" in svc, f"{name} has no healthcheck"
        if name == "postgres":
            assert svc["profiles"] == ["postgres"]  # optional
            continue
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile"
        assert svc["read_only"] is True
    for h in HOSPITALS:
        svc = services[h]
        assert "ports" not in svc and "expose" not in svc, f"{h} must publish no port"
        assert f"./pki/{h}:/pki:ro" in svc["volumes"], (
            "each hospital mounts only its own certificate"
        )
        assert svc["depends_on"]["guardian"]["condition"] == "service_healthy"
    assert not any("ports" in services[s] for s in ("guardian", "student"))


def test_compose_gateway_is_https_on_the_loopback_only() -> None:
    gateway = compose()["services"]["gateway"]
    # Loopback only: exposing it further is an explicit choice (docs/usage.md).
    assert gateway["ports"] == ["127.0.0.1:${CAPC_GATEWAY_PORT:-8080}:8080"]
    assert "--insecure-dev" not in gateway["command"]
    assert "./pki/gateway:/pki:ro" in gateway["volumes"]
    health = gateway["healthcheck"]["test"]
    at = health.index("--http")
    assert health[at + 1] == "https://127.0.0.1:8080/healthz"
    assert health[health.index("--ca") + 1] == "/pki/ca.pem"
    assert health[health.index("--server-name") + 1] == "gateway"


def test_make_pki_issues_the_gateway_https_certificate_into_its_directory() -> None:
    text = (ROOT / "deploy" / "make-pki.sh").read_text()
    assert "pki issue-https" in text and "--host gateway" in text
    assert "CAPC_GATEWAY_HOSTS" in text
    assert '"$OUT/ca/gateway-https.pem" "$OUT/ca/gateway-https.key" "$OUT/gateway/"' in text


def test_compose_commands_parse_with_the_real_cli() -> None:
    parser = build_parser()
    for name, svc in compose()["services"].items():
        if name == "postgres":
            continue
        # Compose substitutes ${VAR:-default}: parse what the defaults give.
        args = [re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", a) for a in svc["command"]]
        parser.parse_args(args)
        health = svc["healthcheck"]["test"]
        assert health[:3] == ["CMD", "capc", "health"]
        parser.parse_args(health[2:])


def _pins(args: list[str]) -> dict[str, tuple[float, int]]:
    """What a guardian started with ``args`` registers: party -> (ceiling, teachers)."""
    parsed = build_parser().parse_args(args)
    return {name: (cap, teachers) for name, cap, teachers in map(parse_register, parsed.register)}


def test_every_guardian_pins_each_hospitals_teacher_count() -> None:
    """Compose and Kubernetes both pin every hospital's teacher count (50, one ensemble
    checkpoint each): a deployment that left it out would leave its hospitals unable to vote, and
    one that pinned more would let a hospital claim more votes than it runs."""
    services = compose()["services"]
    guardian = [
        re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", a) for a in services["guardian"]["command"]
    ]
    assert _pins(guardian) == {h: (10.0, 50) for h in HOSPITALS}
    for h in HOSPITALS:
        letter = h[-1].upper()
        assert (
            f"{h}=${{CAPC_CAP_{letter}:-10}}:${{CAPC_TEACHERS_{letter}:-50}}"
            in (services["guardian"]["command"])
        )
        assert services[h]["command"].count("--model") == 1
    docs = manifests()
    args = _workload(docs, "Deployment", "guardian")["spec"]["template"]["spec"]["containers"][0]
    assert _pins(args["args"]) == {h: (10.0, 50) for h in HOSPITALS}
    answerers = {
        d["metadata"]["namespace"]: d["spec"]["template"]["spec"]["containers"][0]["args"]
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"] in HOSPITALS
    }
    assert {f"capc-{h}" for h in HOSPITALS} == set(answerers)
    assert all(args.count("--model") == 1 for args in answerers.values())


def test_task_file_is_a_valid_task() -> None:
    config = json.loads((ROOT / "deploy" / "task.json").read_text())
    TaskConfig.parse("images", config, config_hash(config))
    k8s = yaml.safe_load((ROOT / "deploy" / "k8s" / "task.yaml").read_text())
    assert json.loads(k8s["data"]["task.json"]) == config


def test_dockerfile_needs_no_registry_and_runs_as_non_root() -> None:
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    stages = [ln for ln in text.splitlines() if ln.startswith("FROM ")]
    # The base is an argument (a debootstrap-made Debian by default), never a registry's.
    assert "ARG BASE_IMAGE=capc-base:bookworm" in text
    assert stages[0].startswith("FROM ${BASE_IMAGE}")
    assert all("python:" not in s for s in stages)
    # Wheels only from the host-built wheelhouse, bind-mounted: no index, no copied layer.
    installs = [ln for ln in text.splitlines() if "pip install" in ln]
    assert installs and all("--no-index" in ln for ln in installs)
    assert "COPY" not in text
    assert "USER capc" in text and "--uid 10001" in text  # the k8s manifests' runAsUser


def manifests() -> list[dict[str, Any]]:
    """Every document ``kubectl apply -f deploy/k8s/`` applies (not postgres/, an option)."""
    docs: list[dict[str, Any]] = []
    for path in sorted((ROOT / "deploy" / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def test_k8s_runs_under_kube_play_and_on_a_cluster() -> None:
    """What podman 4.3's kube play plays (Deployment, PersistentVolumeClaim, ConfigMap,
    Secret; Namespace, Service and NetworkPolicy it skips) and nothing it would trip on:
    no StatefulSet, no ``$(VAR)`` in arguments, secret volumes with ``optional`` said,
    every emptyDir named apart (podman shares one name's across pods), names unique
    across namespaces. docs/usage.md's block plays them (tests/containers/test_kube.py)."""
    played = {"guardian", "student", "gateway", *HOSPITALS}
    kinds = {"Deployment", "PersistentVolumeClaim", "ConfigMap", "Namespace", "Service"}
    kinds |= {"NetworkPolicy"}
    names: dict[str, str] = {}
    empty_dirs: list[str] = []
    for workload in sorted(played):
        docs = [d for d in yaml.safe_load_all(_k8s(workload)) if d]
        assert {d["kind"] for d in docs} <= kinds, workload
        for d in docs:
            if d["kind"] in ("Deployment", "PersistentVolumeClaim"):
                name = d["metadata"]["name"]
                assert name not in names, f"{name} in {workload} and {names[name]}"
                names[name] = workload
        deploy = next(d for d in docs if d["kind"] == "Deployment")
        assert deploy["metadata"]["name"] == workload
        assert deploy["spec"]["replicas"] == 1
        assert deploy["spec"]["strategy"] == {"type": "Recreate"}, "one writer per ledger"
        spec = deploy["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        container = spec["containers"][0]
        assert not any("$(" in a for a in container["args"]), workload
        # kube play publishes every containerPort on the host's 0.0.0.0: the gateway alone
        # declares one, with its hostPort on the loopback.
        assert ("ports" in container) == (workload == "gateway"), workload
        assert "exec" in container["readinessProbe"], "kube play runs exec probes"
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        for v in spec["volumes"]:
            if "secret" in v:
                assert v["secret"]["optional"] is False
                assert v["secret"]["secretName"] == f"{workload}-pki"
            if "emptyDir" in v:
                empty_dirs.append(v["name"])
                assert v["name"].startswith(f"{workload}-")
    assert len(set(empty_dirs)) == len(empty_dirs)
    assert not any(d["kind"] == "StatefulSet" for d in manifests())


def _k8s(name: str) -> str:
    return (ROOT / "deploy" / "k8s" / f"{name}.yaml").read_text()


def postgres() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(_k8s("postgres/postgres")) if d]


def test_k8s_ledgers_are_sqlite_on_volume_claims() -> None:
    docs = manifests()
    guardian = _workload(docs, "Deployment", "guardian")["spec"]["template"]["spec"]
    args = guardian["containers"][0]["args"]
    assert _flag(args, "--db") == "sqlite:////var/lib/capc/ledger.db"
    mounts = {m["mountPath"]: m["name"] for m in guardian["containers"][0]["volumeMounts"]}
    claim = next(v for v in guardian["volumes"] if v["name"] == mounts["/var/lib/capc"])
    assert claim["persistentVolumeClaim"]["claimName"] == "guardian-data"
    pvc = _workload(docs, "PersistentVolumeClaim", "guardian-data")
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    gateway = _workload(docs, "Deployment", "gateway")["spec"]["template"]["spec"]
    assert _flag(gateway["containers"][0]["args"], "--db") == "sqlite:////var/lib/capc/gateway.db"


def test_k8s_each_hospital_in_its_own_namespace_with_egress_only_to_the_guardian() -> None:
    docs = manifests()
    for h in HOSPITALS:
        ns = f"capc-{h}"
        mine = [
            d for d in docs if d["metadata"].get("namespace") == ns or d["metadata"]["name"] == ns
        ]
        assert any(d["kind"] == "Namespace" for d in mine)
        deploy = next(d for d in mine if d["kind"] == "Deployment")
        assert deploy["metadata"]["name"] == h
        container = deploy["spec"]["template"]["spec"]["containers"][0]
        assert "ports" not in container
        assert f"hospital-{h[-1]}" in container["args"]
        policy = next(d for d in mine if d["kind"] == "NetworkPolicy")
        spec = policy["spec"]
        assert spec["podSelector"] == {} and set(spec["policyTypes"]) == {"Ingress", "Egress"}
        assert spec["ingress"] == []
        targets = [t for rule in spec["egress"] for t in rule["to"]]
        apps = {t["podSelector"]["matchLabels"].get("app") for t in targets if "podSelector" in t}
        dns = {t["podSelector"]["matchLabels"].get("k8s-app") for t in targets}
        assert apps - {None} == {"guardian"} and "kube-dns" in dns
        assert all("ipBlock" not in t for t in targets), "no egress beyond the guardian and DNS"


def test_k8s_gateway_serves_https() -> None:
    docs = manifests()
    gateway = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gateway"
    )
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    assert "--insecure-dev" not in container["args"]
    # Published on the node's loopback only, as docker-compose.yml publishes it.
    assert container["ports"] == [
        {"containerPort": 8080, "name": "https", "hostPort": 8080, "hostIP": "127.0.0.1"}
    ]
    probe = container["readinessProbe"]["exec"]["command"]
    assert probe[probe.index("--http") + 1] == "https://127.0.0.1:8080/healthz"
    assert probe[probe.index("--ca") + 1] == "/pki/ca.pem"
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "gateway")
    assert service["spec"]["ports"] == [{"port": 8080, "targetPort": "https", "name": "https"}]


def _secrets(container: dict[str, Any]) -> set[str]:
    return {
        e["valueFrom"]["secretKeyRef"]["name"]
        for e in container.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }


def _workload(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def test_k8s_gateway_and_ledger_use_separate_database_roles() -> None:
    """postgres/postgres.yaml, the PostgreSQL option: the superuser's password reaches PostgreSQL
    only, and the guardian's and the gateway's URLs come from Secrets of their own."""
    docs = postgres()
    pg = _workload(docs, "StatefulSet", "postgres")
    container = pg["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "postgres-admin"
    assert env["LEDGER_DB_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "ledger-db"
    assert env["GATEWAY_DB_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "gateway-db"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["init"] == "/docker-entrypoint-initdb.d"
    volumes = {v["name"]: v for v in pg["spec"]["template"]["spec"]["volumes"]}
    config = _workload(docs, "ConfigMap", volumes["init"]["configMap"]["name"])
    script = (ROOT / "deploy" / "postgres-init.sh").read_text()
    assert list(config["data"].values()) == [script], "the ConfigMap is deploy/postgres-init.sh"
    # What the file tells the operator to give each workload: its own secret's URL only.
    text = _k8s("postgres/postgres")
    assert "{name: LEDGER_URL, valueFrom: {secretKeyRef: {name: ledger-db, key: url}}}" in text
    assert "{name: TOKEN_DB_URL, valueFrom: {secretKeyRef: {name: gateway-db, key: url}}}" in text
    # As shipped, no workload reads a database secret (their ledgers are SQLite files).
    for d in manifests():
        if d["kind"] == "Deployment":
            assert _secrets(d["spec"]["template"]["spec"]["containers"][0]) == set()


def test_the_init_script_makes_two_roles_that_cannot_reach_each_other() -> None:
    script = (ROOT / "deploy" / "postgres-init.sh").read_text()
    assert 'CREATE ROLE :"ledger"' in script and 'CREATE ROLE :"gateway"' in script
    for db in ("ledger", "gateway"):
        assert f'CREATE DATABASE :"{db}" OWNER :"{db}"' in script
        assert f'REVOKE ALL ON DATABASE :"{db}" FROM PUBLIC' in script


def test_compose_gateway_and_ledger_use_separate_database_roles() -> None:
    services = compose()["services"]
    guardian = " ".join(services["guardian"]["command"])
    gateway = " ".join(services["gateway"]["command"])
    assert "CAPC_LEDGER_URL" in guardian and "GATEWAY" not in guardian
    assert "CAPC_GATEWAY_DB_URL" in gateway and "LEDGER" not in gateway
    postgres = services["postgres"]
    assert (
        "./deploy/postgres-init.sh:/docker-entrypoint-initdb.d/10-capc-roles.sh:ro"
        in (postgres["volumes"])
    )
    env = postgres["environment"]
    assert {"LEDGER_DB_PASSWORD", "GATEWAY_DB_PASSWORD", "POSTGRES_PASSWORD"} <= set(env)
    for name, svc in services.items():
        if name != "postgres":
            assert "POSTGRES_PASSWORD" not in str(svc), f"{name} must not know the superuser"


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_every_hospital_sets_its_own_cap_and_keeps_its_own_ledger() -> None:
    services = compose()["services"]
    for h in HOSPITALS:
        args = services[h]["command"]
        assert float(_flag(args, "--epsilon-cap").split(":-")[-1].rstrip("}")) > 0
        # A raise is refused without a reason: each hospital's comes from its own variable.
        letter = h.rsplit("-", 1)[1].upper()
        assert _flag(args, "--cap-reason") == f"${{CAPC_CAP_REASON_{letter}:-}}"
        ledger = _flag(args, "--ledger")
        # In the hospital's own named volume, not in the read-only image.
        volume = next(v for v in services[h]["volumes"] if v.endswith(":/var/lib/capc"))
        assert ledger.startswith("/var/lib/capc/") and volume == f"{h}-data:/var/lib/capc"
    docs = manifests()
    for h in HOSPITALS:
        ns = f"capc-{h}"
        deploy = _workload(docs, "Deployment", h)
        assert deploy["metadata"]["namespace"] == ns
        spec = deploy["spec"]["template"]["spec"]
        args = spec["containers"][0]["args"]
        assert float(_flag(args, "--epsilon-cap")) > 0
        mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
        mount = mounts["/var/lib/capc"]
        assert _flag(args, "--ledger").startswith("/var/lib/capc/")
        claim = next(v for v in spec["volumes"] if v["name"] == mount)["persistentVolumeClaim"]
        pvc = next(
            d
            for d in docs
            if d["kind"] == "PersistentVolumeClaim"
            and d["metadata"]["name"] == claim["claimName"]
            and d["metadata"]["namespace"] == ns
        )
        assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_make_pki_gives_the_guardian_its_audit_key() -> None:
    text = (ROOT / "deploy" / "make-pki.sh").read_text()
    assert 'cp "$OUT/ca/guardian-audit.key" "$OUT/guardian/"' in text
