"""A task as the guardian registers it and every party reads it.

The configuration is a JSON object; its SHA-256 (of the canonical JSON) is
the config hash every message carries, so two parties disagreeing on the
task are refused rather than computing different circuits.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from capc.he.params import CkksParams
from capc.mpc.mechanism_circuits import CIRCUIT_FRAC_BITS, ConfidentGNMax, MultiLabel
from capc.privacy.mechanisms.multi_label import subset_bits
from capc.privacy.mechanisms.single_label import NOT_ANSWERED
from capc.privacy.round_cost import MechanismSpec
from services.proto.capc.v1 import common_pb2


class TaskError(ValueError):
    """A task configuration is invalid."""


def config_hash(config: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a task configuration."""
    return hashlib.sha256(
        json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


PERSONALIZATION_MODES = ("weighting", "vanishing")


@dataclass(frozen=True)
class Personalization:
    """Personalized budgets: the guardian derives each party's vote weight
    (``weighting``) or participation rate (``vanishing``) from its eps cap, so
    that every party reaches its cap after about ``planned_queries`` queries.
    ``max_weight`` bounds any weight (it sizes the circuit)."""

    mode: str
    planned_queries: int = 1000
    max_weight: float = 4.0

    def __post_init__(self) -> None:
        if self.mode not in PERSONALIZATION_MODES:
            raise ValueError(
                f"personalization mode must be one of {', '.join(PERSONALIZATION_MODES)}, got {self.mode!r}"
            )
        if self.planned_queries < 1:
            raise ValueError("planned_queries must be >= 1")
        if not 1.0 <= self.max_weight <= 64.0:
            raise ValueError("max_weight must lie in [1, 64]")


#: Architectures an encrypted-query task may name (capc.he evaluates them).
HE_ARCHITECTURES = ("he-cnn", "he-mlp")


@dataclass(frozen=True)
class Encryption:
    """Encrypted-query mode: the queries reach the parties only as CKKS ciphertexts.

    Every answering party's teacher must have this ``architecture`` and
    ``width`` (the student packs its queries for that layout); ``params`` are
    the CKKS parameters every context must use.
    """

    architecture: str
    width: int | None
    params: CkksParams

    def __post_init__(self) -> None:
        if self.architecture not in HE_ARCHITECTURES:
            raise ValueError(
                f"encrypted queries need an HE-friendly architecture ({', '.join(HE_ARCHITECTURES)}), "
                f"got {self.architecture!r}"
            )

    def to_json(self) -> str:
        """Canonical JSON, as carried by each encrypted batch."""
        return json.dumps(
            {
                "architecture": self.architecture,
                "width": self.width,
                "params": self.params.to_dict(),
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def parse(cls, d: object) -> Encryption:
        assert isinstance(d, dict), "encryption must be an object"
        unknown = set(d) - {"architecture", "width", "params"}
        assert not unknown, f"unknown encryption settings {sorted(unknown)}"
        params = d.get("params", {})
        assert isinstance(params, dict), "encryption.params must be an object"
        width = d.get("width")
        return cls(
            architecture=str(d["architecture"]),
            width=None if width is None else int(width),
            params=CkksParams.from_dict(params),
        )


#: Fixed-point fractional bits of shares when votes are not integers (tau clipping, weights).
FRACTIONAL_SHARE_BITS = 8


@dataclass(frozen=True)
class TaskConfig:
    """A task as registered in the ledger: label space, inputs, mechanism, quorum.

    Single-label tasks name ``num_classes``; multi-label tasks (Binary, tau,
    Powerset voting) name ``num_labels`` and ``num_classes`` holds k too, the
    number of teacher outputs.
    """

    name: str
    config_hash: str
    num_classes: int
    input_shape: tuple[int, ...]
    mechanism: MechanismSpec
    quorum: int
    personalization: Personalization | None = None
    encryption: Encryption | None = None

    @classmethod
    def parse(cls, name: str, config: dict[str, object], config_hash: str) -> TaskConfig:
        try:
            mech = config["mechanism"]
            assert isinstance(mech, dict), "mechanism must be an object"
            shape = config["input_shape"]
            assert isinstance(shape, list), "input_shape must be a list"
            multi = str(mech["name"]) in ("binary", "tau", "powerset")
            outputs = int(str(config["num_labels" if multi else "num_classes"]))
            pers = config.get("personalization")
            assert pers is None or isinstance(pers, dict), "personalization must be an object"
            enc = config.get("encryption")
            task = cls(
                name=name,
                config_hash=config_hash,
                num_classes=outputs,
                input_shape=tuple(int(x) for x in shape),
                mechanism=MechanismSpec(
                    name=str(mech["name"]),
                    sigma=float(mech["sigma"]),
                    threshold=float(mech.get("threshold", 0.0)),
                    sigma1=float(mech.get("sigma1", 0.0)),
                    num_labels=outputs if multi else 1,
                    tau=float(mech.get("tau", 0.0)),
                ),
                quorum=int(str(config.get("quorum", 1))),
                personalization=None
                if pers is None
                else Personalization(
                    mode=str(pers["mode"]),
                    planned_queries=int(pers.get("planned_queries", 1000)),
                    max_weight=float(pers.get("max_weight", 4.0)),
                ),
                encryption=None if enc is None else Encryption.parse(enc),
            )
        except (KeyError, AssertionError, TypeError, ValueError) as err:
            raise TaskError(f"task {name!r} has an invalid configuration: {err}") from err
        if multi and not 1 <= task.num_classes <= MAX_LABELS[task.mechanism.name]:
            raise TaskError(
                f"task {name!r}: {task.mechanism.name} voting takes 1 to {MAX_LABELS[task.mechanism.name]} labels, got {task.num_classes}"
            )
        if not multi and task.num_classes < 2:
            raise TaskError(f"task {name!r}: num_classes must be >= 2")
        if task.encryption is not None and (multi or task.personalization is not None):
            raise TaskError(
                f"task {name!r}: encrypted queries support single-label voting "
                "(confident-gnmax, gnmax) without personalized budgets"
            )
        return task

    @property
    def multi_label(self) -> bool:
        return self.mechanism.multi_label

    @property
    def weighting(self) -> bool:
        return self.personalization is not None and self.personalization.mode == "weighting"

    @property
    def vanishing(self) -> bool:
        return self.personalization is not None and self.personalization.mode == "vanishing"

    @property
    def vote_width(self) -> int:
        """Columns of a party's vote matrix: classes, labels, or 2**k label subsets (Powerset)."""
        if self.mechanism.name == "powerset":
            return 1 << self.num_classes
        return self.num_classes

    @property
    def frac_bits(self) -> int:
        """Fractional bits of the shares: 0 for integer votes, more for clipped or weighted ones."""
        return FRACTIONAL_SHARE_BITS if self.weighting or self.mechanism.name == "tau" else 0

    @property
    def max_weight(self) -> float:
        return self.personalization.max_weight if self.weighting and self.personalization else 1.0

    def overridden(self, msg: common_pb2.Mechanism | None) -> TaskConfig:
        """This task with a request's mechanism overrides, checked against the task's policy.

        An override may only make rounds more private: a larger ``sigma`` (the
        answer's noise std, in votes), a larger ``sigma1`` (the confidence test's
        noise std) or a higher confidence ``threshold`` (votes). Zero or absent
        fields keep the task's value; the mechanism, its labels and tau cannot change.
        Raises TaskError saying which field broke the policy.
        """
        if msg is None or msg.ByteSize() == 0:
            return self
        m = self.mechanism
        fixed = {
            "name": (msg.name, m.name, ""),
            "num_classes": (msg.num_classes, 0 if self.multi_label else self.num_classes, 0),
            "num_labels": (msg.num_labels, self.num_classes if self.multi_label else 0, 0),
            "tau": (msg.tau, m.tau, 0.0),
        }
        for field_name, (given, own, unset) in fixed.items():
            if given != unset and given != own:
                raise TaskError(
                    f"task {self.name!r} fixes {field_name} = {own!r}; a job cannot change it (got {given!r})"
                )
        changes: dict[str, float] = {}
        for field_name in ("sigma", "sigma1", "threshold"):
            given = float(getattr(msg, field_name))
            own = float(getattr(m, field_name))
            if given == 0.0:
                continue
            if not math.isfinite(given) or given > MAX_OVERRIDE:
                raise TaskError(f"{field_name} must be finite and at most {MAX_OVERRIDE:g}")
            if given < own:
                raise TaskError(
                    f"{field_name} = {given:g} is below the task's {own:g}: overrides may only add noise or raise the threshold"
                )
            if field_name != "sigma" and not m.confident:
                raise TaskError(f"{field_name} applies only to a confident mechanism")
            changes[field_name] = given
        if msg.confidence_threshold:
            raise TaskError("confidence_threshold is not a job override; use threshold")
        if not changes:
            return self
        mech = dataclasses.replace(
            m,
            sigma=changes.get("sigma", m.sigma),
            sigma1=changes.get("sigma1", m.sigma1),
            threshold=changes.get("threshold", m.threshold),
        )
        return dataclasses.replace(self, mechanism=mech)

    def circuit_spec(self, parties: int, vote_total: float | None = None) -> CircuitSpec:
        """The round's circuit for ``parties`` voters. ``vote_total``: the sum of their weights
        (the guardian's; it sets the majority threshold of Binary and tau voting and
        is folded into the guardian's inputs, so the student may leave it out)."""
        m = self.mechanism
        frac = max(CIRCUIT_FRAC_BITS, self.frac_bits)
        max_votes = parties * self.max_weight
        total = max_votes if vote_total is None else vote_total
        if m.per_label:
            return MultiLabel(
                num_labels=self.num_classes,
                max_votes=max_votes,
                sigma=m.sigma,
                decision_threshold=total / 2.0,
                confidence_threshold=m.threshold if m.confident else None,
                sigma1=m.sigma1 if m.confident else 1.0,
                frac_bits=frac,
                share_frac_bits=self.frac_bits,
            )
        return ConfidentGNMax(
            num_classes=self.vote_width,
            max_votes=max_votes,
            sigma2=m.sigma,
            threshold=m.threshold,
            sigma1=m.sigma1 if m.confident else 1.0,
            confident=m.confident,
            frac_bits=frac,
            share_frac_bits=self.frac_bits,
        )

    def decode(self, spec: CircuitSpec, outputs: dict[str, NDArray[np.uint64]]) -> Labels:
        """The student's circuit outputs -> labels: (B,) classes, or (B, k) 0/1 for multi-label;
        NOT_ANSWERED (-1) where the mechanism declined (a query, or one label)."""
        raw = spec.decode(outputs).astype(np.int64)
        if self.mechanism.name != "powerset":
            return raw
        bits = subset_bits(np.maximum(raw, 0), self.num_classes).astype(np.int64)
        return np.where((raw == NOT_ANSWERED)[:, None], NOT_ANSWERED, bits)


def mechanism_message(task: TaskConfig) -> common_pb2.Mechanism:
    """The task's mechanism as the answering parties receive it with each round."""
    m = task.mechanism
    return common_pb2.Mechanism(
        name=m.name,
        num_classes=0 if task.multi_label else task.num_classes,
        num_labels=task.num_classes if task.multi_label else 0,
        sigma=m.sigma,
        threshold=m.threshold,
        sigma1=m.sigma1,
        tau=m.tau,
    )


CircuitSpec = ConfidentGNMax | MultiLabel
Labels = NDArray[np.int64]
#: Largest label count per multi-label mechanism (Powerset's circuit has 2**k classes).
MAX_LABELS = {"binary": 64, "tau": 64, "powerset": 10}
#: Largest sigma, sigma1 or threshold a job may ask for (votes): beyond it no query is answered.
MAX_OVERRIDE = 1e6
