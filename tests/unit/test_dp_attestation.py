"""What a hospital attests about its teachers (services.answerer.attestation) and what
the guardian makes of it (services.guardian.budgets.attest): records read from real
teacher files' cards or ``--dp-training``, one digest per files-and-records, the DP
kind claimed only when every teacher is attested, and the guardian's charge once per
digest, refused past the party's cap, malformed attestations refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from capc.models import Teacher, save_teacher
from capc.models.ensemble import Voters
from capc.models.ensemble.files import save_checkpoints
from capc.models.registry import build
from capc.privacy.dp_training import CARD_KEY, DpTraining, plan_training
from capc.round.training import TrainingRefusedError
from services.answerer.attestation import attestation
from services.common import serde
from services.common.ledger import Ledger
from services.common.protocol import RequestError
from services.guardian import budgets
from services.proto.capc.v1 import guardian_pb2

DELTA = 1e-5


def record(epsilon: float = 2.0) -> DpTraining:
    return plan_training(epsilon, DELTA, 20, clip=1.0, records=64)


def teacher(seed: int, rec: DpTraining | None) -> Teacher:
    card: dict[str, object] = {"data": "test"}
    if rec is not None:
        card[CARD_KEY] = rec.to_dict()
    return Teacher("he-mlp", (4,), 3, build("he-mlp", (4,), 3, seed=seed), card=card, device="cpu")


def saved(path: Path, seed: int, rec: DpTraining | None) -> str:
    save_teacher(path, teacher(seed, rec))
    return str(path)


def test_a_card_record_is_attested_with_a_digest_of_the_file(tmp_path: Path) -> None:
    rec = record()
    spec = saved(tmp_path / "t.pt", 0, rec)
    first = attestation([spec], Voters.load([spec]))
    assert first is not None and first.records == (rec,)
    again = attestation([spec], Voters.load([spec]))
    assert again == first  # a restart: the same digest, charged once
    saved(tmp_path / "t.pt", 1, rec)  # retrained: other weights, the same record
    retrained = attestation([spec], Voters.load([spec]))
    assert retrained is not None and retrained.digest != first.digest


def test_the_dp_kind_needs_every_teacher_attested(tmp_path: Path) -> None:
    dp = saved(tmp_path / "dp.pt", 0, record())
    plain = saved(tmp_path / "plain.pt", 1, None)
    assert attestation([plain], Voters.load([plain])) is None
    assert attestation([dp, plain], Voters.load([dp, plain])) is None
    both = attestation([dp, dp], Voters.load([dp, dp]))
    assert both is not None and len(both.records) == 2  # two files: charged composed


def test_dp_training_attests_a_model_without_a_card(tmp_path: Path) -> None:
    plain = saved(tmp_path / "plain.pt", 1, None)
    rec = record(1.5)
    path = tmp_path / "record.json"
    path.write_text(json.dumps(rec.to_dict()))
    got = attestation([plain], Voters.load([plain]), path)
    assert got is not None and got.records == (rec,)
    dp = saved(tmp_path / "dp.pt", 0, record())
    with pytest.raises(ValueError, match="every --model carries its own"):
        attestation([dp], Voters.load([dp]), path)
    path.write_text(json.dumps({**rec.to_dict(), "sampling_rate": 0.1}))
    with pytest.raises(ValueError, match="sampling_rate"):
        attestation([plain], Voters.load([plain]), path)
    with pytest.raises(ValueError, match="no such file"):
        attestation([plain], Voters.load([plain]), tmp_path / "missing.json")


def test_a_file_whose_members_disagree_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "several.pt"
    save_checkpoints(path, [teacher(0, record(2.0)), teacher(1, record(1.0))])
    with pytest.raises(ValueError, match="different DP-training records"):
        attestation([str(path)], Voters.load([str(path)]))
    save_checkpoints(path, [teacher(0, record(2.0)), teacher(1, record(2.0))])
    got = attestation([str(path)], Voters.load([str(path)]))
    assert got is not None and got.records == (record(2.0),)  # one file: one training


def test_the_guardian_charges_an_attested_training_once(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "guardian.db"), delta=DELTA)
    ledger.register_party("h1", 5.0)
    ledger.register_party("h2", 0.5)
    spec = saved(tmp_path / "t.pt", 0, record(2.0))
    att = attestation([spec], Voters.load([spec]))
    assert att is not None
    reg = serde.register_to_proto([], 5.0, "{}", [], "", att)
    assert budgets.attest(ledger, "h1", reg) == att
    assert budgets.attest(ledger, "h1", reg) == att  # reconnected: nothing more
    assert len(ledger.trainings("h1")) == 1
    assert ledger.budget("h1").spent == pytest.approx(record(2.0).spent(DELTA), rel=1e-9)
    assert budgets.attest(ledger, "h1", guardian_pb2.Register()) is None  # ordinary
    with pytest.raises(TrainingRefusedError, match="ask the guardian's operator"):
        budgets.attest(ledger, "h2", reg)
    assert not ledger.spent_loss("h2").any()
    bad = guardian_pb2.Register()
    bad.dp_training.records_json.append("{not json")
    bad.dp_training.sha256 = att.digest
    with pytest.raises(RequestError, match="malformed DP-training attestation"):
        budgets.attest(ledger, "h1", bad)
    bad.dp_training.records_json[0] = json.dumps(record().to_dict())
    bad.dp_training.sha256 = "00"
    with pytest.raises(RequestError, match="hex"):
        budgets.attest(ledger, "h1", bad)
    entries = [e for e in ledger.audit_entries(limit=100) if e.action == "dp_training"]
    assert [e.actor for e in entries] == ["h1"]
    assert entries[0].detail["sha256"] == att.digest
    assert np.isclose(float(str(entries[0].detail["epsilon"])), record(2.0).spent(DELTA))
    assert ledger.verify_audit() > 0


def test_an_attested_party_reads_every_query_with_its_stored_statistics(tmp_path: Path) -> None:
    """DP-trained heads are trained on features read with the stored (pretrained, public)
    statistics, so an attested party reads recipes with them too; an ordinary DIET party
    reads a recipe batch with the batch's own statistics, and both read tensors stored."""
    import torch

    from capc.data.generators import Recipe
    from capc.mechanisms import from_config
    from capc.task_config import TaskConfig, config_hash
    from services.answerer.budget import OwnBudget
    from services.answerer.party import AnsweringParty
    from services.common.serde.recipes import recipe_to_proto
    from services.proto.capc.v1 import common_pb2

    model = build("small-cnn", (1, 28, 28), 10, seed=0)
    with torch.no_grad():  # statistics far from any batch's: stored and current disagree
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                assert m.running_mean is not None and m.running_var is not None
                m.running_mean.fill_(3.0)
                m.running_var.fill_(0.01)
    cnn = Teacher("small-cnn", (1, 28, 28), 10, model, card={}, device="cpu")
    recipe = Recipe("gaussian", seed=5, start=0, count=16, shape=(1, 28, 28))
    synthetic = recipe.generate()
    x = np.random.default_rng(0).random((16, 1, 28, 28)).astype(np.float32)
    stored = {"tensor": cnn.predict(x), "recipe": cnn.predict(synthetic)}
    current = cnn.predict(synthetic, current_statistics=True)
    assert (stored["recipe"] != current).any()  # the test has teeth
    mechanism = {"name": "dp-trained"}
    config = {"num_classes": 10, "input_shape": [1, 28, 28], "mechanism": mechanism}
    batches = {
        "tensor": common_pb2.QueryBatch(tensor=serde.queries_to_proto(x)),
        "recipe": common_pb2.QueryBatch(recipe=recipe_to_proto(recipe)),
    }
    header = common_pb2.Header(task="t", config_hash=config_hash(config))
    spec = saved(tmp_path / "dp.pt", 0, record())
    att = attestation([spec], Voters.load([spec]))
    assert att is not None
    want = {
        ("plain", "tensor"): stored["tensor"],
        ("plain", "recipe"): current,
        ("attested", "tensor"): stored["tensor"],
        ("attested", "recipe"): stored["recipe"],
    }
    for kind in ("plain", "attested"):
        own = OwnBudget("h", Ledger(str(tmp_path / f"{kind}.db"), delta=DELTA), 10.0)
        if kind == "attested":
            own.attest(att)
        party = AnsweringParty("h", Voters([cnn]), "127.0.0.1:9", None, own)
        task = TaskConfig.parse("t", config, config_hash(config))
        for source, batch in batches.items():
            msg = guardian_pb2.RoundWork(
                round_id=1,
                queries=batch,
                mechanism=serde.mechanism_to_proto(from_config(mechanism, 10)),
            )
            queries = serde.round_work_from_proto(msg, "h", header, task, config).queries
            if isinstance(queries, serde.RecipeQueries):
                x = serde.regenerate(queries.recipe, task.records)
                got = party._predict(task, x, party._synthetic(x))[:, 0]
            else:
                assert isinstance(queries, serde.TensorQueries)
                got = party._predict(task, queries.x, False)[:, 0]
            np.testing.assert_array_equal(got, want[kind, source], err_msg=f"{kind} {source}")
