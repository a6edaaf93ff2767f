"""``capc up``'s options and printed lines, and ``capcctl jobs submit``'s defaults,
without starting a consortium (tests/e2e/test_up.py starts one)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from capc_client.cli import build_parser as capcctl_parser

from services.cli import build_parser
from services.up import Access, first_command, own_teachers


def test_capc_up_options() -> None:
    args = build_parser().parse_args(
        ["up", "--teachers", "hospital-1=a.pt", "--teachers-per-hospital", "7", "--json"]
    )
    assert args.teachers == ["hospital-1=a.pt"] and args.teachers_per_hospital == 7
    assert args.json and args.parties == 5 and args.epsilon == 10.0 and args.queries == 1024
    defaults = build_parser().parse_args(["up"])
    assert defaults.teachers == [] and defaults.teachers_per_hospital == 50
    assert defaults.task is None and defaults.body is None


def test_own_teacher_files_are_named_hospitals_with_existing_files(tmp_path: Path) -> None:
    f = tmp_path / "t.pt"
    f.write_bytes(b"x")
    assert own_teachers([f"hospital-2={f}"], 3) == {2: f.resolve()}
    for bad in (f"hospital-3={f}", f"clinic={f}", "hospital-0", f"hospital-0={tmp_path / 'no'}"):
        with pytest.raises(SystemExit):
            own_teachers([bad], 3)


def test_the_export_line_reads_back_in_a_shell() -> None:
    access = Access("https://127.0.0.1:9", "capc_a_b", "capc_c_d", Path("/a dir/ca.pem"))
    words = shlex.split(access.export())
    assert words == [
        "export",
        "CAPC_URL=https://127.0.0.1:9",
        "CAPC_TOKEN=capc_a_b",
        "CAPC_CA=/a dir/ca.pem",
    ]


def test_the_first_command_asks_only_what_every_hospital_has_left() -> None:
    assert first_command(3201, 1024) == "capcctl jobs submit --count 1024 --wait"
    assert first_command(300, 1024) == "capcctl jobs submit --count 300 --wait"
    assert first_command(0, 1024) is None


def test_capcctl_submit_waits_and_defaults_to_a_generator_the_task_accepts() -> None:
    args = capcctl_parser().parse_args(["jobs", "submit", "--count", "1024", "--wait"])
    # No generator named: the student party picks the task's default.
    assert args.watch and args.generator is None and args.count == 1024


def test_the_default_generator_follows_the_task_records() -> None:
    from capc.data.schema import ImageSchema, NumericFeature, TableSchema
    from capc.data.table_queries import default_generator

    assert default_generator(ImageSchema(1, 28, 28)) == "gaussian"
    assert default_generator(None) == "gaussian"
    assert default_generator(TableSchema((NumericFeature("a", 0, 1),))) == "beta"
    assert capcctl_parser().parse_args(["jobs", "submit", "--count", "8", "--watch"]).watch
