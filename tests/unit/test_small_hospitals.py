"""Issue 56, small hospitals: the planner's advice fits a hospital's size (and points
to DP-trained teachers where partitioning cannot work), `capc task init` builds
ranges a consortium can share, and `capc up` re-checks a plan against the teacher
counts that register."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from capc.data.schema import NumericFeature, SchemaError, TableSchema
from capc.planning.sizing import (
    DP_TEACHER_COMMAND,
    MIN_RECORDS_PER_TEACHER,
    NoUsefulSigmaError,
    plan_gnmax,
    recheck,
)
from services.commands import cli
from services.commands.task_cli import public_ranges, shared_table, widened
from tests.hospital_files import breast_cancer_frame


def _plan(**kw: int | None) -> object:
    args = {
        "classes": 2,
        "hospitals": 3,
        "teachers_per_hospital": 2,
        "quorum": 2,
        "epsilon": 10.0,
        "delta": 1e-5,
        "queries": 1024,
    }
    return plan_gnmax(**{**args, **kw})  # type: ignore[arg-type]


def test_a_60_row_hospital_is_not_told_to_split_into_tiny_teachers() -> None:
    # Without its size: "use at least N teachers per hospital", as before.
    with pytest.raises(NoUsefulSigmaError, match="Use at least") as plain:
        _plan()
    assert DP_TEACHER_COMMAND not in str(plain.value)
    # With it, a 60-row hospital is pointed to one DP-trained teacher instead.
    with pytest.raises(NoUsefulSigmaError) as small:
        _plan(records_per_hospital=60)
    text = str(small.value)
    assert "partitioning cannot work" in text and DP_TEACHER_COMMAND in text
    assert "Use at least" not in text
    # A hospital large enough to fill the teachers gets the plain advice.
    with pytest.raises(NoUsefulSigmaError, match="Use at least"):
        _plan(records_per_hospital=10**6)


def test_a_plan_warns_when_its_teachers_would_be_too_small() -> None:
    plan = plan_gnmax(
        classes=2,
        hospitals=5,
        teachers_per_hospital=50,
        quorum=5,
        epsilon=10.0,
        delta=1e-5,
        queries=256,
        records_per_hospital=60,
    )
    notes = plan.size_notes()
    assert len(notes) == 1 and "about 1 records" in notes[0] and DP_TEACHER_COMMAND in notes[0]
    assert f"at most {max(60 // MIN_RECORDS_PER_TEACHER, 1)} teacher" in notes[0]
    big = plan_gnmax(
        classes=2,
        hospitals=5,
        teachers_per_hospital=50,
        quorum=5,
        epsilon=10.0,
        delta=1e-5,
        queries=256,
        records_per_hospital=50 * MIN_RECORDS_PER_TEACHER,
    )
    assert big.size_notes() == []


def test_sample_ranges_are_widened_and_public_ones_kept() -> None:
    assert widened(7.0, 24.0, 0.5) == (0.0, 33.0)  # a non-negative feature stays so
    assert widened(-10.0, -2.0, 0.5) == (-14.0, 0.0)
    assert widened(7.0, 24.0, 0.0) == (7.0, 24.0)
    schema = TableSchema((NumericFeature("a", 7.0, 24.0), NumericFeature("b", 0.0, 1.0)), "y")
    shared, notes = shared_table(schema, {"b": (0.0, 5.0)}, 0.5)
    assert shared.features == (NumericFeature("a", 0.0, 33.0), NumericFeature("b", 0.0, 5.0))
    assert len(notes) == 1 and "'COL=LOW,HIGH'" in notes[0] and ": a" in notes[0]
    with pytest.raises(ValueError, match="'c', not a numeric column"):
        shared_table(schema, {"c": (0.0, 1.0)}, 0.5)
    assert public_ranges(["mean radius=0,40"]) == {"mean radius": (0.0, 40.0)}
    for bad in ("a=1", "a=3,1", "=0,1", "a"):
        with pytest.raises(ValueError, match="--range-of takes COL=LOW,HIGH"):
            public_ranges([bad])


def test_task_init_ranges_fit_another_hospitals_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The case: ranges from one hospital's sample refused another's rows.
    frame = breast_cancer_frame()
    first, other = frame.iloc[:60], frame.iloc[60:]
    sample = tmp_path / "sample.csv"
    first.to_csv(sample, index=False)
    base = ["task", "init", "--data", str(sample), "--label", "diagnosis", "--drop", "patient_id"]
    size = ["--hospitals", "3", "--teachers-per-hospital", "3", "--quorum", "2", "--queries", "8"]

    def init(*extra: str) -> tuple[TableSchema, str]:
        out = tmp_path / "task.json"
        assert cli.main([*base, *size, "--out", str(out), *extra]) == 0
        from capc.data.schema import parse_records

        schema = parse_records(json.loads(out.read_text())["records"])
        assert isinstance(schema, TableSchema)
        return schema, capsys.readouterr().err

    def fitting(schema: TableSchema) -> int:
        """Rows of the other hospitals that lie inside every numeric range."""
        inside = np.ones(len(other), dtype=bool)
        for f in schema.features:
            if isinstance(f, NumericFeature):
                v = other[f.name].to_numpy(dtype=np.float64)
                inside &= (v >= f.low) & (v <= f.high)
        return int(inside.sum())

    narrow, _ = init("--widen", "0")
    with pytest.raises(SchemaError, match=r"--range-of '.*=LOW,HIGH'") as refused:
        narrow.encode(other, "hospital-1.csv")
    assert "re-registers the task" in str(refused.value)
    shared, warned = init()
    assert "widened by 0.5" in warned and "PUBLIC ranges" in warned
    # Widened, the sample's ranges take in far more of the other hospitals' rows.
    assert fitting(shared) > fitting(narrow) + len(other) // 4
    # The refusal's own advice, followed: public ranges (here the whole data set's, as
    # a data dictionary gives them) for each column it names, until every row fits.
    given: list[str] = []
    for _ in range(len(shared.features)):
        try:
            shared.encode(other, "hospital-1.csv")
            break
        except SchemaError as err:
            name = str(err).split("feature '", 1)[1].split("'", 1)[0]
            low, high = frame[name].min(), frame[name].max()
            given += ["--range-of", f"{name}={np.floor(low):g},{np.ceil(high):g}"]
            shared, _ = init(*given)
    assert np.isfinite(shared.encode(other, "hospital-1.csv")).all()
    # The sample's size sets the advice: 60 rows, 3 teachers of 20, is fine.
    assert "teachers gives each" not in warned


def test_capc_up_rechecks_the_plan_against_the_teachers_that_register() -> None:
    mech = {"name": "gnmax", "sigma": 40.0}
    assert recheck(mech, 10, 3, [50, 50, 50, 50, 50]) == []
    # One hospital brings a single model (the ONNX file): a round of three may
    # now hold 101 voters, below the 144-vote lead sigma 40 needs, and it carries 1 of
    # 201 votes while paying as every hospital does.
    warned = recheck(mech, 10, 3, [1, 50, 50, 50, 50])
    assert len(warned) == 2
    assert "only 101 voters" in warned[0] and "lead of 144 votes" in warned[0]
    assert "hospital-0 (1 of 201 votes)" in warned[1] and DP_TEACHER_COMMAND in warned[1]
    # Every hospital in every round: enough voters, the share warning alone.
    only_share = recheck(mech, 10, 5, [1, 50, 50, 50, 50])
    assert len(only_share) == 1 and only_share[0].startswith("hospital-0 (1 of 201")
    # Counts far below the plan: the smallest quorum's round is mostly noise.
    noisy = recheck(mech, 10, 2, [2, 2, 2])
    assert any("mostly noise" in w and "only 4 voters" in w for w in noisy)
    assert recheck({"name": "binary", "sigma": 1.0}, 2, 1, [1]) == []


def test_frames_stay_as_read() -> None:
    # breast_cancer_frame is shared by other tests: the split above copies nothing back.
    assert isinstance(breast_cancer_frame(), pd.DataFrame)
