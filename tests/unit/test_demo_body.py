"""The demo's shipped body: made by the project's own ``capc diet pretrain``, named by its
digest, and the recorded command builds the same architecture."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
from pathlib import Path

import pytest
import torch

from capc.learning.cli import add_parser
from capc.learning.diet import BodyConfig
from capc.models import load_teacher
from capc.models.checkpoint import weights_sha256
from services.commands import demo
from services.commands.demo import SHIPPED_BODY, SHIPPED_RECORD


def pretrain(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="capc")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.handler(args))


def shrunk(command: str, out: Path, cache: Path, record: Path) -> list[str]:
    """A recorded command with a tiny pretraining (architecture untouched)."""
    words = shlex.split(command)
    assert words[:3] == ["capc", "diet", "pretrain"]
    argv = words[1:]
    for flag, value in (("--pretrain-steps", "2"), ("--pool", "64"), ("--pretrain-batch", "16")):
        argv[argv.index(flag) + 1] = value
    return [*argv, "--out", str(out), "--cache", str(cache), "--record", str(record)]


def test_a_recorded_body_names_its_command_and_digests(tmp_path: Path) -> None:
    out, record = tmp_path / "body.pt", tmp_path / "body.json"
    argv = [
        *("diet", "pretrain", "--width", "4", "--pretrain-steps", "2", "--pool", "64"),
        *("--pretrain-batch", "16", "--half", "--out", str(out), "--record", str(record)),
        *("--cache", str(tmp_path / "cache")),
    ]
    assert pretrain(argv) == 0
    rec = json.loads(record.read_text())
    assert rec["file_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    body = load_teacher(out)
    assert rec["stored_weights_sha256"] == weights_sha256(body.model.features)
    assert rec["stored"] == "float16" and rec["width"] == 4
    assert rec["command"].startswith("capc diet pretrain") and "--half" in rec["command"]
    stored = torch.load(out, weights_only=True)["state_dict"]
    assert {v.dtype for v in stored.values() if v.is_floating_point()} == {torch.float16}
    # The recorded command, rerun, makes that body again (same machine and threads).
    again = tmp_path / "again.pt"
    words = shlex.split(rec["command"])[1:]
    assert pretrain([*words, "--out", str(again), "--cache", str(tmp_path / "c2")]) == 0
    assert weights_sha256(load_teacher(again).model) == weights_sha256(body.model)


@pytest.mark.skipif(
    not SHIPPED_BODY.exists() and os.environ.get("CI") != "true",
    reason="the shipped body is not in this checkout (make demo-body)",
)
def test_the_shipped_body_is_what_its_record_says_and_its_command_builds(tmp_path: Path) -> None:
    rec = json.loads(SHIPPED_RECORD.read_text())
    assert rec["file_sha256"] == hashlib.sha256(SHIPPED_BODY.read_bytes()).hexdigest()
    assert SHIPPED_BODY.stat().st_size < 4_000_000  # a few MB in the repository
    shipped = load_teacher(SHIPPED_BODY)
    assert weights_sha256(shipped.model.features) == rec["stored_weights_sha256"]
    assert shipped.card["kind"] == "pretrained body" and "no real data" in shipped.card["data"]
    out = tmp_path / "small.pt"
    assert pretrain(shrunk(rec["command"], out, tmp_path / "cache", tmp_path / "r.json")) == 0
    small = load_teacher(out)
    assert (small.architecture, small.width, small.input_shape, small.num_classes) == (
        shipped.architecture,
        shipped.width,
        shipped.input_shape,
        shipped.num_classes,
    )
    a, b = small.model.state_dict(), shipped.model.state_dict()
    assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}


def test_a_checkout_without_the_shipped_body_pretrains_a_small_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make demo` on a clone that lacks services/assets/demo-body.pt still runs."""
    made: list[int] = []
    monkeypatch.setattr(demo, "SHIPPED_BODY", tmp_path / "missing.pt")

    def pretrained_body(config: BodyConfig, *args: object) -> str:
        made.append(config.pretrain.steps)
        return "body"

    monkeypatch.setattr(demo, "pretrained_body", pretrained_body)
    monkeypatch.setattr(demo, "save_body", lambda path, *a: path.write_bytes(b"body"))
    args = argparse.Namespace(pretrain_steps=None, body=None)
    path = demo._body(args, tmp_path, demo.Steps(6))
    assert path == tmp_path / "body.pt" and path.exists()
    assert made == [demo.QUICK_BODY.pretrain.steps]
    assert "make demo-body" in capsys.readouterr().out
