"""The student party's training options, as the gateway and the student party read them."""

from __future__ import annotations

import typing

import pytest

from services.gateway import schemas
from services.student.training import (
    SEMI_SUPERVISED,
    STUDENT_L2,
    TrainingError,
    TrainingOptions,
)


def test_the_gateway_offers_the_student_partys_semi_supervised_modes() -> None:
    assert typing.get_args(schemas.SemiSupervised) == SEMI_SUPERVISED


def test_options_default_to_the_central_experiments_best_student() -> None:
    assert (
        TrainingOptions.parse(0.0, "") == TrainingOptions(STUDENT_L2, "none") == TrainingOptions()
    )
    assert STUDENT_L2 == 0.01
    opts = TrainingOptions.parse(0.003, "pseudo-labels")
    assert TrainingOptions.from_dict(opts.to_dict()) == opts
    with pytest.raises(TrainingError, match="semi_supervised must be one of"):
        TrainingOptions.parse(0.0, "fixmatch++")
    for bad in (-1.0, float("nan"), 1e9):
        with pytest.raises(TrainingError, match="l2 must lie"):
            TrainingOptions.parse(bad, "none")
