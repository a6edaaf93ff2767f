"""Every default buys at least 1,000 queries per hospital at eps 10.

For each shipped default task and deployment (``capc up``'s planned task, the demo's,
services/tasks/images.json, deploy/task.json with docker-compose.yml's and
deploy/k8s's teacher registrations), the ledger's own planner (``Ledger.queries_fit``,
the guardian's default accountant at delta 1e-5) counts the queries that fit each
hospital's cap of eps 10, for the teacher counts that deployment configures. The
robust Confident-GNMax default at sigma 1.5 this replaced fitted 2.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from capc.mechanisms import from_config
from capc.task_config import TaskConfig, config_hash
from services import tasks
from services.commands.cli import build_parser
from services.commands.demo import demo_task
from services.commands.demo_args import DEMO_HOSPITALS, DEMO_TEACHERS
from services.commands.up import planned_task
from services.commands.up_args import PLANNED_QUERIES, TEACHERS_PER_HOSPITAL
from services.common.ledger import Ledger
from services.guardian.main import parse_register

ROOT = Path(__file__).resolve().parents[2]
CAP = 10.0
AT_LEAST = 1000
#: The demo's share of the vote: sigma 40 for 250 teachers. A sigma far above it buys
#: queries with labels no better than chance; the bound below keeps the two consistent.
SHARE = 40.0 / 250


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ledger]:
    """A fresh guardian ledger, as `capc guardian` creates it (its default accountant)."""
    led = Ledger(str(tmp_path_factory.mktemp("ledger") / "ledger.db"), delta=1e-5)
    yield led
    led.engine.dispose()


def fits(ledger: Ledger, task: dict[str, Any], teachers: dict[str, int]) -> dict[str, int]:
    """Per hospital: queries of ``task``'s worst case that fit a cap of eps 10, at the vote
    weight the guardian gives it (1 without personalization) for these teacher counts."""
    parsed = TaskConfig.parse("images", task, config_hash(task))
    assert parsed.personalization is None, "a personalized default needs its weights here"
    mech = from_config(task["mechanism"], int(task["num_classes"]))
    return {h: ledger.queries_fit(mech.worst_case(1, 1.0), CAP) for h in teachers}


def check(ledger: Ledger, task: dict[str, Any], teachers: dict[str, int]) -> None:
    voters = sum(teachers.values())
    got = fits(ledger, task, teachers)
    assert min(got.values()) >= AT_LEAST, got
    # Consistent with the votes it was planned for: noise no larger than the demo's share.
    assert float(task["mechanism"]["sigma"]) <= SHARE * voters + 1e-9


def registrations(args: list[str]) -> dict[str, tuple[float, int]]:
    """A guardian command line's --register pins: party -> (cap, teachers)."""
    parsed = build_parser().parse_args(args)
    return {name: (cap, n) for name, cap, n in map(parse_register, parsed.register)}


def defaults(args: list[str]) -> list[str]:
    """A compose command with every ${VAR:-default} replaced by its default."""
    return [re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", a) for a in args]


def test_capc_up_default_task_fits_the_planned_queries(ledger: Ledger) -> None:
    teachers = {f"hospital-{i}": TEACHERS_PER_HOSPITAL for i in range(5)}
    task = planned_task(sum(teachers.values()), CAP, PLANNED_QUERIES)
    check(ledger, task, teachers)
    assert task["mechanism"] == {"name": "gnmax", "sigma": 40.0}
    assert min(fits(ledger, task, teachers).values()) == 3201  # 6 rounds of 512: 3,072


@pytest.mark.parametrize("voters", [3, 15, 150, 250, 1000])
def test_capc_up_plans_enough_noise_for_any_number_of_voters(ledger: Ledger, voters: int) -> None:
    task = planned_task(voters, CAP, PLANNED_QUERIES)
    got = fits(ledger, task, {"hospital-0": voters})
    assert got["hospital-0"] >= PLANNED_QUERIES
    # Never more noise than needed beyond the demo's share of the vote.
    sigma = float(task["mechanism"]["sigma"])
    assert sigma <= max(
        SHARE * voters, 0.01 + float(planned_task(1, CAP, 1024)["mechanism"]["sigma"])
    )


def test_shipped_images_and_demo_tasks(ledger: Ledger) -> None:
    teachers = {f"hospital-{i}": DEMO_TEACHERS for i in range(DEMO_HOSPITALS)}
    check(ledger, tasks.load("images"), teachers)
    check(ledger, demo_task(DEMO_HOSPITALS * DEMO_TEACHERS), teachers)


def test_deploy_task_with_compose_registrations(ledger: Ledger) -> None:
    task = json.loads((ROOT / "deploy" / "task.json").read_text())
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    pins = registrations(defaults(compose["services"]["guardian"]["command"]))
    assert {cap for cap, _ in pins.values()} == {CAP}
    check(ledger, task, {h: n for h, (_, n) in pins.items()})


def test_deploy_task_with_kubernetes_registrations(ledger: Ledger) -> None:
    k8s_task = yaml.safe_load((ROOT / "deploy" / "k8s" / "task.yaml").read_text())
    task = json.loads(k8s_task["data"]["task.json"])
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "k8s" / "guardian.yaml").read_text()))
    guardian = next(
        d for d in docs if d and d["kind"] == "Deployment" and d["metadata"]["name"] == "guardian"
    )
    pins = registrations(guardian["spec"]["template"]["spec"]["containers"][0]["args"])
    assert {cap for cap, _ in pins.values()} == {CAP}
    check(ledger, task, {h: n for h, (_, n) in pins.items()})


def test_the_old_default_would_have_failed(ledger: Ledger) -> None:
    old = tasks.load("one-teacher")  # the e2e tests' task: one teacher per hospital
    assert min(fits(ledger, old, {"hospital-0": 1}).values()) < AT_LEAST
