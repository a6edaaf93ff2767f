"""A real local consortium: guardian and five answering parties as separate processes over mutual TLS.

The student labels held-out digits through the network. With the guardian's
test-only noise seed the test replays the noise and checks every label
against capc.privacy's plaintext Confident-GNMax on the same teachers, and
checks the ledger against an independent accountant.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

from capc.learning.supervised import fit
from capc.models import Teacher, build, load_teacher, save_teacher
from capc.mpc.mechanism_circuits import round_noise
from capc.privacy import events
from capc.privacy.accountant import Accountant
from capc.privacy.mechanisms.single_label import confident_decide, gaussian_noise
from capc.privacy.randomness import SecureRandom
from services.common import pki, tls
from services.common.task import TaskConfig, config_hash
from services.guardian.ledger import Ledger
from services.guardian.ledger.models import RoundState
from services.student.client import StudentClient

ROOT = Path(__file__).resolve().parents[2]
PARTIES = 5
NOISE_SEED = "e2e-consortium"
TASK = {
    "num_classes": 10,
    "input_shape": [1, 8, 8],
    "mechanism": {"name": "confident-gnmax", "sigma": 1.0, "threshold": 3.0, "sigma1": 1.5},
    "quorum": 3,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(proc: subprocess.Popen[str], text: str, timeout: float = 120) -> None:
    assert proc.stdout is not None
    stream = proc.stdout
    ready = threading.Event()
    seen: list[str] = []

    def pump() -> None:
        for line in stream:
            seen.append(line)
            if text in line:
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not ready.wait(0.2) and proc.poll() is None and time.monotonic() < deadline:
        pass
    if not ready.is_set():
        raise AssertionError(f"{text!r} not seen: {''.join(seen)[-2000:]}")


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "services.cli", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture(scope="module")
def consortium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    d = tmp_path_factory.mktemp("consortium")
    pki_dir = d / "pki"
    pki.init_ca(pki_dir)
    pki.issue(pki_dir, "guardian", "guardian")
    pki.issue(pki_dir, "student", "student")
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]
    y = digits.target.astype(np.int64)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(x))
    test_idx, train_idx = order[:256], order[256:]
    models: list[Path] = []
    for i, part in enumerate(np.array_split(train_idx, PARTIES)):
        name = f"hospital-{i}"
        pki.issue(pki_dir, "answerer", name)
        model = fit(build("small-cnn", (1, 8, 8), 10), x[part], y[part], epochs=15, seed=i)
        path = d / f"{name}.pt"
        save_teacher(
            path, Teacher("small-cnn", (1, 8, 8), 10, model, {"data": f"digits partition {i}"})
        )
        models.append(path)
    db = str(d / "ledger.db")
    ledger = Ledger(db)
    ledger.create_task("digits", TASK)
    ledger.close()
    port = free_port()
    register = [a for i in range(PARTIES) for a in ("--register", f"hospital-{i}=1000000")]
    procs = [
        spawn(
            "guardian",
            "--db",
            db,
            "--listen",
            f"127.0.0.1:{port}",
            "--pki",
            str(pki_dir),
            "--noise-seed",
            NOISE_SEED,
            "--share-timeout",
            "30",
            *register,
        )
    ]
    wait_for(procs[0], "guardian serving")
    for i, path in enumerate(models):
        procs.append(
            spawn(
                "answerer",
                "--model",
                str(path),
                "--guardian",
                f"127.0.0.1:{port}",
                "--name",
                f"hospital-{i}",
                "--pki",
                str(pki_dir),
                "--server-name",
                "localhost",
            )
        )
    for p in procs[1:]:
        wait_for(p, "connected to the guardian")
    yield {
        "pki": pki_dir,
        "port": port,
        "db": db,
        "models": models,
        "queries": x[test_idx],
        "truth": y[test_idx],
        "procs": procs,
    }
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()


def replay(
    queries: np.ndarray, models: list[Path], batches: list[int], parties: list[tuple[str, ...]]
) -> np.ndarray:
    """The plaintext mechanism on the same teachers with the guardian's replayed noise."""
    teachers = {f"hospital-{i}": load_teacher(p) for i, p in enumerate(models)}
    rng = SecureRandom.from_seed(NOISE_SEED)
    task = TaskConfig.parse("digits", TASK, config_hash(TASK))
    out = []
    start = 0
    for b, used in zip(batches, parties, strict=True):
        xb = queries[start : start + b]
        start += b
        hist = np.zeros((b, 10))
        for name in used:
            hist[np.arange(b), teachers[name].predict(xb)] += 1
        spec = task.circuit_spec(len(used))
        eta2 = gaussian_noise((b, 10), spec.sigma2, rng)
        eta1 = gaussian_noise((b,), spec.sigma1, rng)
        out.append(
            confident_decide(hist, spec.threshold, round_noise(eta1), round_noise(eta2)).labels
        )
    return np.concatenate(out)


def test_labels_equal_the_plaintext_mechanism_and_the_ledger_is_exact(
    consortium: dict[str, object],
) -> None:
    pki_dir = consortium["pki"]
    assert isinstance(pki_dir, Path)
    task = TaskConfig.parse("digits", TASK, config_hash(TASK))
    student = StudentClient(
        f"127.0.0.1:{consortium['port']}",
        tls.TLSFiles.in_dir(pki_dir, "student"),
        task,
        server_name="localhost",
    )
    queries = consortium["queries"]
    assert isinstance(queries, np.ndarray)
    labels, rounds = student.label(queries, batch_size=64)
    student.close()
    assert len(rounds) == 4 and all(len(r.parties) == PARTIES for r in rounds)
    models = consortium["models"]
    assert isinstance(models, list)
    expected = replay(queries, models, [len(r.labels) for r in rounds], [r.parties for r in rounds])
    np.testing.assert_array_equal(labels, expected)
    answered = labels >= 0
    truth = consortium["truth"]
    assert isinstance(truth, np.ndarray)
    assert answered.mean() > 0.5 and (labels[answered] == truth[answered]).mean() > 0.8

    ledger = Ledger(str(consortium["db"]))
    # The guardian commits a round after the student's last message; until then
    # the ledger holds the (larger) reservation.
    deadline = time.monotonic() + 30
    while ledger.count_rounds(RoundState.COMMITTED) < len(rounds) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ledger.count_rounds(RoundState.COMMITTED) == len(rounds)
    for i in range(PARTIES):
        acct = Accountant(f"hospital-{i}")
        for r in rounds:
            acct.compose(events.threshold_test(3.0, 1.5), len(r.labels))
            acct.compose(events.gnmax(1.0), int((r.labels >= 0).sum()))
        assert ledger.budget(f"hospital-{i}").spent == pytest.approx(
            acct.spent(1e-5).epsilon, rel=1e-9
        )
    assert ledger.verify_audit() > 0
    print(
        json.dumps(
            {
                "answered": float(answered.mean()),
                "accuracy": float((labels[answered] == truth[answered]).mean()),
            }
        )
    )
