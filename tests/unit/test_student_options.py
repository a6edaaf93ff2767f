"""The student party's training options, as the gateway, capcctl and the student party
read them: every semi-supervised method under its own name."""

from __future__ import annotations

import sys
import typing
from pathlib import Path

import numpy as np
import pytest
import torch

from capc.learning.semi_supervised import (
    METHOD_NAMES,
    check_method,
    fit_student_head,
    method_names,
    pseudo_label_head,
    self_train_linear,
)
from capc.models import build
from capc.models.inference import features
from services.gateway import schemas
from services.student.training import (
    DEPRECATED_SEMI_SUPERVISED,
    PRETRAINED,
    SEMI_SUPERVISED,
    STUDENT_L2,
    TrainingError,
    TrainingOptions,
)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients"))
from capc_client.cli import build_parser as capcctl_parser  # noqa: E402


def test_the_gateway_and_capcctl_offer_the_student_partys_semi_supervised_methods() -> None:
    assert typing.get_args(schemas.SemiSupervised) == SEMI_SUPERVISED
    assert (*METHOD_NAMES, *DEPRECATED_SEMI_SUPERVISED) == SEMI_SUPERVISED
    parser = capcctl_parser()
    for name in SEMI_SUPERVISED:
        args = parser.parse_args(["models", "train", "J", "--semi-supervised", name])
        assert args.semi_supervised == name
    with pytest.raises(SystemExit):
        parser.parse_args(["models", "train", "J", "--semi-supervised", "mixmatch"])


def test_options_default_to_the_central_experiments_best_student() -> None:
    assert (
        TrainingOptions.parse(0.0, "", PRETRAINED)
        == TrainingOptions(STUDENT_L2, "none")
        == TrainingOptions()
    )
    assert STUDENT_L2 == 0.01
    opts = TrainingOptions.parse(0.003, "pseudo-label-head", PRETRAINED)
    assert TrainingOptions.from_dict(opts.to_dict(), PRETRAINED) == opts
    assert opts.to_dict() == {"l2": 0.003, "semi_supervised": "pseudo-label-head"}
    for bad in (-1.0, float("nan"), 1e9):
        with pytest.raises(TrainingError, match="l2 must lie"):
            TrainingOptions.parse(bad, "none", PRETRAINED)


def test_pseudo_label_head_and_fixmatch_are_distinct_options_for_distinct_students() -> None:
    # One name, one algorithm: the last-layer variant and whole-model FixMatch each have
    # their own, and neither is taken by the other kind of student.
    head = TrainingOptions.parse(0.0, "pseudo-label-head", PRETRAINED)
    scratch = TrainingOptions.parse(0.0, "fixmatch", "small-cnn")
    assert head.semi_supervised != scratch.semi_supervised
    assert not head.deprecated and not scratch.deprecated
    assert method_names("last layer") == ("none", "self-training", "pseudo-label-head")
    assert method_names("whole model") == ("none", "fixmatch")
    assert check_method("pseudo-label-head", "last layer") == "pseudo-label-head"
    with pytest.raises(ValueError, match="takes none, self-training, pseudo-label-head"):
        check_method("fixmatch", "last layer")
    with pytest.raises(ValueError, match="takes none, fixmatch"):
        check_method("pseudo-label-head", "whole model")


def test_an_unknown_method_is_refused_naming_every_choice() -> None:
    with pytest.raises(TrainingError) as err:
        TrainingOptions.parse(0.0, "fixmatch++", PRETRAINED)
    assert "semi_supervised must be one of" in str(err.value) and "'fixmatch++'" in str(err.value)
    for name in SEMI_SUPERVISED:
        assert name in str(err.value)
    with pytest.raises(
        ValueError, match="unknown semi-supervised method 'mixmatch'; choose one of"
    ):
        check_method("mixmatch", "last layer")


@pytest.mark.parametrize(
    ("architecture", "method"), [(PRETRAINED, "pseudo-label-head"), ("small-cnn", "fixmatch")]
)
def test_the_deprecated_name_is_read_as_what_it_meant_and_says_so(
    architecture: str, method: str
) -> None:
    opts = TrainingOptions.parse(0.0, "pseudo-labels", architecture)
    assert opts.semi_supervised == method
    assert '"pseudo-labels" is deprecated' in opts.deprecated
    assert f'read as "{method}"' in opts.deprecated
    assert '"pseudo-label-head"' in opts.deprecated and '"fixmatch"' in opts.deprecated
    # What the response carries, and a request stored under the old name before a restart.
    assert opts.to_dict()["deprecated"] == opts.deprecated
    assert TrainingOptions.from_dict(opts.to_dict(), architecture) == opts
    stored = {"l2": STUDENT_L2, "semi_supervised": "pseudo-labels"}
    assert TrainingOptions.from_dict(stored, architecture) == opts


def test_one_head_trainer_runs_the_method_each_name_says() -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 240)
    x = (rng.random((240, 1, 8, 8)) * 0.3).astype(np.float32)
    for c in range(3):
        x[y == c, :, c * 2 : c * 2 + 3] += 0.7
    body = build("small-cnn", (1, 8, 8), 3, width=4, seed=0).eval()
    f = features(body, x, current_statistics=True, batch=80)
    labels = np.where(np.arange(240) % 4 == 0, y, -1)  # a quarter answered
    seen = labels >= 0

    def weights(head: torch.nn.Module) -> torch.Tensor:
        w: torch.Tensor = head.state_dict()["1.weight"]
        return w

    fitted = {
        m: fit_student_head(m, body, f, labels, x, 3, batch=80, l2=0.01, seed=1)
        for m in method_names("last layer")
    }
    assert torch.allclose(
        weights(fitted["self-training"]), weights(self_train_linear(f, labels, 3, l2=0.01))
    )
    plh = pseudo_label_head(body, f[seen], y[seen], x[~seen], 3, batch=80, l2=0.01, seed=1)
    assert torch.allclose(weights(fitted["pseudo-label-head"]), weights(plh))
    # three names, three different heads
    heads = list(fitted.values())
    for i in range(3):
        for j in range(i + 1, 3):
            assert not torch.allclose(weights(heads[i]), weights(heads[j]))
    with pytest.raises(ValueError, match="does not train a last layer"):
        fit_student_head("fixmatch", body, f, labels, x, 3, batch=80)
    with pytest.raises(ValueError, match="takes classes, not labels"):
        fit_student_head(
            "self-training", body, f, np.zeros((240, 3), dtype=np.int64), x, 3, batch=80
        )


def test_own_weight_is_an_integer_in_range_everywhere_it_is_read() -> None:
    """The CaPC loop's own_weight: the student party's parse, the gateway's schema and
    capcctl each take an integer 1..16 (0 on the wire: the default) and refuse the rest
    saying what is allowed."""
    from pydantic import ValidationError

    from services.common.limits import MAX_OWN_WEIGHT

    assert MAX_OWN_WEIGHT == 16
    assert TrainingOptions.parse(0.0, "", PRETRAINED, 0) == TrainingOptions()
    four = TrainingOptions.parse(0.0, "", PRETRAINED, 4)
    assert four.own_weight == 4 and four.to_dict() == {
        "l2": STUDENT_L2,
        "semi_supervised": "none",
        "own_weight": 4,
    }
    assert TrainingOptions.from_dict(four.to_dict(), PRETRAINED) == four
    # A model stored before the option existed reads as weight 1, and 1 is not stored.
    assert TrainingOptions.from_dict({"l2": STUDENT_L2, "semi_supervised": "none"}, PRETRAINED) == (
        TrainingOptions()
    )
    assert "own_weight" not in TrainingOptions.parse(0.0, "", PRETRAINED, 1).to_dict()
    for bad in (17, -1, 1000):
        with pytest.raises(TrainingError, match=r"own_weight must lie in \[1, 16\].*got"):
            TrainingOptions.parse(0.0, "", PRETRAINED, bad)
    for bad_type in (2.5, True, "4"):
        with pytest.raises(TrainingError, match="own_weight must be an integer"):
            TrainingOptions.parse(0.0, "", PRETRAINED, bad_type)  # type: ignore[arg-type]
    assert schemas.ModelCreate.model_validate({"job_ids": [], "own_weight": 16}).own_weight == 16
    for bad_json in (0, 17, 2.5, "4", True):
        with pytest.raises(ValidationError, match="own_weight"):
            schemas.ModelCreate.model_validate({"job_ids": [], "own_weight": bad_json})
    parser = capcctl_parser()
    assert parser.parse_args(["models", "train", "J", "--own-weight", "4"]).own_weight == 4
    assert (
        parser.parse_args(["loop", "run", "--records", "r.npz", "--own-weight", "4"]).own_weight
        == 4
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["models", "train", "J", "--own-weight", "2.5"])
