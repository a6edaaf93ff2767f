"""A hospital's own model as a teacher: ONNX, TorchScript and module:factory predict what
the PyTorch model they came from predicts, and every way of getting one wrong is a
ValueError that names the file and what to do."""

from __future__ import annotations

import hashlib
import shlex
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from capc.models.ensemble import Voters, load_members
from capc.models.foreign import CodeModelRefusedError, ForeignTeacher, Interface, sniff
from services.commands.cli import build_parser
from tests.e2e.own_models import OwnNet, export_onnx, export_thief, export_torchscript, own_net

SHAPE, CLASSES = (4,), 3
LIGHT = Interface("light", SHAPE, CLASSES)
FACTORY = "tests.e2e.own_models:own_net"


@pytest.fixture(scope="module")
def model() -> nn.Module:
    torch.manual_seed(0)
    return own_net().eval()


@pytest.fixture
def queries() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((11, *SHAPE)).astype(np.float32)


def reference(model: nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(x)).argmax(1).numpy()  # type: ignore[no-any-return]


def weights(model: nn.Module, path: Path) -> Path:
    torch.save(model.state_dict(), path)
    return path


def test_onnx_predicts_as_the_torch_model(
    model: nn.Module, queries: np.ndarray, tmp_path: Path
) -> None:
    t = load_members(export_onnx(model, SHAPE, tmp_path / "m.onnx"))
    assert isinstance(t, ForeignTeacher)
    assert (t.architecture, t.input_shape, t.num_classes, t.batch) == ("onnx", SHAPE, 3, None)
    assert np.array_equal(t.predict(queries), reference(model, queries))
    # The hash is what sha256sum prints for the file.
    assert t.model_hash == hashlib.sha256((tmp_path / "m.onnx").read_bytes()).hexdigest()


def test_onnx_with_a_fixed_batch_is_chunked_and_padded(
    model: nn.Module, queries: np.ndarray, tmp_path: Path
) -> None:
    t = load_members(export_onnx(model, SHAPE, tmp_path / "f.onnx", fixed_batch=4))
    assert isinstance(t, ForeignTeacher) and t.batch == 4
    # 11 queries: two full passes and one padded with a row of zeros.
    assert np.array_equal(t.predict(queries), reference(model, queries))


def test_torchscript_predicts_as_the_torch_model(
    model: nn.Module, queries: np.ndarray, tmp_path: Path
) -> None:
    t = load_members(export_torchscript(model, SHAPE, tmp_path / "m.ts"), LIGHT, trust_code=True)
    assert isinstance(t, ForeignTeacher)
    assert (t.architecture, t.num_classes) == ("torchscript", 3)
    assert np.array_equal(t.predict(queries), reference(model, queries))


def test_module_factory_predicts_as_the_torch_model(
    model: nn.Module, queries: np.ndarray, tmp_path: Path
) -> None:
    w = weights(model, tmp_path / "w.pt")
    t = load_members(f"{FACTORY}@{w}", LIGHT, trust_code=True)
    assert isinstance(t, ForeignTeacher)
    assert t.architecture == "module:tests.e2e.own_models:own_net"
    assert t.model_hash == hashlib.sha256(w.read_bytes()).hexdigest()
    assert np.array_equal(t.predict(queries), reference(model, queries))


def test_files_are_told_apart_by_content_not_suffix(model: nn.Module, tmp_path: Path) -> None:
    onnx = export_onnx(model, SHAPE, tmp_path / "looks-like-a-checkpoint.pt")
    ts = export_torchscript(model, SHAPE, tmp_path / "looks-like.onnx")
    ckpt = weights(model, tmp_path / "state.onnx")
    assert (sniff(onnx), sniff(ts), sniff(ckpt)) == ("onnx", "torchscript", "checkpoint")
    first, second = load_members(onnx), load_members(ts, LIGHT, trust_code=True)
    assert isinstance(first, ForeignTeacher) and isinstance(second, ForeignTeacher)
    assert first.architecture == "onnx" and second.architecture == "torchscript"


def test_multi_label_votes_every_positive_score(
    model: nn.Module, queries: np.ndarray, tmp_path: Path
) -> None:
    want = Interface("attributes", SHAPE, CLASSES, multi_label=True)
    t = load_members(export_onnx(model, SHAPE, tmp_path / "m.onnx"), want)
    assert isinstance(t, ForeignTeacher)
    with torch.no_grad():
        labels = (model(torch.from_numpy(queries)) > 0).long().numpy()
    assert t.multi_label and np.array_equal(t.predict(queries), labels)


def test_current_statistics_do_not_reach_a_foreign_model(
    model: nn.Module, queries: np.ndarray, tmp_path: Path
) -> None:
    t = load_members(export_onnx(model, SHAPE, tmp_path / "m.onnx"))
    assert isinstance(t, ForeignTeacher)
    assert np.array_equal(t.predict(queries, current_statistics=True), t.predict(queries))


def test_voters_mix_foreign_models_and_say_where_each_came_from(
    model: nn.Module, queries: np.ndarray, tmp_path: Path
) -> None:
    specs = [
        str(export_onnx(model, SHAPE, tmp_path / "m.onnx")),
        str(export_torchscript(model, SHAPE, tmp_path / "m.ts")),
        f"{FACTORY}@{weights(model, tmp_path / 'w.pt')}",
    ]
    voters = Voters.load(specs, LIGHT, trust_code=True)
    assert len(voters) == 3 and voters.sources == specs and voters.single is None
    preds = voters.predict(queries)
    assert preds.shape == (11, 3)
    assert all(np.array_equal(preds[:, i], reference(model, queries)) for i in range(3))
    assert [a for a, _ in voters.infos()] == [
        "onnx",
        "torchscript",
        "module:tests.e2e.own_models:own_net",
    ]
    assert voters.misfit("hospital-a", LIGHT) is None


def test_misfit_names_the_model_and_both_shapes(model: nn.Module, tmp_path: Path) -> None:
    voters = Voters.load([export_onnx(model, SHAPE, tmp_path / "m.onnx")])
    images = Interface("images", (1, 28, 28), 10)
    why = voters.misfit("hospital-a", images)
    assert why is not None
    assert "hospital-a's model" in why and "m.onnx" in why
    assert "takes inputs (4,) but task images has (1, 28, 28)" in why
    classes = voters.misfit("hospital-a", Interface("five", SHAPE, 5))
    assert classes is not None and "gives 3 classes but task five has 5" in classes
    multi = voters.misfit("hospital-a", Interface("attrs", SHAPE, 3, multi_label=True))
    assert multi is not None and "multi-label" in multi
    with pytest.raises(ValueError, match="takes inputs"):
        voters.check("hospital-a", images)


def test_torch_models_on_the_wrong_shape_are_refused_naming_it(
    model: nn.Module, tmp_path: Path
) -> None:
    images = Interface("images", (1, 28, 28), 10)
    ts = export_torchscript(model, SHAPE, tmp_path / "m.ts")
    with pytest.raises(
        ValueError, match=r"m\.ts fails on a batch of task images's inputs \(1, 28, 28\)"
    ):
        load_members(ts, images, trust_code=True)
    with pytest.raises(ValueError, match="declares no input shape"):
        load_members(ts, trust_code=True)
    w = weights(model, tmp_path / "w.pt")
    with pytest.raises(ValueError, match="fails on a batch"):
        load_members(f"{FACTORY}@{w}", images, trust_code=True)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("no_such_pkg.models:net@{w}", "cannot import module 'no_such_pkg.models'"),
        ("tests.e2e.own_models:missing@{w}", "has no 'missing'"),
        ("tests.e2e.own_models:NOT_CALLABLE@{w}", "is a int, not a callable"),
        ("tests.e2e.own_models:not_a_module@{w}", "returned a dict, not a torch.nn.Module"),
        ("tests.e2e.own_models:images_small_cnn@{w}", "do not match the module"),
        ("tests.e2e.own_models:own_net@{missing}", "no weights file"),
        ("tests.e2e.own_models:own_net@{junk}", "is not a state dict"),
    ],
)
def test_factory_errors_name_the_spec_and_what_to_do(
    model: nn.Module, tmp_path: Path, spec: str, match: str
) -> None:
    w = weights(model, tmp_path / "w.pt")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not weights")
    text = spec.format(w=w, missing=tmp_path / "nope.pt", junk=junk)
    with pytest.raises(ValueError, match=match) as err:
        load_members(text, LIGHT, trust_code=True)
    assert text in str(err.value)


def test_unreadable_files_are_refused_naming_them(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no model file at .*nope\.onnx"):
        load_members(tmp_path / "nope.onnx")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00garbage, not a model")
    with pytest.raises(
        ValueError, match=r"junk\.bin is not a capc checkpoint, a TorchScript file or an ONNX"
    ):
        load_members(junk)


class TwoInputs(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


class NaNs(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(-(x.abs() + 1.0))[:, :3]


class Flat(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=1)


def test_onnx_with_several_inputs_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "two.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the legacy exporter, on purpose
        torch.onnx.export(
            TwoInputs(), (torch.zeros(1, 4), torch.zeros(1, 4)), str(path), dynamo=False
        )
    with pytest.raises(ValueError, match=r"two\.onnx has 2 inputs.*single input"):
        load_members(path)


def test_a_model_giving_nan_is_refused_at_start(tmp_path: Path) -> None:
    path = export_onnx(NaNs(), SHAPE, tmp_path / "nan.onnx")
    with pytest.raises(ValueError, match=r"nan\.onnx gives NaN"):
        load_members(path)


def test_a_model_not_giving_b_by_k_scores_is_refused(tmp_path: Path) -> None:
    path = export_torchscript(Flat(), SHAPE, tmp_path / "flat.ts")
    with pytest.raises(ValueError, match=r"flat\.ts gives outputs of shape"):
        load_members(path, LIGHT, trust_code=True)


def test_own_net_is_not_a_capc_architecture() -> None:
    # The factory's module is the hospital's own class, not one of capc's registry.
    assert isinstance(own_net(), OwnNet)


def usage_commands() -> list[list[str]]:
    """The ``capc answerer`` command lines of docs/usage.md's "Bring your own model"."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "usage.md").read_text()
    section = text.split("## Bring your own model", 1)[1].split("\n## ", 1)[0]
    joined = section.replace("\\\n", " ")
    return [shlex.split(line)[1:] for line in joined.splitlines() if line.startswith("capc ")]


def test_the_documented_command_lines_parse() -> None:
    *commands, export = usage_commands()
    assert len(commands) == 3
    trusted = []
    for argv in commands:
        args = build_parser().parse_args(argv)
        assert args.command == "answerer" and args.task == Path("images.json")
        trusted.append(args.trust_model_code)
    assert [c[c.index("--model") + 1] for c in commands] == [
        "model.onnx",
        "model.ts",
        "hospital_models.net:build@weights.pt",
    ]
    # Code models are shown with the flag they need; ONNX without it.
    assert trusted == [False, True, True]
    args = build_parser().parse_args(export)
    assert (args.command, args.teacher_command, args.onnx) == (
        "teacher",
        "export",
        "teacher-{i}.onnx",
    )


@pytest.mark.parametrize(
    ("shape", "classes", "reason"),
    [
        ((1, 28, 28), 3, "takes inputs (4,) but task images has (1, 28, 28)"),
        ((4,), 10, "gives 3 classes but task images has 10"),
    ],
)
def test_without_task_the_round_says_what_does_not_fit(
    model: nn.Module, tmp_path: Path, shape: tuple[int, ...], classes: int, reason: str
) -> None:
    from capc.mechanisms import from_config
    from capc.task_config import canonical_json, config_hash
    from services.answerer.budget import OwnBudget
    from services.answerer.party import AnsweringParty
    from services.common import serde
    from services.common.buffers import BoundedBuffer
    from services.common.ledger import Ledger
    from services.proto.capc.v1 import common_pb2, guardian_pb2

    onnx = export_onnx(model, SHAPE, tmp_path / "model.onnx")
    # The hospital's own ledger admits the round (its cap covers it): the check under test
    # comes after it.
    own = OwnBudget("hospital-a", Ledger(str(tmp_path / "own.db")), 1e4)
    party = AnsweringParty("hospital-a", Voters.load([onnx]), "127.0.0.1:9", None, own)
    mechanism = {"name": "gnmax", "sigma": 4.0}
    config = {"num_classes": classes, "input_shape": list(shape), "mechanism": mechanism}
    work = guardian_pb2.RoundWork(
        round_id=7,
        queries=common_pb2.QueryBatch(
            tensor=serde.queries_to_proto(np.zeros((2, *shape), np.float32))
        ),
        mechanism=serde.mechanism_to_proto(from_config(mechanism, classes)),
    )
    out: BoundedBuffer[guardian_pb2.PartyMessage] = BoundedBuffer(4)
    header = common_pb2.Header(task="images", config_hash=config_hash(config))
    own.define(guardian_pb2.TaskDefinition(config_json=canonical_json(config)), header)
    party._answer(own.decode(work, header), out)
    msg = out.get(timeout=5)
    assert msg is not None and msg.WhichOneof("body") == "failure"
    assert msg.failure.round_id == 7
    assert "hospital-a's model" in msg.failure.reason and "model.onnx" in msg.failure.reason
    assert reason in msg.failure.reason


def test_an_encrypted_task_refuses_a_foreign_model_at_start(
    model: nn.Module, tmp_path: Path
) -> None:
    from capc.task_config import TaskConfig
    from services.answerer.main import check_encryption

    config: dict[str, object] = {
        "num_classes": 3,
        "input_shape": [4],
        "mechanism": {"name": "gnmax", "sigma": 4.0},
        "encryption": {"architecture": "he-mlp"},
    }
    task = TaskConfig.parse("sealed", config, "hash")
    voters = Voters.load([export_onnx(model, SHAPE, tmp_path / "m.onnx")])
    with pytest.raises(ValueError, match=r"task sealed sends encrypted queries.*he-mlp.*onnx"):
        check_encryption(voters, task)


def test_a_malicious_torchscript_file_is_refused_before_torch_loads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack: a .ts whose forward copies a secret file (the party's TLS key, say)
    over another file. Without trust_code it is refused before torch.jit.load is even
    called; with it, the same file really does the harm (so the test can fail)."""
    secret, target = tmp_path / "party.key", tmp_path / "planted.py"
    secret.write_bytes(b"PRIVATE KEY")
    target.write_bytes(b"# untouched")
    evil = export_thief(secret, target, tmp_path / "teacher.ts")
    loaded: list[str] = []
    real_load = torch.jit.load

    def spy(*args: Any, **kwargs: Any) -> Any:
        loaded.append(str(args[0]))
        return real_load(*args, **kwargs)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(torch.jit, "load", spy)
    with pytest.raises(CodeModelRefusedError, match=r"teacher\.ts is a TorchScript file") as err:
        load_members(evil, LIGHT)
    assert "--trust-model-code" in str(err.value) and "ONNX" in str(err.value)
    with pytest.raises(CodeModelRefusedError):
        Voters.load([evil], LIGHT)
    assert loaded == [] and target.read_bytes() == b"# untouched"
    # Given trust, the file runs: its probe at load copies the secret.
    load_members(evil, LIGHT, trust_code=True)
    assert loaded == [str(evil)] and target.read_bytes() == b"PRIVATE KEY"


def test_module_factory_is_refused_without_trust_before_import(
    model: nn.Module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hospital module that leaves a mark when imported: refused, it is never imported;
    trusted, it is (and votes)."""
    marker = tmp_path / "imported"
    (tmp_path / "marking_hospital_code.py").write_text(
        "from pathlib import Path\n"
        f"Path({str(marker)!r}).write_text('ran')\n"
        "from tests.e2e.own_models import own_net as net\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    w = weights(model, tmp_path / "w.pt")
    spec = f"marking_hospital_code:net@{w}"
    with pytest.raises(CodeModelRefusedError, match="module:factory") as err:
        load_members(spec, LIGHT)
    assert spec in str(err.value) and "--trust-model-code" in str(err.value)
    assert not marker.exists() and "marking_hospital_code" not in sys.modules
    load_members(spec, LIGHT, trust_code=True)
    assert marker.read_text() == "ran"
    monkeypatch.delitem(sys.modules, "marking_hospital_code")
