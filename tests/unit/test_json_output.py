"""``--json`` anywhere writes exactly one JSON value to stdout: every ``capc`` command
that takes it, and every ``capcctl`` command, on success and on failure."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.commands import cli

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients"))
from capc_client import cli as capcctl  # noqa: E402

#: A gateway address nothing listens on.
NOWHERE = "https://127.0.0.1:9"


def _only_json(capfd: pytest.CaptureFixture[str]) -> Any:
    out = capfd.readouterr().out
    return json.loads(out)


def _noisy(*_: Any, **__: Any) -> None:
    """What a long command's work may do to stdout: print, and start processes that do."""
    print("a progress line on stdout")
    subprocess.run([sys.executable, "-c", "print('a child process says hello')"], check=True)


# -- capc --------------------------------------------------------------------------------


def _capc_json_commands() -> Iterator[str]:
    """Every capc command path (e.g. "privacy plan") that takes --json."""

    def walk(parser: argparse.ArgumentParser, path: str) -> Iterator[str]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from walk(child, f"{path} {name}".strip())
            elif "--json" in action.option_strings:
                yield path

    yield from walk(cli.build_parser(), "")


def _run_capc(argv: list[str]) -> int:
    return cli.main(argv)


def test_capc_privacy_commands(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    votes = tmp_path / "votes.npy"
    np.save(votes, np.array([[200, 30, 20], [100, 100, 50]]))
    plan = ["privacy", "plan", "--mechanism", "gnmax", "--sigma", "40", "--epsilon", "10"]
    assert _run_capc([*plan, "--json"]) == 0
    assert _only_json(capfd)["epsilon"] == 10.0
    cost = ["privacy", "cost", "--mechanism", "confident-gnmax", "--teachers", "250"]
    cost += ["--threshold", "200", "--sigma1", "150", "--sigma", "40", "--classes", "3"]
    assert _run_capc([*cost, "--votes", str(votes), "--json"]) == 0
    assert _only_json(capfd)["queries"] == 2
    advise = ["privacy", "advise", "--labels", "5", "--mean-l2", "1.5", "--subsets", "10"]
    advise += ["--teachers", "50", "--queries", "1000", "--epsilon", "10"]
    assert _run_capc([*advise, "--json"]) == 0
    assert "mechanism" in _only_json(capfd)


def test_capc_gateway_token_create(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "tokens.db")
    argv = ["gateway", "token", "create", "--role", "analyst", "--db", db, "--json"]
    assert _run_capc(argv) == 0
    assert _only_json(capfd)["role"] == "analyst"


def test_capc_audit_verify(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from services.common.ledger import Ledger

    url = str(tmp_path / "guardian.db")
    Ledger(url).create_task("t", {"num_classes": 2})
    _run_capc(["audit", "verify", "--ledger", url, "--json"])
    assert "ok" in _only_json(capfd)


def test_capc_diet_run(monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    from capc.learning import cli as diet_cli

    def run(config: Any, cache: Path, log: Any) -> dict[str, Any]:
        log("progress")
        _noisy()
        return {"rows": []}

    monkeypatch.setattr(diet_cli, "run", run)
    assert _run_capc(["diet", "run", "--quick", "--json"]) == 0
    assert _only_json(capfd) == {"rows": []}


def test_capc_labeldp(monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    from capc.labeldp import cli as labeldp_cli

    def run_method(args: argparse.Namespace, log: Any) -> dict[str, Any]:
        log("progress")
        _noisy()
        return {"method": args.method}

    monkeypatch.setattr(labeldp_cli, "run_method", run_method)
    for method in ("alibi", "rr", "pate-fm"):
        assert _run_capc(["labeldp", method, "--epsilon", "1", "--json"]) == 0
        assert _only_json(capfd) == {"method": method}


class _Consortium:
    """A LocalConsortium that starts nothing but, like the real one, writes to stdout."""

    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    def __enter__(self) -> _Consortium:
        _noisy()
        return self

    def __exit__(self, *_: object) -> None:
        print("stopping")

    def start_student(self) -> None:
        _noisy()


def test_capc_audit_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from services.audit import run as audit_run

    def audit(*_: Any) -> dict[str, Any]:
        _noisy()
        return {"audits": []}

    monkeypatch.setattr(audit_run, "LocalConsortium", _Consortium)
    monkeypatch.setattr(audit_run, "audit_consortium", audit)
    assert _run_capc(["audit", "run", "--dir", str(tmp_path), "--json"]) == 0
    assert _only_json(capfd) == {"audits": []}


def test_every_capc_json_command_is_covered() -> None:
    """A new --json command needs a test here (capc demo's is tests/unit/test_demo_rerun.py)."""
    covered = {"privacy plan", "privacy cost", "privacy advise", "gateway token create"}
    covered |= {"audit verify", "diet run", "labeldp alibi", "labeldp rr", "labeldp pate-fm"}
    covered |= {"audit run", "demo"}
    # task init, teacher fit, data pack: tests/integration/test_teacher_fit.py and
    # tests/integration/test_data_pack.py read their whole
    # stdout as JSON.
    covered |= {"task init", "teacher fit", "data pack"}
    # capc up: tests/e2e/test_up.py reads a second start's stdout as one JSON object.
    covered |= {"up"}
    # audit record: tests/integration/test_privacy_audit_writers.py reads its stdout as
    # one JSON object.
    covered |= {"audit record"}
    assert set(_capc_json_commands()) == covered


# -- capcctl -----------------------------------------------------------------------------


def _capcctl_commands(tmp_path: Path) -> Iterator[list[str]]:
    """Every capcctl command, with made-up positionals and the options it needs."""
    records = tmp_path / "records.json"
    records.write_text("[[0.0]]")
    unlabelled = tmp_path / "unlabelled.npz"
    np.savez(unlabelled, x=np.zeros((2, 1, 28, 28), dtype=np.float32))
    extra = {
        ("jobs", "submit"): ["--generator", "mix", "--count", "8"],
        ("jobs", "results"): ["ID", "-o", str(tmp_path / "out.npz")],
        ("jobs", "watch"): ["ID"],
        ("jobs", "show"): ["ID"],
        ("models", "train"): ["JOB"],
        ("models", "predict"): ["ID", str(records)],
        ("models", "show"): ["ID"],
        ("models", "download"): ["ID", "-o", str(tmp_path / "m.pt")],
        ("loop", "run"): ["--records", str(unlabelled)],
    }
    (top,) = [
        a for a in capcctl.build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ]
    for name, parser in top.choices.items():
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        for sub in subs[0].choices if subs else [None]:
            path = [name] if sub is None else [name, sub]
            yield [*path, *extra.get(tuple(path), [])]  # type: ignore[arg-type]


def test_every_capcctl_command_fails_as_json(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    commands = list(_capcctl_commands(tmp_path))
    assert len(commands) >= 14
    for argv in commands:
        code = capcctl.main([*argv, "--url", NOWHERE, "--token", "t", "--json", "--quiet"])
        out, err = capfd.readouterr()
        assert code == 1, argv
        assert json.loads(out)["status"] == 0, (argv, out)
        assert "cannot reach the gateway" in err


def test_capcctl_refusals_are_json(capfd: pytest.CaptureFixture[str]) -> None:
    assert capcctl.main(["budget", "--url", NOWHERE, "--json"]) == 2  # no token
    assert "no token" in _only_json(capfd)["error"]
    argv = ["jobs", "submit", "--generator", "mix", "--count", "8", "--raise", "x"]
    argv += ["--url", NOWHERE, "--token", "t", "--json"]
    capcctl.main(argv)
    assert "--raise takes NAME=VALUE" in json.loads(capfd.readouterr().out)["error"]


def test_capcctl_results_print_one_json_value(capfd: pytest.CaptureFixture[str]) -> None:
    from capc_client.models import Job

    job = Job.model_validate(
        {
            "id": "j1",
            "state": "done",
            "requested": 8,
            "processed": 8,
            "answered": 7,
            "rounds": 1,
            "task": "images",
            "source": "recipe",
            "progress": 1.0,
            "error": "",
            "created_at": "2026-01-01T00:00:00Z",
        }
    )

    class Watching:
        def wait(self, job_id: str, on_progress: Any = None) -> Job:
            if on_progress is not None:
                on_progress(job)  # the progress bar goes to stderr
            return job

    args = capcctl.build_parser().parse_args(["jobs", "watch", "j1", "--json"])
    assert capcctl.cmd_jobs_watch(Watching(), args) == 0  # type: ignore[arg-type]
    out, err = capfd.readouterr()
    # --json is quiet: its JSON on stdout and no progress bar on stderr (issue 56).
    assert json.loads(out)["id"] == "j1" and err == ""
    plain = capcctl.build_parser().parse_args(["jobs", "watch", "j1"])
    assert capcctl.cmd_jobs_watch(Watching(), plain) == 0  # type: ignore[arg-type]
    out, err = capfd.readouterr()
    assert "answered 7" in err and "answered 7" not in out
    capcctl._print(args, [job, job], ["unused"])
    assert len(json.loads(capfd.readouterr().out)) == 2
