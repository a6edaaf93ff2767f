"""``capc student``'s data options: a pretrained body needs a reference batch, and
each refusal says what is missing and where it comes from; ``--own-data`` goes with or
without a body (a table task's querier has none)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.commands.cli import build_parser
from services.student import main as student_main


def _args(*extra: str) -> list[str]:
    return ["student", "--guardian", "g:1", "--task", "t.json", "--insecure-dev", *extra]


def _run(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    args = build_parser().parse_args(_args(*extra))
    code = student_main.run(args)
    return code, capsys.readouterr().err


def test_a_body_without_reference_data_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capsys, "--body", "body.pt", "--test-data", "test.npz")
    assert code == 2
    assert "--body needs --reference-data FILE" in err
    assert "256 real unlabelled records" in err and ".npz with x" in err
    assert "never from the labelled test set" in err


@pytest.mark.parametrize(
    "extra",
    [
        (),
        ("--test-data", "t.npz"),
        ("--body", "b.pt", "--reference-data", "r.npz"),
        ("--body", "b.pt", "--own-data", "o.npz"),
        # A table task's querier (the CaPC loop) trains its MLP from scratch: no body.
        ("--own-data", "o.npz"),
    ],
)
def test_consistent_data_options_pass(extra: tuple[str, ...]) -> None:
    args = build_parser().parse_args(_args(*extra))
    assert student_main.data_error(args) is None


def test_local_consortium_passes_a_reference_batch_with_a_body() -> None:
    """capc up and capc demo start their student with --reference-data when it has a body."""
    source = (Path(__file__).resolve().parents[2] / "services" / "local.py").read_text()
    assert '"--reference-data", str(reference_file)' in source
