"""docs/hospital.md's "whole path on one machine", run as written, on image folders this test
writes: ``capc task init``, ``capc teacher fit`` for three hospitals, ``capc data pack``,
``capc up`` with the hospitals' own teachers and hospital-0's CaPC loop, then the printed
``export`` lines and the section's ``capcctl`` commands (submit, train, predict, the loop).

Only the ids the section calls ``JOB_ID`` and ``MODEL_ID`` are filled in, from what the
commands before printed; every other word is the document's."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from capc.data.offline import animal_mnist
from tests.e2e.test_up import ROOT, Up, capcctl, exported

DOC = ROOT / "docs" / "hospital.md"
SECTION = "## 4. The whole path on one machine"
#: Images each folder gets (hospitals' folders: 40 teachers x 15 records, 20% held out).
#: Few: each teacher reads each held-out record and each of the loop's unlabelled records
#: through the body with its own statistics, and the section runs as written whatever
#: the folders hold.
SIZES = {
    "hospital-0": 750,
    "hospital-1": 750,
    "hospital-2": 750,
    "own": 100,
    "own-test": 300,
    "unlabelled": 128,
    "student-test": 500,
    "reference": 256,
}
FLAT = {"unlabelled", "reference"}


def section_commands() -> list[str]:
    """Every command line of the section's fenced blocks, in order."""
    text = DOC.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    body = text[start : end if end > 0 else len(text)]
    blocks = re.findall(r"```\n(.*?)```", body, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def write_folders(root: Path) -> None:
    """PNG folders of disjoint animal-mnist images: class subfolders, or flat (FLAT)."""
    x, y = animal_mnist()
    order = np.random.default_rng(11).permutation(len(x))
    at = 0
    for name, size in SIZES.items():
        for k in order[at : at + size]:
            folder = root / name if name in FLAT else root / name / f"c{int(y[k])}"
            folder.mkdir(parents=True, exist_ok=True)
            pixels = np.rint(x[k, 0] * 255).astype(np.uint8)
            Image.fromarray(pixels, mode="L").save(folder / f"img-{k}.png")
        at += size


def capc(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    words = shlex.split(line)
    done = subprocess.run(
        [sys.executable, "-m", "services.commands.cli", *words[1:]],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


def newest_id(kind: str, env: dict[str, str], cwd: Path) -> str:
    """The id of the newest job or model (``capcctl jobs|models list --json``)."""
    listed = capcctl(f"capcctl {kind} list --json", env, cwd)
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    items = data[kind] if isinstance(data, dict) else data
    return str(max(items, key=lambda item: item["created_at"])["id"])


def test_the_section_has_every_step() -> None:
    commands = section_commands()
    firsts = [" ".join(shlex.split(c)[:2]) for c in commands]
    for step in ("capc task", "capc teacher", "capc data", "capc up", "capcctl jobs"):
        assert step in firsts, step
    assert any(c.startswith("capcctl loop run") for c in commands)


@pytest.mark.slow
@pytest.mark.timeout(3000)  # 3 hospitals' teachers, 6 processes and 2 gateways, on a busy CI
def test_the_quick_start_runs_as_written(tmp_path: Path) -> None:
    write_folders(tmp_path)
    commands = section_commands()
    up: Up | None = None
    consortium: dict[str, str] = {}
    loop: dict[str, str] = {}
    try:
        for line in commands:
            if line.startswith("capc up"):
                up = Up(None, *shlex.split(line)[2:], cwd=tmp_path)
                consortium = exported(up.wait_for_line("export ", timeout=2400))
                loop = exported(up.wait_for_line("export ", timeout=600, nth=1))
                admin = up.wait_for_line("# admin token").rsplit("CAPC_TOKEN=", 1)[1]
            elif line.startswith("capc "):
                capc(line, tmp_path)
            elif line.startswith("capcctl loop"):
                done = capcctl(line + " --json", loop, tmp_path)
                assert done.returncode == 0, done.stdout + done.stderr
                report = json.loads(done.stdout)
                assert report["accuracy_before"] is not None
                # A fair "before": the best of the default model and logistic
                # regressions on the own records alone, and the report names it.
                before = report["before"]["metrics"]
                assert before["before_model"] in before["before_choice"], before
                assert any(k.startswith("logistic regression") for k in before["before_choice"])
                assert report["accuracy_after"] is not None
                assert report["labels_bought"] > 0 and report["records_revealed"] > 0
            else:
                env = consortium
                if "JOB_ID" in line:
                    line = line.replace("JOB_ID", newest_id("jobs", env, tmp_path))
                if "MODEL_ID" in line:
                    line = line.replace("MODEL_ID", newest_id("models", env, tmp_path))
                done = capcctl(line, env, tmp_path)
                assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        assert up is not None, "the section starts no consortium"
        budget = capcctl("capcctl budget --json", {**consortium, "CAPC_TOKEN": admin}, tmp_path)
        assert budget.returncode == 0, budget.stderr
        spent = {b["party"]: b["epsilon_spent"] for b in json.loads(budget.stdout)["budgets"]}
        assert all(0 < spent[f"hospital-{i}"] <= 10.0 for i in range(3)), spent
        # hospital-0 paid for the consortium's job alone; the two others also for its loop.
        assert spent["hospital-0"] < min(spent["hospital-1"], spent["hospital-2"]), spent
    finally:
        if up is not None:
            up.stop()
