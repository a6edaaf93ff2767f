"""Issue 56: long steps report progress with a rate and an estimate, deterministically
spaced and silent when quiet; libraries' FutureWarnings stay off a user's terminal."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from capc.cli_output import Progress

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients"))
from capc_client import cli as capcctl  # noqa: E402


class Clock:
    """Seconds that advance only when told: what the lines say does not depend on timing."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_lines_carry_a_rate_and_an_estimate() -> None:
    lines: list[str] = []
    clock = Clock()
    p = Progress("hospital-0's teachers", 4, say=lines.append, clock=clock)
    for _ in range(4):
        clock.now += 2.0
        p.advance()
    assert lines[0] == "  hospital-0's teachers: 1/4 (0.50/s, about 6 s left)"
    assert lines[-1] == "  hospital-0's teachers: 4/4 (0.50/s, about 0 s left)"
    assert len(lines) == 4
    slow: list[str] = []
    q = Progress("x", 2, say=slow.append, clock=clock)
    clock.now += 30.0
    q.advance()
    assert slow == ["  x: 1/2 (30.0 s each, about 30 s left)"]


def test_a_long_step_writes_a_bounded_number_of_lines_the_last_always() -> None:
    lines: list[str] = []
    p = Progress("t", 250, say=lines.append, lines=20, clock=Clock())
    for _ in range(250):
        p.advance()
    assert 19 <= len(lines) <= 21 and lines[-1].startswith("  t: 250/250")
    p.advance()  # past the end: nothing more
    assert len(lines) <= 21


def test_quiet_progress_says_nothing() -> None:
    lines: list[str] = []
    p = Progress("t", 3, say=lines.append, quiet=True)
    p.advance(3)
    assert lines == [] and p.done == 3


def test_fitting_a_head_ensemble_reports_each_teacher() -> None:
    from capc.learning.teachers import fit_head_ensemble
    from capc.models import build

    body = build("small-cnn", (1, 8, 8), 3, width=4, seed=0)
    rng = np.random.default_rng(0)
    x = rng.random((24, 1, 8, 8), dtype=np.float32)
    y = np.arange(24) % 3
    parts = [np.arange(i, 24, 3) for i in range(3)]
    seen: list[int] = []
    fit_head_ensemble(body, x, y, parts, architecture="small-cnn", width=4, progress=seen.append)
    assert seen == [1, 1, 1]


def test_capcctl_job_progress_shows_the_rate_since_it_was_first_seen(capsys) -> None:  # type: ignore[no-untyped-def]
    from capc_client.models import Job

    def job(processed: int) -> Job:
        return Job.model_validate(
            {
                "id": "j1",
                "state": "running",
                "requested": 100,
                "processed": processed,
                "answered": processed,
                "rounds": 1,
                "task": "images",
                "source": "recipe",
                "progress": processed / 100,
                "error": "",
                "created_at": "2026-01-01T00:00:00Z",
            }
        )

    clock = Clock()
    bar = capcctl.JobProgress(clock)
    bar(job(0))
    clock.now = 4.0
    bar(job(20))
    err = capsys.readouterr().err
    assert "20/100" in err and "5 queries/s, about 16 s left" in err
    assert capcctl.rate_text(0, 10, 5.0, "queries") == ""


def test_capc_raises_no_future_warning_of_its_own() -> None:
    # What lets capc silence FutureWarnings: none of them is capc's own.
    own = re.compile(r"warn\((?:[^()]|\([^()]*\))*FutureWarning", re.S)
    for folder in ("capc", "services", "clients"):
        for path in (ROOT / folder).rglob("*.py"):
            assert not own.search(path.read_text(encoding="utf-8")), path
    assert own.search("warnings.warn(f'x {y(1)}', FutureWarning)")


def test_the_fork_server_scan_raises_no_library_warning() -> None:
    # What put a torch FutureWarning on `capc up`'s stderr: the fork server reads every
    # object's class once, torch's deprecated aliases included.
    code = (
        "import warnings, torch.distributed\n"
        "warnings.simplefilter('error')\n"
        "from services.testbed.forkserver import _find_import_generators\n"
        "_find_import_generators()\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=300)


def test_a_library_future_warning_stays_off_the_terminal() -> None:
    code = (
        "import warnings, sys\n"
        "from services.commands.cli import quiet_library_warnings\n"
        "quiet_library_warnings()\n"
        "warnings.warn_explicit('torch says: this changes', FutureWarning, 'torch/x.py', 1,"
        " module='torch.x')\n"
        "warnings.warn('a user warning still shows', UserWarning)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "torch says" not in done.stderr
    assert "a user warning still shows" in done.stderr
    # A user who asks for warnings (-W) keeps them.
    shown = subprocess.run(
        [sys.executable, "-W", "default", "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "torch says" in shown.stderr


def test_capcctl_training_progress_shows_a_fraction_a_rate_and_an_estimate() -> None:
    from capc_client.models import StudentModel

    def model(done: int, total: int, unit: str, state: str = "training") -> StudentModel:
        return StudentModel.model_validate(
            {
                "id": "m1",
                "state": state,
                "job_ids": ["j1"],
                "architecture": "mlp",
                "epochs": 10,
                "examples": 0,
                "metrics": {},
                "error": "",
                "created_at": "2026-01-01T00:00:00Z",
                "progress_done": done,
                "progress_total": total,
                "progress_unit": unit,
            }
        )

    clock = Clock()
    show = capcctl.TrainingWatch("training model", clock)
    assert show.line(model(0, 0, "", "queued")) == "training model m1: queued after 0 s"
    clock.now = 8.0
    line = show.line(model(2, 10, "epochs"))
    assert "2/10 epochs" in line and "0.25 epochs/s, about 32 s left" in line
    # A later unit counts from its own first report, not from the wait's start.
    clock.now = 20.0
    assert "(" not in show.line(model(1, 5, "candidate fits"))
    clock.now = 24.0
    assert "0.5 candidate fits/s, about 4 s left" in show.line(model(3, 5, "candidate fits"))
