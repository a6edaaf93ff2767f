"""``capc diet run --quick`` as a separate process: every cell of the table, references, goals."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from capc.learning.__main__ import main as learning_main
from capc.learning.diet import STATISTICS, DietConfig
from capc.models import build
from capc.models.checkpoint import weights_sha256
from capc.privacy import gaussian_dp, planning, rdp
from capc.privacy.conversion import DEFAULT_ORDERS

#: scikit-learn's 1,797 digits, not animal-mnist's 10,000 images: the same paths (the
#: private set is only split, fitted on and queried), at a fifth of the training.
SMALL = ["--dataset", "digits"]


@pytest.mark.slow
def test_diet_run_quick_writes_the_whole_table(tmp_path: Path) -> None:
    out = tmp_path / "diet.json"
    cmd = [
        sys.executable,
        "-m",
        "services.commands.cli",
        "diet",
        "run",
        "--quick",
        "--out",
        str(out),
    ]
    cmd += ["--cache", str(tmp_path / "cache"), *SMALL]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "best student" in done.stdout or "current statistics" in done.stdout
    result = json.loads(out.read_text())
    config = DietConfig()
    cells = {(t["method"], t["generator"], t["statistics"], t["epsilon"]) for t in result["table"]}
    for g in config.generators:
        for eps in config.epsilons:
            assert ("pate-scratch", g, "original", eps) in cells
            for stats in STATISTICS:
                assert ("diet", g, stats, eps) in cells
    for t in result["table"]:
        assert 0 <= t["answered"] <= result["config"]["queries"]
        assert {"student_accuracy", "student_accuracy_self_trained", "label_accuracy"} <= set(t)
    assert set(result["references"]) >= {
        "teacher_ensemble_accuracy",
        "non_private_last_layer_accuracy",
        "non_private_full_training_accuracy",
    }
    assert {"current_beats_original_on_noise", "reaches_75_percent"} <= set(result["goals"])
    # without the services: the same parser, mounted by ``python -m capc.learning``
    shown = subprocess.run(
        [sys.executable, "-m", "capc.learning", "diet", "show", str(out), "--markdown"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    table = [line for line in shown.stdout.splitlines() if line.startswith("| diet ")]
    assert len(table) == len(config.generators) * len(STATISTICS) * len(config.epsilons)
    # the recorded digest names the body the run used: the one in the cache
    (cached,) = (tmp_path / "cache").glob("body-*.pt")
    spec = result["config"]["body"]
    body = build(spec["architecture"], tuple(spec["input_shape"]), 10, spec["width"])
    body.features.load_state_dict(torch.load(cached, weights_only=True))
    assert result["body_sha256"] == weights_sha256(body.features)
    # a second run reads the pretrained body from the cache and repeats every row
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "read from" in again.stdout
    repeated = json.loads(out.read_text())
    assert repeated["body_sha256"] == result["body_sha256"]
    # (compared as JSON text: a NaN cell is never equal to itself)
    assert json.dumps(repeated["rows"]) == json.dumps(result["rows"])


@pytest.mark.slow
def test_diet_run_quick_plain_gnmax_reports_both_accountants(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plain.json"
    cmd = [sys.executable, "-m", "capc.learning", "diet", "run", "--quick", "--no-baseline", *SMALL]
    cmd += ["--generators", "gaussian", "--statistics", "current", "--epsilons", "5,10"]
    cmd += ["--threshold", "none", "--sigma2", "100", "--accountants", "rdp,gdp"]
    cmd += ["--first-seed", "3", "--cache", str(tmp_path / "cache"), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    config = result["config"]
    assert config["mechanism_at_teachers"]["threshold"] is None
    sigma2 = config["mechanism_at_teachers"]["sigma2"]
    rows = {(r["accountant"], r["epsilon"]): r for r in result["rows"]}
    assert set(rows) == {(a, e) for a in ("rdp", "gdp") for e in (5.0, 10.0)}
    assert config["seeds"] == [3] and {r["seed"] for r in result["rows"]} == {3}
    for eps in (5.0, 10.0):
        gdp = rows["gdp", eps]
        fit = gaussian_dp.max_queries_gdp(gaussian_dp.gnmax_mu(sigma2), eps, config["delta"])
        assert gdp["answered"] == gdp["processed"] == min(fit, config["queries"])
        assert gdp["epsilon_spent"] <= eps and math.isnan(gdp["sanitised_data_dependent_epsilon"])
        # the rdp row stops where the data-independent plan says, whatever the votes
        by_rdp = rows["rdp", eps]
        per_query = rdp.gnmax_data_independent(sigma2, DEFAULT_ORDERS)
        room = planning.max_queries(per_query, DEFAULT_ORDERS, eps, config["delta"])
        assert by_rdp["processed"] == by_rdp["answered"] == min(room, config["queries"])
        assert by_rdp["epsilon_spent"] <= eps
        assert {by_rdp["stopping"], gdp["stopping"]} == {"data-independent"}
    assert (
        "gdp" in done.stdout and "accountant" in done.stdout and "sanitised dd eps" in done.stdout
    )
    # The labels through the protocol's own roles and garbled circuit change no row.
    secure = tmp_path / "secure.json"
    cmd[cmd.index("--out") + 1] = str(secure)
    again = subprocess.run(
        [*cmd, "--labels-by", "2pc"], capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    through = json.loads(secure.read_text())
    assert through["config"]["labels_by"] == "2pc" and config["labels_by"] == "oracle"
    # (compared as JSON text: a NaN cell is never equal to itself)
    assert json.dumps(through["rows"]) == json.dumps(result["rows"])
    # An accountant the project does not have: a clear error from the parser, no run (in
    # this process: the parser is all it reaches).
    with pytest.raises(SystemExit) as refused:
        learning_main(["diet", "run", "--accountants", "pld"])
    assert refused.value.code == 2 and "pld" in capsys.readouterr().err
