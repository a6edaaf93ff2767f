"""``capc up``'s options and printed lines, and ``capcctl jobs submit``'s defaults,
without starting a consortium (tests/e2e/test_up.py starts one)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import numpy as np
import pytest
from capc_client.cli import build_parser as capcctl_parser

from services.commands.cli import build_parser
from services.commands.demo import shipped_body
from services.commands.up import Access, first_command, loop_plan, own_teachers


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


def _up(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["up", "--parties", "3", *argv])


def test_loop_options_are_refused_unless_complete(tmp_path: Path) -> None:
    from services.commands.up import config_of, planned_task

    task = config_of(planned_task(30, 10.0, 256))
    own, test = tmp_path / "own.npz", tmp_path / "test.npz"
    x = np.zeros((4, 1, 28, 28), dtype=np.float32)
    np.savez(own, x=x, y=np.array([0, 1, 2, 3]))
    np.savez(test, x=x, y=np.array([4, 5, 6, 7]))
    assert loop_plan(_up(), task) is None
    plan = loop_plan(
        _up("--loop", "hospital-2", "--own-data", str(own), "--own-test", str(test)), task
    )
    assert plan is not None and plan.hospital == 2 and plan.querier == "hospital-2-querier"
    assert plan.own[1].tolist() == [0, 1, 2, 3] and plan.test[0].shape == (4, 1, 28, 28)
    for bad in (
        ["--loop", "hospital-3", "--own-data", str(own), "--own-test", str(test)],
        ["--loop", "hospital-0", "--own-data", str(own)],
        ["--own-data", str(own), "--own-test", str(test)],
        ["--loop", "hospital-0", "--own-data", str(tmp_path / "no.npz"), "--own-test", str(test)],
        [
            "--loop",
            "hospital-0",
            "--own-data",
            str(test.with_suffix(".txt")),
            "--own-test",
            str(test),
        ],
    ):
        with pytest.raises(SystemExit):
            loop_plan(_up(*bad), task)
    np.savez(own, x=x + 2.0, y=np.array([0, 1, 2, 3]))  # pixels out of the task's range
    with pytest.raises(SystemExit, match="own-data"):
        loop_plan(
            _up("--loop", "hospital-0", "--own-data", str(own), "--own-test", str(test)), task
        )


def test_a_task_on_other_inputs_needs_its_own_data_and_teachers() -> None:
    from services.commands.up import config_of, student_data

    config = {
        "num_classes": 2,
        "input_shape": [3, 32, 32],
        "mechanism": {"name": "gnmax", "sigma": 4.0},
    }
    with pytest.raises(SystemExit, match="--test-data, --reference-data, --teachers hospital-0"):
        student_data(_up(), config_of(config), {})


def test_a_table_task_runs_without_a_body_or_reference_batch() -> None:
    from services import tasks
    from services.commands.up import body_path, config_of, student_data

    table = config_of(tasks.load("breast-cancer"))
    # A table's student is an MLP from scratch: no reference batch is asked for.
    with pytest.raises(SystemExit, match=r"give --test-data, --teachers hospital-0"):
        student_data(_up(), table, {})
    assert body_path(_up(), table) is None
    with pytest.raises(SystemExit, match=r"image body.*table rows of 30 features.*without --body"):
        body_path(_up("--body", "body.pt"), table)
    # An image task keeps the shipped body unless given one.
    images = config_of(
        {
            "num_classes": 10,
            "input_shape": [1, 28, 28],
            "mechanism": {"name": "gnmax", "sigma": 4.0},
        }
    )
    assert body_path(_up(), images) == shipped_body()[0]
    assert body_path(_up("--body", "body.pt"), images) == Path("body.pt")
    # Images of another shape: the shipped body cannot read them.
    other = config_of(
        {"num_classes": 2, "input_shape": [3, 32, 32], "mechanism": {"name": "gnmax", "sigma": 4.0}}
    )
    with pytest.raises(SystemExit, match=r"takes 1x28x28 images, the task's are 3x32x32"):
        body_path(_up(), other)
    assert body_path(_up("--body", "body.pt"), other) == Path("body.pt")


def test_the_loop_block_prints_after_the_consortium_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from services.commands.up import LOOP_COMMAND, LoopAccess, print_report

    access = Access("https://127.0.0.1:9", "capc_a_b", "capc_c_d", Path("/pki/ca.pem"))
    loop = LoopAccess(
        "hospital-0", "https://127.0.0.1:10", "capc_e_f", Path("/pki/ca.pem"), "capc_g_h", 300
    )
    summary = {
        "description": "task images",
        "queries_left": {"hospital-0": 5},
        "command": "capcctl jobs submit --count 5 --wait",
        "loop": loop.summary(),
    }
    print_report(_up(), None, access, summary)  # type: ignore[arg-type]
    lines = capsys.readouterr().out.splitlines()
    assert lines[-4].startswith("# hospital-0's CaPC loop: its own gateway; the other ")
    assert "cover 300 more queries" in lines[-4]
    # Its operator gets the admin view of its own gateway (budget, ledger, dashboard).
    assert lines[-3].endswith("/dashboard): CAPC_TOKEN=capc_g_h")
    assert lines[-2:] == [
        "export CAPC_URL=https://127.0.0.1:10 CAPC_TOKEN=capc_e_f CAPC_CA=/pki/ca.pem",
        LOOP_COMMAND,
    ]
    assert set(loop.summary()) == {
        "hospital",
        "url",
        "token",
        "ca",
        "export",
        "command",
        "admin_token",
        "dashboard",
        "queries_left",
    }


def test_a_checkpoints_file_of_several_teachers_is_counted_as_them(tmp_path: Path) -> None:
    from capc.models import Teacher, build
    from capc.models.ensemble import save_checkpoints
    from services.commands.up import teacher_counts

    teachers = [Teacher("mlp", (30,), 2, build("mlp", (30,), 2, None)) for _ in range(3)]
    path = tmp_path / "hospital.pt"
    save_checkpoints(path, teachers)
    assert teacher_counts({1: path}, 3, 10) == [10, 3, 10]


def test_a_code_model_is_refused_before_it_runs(tmp_path: Path) -> None:
    """capc up runs every hospital with its own rights: a TorchScript file is code."""
    from services.commands.up import teacher_counts
    from tests.e2e.own_models import export_thief

    secret, target = tmp_path / "ca.key", tmp_path / "planted"
    secret.write_bytes(b"CA KEY")
    target.write_bytes(b"......")
    evil = export_thief(secret, target, tmp_path / "hospital.ts")
    with pytest.raises(SystemExit, match="capc checkpoints and ONNX files only"):
        teacher_counts({0: evil}, 3, 10)
    assert target.read_bytes() == b"......"


def test_the_loop_lowers_the_planned_quorum_and_refuses_a_task_files() -> None:
    from services.commands.up import loop_quorum

    task = {"quorum": 3, "num_classes": 10}
    assert loop_quorum(task, _up("--loop", "hospital-0"))["quorum"] == 2
    assert loop_quorum(task, _up("--parties", "5", "--loop", "hospital-0")) is task
    with pytest.raises(SystemExit, match="quorum of 3"):
        loop_quorum(task, _up("--loop", "hospital-0", "--task", "t.json"))


def test_with_a_loop_the_first_command_leaves_most_of_the_caps_for_it() -> None:
    # Issue 56: `capc up --loop` suggested `--count 512`, the whole cap, and the
    # loop that followed ran out of budget half way.
    assert first_command(512, 1024, loop=True) == "capcctl jobs submit --count 128 --wait"
    assert first_command(3, 1024, loop=True) is None
    assert first_command(512, 1024) == "capcctl jobs submit --count 512 --wait"


def test_a_table_task_is_named_by_its_file_not_the_wire_name_images() -> None:
    import json

    from services.commands.up import describe, task_label

    path = Path(__file__).parents[2] / "services" / "tasks" / "breast-cancer.json"
    task = json.loads(path.read_text())
    line = describe(task, [3, 3], 10.0, 100, task_label(_up("--task", str(path))))
    assert line.startswith("task breast-cancer (table rows of 30 features): gnmax")
    assert "task images" not in line
    assert task_label(_up()) == "images"


def test_a_torchscript_teacher_takes_the_given_task_instead_of_a_traceback(
    tmp_path: Path,
) -> None:
    # Issue 56: `capc up --task T --teachers hospital-0=model.ts` crashed with a
    # ValueError telling the user to pass --task, which was given.
    import torch

    from services.commands.up import interface_of, teacher_counts
    from tests.e2e.own_models import export_torchscript

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
    path = export_torchscript(model, (1, 28, 28), tmp_path / "model.ts")
    task = Path(__file__).parents[2] / "services" / "tasks" / "images.json"
    args = _up("--task", str(task), "--teachers", f"hospital-0={path}")
    own = own_teachers(args.teachers, 3)
    try:
        counts = teacher_counts(own, 3, 7, interface_of(args))
    except SystemExit as refused:
        # A build where TorchScript needs an explicit trust flag refuses it: by name,
        # without a traceback, and without asking for the --task that was given.
        assert "hospital-0" in str(refused) and "--task" not in str(refused)
    else:
        assert counts == [1, 7, 7]
    bad = tmp_path / "bad.ts"
    bad.write_bytes(b"not a model")
    with pytest.raises(SystemExit, match="hospital-0's teacher file"):
        teacher_counts({0: bad}, 3, 7, interface_of(args))


def test_json_keeps_the_progress_lines_quiet(tmp_path: Path) -> None:
    from services.commands.up import consortium

    quiet = consortium(_up("--json", "--dir", str(tmp_path / "a")))[0]
    talking = consortium(_up("--dir", str(tmp_path / "b")))[0]
    assert quiet.progress is False and talking.progress is True
    # Nothing was started or fitted by building them.
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
