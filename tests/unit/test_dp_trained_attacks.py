"""Attacks on "a dp-trained round releases only post-processing of DP-trained models,
and each honest hospital's loss is its training charge (plus the ordinary rounds it
answered)". Each test fails if its attack works.

- a deviating student's job overrides cannot switch a noisy mechanism's noise off, nor
  a noise-free one's on, nor rename the mechanism; every mechanism that charges nothing
  per answer is one the services restrict to attested parties (they check the flag);
- a record that lies about its epsilon is charged by its noise and steps;
- a training charged in a party's SQL ledger survives a crash before its Register (the
  next start charges nothing more, the spend still holds it); the same record with
  other file bytes is charged again (an over-count, never an under-count);
- an attested party reads no stored BatchNorm statistics, which may be fitted on its
  records outside the DP-SGD accounting: a table teacher holding BatchNorm (stored
  statistics read for every table query) is refused at start, and so is a
  standardising head, which falls back to its stored statistics on a one-query batch.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from capc.mechanisms import MechanismError, from_config
from capc.mechanisms.registry import MECHANISMS
from capc.models import Teacher
from capc.models.ensemble import Voters
from capc.models.heads import standardised_head
from capc.models.inference import logits
from capc.models.registry import build
from capc.privacy import accountants
from capc.privacy.dp_training import CARD_KEY, DpTraining, plan_training
from capc.round.training import Attestation, file_digest
from capc.task_config import TaskConfig, TaskError, config_hash
from services.answerer.attestation import attestation
from services.answerer.ledger_port import SqlPartyLedger
from services.common.ledger import Ledger

DELTA = 1e-5
NAME = "hospital-a"
GDP = accountants.make(accountants.DEFAULT_ACCOUNTANT)


def task(mechanism: dict[str, object]) -> TaskConfig:
    cfg: dict[str, object] = {"num_classes": 3, "input_shape": [2], "mechanism": mechanism}
    return TaskConfig.parse("t", cfg, config_hash(cfg))


def attested(rec: DpTraining, file: bytes = b"\x01" * 32) -> Attestation:
    return Attestation((rec,), file_digest([file], [rec]))


# -- a deviating student's job ---------------------------------------------------------


def test_a_job_cannot_switch_a_mechanisms_noise_off_or_on() -> None:
    gnmax = task({"name": "gnmax", "sigma": 4.0})
    # 0 means "keep the task's": the round stays noisy.
    kept = gnmax.tightened({"sigma": 0.0}).mechanism
    assert kept.params.model_dump()["sigma"] == 4.0
    with pytest.raises(TaskError, match="below the task's"):
        gnmax.tightened({"sigma": 1e-300})
    free = task({"name": "dp-trained"})
    with pytest.raises(TaskError):
        free.tightened({"sigma": 1.0})
    # A job's mechanism is the task's: neither dp-trained for a noisy task nor the reverse.
    with pytest.raises(TaskError, match="cannot run dp-trained"):
        gnmax.running(free.mechanism)
    with pytest.raises(TaskError, match="cannot run gnmax"):
        free.running(gnmax.mechanism)


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_only_flagged_mechanisms_can_be_configured_noise_free(name: str) -> None:
    """Services leave unattested parties out by the flag, never a name: a mechanism that
    accepts all its noise at 0 (a free, unnoised answer) must carry it."""
    cls = MECHANISMS[name]
    fields = cls.params_model.model_fields
    noise = {k: 0.0 for k in fields if k.startswith("sigma")}
    if not noise:
        pytest.skip(f"{name} has no noise parameter")
    try:
        mech = from_config({"name": name, **noise}, 3)
    except MechanismError:
        assert not cls.trained_teachers_only
        return
    assert cls.trained_teachers_only, f"{name} runs with zero noise but is not flagged"
    assert not GDP.filter_cost(mech.worst_case(1, 1.0)).any()


# -- the charge ------------------------------------------------------------------------


def test_a_lying_record_is_charged_by_its_noise_and_steps(tmp_path: Path) -> None:
    honest = plan_training(8.0, DELTA, 300, clip=1.0, records=100)
    # Claims epsilon 0.01 (and another delta): the charge ignores both.
    lying = DpTraining.from_dict({**honest.to_dict(), "epsilon": 0.01, "delta": 1e-9})
    sql = Ledger(str(tmp_path / "own.db"), delta=DELTA)
    sql.register_party(NAME, 10.0, actor=NAME)
    charge = SqlPartyLedger(sql, NAME).charge_training(attested(lying))
    want = GDP.filter_cost(honest.event())
    np.testing.assert_allclose(sql.spent_loss(NAME), want, rtol=1e-12)
    assert charge.epsilon == pytest.approx(honest.spent(DELTA), rel=1e-9)
    assert charge.epsilon > 7.0
    # Many steps under much noise: the charge is sqrt(T)/sigma's, however the record says.
    huge = DpTraining.from_dict(
        {**honest.to_dict(), "noise_multiplier": 1e6, "steps": 10**12, "epsilon": 0.01}
    )
    mu = 2 * math.sqrt(10**12) / 1e6
    assert huge.mu == pytest.approx(mu)
    other = Ledger(str(tmp_path / "other.db"), delta=DELTA)
    other.register_party(NAME, 10.0, actor=NAME)
    c = SqlPartyLedger(other, NAME).charge_training(attested(huge))
    assert c.epsilon == pytest.approx(huge.spent(DELTA), rel=1e-6)


def test_a_crash_between_charge_and_register_over_counts_never_under(tmp_path: Path) -> None:
    path = str(tmp_path / "own.db")
    rec = plan_training(2.0, DELTA, 50, clip=1.0, records=100)
    first = Ledger(path, delta=DELTA)
    first.register_party(NAME, 10.0, actor=NAME)
    assert SqlPartyLedger(first, NAME).charge_training(attested(rec)).charged
    charged = first.spent_loss(NAME).copy()
    del first  # the process dies before its Register: nothing else is written
    again = Ledger(path, delta=DELTA)
    restart = SqlPartyLedger(again, NAME).charge_training(attested(rec))
    assert not restart.charged
    np.testing.assert_allclose(again.spent_loss(NAME), charged, rtol=1e-12)
    # The same training saved again (other bytes): charged again, an over-count.
    other = SqlPartyLedger(again, NAME).charge_training(attested(rec, b"\x02" * 32))
    assert other.charged
    assert (again.spent_loss(NAME) > charged).all()


# -- what an attested party reads ------------------------------------------------------


def carded(arch: str, shape: tuple[int, ...], rec: DpTraining) -> Teacher:
    model = build(arch, shape, 3, seed=0)
    return Teacher(arch, shape, 3, model, card={CARD_KEY: rec.to_dict()}, device="cpu")


def test_an_attested_table_teacher_with_batchnorm_is_refused(tmp_path: Path) -> None:
    """A table query is read with stored statistics; a BatchNorm's would be the records'."""
    from capc.models import save_teacher

    rec = plan_training(2.0, DELTA, 20, clip=1.0, records=64)
    mlp = build("mlp", (4,), 3, seed=0)
    assert any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in mlp.modules())
    t = Teacher("mlp", (4,), 3, mlp, card={CARD_KEY: rec.to_dict()}, device="cpu")
    spec = str(tmp_path / "mlp.pt")
    save_teacher(Path(spec), t)
    with pytest.raises(ValueError, match="BatchNorm"):
        attestation([spec], Voters.load([spec]))


def test_an_attested_standardising_head_is_refused(tmp_path: Path) -> None:
    """A standardising head falls back to its stored statistics on a one-query batch, even
    under current statistics: they would be the records' features'."""
    from capc.models import save_teacher

    rec = plan_training(2.0, DELTA, 20, clip=1.0, records=64)
    model = build("small-cnn", (1, 28, 28), 3, seed=0)
    model.head = standardised_head(model.dim, 3)  # type: ignore[assignment]
    with torch.no_grad():
        model.head[0].running_mean.fill_(5.0)  # type: ignore[index]
    t = Teacher("small-cnn", (1, 28, 28), 3, model, card={CARD_KEY: rec.to_dict()}, device="cpu")
    x = np.random.default_rng(0).random((1, 1, 28, 28)).astype(np.float32)
    spec = str(tmp_path / "cnn.pt")
    save_teacher(Path(spec), t)
    voters = Voters.load([spec])
    # The attack's teeth: one query under "current statistics" reads the stored ones.
    member = voters.members[0]
    assert isinstance(member, Teacher)
    norm = member.model.head[0]  # type: ignore[index]
    outs = []
    for mean in (5.0, -5.0):
        with torch.no_grad():
            norm.running_mean.fill_(mean)
        outs.append(logits(member.model, x, current_statistics=True))
    assert not torch.allclose(outs[0], outs[1])
    with pytest.raises(ValueError, match="standardising head"):
        attestation([spec], voters)


def test_an_attested_image_teacher_without_stored_statistics_is_kept(tmp_path: Path) -> None:
    """The refusal above leaves alone a teacher with no stored statistics; an image
    teacher with BatchNorm that the DP fit did not write is refused, as every query of an
    attested party reads the stored statistics."""
    from capc.models import save_teacher

    rec = plan_training(2.0, DELTA, 20, clip=1.0, records=64)
    for arch, shape, kept in (("he-mlp", (4,), True), ("small-cnn", (1, 28, 28), False)):
        t = carded(arch, shape, rec)
        spec = str(tmp_path / f"{arch}.pt")
        save_teacher(Path(spec), t)
        if kept:
            assert attestation([spec], Voters.load([spec])) is not None
        else:
            with pytest.raises(ValueError, match="BatchNorm"):
                attestation([spec], Voters.load([spec]))


def test_a_teacher_retrained_while_it_loads_leaves_no_training_uncharged(
    tmp_path: Path,
) -> None:
    """The answerer loads v1, then the file becomes v2 (a retrain with the same record)
    before it is hashed. v1 answers; v2 answers after a restart. Each must be charged:
    had the first start charged v2's digest, the restart would charge nothing and v1's
    training would never be counted."""
    from capc.models import save_teacher

    rec = plan_training(2.0, DELTA, 20, clip=1.0, records=64)
    spec = tmp_path / "t.pt"
    save_teacher(spec, carded("he-mlp", (4,), rec))
    v1 = Voters.load([str(spec)])
    v2_teacher = carded("he-mlp", (4,), rec)
    with torch.no_grad():
        for p in v2_teacher.model.parameters():
            p.add_(1.0)
    save_teacher(spec, v2_teacher)  # rewritten before the first start hashed it
    first = attestation([str(spec)], v1)
    restart = attestation([str(spec)], Voters.load([str(spec)]))
    assert first is not None and restart is not None
    assert first.digest != restart.digest
    sql = Ledger(str(tmp_path / "own.db"), delta=DELTA)
    sql.register_party(NAME, 10.0, actor=NAME)
    port = SqlPartyLedger(sql, NAME)
    assert port.charge_training(first).charged
    assert port.charge_training(restart).charged


def test_pate_fm_refuses_the_noise_free_mechanism_for_its_ordinary_teachers() -> None:
    """PATE-FM's teachers are heads fitted on the records without DP-SGD: dp-trained there
    would release their plain argmax and report epsilon 0."""
    from capc.labeldp import pate_fm

    config = pate_fm.PateFmConfig(epsilon=1.0, mechanism={"name": "dp-trained"}, teachers=5)
    with pytest.raises(ValueError, match="only for teachers trained with DP-SGD"):
        pate_fm.mechanism(config, 3)
    noisy = pate_fm.PateFmConfig(epsilon=1.0, mechanism={"name": "gnmax", "sigma": 4.0})
    assert pate_fm.mechanism(noisy, 3).name == "gnmax"


def test_an_attested_image_ensemble_on_a_batchnorm_body_is_kept(tmp_path: Path) -> None:
    """A DIET ensemble (a BatchNorm body, per-teacher statistics, linear heads) answers
    image queries with the batch's own statistics: the refusal leaves it alone."""
    from capc.models.ensemble import TeacherEnsemble, save_ensemble
    from capc.models.ensemble.shared_body import statistics_of

    rec = plan_training(2.0, DELTA, 20, clip=1.0, records=64)
    body = build("small-cnn", (1, 28, 28), 3, seed=0)
    dim = body.dim
    ensemble = TeacherEnsemble(
        "small-cnn",
        (1, 28, 28),
        3,
        body,
        [statistics_of(body), statistics_of(body)],
        torch.zeros((2, 3, dim)),
        torch.zeros((2, 3)),
        card={CARD_KEY: rec.to_dict()},
        device="cpu",
    )
    spec = tmp_path / "ensemble.pt"
    save_ensemble(spec, ensemble)
    att = attestation([str(spec)], Voters.load([str(spec)]))
    assert att is not None and att.records == (rec,)


def test_dp_sgd_refuses_a_frozen_batchnorm() -> None:
    """Opacus validates trainable modules only; a frozen BatchNorm in training mode mixes
    the records through its batch statistics and stores theirs in the model."""
    from capc.learning import dp_sgd
    from capc.privacy.randomness import SecureRandom

    norm = torch.nn.BatchNorm1d(8)
    first = torch.nn.Linear(4, 8)
    model = torch.nn.Sequential(first, norm, torch.nn.Linear(8, 3))
    for p in [*first.parameters(), *norm.parameters()]:
        p.requires_grad_(False)
    assert norm.running_mean is not None
    before = norm.running_mean.clone()
    rng = np.random.default_rng(0)
    x = rng.random((32, 4)).astype(np.float32)
    y = rng.integers(0, 3, 32).astype(np.int64)
    rec = plan_training(2.0, DELTA, 3, clip=1.0, records=32)
    with pytest.raises(ValueError, match="BatchNorm"):
        dp_sgd.train(model, x, y, rec, lr=0.1, rng=SecureRandom.from_seed(0))
    assert torch.equal(norm.running_mean, before)


def test_dp_sgd_refuses_an_instance_norm_tracking_running_statistics() -> None:
    """InstanceNorm normalises each record by its own statistics, but with
    track_running_stats it stores the records' average in the model and reads it at
    inference: outside the training's charge."""
    from capc.learning import dp_sgd
    from capc.privacy.randomness import SecureRandom

    rng = np.random.default_rng(0)
    x = rng.random((16, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, 16).astype(np.int64)
    rec = plan_training(2.0, DELTA, 2, clip=1.0, records=16)
    for tracked in (True, False):
        model = torch.nn.Sequential(
            torch.nn.Conv2d(1, 4, 3),
            torch.nn.InstanceNorm2d(4, track_running_stats=tracked),
            torch.nn.Flatten(),
            torch.nn.Linear(4 * 6 * 6, 3),
        )
        if tracked:
            with pytest.raises(ValueError, match="track_running_stats"):
                dp_sgd.train(model, x, y, rec, lr=0.1, rng=SecureRandom.from_seed(0))
        else:  # per-record statistics only: trained
            dp_sgd.train(model, x, y, rec, lr=0.1, rng=SecureRandom.from_seed(0))


def test_an_attested_instance_norm_with_running_statistics_is_refused() -> None:
    """An InstanceNorm tracking running statistics reads the stored ones at every query,
    image or not."""
    from services.answerer.attestation import stored_statistics

    rec = plan_training(2.0, DELTA, 20, clip=1.0, records=64)
    plain = carded("he-cnn", (1, 28, 28), rec)
    assert stored_statistics(Voters([plain])) is None
    tracked = carded("he-cnn", (1, 28, 28), rec)
    tracked.model.add_module("norm", torch.nn.InstanceNorm2d(4, track_running_stats=True))
    why = stored_statistics(Voters([tracked]))
    assert why is not None and "InstanceNorm" in why
