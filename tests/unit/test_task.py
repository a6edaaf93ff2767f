"""Task configurations: multi-label and personalized tasks, and what parties derive from them."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import pytest

from capc.data.multilabel import ATTRIBUTE_TABLE, attributes_of
from capc.mechanisms import from_config
from capc.mpc import validity
from capc.mpc.mechanism_circuits import ConfidentGNMaxCircuit, MultiLabelCircuit
from capc.privacy.accountants import RenyiDp
from capc.round.messages import QueryBatch, RoundWork
from capc.round.party import ensemble_votes
from capc.task_config import (
    EncryptionSpec,
    MechanismSpec,
    TaskConfig,
    TaskError,
    TaskSpec,
    config_hash,
)
from services.common.serde import (
    mechanism_to_proto,
    queries_to_proto,
    round_work_from_proto,
)
from services.proto.capc.v1 import common_pb2, guardian_pb2


def parse(config: dict[str, Any]) -> TaskConfig:
    return TaskConfig.parse("t", config, config_hash(config))


def ml(mechanism: dict[str, Any], k: int = 5, **extra: Any) -> dict[str, Any]:
    return {"num_labels": k, "input_shape": [1, 28, 28], "mechanism": mechanism, **extra}


def test_multi_label_tasks_size_votes_and_circuits() -> None:
    binary = parse(ml({"name": "binary", "sigma": 2.0, "threshold": 1.0, "sigma1": 3.0}))
    assert binary.multi_label and binary.vote_width == 5 and binary.frac_bits == 0
    spec = binary.circuit_spec(6)
    assert isinstance(spec, MultiLabelCircuit) and spec.confident
    # The student does not know the guardian's vote total; both build the same circuit.
    assert binary.circuit_spec(6, vote_total=5.25).circuit().name == spec.circuit().name
    tau = parse(ml({"name": "tau", "sigma": 2.0, "tau": 1.5}))
    assert tau.frac_bits == 8 and not tau.mechanism.confident
    power = parse(ml({"name": "powerset", "sigma": 2.0, "threshold": 3.0, "sigma1": 2.0}, k=3))
    pspec = power.circuit_spec(4)
    assert (
        power.vote_width == 8
        and isinstance(pspec, ConfidentGNMaxCircuit)
        and pspec.num_classes == 8
    )
    out = {
        "label": np.array([[5], [0], [7]], dtype=np.uint64),
        "answered": np.array([[1], [0], [1]], dtype=np.uint64),
    }
    np.testing.assert_array_equal(power.decode(pspec, out), [[1, 0, 1], [-1, -1, -1], [1, 1, 1]])


def test_personalized_tasks() -> None:
    weighted = parse(
        ml({"name": "binary", "sigma": 2.0}, personalization={"mode": "weighting", "max_weight": 3})
    )
    assert weighted.weighting and weighted.frac_bits == 8 and weighted.max_weight == 3.0
    assert weighted.circuit_spec(4).max_votes == 12.0
    vanishing = parse(ml({"name": "binary", "sigma": 2.0}, personalization={"mode": "vanishing"}))
    assert vanishing.vanishing and vanishing.max_weight == 1.0


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (
            {"num_classes": 5, "input_shape": [4], "mechanism": {"name": "binary", "sigma": 1}},
            "num_labels",
        ),
        (ml({"name": "powerset", "sigma": 1.0}, k=11), "1 to 9 labels"),
        (ml({"name": "tau", "sigma": 1.0}), "tau: Field required"),
        (ml({"name": "binary", "sigma": 1.0}, personalization={"mode": "boost"}), "mode"),
        (
            ml(
                {"name": "binary", "sigma": 1.0},
                personalization={"mode": "weighting", "max_weight": 0.5},
            ),
            "max_weight",
        ),
        (
            {"num_classes": 1, "input_shape": [4], "mechanism": {"name": "gnmax", "sigma": 1}},
            "num_classes",
        ),
    ],
)
def test_bad_task_configurations_say_what_is_wrong(config: dict[str, Any], reason: str) -> None:
    with pytest.raises(TaskError, match=reason):
        parse(config)


def test_a_task_whose_votes_no_proof_checks_is_refused() -> None:
    """Issue 41: where a vote statement would exceed MAX_ELEMENTS per query, rounds ran on
    the circuit's range checks alone, and one hospital's invalid vote (+9a on a target,
    -a elsewhere) decided labels. Such tasks are refused, saying the limit and the way out;
    the largest allowed ones parse, and every task that parses has a statement."""
    tau = {"name": "tau", "sigma": 1.0}
    for t, most in ((3.0, 25), (1.0, 26)):
        largest = parse(ml({**tau, "tau": t}, k=most))
        assert largest.mechanism.vote_relation(1) is not None
        with pytest.raises(
            TaskError,
            match=(
                rf"tau voting over {most + 1} labels has no vote-validity statement \(at most "
                rf"{most} labels fit one proof per query at tau {t:g}, MAX_ELEMENTS 512\): a "
                rf"hospital could decide labels with an invalid vote\. Use at most {most} "
                rf"labels, or split the labels into tasks of at most {most}$"
            ),
        ):
            parse(ml({**tau, "tau": t}, k=most + 1))
    with pytest.raises(TaskError, match=r"tau voting over 30 labels .* at most 25 labels"):
        parse(ml({**tau, "tau": 3.0}, k=30))
    assert parse(ml({"name": "powerset", "sigma": 1.0}, k=9)).mechanism.vote_relation(1)
    with pytest.raises(
        TaskError,
        match=(
            r"powerset takes 1 to 9 labels, got 10: a vote-validity statement covers at most "
            r"2\*\*9 subsets per query .* Use at most 9 labels, or split the labels into tasks"
        ),
    ):
        parse(ml({"name": "powerset", "sigma": 1.0}, k=10))
    # Binary voting's statement fits every label count a task may name.
    assert parse(ml({"name": "binary", "sigma": 1.0}, k=64)).mechanism.vote_relation(1)
    # One-hot votes over more classes than a proof holds: plaintext refused, ...
    gnmax = {"input_shape": [4], "mechanism": {"name": "gnmax", "sigma": 1.0}}
    assert parse({**gnmax, "num_classes": 512}).mechanism.vote_relation(1)
    with pytest.raises(
        TaskError, match=r"gnmax voting over 513 classes .* or use encrypted queries"
    ):
        parse({**gnmax, "num_classes": 513})
    # ... while encrypted queries' circuit checks each party's one-hot vote itself.
    encrypted = parse(
        {
            **gnmax,
            "num_classes": 513,
            "input_shape": [1, 28, 28],
            "encryption": {"architecture": "he-cnn"},
        }
    )
    assert encrypted.encryption is not None and encrypted.mechanism.vote_relation(1) is None


def test_the_label_limits_are_the_proofs_own() -> None:
    """proven_outputs, which the refusals quote, is exactly where vote_relation stops."""
    for config, top in (
        ({"name": "tau", "sigma": 1.0, "tau": 3.0}, 64),
        ({"name": "tau", "sigma": 1.0, "tau": 0.5}, 64),
        ({"name": "binary", "sigma": 1.0}, 64),
        ({"name": "powerset", "sigma": 1.0}, 9),
    ):
        fits = [k for k in range(1, top + 1) if from_config(config, k).vote_relation(1) is not None]
        assert fits == list(range(1, fits[-1] + 1))
        assert min(from_config(config, 1).proven_outputs(), top) == fits[-1]
    assert from_config({"name": "powerset", "sigma": 1.0}, 1).proven_outputs() == 9
    assert from_config({"name": "gnmax", "sigma": 1.0}, 2).proven_outputs() == 512


def test_answering_party_votes_follow_the_round() -> None:
    task = parse(ml({"name": "binary", "sigma": 2.0}, k=3))
    preds = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 1]])
    voting = np.array([True, False, True])
    work = RoundWork(7, "a", task.mechanism, b"", 0.5, 8, 1, voting, QueryBatch("tensor", 3))
    votes = ensemble_votes(work, preds[:, None], 3)
    np.testing.assert_array_equal(votes, [[128, 0, 128], [0, 0, 0], [128, 128, 128]])
    # An ensemble of two teachers: the sum of their votes, each weighted and rounded alone.
    other = np.array([[0, 0, 1], [1, 1, 1], [0, 1, 0]])
    both = ensemble_votes(work, np.stack([preds, other], axis=1), 3)
    np.testing.assert_array_equal(both, [[128, 0, 256], [0, 0, 0], [128, 256, 128]])
    with pytest.raises(ValueError, match="3 outputs, this party's teachers 5"):
        ensemble_votes(work, preds[:, None], 5)
    with pytest.raises(ValueError, match=r"\(B, m, k\) labels"):
        ensemble_votes(work, preds, 3)
    # As the party reads the round: no mechanism, or a mask of another size, is refused.
    header = common_pb2.Header(task="t", config_hash=task.config_hash)
    config = ml({"name": "binary", "sigma": 2.0}, k=3)
    with pytest.raises(ValueError, match="names no mechanism"):
        round_work_from_proto(guardian_pb2.RoundWork(vote_weight=1.0), "a", header, task, config)
    wire = guardian_pb2.RoundWork(
        mechanism=mechanism_to_proto(task.mechanism),
        queries=common_pb2.QueryBatch(
            tensor=queries_to_proto(np.zeros((3, 1, 28, 28), np.float32))
        ),
        participation=b"\x01\x00",
    )
    with pytest.raises(ValueError, match="3 bits"):
        round_work_from_proto(wire, "a", header, task, config)
    # The task travels by name and hash: work naming another is refused.
    elsewhere = common_pb2.Header(task="t", config_hash="0" * 64)
    with pytest.raises(ValueError, match="names task 't'"):
        round_work_from_proto(wire, "a", elsewhere, task, config)


def test_animal_attributes_are_a_fixed_function_of_the_class() -> None:
    y = attributes_of(np.array([0, 2, 4, 9]))
    np.testing.assert_array_equal(y[1], y[2])  # cat and dog share a vector
    assert y.shape == (4, 5) and set(np.unique(ATTRIBUTE_TABLE)) == {0, 1}
    assert ATTRIBUTE_TABLE.mean(axis=0).min() >= 0.25 and ATTRIBUTE_TABLE.mean(axis=0).max() <= 0.6
    with pytest.raises(ValueError, match="indices"):
        attributes_of(np.array([10]))


def test_job_overrides_may_only_add_privacy() -> None:
    task = parse(
        {
            "num_classes": 10,
            "input_shape": [1, 28, 28],
            "mechanism": {"name": "confident-gnmax", "sigma": 2.0, "threshold": 3.0, "sigma1": 4.0},
        }
    )
    assert task.tightened(None) is task and task.tightened({}) is task
    assert task.tightened({"sigma": 0.0}) is task  # 0 keeps the task's value
    more = task.tightened({"sigma": 5.0, "threshold": 6.0})
    assert task.running(more.mechanism) == more
    assert more.mechanism.to_config() == {
        "name": "confident-gnmax",
        "sigma": 5.0,
        "threshold": 6.0,
        "sigma1": 4.0,
    }
    assert task.running(task.mechanism) is task
    # Same config hash (the task did not change), and a cheaper worst case.
    assert more.config_hash == task.config_hash
    orders = RenyiDp(np.array([2.0, 8.0, 32.0]))
    assert (
        orders.cost(more.mechanism.worst_case(10)) < orders.cost(task.mechanism.worst_case(10))
    ).all()
    refused = {
        "is below the task's": {"sigma": 1.0},
        "sigma1 = 3": {"sigma1": 3.0},
        "finite": {"sigma": float("nan")},
        "at most": {"threshold": 1e9},
        "no parameter 'confidence_threshold'": {"confidence_threshold": 9.0},
    }
    for text, overrides in refused.items():
        with pytest.raises(TaskError, match=text):
            task.tightened(overrides)
    # A resolved mechanism (what a job stores and a round carries) is held to the same
    # rule: the task's mechanism and label space, each parameter the task's or raised.
    looser = {"name": "confident-gnmax", "sigma": 1.0, "threshold": 3.0, "sigma1": 4.0}
    for config, outputs, text in (
        (looser, 10, "is below the task's"),
        ({**looser, "sigma": 2.0, "threshold": 2.0}, 10, "is below the task's"),
        ({"name": "gnmax", "sigma": 9.0}, 10, "cannot run gnmax"),
        ({**looser, "sigma": 5.0}, 5, "over 5"),
    ):
        with pytest.raises(TaskError, match=text):
            task.running(from_config(config, outputs))
    # A zero means "keep the task's" in overrides, never in a resolved mechanism: one that
    # switches the task's threshold test off is refused.
    binary = parse(ml({"name": "binary", "sigma": 2.0, "threshold": 1.0, "sigma1": 3.0}))
    off = from_config({"name": "binary", "sigma": 2.0, "threshold": 1.0, "sigma1": 0.0}, 5)
    with pytest.raises(TaskError, match="or a tightening of it"):
        binary.running(off)
    gnmax = parse(
        {
            "num_classes": 10,
            "input_shape": [1, 28, 28],
            "mechanism": {"name": "gnmax", "sigma": 2.0},
        }
    )
    with pytest.raises(TaskError, match="gnmax has no parameter 'sigma1'"):
        gnmax.tightened({"sigma1": 9.0})


def test_encrypted_tasks() -> None:
    base = {
        "num_classes": 10,
        "input_shape": [1, 28, 28],
        "mechanism": {"name": "confident-gnmax", "sigma": 4.0, "threshold": 8.0, "sigma1": 4.0},
        "encryption": {"architecture": "he-cnn", "width": 5, "params": {"share_bits": 22}},
    }
    task = TaskConfig.parse("t", base, config_hash(base))
    assert task.encryption is not None and task.encryption.params.share_bits == 22
    assert '"architecture":"he-cnn"' in task.encryption.to_json()
    bad: list[tuple[dict[str, Any], str]] = [
        ({**base, "encryption": {"architecture": "resnet10"}}, "HE-friendly"),
        ({**base, "encryption": {"architecture": "he-cnn", "key": 1}}, "key: Extra inputs"),
        (
            {
                **base,
                "encryption": {"architecture": "he-cnn", "params": {"poly_modulus_degree": 4096}},
            },
            "128-bit",
        ),
        ({**base, "personalization": {"mode": "weighting"}}, "without personalized budgets"),
        (
            {
                **{k: v for k, v in base.items() if k != "num_classes"},
                "num_labels": 3,
                "mechanism": {"name": "binary", "sigma": 1.0},
            },
            "single-label voting",
        ),
    ]
    for config, reason in bad:
        with pytest.raises(TaskError, match=reason):
            TaskConfig.parse("t", config, config_hash(config))


def test_weighted_tau_keeps_the_proven_grid_and_the_weight_apart() -> None:
    """A tau vote is proven on its 2^-8 grid and weighted on 8 more bits by the verifiers:
    the shares carry both (16 bits), and the weight multiplier is the weight on its own grid
    (an integer), so proven shares of weighted tau votes reconstruct exactly."""
    weighted = parse(
        ml({"name": "tau", "sigma": 2.0, "tau": 1.5}, personalization={"mode": "weighting"})
    )
    assert (weighted.weight_bits, weighted.frac_bits) == (8, 16)
    plain = parse(ml({"name": "tau", "sigma": 2.0, "tau": 1.5}))
    assert (plain.weight_bits, plain.frac_bits) == (0, 8)
    relation = weighted.mechanism.vote_relation(1)
    assert relation is not None and relation.grid_bits == 8
    preds = np.array([[[1, 1, 1, 0, 0]], [[0, 0, 0, 0, 1]]])
    counts = weighted.mechanism.encode_ensemble_votes(preds, frac_bits=relation.grid_bits)
    np.testing.assert_array_equal(counts[1], [0, 0, 0, 0, 256])
    assert counts[0, 0] == int(1.5 / np.sqrt(3) * 256)  # clipped to norm tau, rounded down
    seed = os.urandom(16)
    bits = relation.encode(counts.astype(np.int64))
    guardian, _ = validity.guardian_shares(relation, bits, seed)
    student, _ = validity.student_shares(seed, relation, len(bits))
    weight = int(np.floor(0.75 * (1 << weighted.weight_bits)))  # the guardian's weight_on_grid
    g = validity.ring_shares(validity.vote_shares(relation, guardian, weight), student=False)
    s = validity.ring_shares(validity.vote_shares(relation, student, weight), student=True)
    np.testing.assert_array_equal((g + s).view(np.int64), counts.astype(np.int64) * weight)


ROUND_TRIP: list[dict[str, Any]] = [
    {"num_classes": 10, "input_shape": [1, 28, 28], "mechanism": {"name": "gnmax", "sigma": 40.0}},
    ml({"name": "binary", "sigma": 2.0}, personalization={"mode": "weighting", "max_weight": 3}),
    {
        "num_classes": 10,
        "input_shape": [1, 28, 28],
        "quorum": 2,
        "mechanism": {"name": "confident-gnmax", "sigma": 4.0, "threshold": 8.0, "sigma1": 4.0},
        "encryption": {"architecture": "he-cnn", "width": 5, "params": {"share_bits": 22}},
        "classes": [str(i) for i in range(10)],
    },
]


@pytest.mark.parametrize("config", ROUND_TRIP)
def test_a_task_round_trips_through_its_configuration(config: dict[str, Any]) -> None:
    task = parse(config)
    written = task.to_config()
    # the written form parses to the same task (its hash is of what was written, which
    # spells out the mechanism's defaults), and is a fixed point of parse/to_config
    assert dataclasses.replace(parse(written), config_hash=task.config_hash) == task
    assert parse(written).to_config() == written
    # what the file said survives, key by key (the mechanism gains its defaults only)
    for key, value in config.items():
        if key == "mechanism":
            assert written[key].items() >= value.items()
        elif key == "encryption":
            assert written[key]["architecture"] == value["architecture"]
            assert written[key]["params"].items() >= value["params"].items()
        elif key == "personalization":
            assert written[key].items() >= value.items()
        else:
            assert written[key] == value


@pytest.mark.parametrize(
    ("mechanism", "reason"),
    [
        ({"sigma": 1.0}, "mechanism.name: Field required"),
        ("gnmax", "mechanism: Input should be a valid dictionary"),
        ({"name": ""}, "mechanism.name: String should have at least 1 character"),
        ({"name": "gnmax", "sigma": 1.0, "sigmaa": 2.0}, "sigmaa"),
    ],
)
def test_a_malformed_mechanism_says_which_field(mechanism: object, reason: str) -> None:
    with pytest.raises(TaskError, match=reason):
        parse({"num_classes": 4, "input_shape": [4], "mechanism": mechanism})


def test_the_typed_spec_is_what_parse_reads() -> None:
    spec = TaskSpec.model_validate(ROUND_TRIP[2])
    assert isinstance(spec.mechanism, MechanismSpec) and spec.mechanism.name == "confident-gnmax"
    assert spec.mechanism.to_config() == ROUND_TRIP[2]["mechanism"]
    assert isinstance(spec.encryption, EncryptionSpec) and spec.encryption.width == 5
