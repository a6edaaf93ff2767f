"""DP-trained teachers, end to end: guardian, four hospitals and the student as separate
processes over mutual TLS, on a task of the dp-trained mechanism.

- Hospitals 0-2 vote with a teacher trained by full-batch DP-SGD here (its record on
  its card); hospital 3 with two partitioned ordinary teachers.
- Each DP-trained hospital's own ledger and the guardian's charge its training once
  (the record's event, exactly), audited under its identity.
- Many rounds charge nothing more; their labels are the plain argmax of the three
  DP-trained teachers' votes (ties to the lowest class); hospital 3 is never asked.
- A restarted hospital charges nothing again; ``capc audit verify`` passes.
- A training past a hospital's own cap is refused at start: exit 2, nothing charged.
- The admin API and ``capcctl budget`` show each training apart from round charges.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from capc.learning import dp_sgd
from capc.models import Teacher, load_teacher, save_teacher
from capc.models.registry import build
from capc.privacy import accountants
from capc.privacy.dp_training import CARD_KEY, DpTraining, plan_training
from capc.privacy.randomness import SecureRandom
from services import tasks
from services.common.ledger import Ledger
from services.local import ROOT, LocalConsortium, load_dataset
from tests.e2e.jobs import assert_ledgers_agree
from tests.e2e.test_own_budgets import verify

DELTA = 1e-5
TRAINED = (0, 1, 2)
PARTITIONED = 3
BATCH = 6
ROUNDS = 4
CAP = 10.0
TASK = {**tasks.load("one-teacher"), "mechanism": {"name": "dp-trained"}, "quorum": 2}
GDP = accountants.make(accountants.DEFAULT_ACCOUNTANT)


def dp_teacher(path: Path, hospital: int, epsilon: float = 2.0) -> DpTraining:
    """A small CNN without BatchNorm (he-cnn) trained by 10 full-batch DP-SGD steps on 200
    random records; its record on its card. Accuracy is not the point here."""
    x, y = load_dataset("animal-mnist", 28, TASK)
    pick = np.random.default_rng(hospital).permutation(len(x))[:200]
    record = plan_training(epsilon, DELTA, 10, clip=1.0, records=len(pick))
    model = build("he-cnn", (1, 28, 28), 10, seed=hospital)
    rng = SecureRandom.from_seed(f"dp-teacher-{hospital}")  # a test: replayable noise
    dp_sgd.train(model, x[pick], y[pick].astype(np.int64), record, lr=0.05, rng=rng)
    card = {"data": f"animal-mnist, 200 records (hospital {hospital})", CARD_KEY: record.to_dict()}
    save_teacher(path, Teacher("he-cnn", (1, 28, 28), 10, model, card=card, device="cpu"))
    return record


@pytest.fixture(scope="module")
def consortium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalConsortium]:
    directory = tmp_path_factory.mktemp("dp-trained")
    own = {i: directory / f"dp-teacher-{i}.pt" for i in TRAINED}
    for i, path in own.items():
        dp_teacher(path, i)
    c = LocalConsortium(
        directory,
        parties=4,
        task=TASK,
        epochs=1,
        epsilon_caps=[CAP] * 4,
        teachers=[1, 1, 1, 2],
        own_models=own,
    )
    with c:
        c.start_student()
        c.start_gateway()
        yield c


def charges(ledger: str) -> list[dict[str, object]]:
    led = Ledger(ledger, delta=None, migrate=False)
    try:
        return [dict(e.detail) for e in led.audit_entries(limit=1000) if e.action == "dp_training"]
    finally:
        led.close()


def spent(ledger: str, party: str) -> np.ndarray:
    led = Ledger(ledger, delta=None, migrate=False)
    try:
        return led.spent_loss(party)
    finally:
        led.close()


def check_charged_once(c: LocalConsortium) -> None:
    """Both ledgers of every DP-trained hospital hold its training once, nothing else."""
    guardian = charges(c.db)
    for i in TRAINED:
        name = f"hospital-{i}"
        record = DpTraining.from_dict(load_teacher(c.model_paths(i)[0]).card[CARD_KEY])
        want = GDP.filter_cost(record.event())
        own = charges(c.party_ledger(i))
        assert [e["party"] for e in own] == [name]
        assert [e["party"] for e in guardian].count(name) == 1
        theirs = next(e for e in guardian if e["party"] == name)
        assert theirs["sha256"] == own[0]["sha256"]
        assert theirs["epsilon"] == pytest.approx(record.spent(DELTA), rel=1e-9)
        for ledger in (c.db, c.party_ledger(i)):
            np.testing.assert_allclose(spent(ledger, name), want, rtol=1e-9, err_msg=ledger)
    assert not any(e["party"] == f"hospital-{PARTITIONED}" for e in guardian)


def test_each_training_is_charged_once_in_both_ledgers(consortium: LocalConsortium) -> None:
    check_charged_once(consortium)


def test_rounds_charge_nothing_more_and_give_the_plain_argmax(
    consortium: LocalConsortium,
) -> None:
    c = consortium
    teachers = [load_teacher(c.model_paths(i)[0]) for i in TRAINED]
    student = c.student()
    try:
        results = [
            student.label_batch(c.queries[k * BATCH : (k + 1) * BATCH]) for k in range(ROUNDS)
        ]
    finally:
        student.close()
    for k, r in enumerate(results):
        assert set(r.parties) == {f"hospital-{i}" for i in TRAINED}, r.parties
        x = c.queries[k * BATCH : (k + 1) * BATCH]
        hist = np.zeros((BATCH, 10), dtype=np.int64)
        for t in teachers:
            hist[np.arange(BATCH), t.predict(x)] += 1
        np.testing.assert_array_equal(r.labels, np.argmax(hist, axis=1))  # lowest on ties
    assert_ledgers_agree(c)
    check_charged_once(c)  # nothing more than the trainings
    for ledger in (c.db, c.party_ledger(PARTITIONED)):
        assert not spent(ledger, f"hospital-{PARTITIONED}").any()


def test_a_job_labels_every_query_it_asks_for_free(consortium: LocalConsortium) -> None:
    """The student's job path with a per-query charge of zero: nothing divides by it, and
    the job labels all it asks for (synthetic queries, through capcctl and the gateway)."""
    c = consortium
    env = {
        **os.environ,
        "CAPC_URL": c.gateway_url,
        "CAPC_TOKEN": c.token("analyst", "analyst"),
        "CAPC_CA": str(c.ca),
        "PYTHONPATH": str(ROOT / "clients"),  # this tree's client, not an installed one
    }
    done = subprocess.run(
        [sys.executable, "-m", "capc_client.cli", "jobs", "submit", "--generator", "gaussian",
         "--count", "24", "--batch-size", "12", "--watch", "--json"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    job = json.loads(done.stdout.strip().splitlines()[-1])
    assert job["state"] == "done" and job["processed"] == 24 and job["rounds"] == 2, job
    assert_ledgers_agree(c)
    check_charged_once(c)


def test_a_restarted_hospital_is_not_charged_again(consortium: LocalConsortium) -> None:
    c = consortium
    c.restart_party(0, epsilon_cap=CAP)
    check_charged_once(c)
    student = c.student()
    try:
        r = student.label_batch(c.queries[:BATCH])
    finally:
        student.close()
    assert "hospital-0" in r.parties
    assert_ledgers_agree(c)
    check_charged_once(c)
    done = verify(c, c.db)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_training_past_the_hospitals_own_cap_is_refused_at_start(
    consortium: LocalConsortium, tmp_path: Path
) -> None:
    c = consortium
    record = DpTraining.from_dict(load_teacher(c.model_paths(0)[0]).card[CARD_KEY])
    cap = record.spent(DELTA) / 2
    ledger = tmp_path / "small-cap.db"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.commands.cli",
            "answerer",
            "--model",
            str(c.model_paths(0)[0]),
            "--guardian",
            c.address,
            "--name",
            "hospital-0",
            "--epsilon-cap",
            repr(cap),
            "--ledger",
            str(ledger),
            "--pki",
            str(c.pki_dir),
            "--server-name",
            "localhost",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "past its cap" in done.stderr and f"cap of {cap:g} eps" in done.stderr
    assert "--dp-epsilon" in done.stderr  # what to do
    assert not spent(str(ledger), "hospital-0").any()
    assert charges(str(ledger)) == []


def test_the_admin_view_and_capcctl_show_the_training_apart(consortium: LocalConsortium) -> None:
    c = consortium
    token = c.token("admin", "data-office")
    env = {
        **os.environ,
        "CAPC_URL": c.gateway_url,
        "CAPC_TOKEN": token,
        "CAPC_CA": str(c.ca),
        "PYTHONPATH": str(ROOT / "clients"),  # this tree's client, not an installed one
    }
    done = subprocess.run(
        [sys.executable, "-m", "capc_client.cli", "budget", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    budgets = {b["party"]: b for b in json.loads(done.stdout)["budgets"]}
    for i in TRAINED:
        b = budgets[f"hospital-{i}"]
        record = DpTraining.from_dict(load_teacher(c.model_paths(i)[0]).card[CARD_KEY])
        [t] = b["trainings"]
        assert t["epsilon"] == pytest.approx(record.spent(DELTA), rel=1e-9)
        assert t["described"].startswith(f"DP-SGD, {record.steps} steps, sigma ")
        assert b["epsilon_spent"] == pytest.approx(t["epsilon"], rel=1e-6)
        assert b["rounds_epsilon"] == pytest.approx(0.0, abs=1e-6)  # rounds were free
        assert b["dp_trained"]
    assert budgets[f"hospital-{PARTITIONED}"]["trainings"] == []
    assert not budgets[f"hospital-{PARTITIONED}"]["dp_trained"]
    text = subprocess.run(
        [sys.executable, "-m", "capc_client.cli", "budget"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert text.returncode == 0, text.stdout + text.stderr
    assert text.stdout.count("training: eps ") == len(TRAINED)
    assert "(DP-SGD, 10 steps, sigma " in text.stdout
