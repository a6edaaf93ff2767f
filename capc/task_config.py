"""A task as the guardian registers it and every party reads it.

The configuration is a JSON object, validated by :class:`TaskSpec` (pydantic;
unknown keys, NaN and wrong types are refused with the field named); its
SHA-256 (of the canonical JSON) is the config hash every message carries, so
two parties disagreeing on the task are refused rather than computing
different circuits. The mechanism is a :mod:`capc.mechanisms` object: this
module never names one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from capc.data.schema import RecordSchema, SchemaError, parse_classes, parse_records
from capc.he.params import CkksParams
from capc.mechanisms import Mechanism, MechanismError, Personalization, from_config, mechanism_class
from capc.mechanisms.base import CircuitSpec


class TaskError(ValueError):
    """A task configuration is invalid."""


def canonical_json(config: dict[str, Any]) -> str:
    """The canonical JSON of a task configuration (sorted keys, no spaces)."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def config_hash(config: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a task configuration."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()


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

    def to_config(self) -> dict[str, Any]:
        """The ``encryption`` object of a task configuration (what :meth:`parse` reads)."""
        return {
            "architecture": self.architecture,
            "width": self.width,
            "params": self.params.to_dict(),
        }

    def to_json(self) -> str:
        """Canonical JSON, as carried by each encrypted batch."""
        return json.dumps(self.to_config(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def parse(cls, d: object) -> Encryption:
        try:
            spec = EncryptionSpec.model_validate(d)
        except ValidationError as err:
            raise TaskError(f"encryption: {_problems(err)}") from None
        return cls.from_spec(spec)

    @classmethod
    def from_spec(cls, spec: EncryptionSpec) -> Encryption:
        return cls(spec.architecture, spec.width, CkksParams.from_dict(spec.params))


class EncryptionSpec(BaseModel):
    """The ``encryption`` object of a task configuration."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    architecture: str
    width: int | None = Field(default=None, ge=1)
    params: dict[str, Any] = Field(default_factory=dict)


#: Fixed-point fractional bits of vote weights (personalized weighting).
FRACTIONAL_SHARE_BITS = 8


class MechanismSpec(BaseModel):
    """The ``mechanism`` object of a task configuration: its ``name`` and its parameters
    (the other keys), which the named mechanism's own model checks
    (:func:`capc.mechanisms.from_config`)."""

    model_config = ConfigDict(frozen=True, extra="allow", allow_inf_nan=False)
    name: str = Field(min_length=1)

    def to_config(self) -> dict[str, Any]:
        """The object as the configuration wrote it, name and parameters."""
        return {"name": self.name, **(self.model_extra or {})}


class TaskSpec(BaseModel):
    """A task configuration as JSON carries it. Single-label tasks name ``num_classes``,
    multi-label ones ``num_labels``; which one is the mechanism's to say."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=False)
    mechanism: MechanismSpec
    input_shape: list[int] = Field(min_length=1, max_length=4)
    num_classes: int | None = Field(default=None, ge=2, le=4096)
    num_labels: int | None = Field(default=None, ge=1, le=64)
    quorum: int = Field(default=1, ge=1, le=10_000)
    personalization: Personalization | None = None
    encryption: EncryptionSpec | None = None
    #: What the records are (capc.data.schema): images with a value range, or table rows
    #: with public feature ranges and levels. Optional for tasks written before schemas.
    records: dict[str, Any] | None = None
    #: The classes' (or labels') names, one per output.
    classes: list[str] | None = None


def _problems(err: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(x) for x in e['loc']) or 'configuration'}: {e['msg']}" for e in err.errors()
    )


@dataclass(frozen=True)
class TaskConfig:
    """A task as registered in the ledger: label space, inputs, mechanism, quorum."""

    name: str
    config_hash: str
    input_shape: tuple[int, ...]
    mechanism: Mechanism
    quorum: int
    personalization: Personalization | None = None
    encryption: Encryption | None = None
    records: RecordSchema | None = None
    classes: tuple[str, ...] | None = None

    @classmethod
    def parse(cls, name: str, config: dict[str, object], config_hash: str) -> TaskConfig:
        """Validate a stored configuration; TaskError says which field is wrong."""
        try:
            spec = TaskSpec.model_validate(config)
            mech_name = spec.mechanism.name
            multi = mechanism_class(mech_name).multi_label
            outputs = spec.num_labels if multi else spec.num_classes
            wrong = spec.num_classes if multi else spec.num_labels
            if outputs is None or wrong is not None:
                want, not_want = (
                    ("num_labels", "num_classes") if multi else ("num_classes", "num_labels")
                )
                raise TaskError(
                    f"{mech_name} needs {want} and takes no {not_want}: give the task "
                    f'"{want}" (the teachers\' outputs){f" and drop {not_want!r}" if wrong else ""}'
                )
            if any(d < 1 for d in spec.input_shape):
                raise TaskError(f"input_shape must be positive, got {spec.input_shape}")
            records = None if spec.records is None else parse_records(spec.records)
            if records is not None and records.input_shape != tuple(spec.input_shape):
                raise TaskError(
                    f"input_shape {spec.input_shape} does not match its records, which encode "
                    f"to {list(records.input_shape)}"
                )
            classes = None if spec.classes is None else parse_classes(spec.classes, outputs)
            task = cls(
                name=name,
                config_hash=config_hash,
                input_shape=tuple(spec.input_shape),
                mechanism=from_config(spec.mechanism.to_config(), outputs),
                quorum=spec.quorum,
                personalization=spec.personalization,
                encryption=None
                if spec.encryption is None
                else Encryption.from_spec(spec.encryption),
                records=records,
                classes=classes,
            )
        except ValidationError as err:
            raise TaskError(
                f"task {name!r} has an invalid configuration: {_problems(err)}"
            ) from None
        except (MechanismError, SchemaError, TaskError, TypeError, ValueError) as err:
            raise TaskError(f"task {name!r} has an invalid configuration: {err}") from err
        if task.encryption is not None and (task.multi_label or task.personalization is not None):
            raise TaskError(
                f"task {name!r}: encrypted queries support single-label voting "
                "without personalized budgets"
            )
        if task.mechanism.trained_teachers_only and task.personalization is not None:
            raise TaskError(
                f"task {name!r}: {task.mechanism.name} charges nothing per query, so there "
                "is no per-query cost for personalized budgets to divide: drop "
                '"personalization"'
            )
        if task.encryption is None:
            # Plaintext queries: each vote is checked by its validity proof and nothing else
            # (encrypted mode's circuit checks each party's one-hot vote itself).
            try:
                task.mechanism.require_vote_statement()
            except MechanismError as err:
                raise TaskError(f"task {name!r}: {err}") from err
        return task

    def to_config(self) -> dict[str, Any]:
        """The configuration object this task parses from (:meth:`parse` of it gives an equal
        task), in the on-disk format: the mechanism with every parameter spelled out,
        optional parts present only when set."""
        config: dict[str, Any] = {
            "mechanism": self.mechanism.to_config(),
            "input_shape": list(self.input_shape),
            "num_labels" if self.multi_label else "num_classes": self.outputs,
            "quorum": self.quorum,
        }
        if self.personalization is not None:
            config["personalization"] = self.personalization.model_dump()
        if self.encryption is not None:
            config["encryption"] = self.encryption.to_config()
        if self.records is not None:
            config["records"] = self.records.to_dict()
        if self.classes is not None:
            config["classes"] = list(self.classes)
        return config

    @property
    def class_names(self) -> tuple[str, ...]:
        """The outputs' names: the task's own, or "0", "1", ... when it names none."""
        return self.classes or tuple(str(i) for i in range(self.outputs))

    @property
    def outputs(self) -> int:
        """Classes (single label) or labels (multi-label): the teachers' outputs."""
        return self.mechanism.outputs

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
        """Columns of a party's vote matrix."""
        return self.mechanism.vote_width

    @property
    def weight_bits(self) -> int:
        """Fractional bits of a party's vote weight: FRACTIONAL_SHARE_BITS under weighting, else
        0 (every weight is 1)."""
        return FRACTIONAL_SHARE_BITS if self.weighting else 0

    @property
    def frac_bits(self) -> int:
        """Fractional bits of the shares: 0 for integer votes, more for fractional or weighted
        ones. A teacher's vote on its grid (``vote_grid_bits``, what a validity proof is about)
        times the weight on its own (``weight_bits``): the product is exact on the sum of both."""
        return self.mechanism.vote_grid_bits + self.weight_bits

    @property
    def max_weight(self) -> float:
        return self.personalization.max_weight if self.weighting and self.personalization else 1.0

    def tightened(self, overrides: Mapping[str, float] | None) -> TaskConfig:
        """This task running the mechanism a job with ``overrides`` (parameter -> value, as
        a job request names them; 0 or absent keeps the task's) runs: the task's,
        tightened by the mechanism's own rule (only more noise or a higher threshold),
        with a vote statement for plaintext queries. Resolved once, when the job is
        created. Raises TaskError saying which field broke it."""
        try:
            mechanism = self.mechanism.tightened(overrides or {})
        except MechanismError as err:
            raise TaskError(f"task {self.name!r}: {err}") from err
        return self._running(mechanism)

    def running(self, mechanism: Mechanism) -> TaskConfig:
        """This task running a job's resolved ``mechanism``, which must be the task's own or
        a tightening of it (:meth:`Mechanism.admits`) and, for plaintext queries, keep a
        vote statement: what each party that runs a job checks, once (the student's
        runner a job, the guardian and each hospital a round). Raises TaskError saying
        what is wrong."""
        try:
            self.mechanism.admits(mechanism)
        except MechanismError as err:
            raise TaskError(f"task {self.name!r}: {err}") from err
        return self._running(mechanism)

    def _running(self, mechanism: Mechanism) -> TaskConfig:
        if mechanism == self.mechanism:
            return self
        if self.encryption is None:  # a raised parameter must keep its statement
            try:
                mechanism.require_vote_statement()
            except MechanismError as err:
                raise TaskError(f"task {self.name!r}: {err}") from err
        return dataclasses.replace(self, mechanism=mechanism)

    def circuit_spec(
        self, voters: int, vote_total: float | None = None, vote_parties: int = 0
    ) -> CircuitSpec:
        """The round's circuit for ``voters`` teachers (every party's, summed: a party with an
        ensemble of m teachers counts m). ``vote_total``: the sum of their weights (the
        guardian's; the student may leave it out). ``vote_parties``: in encrypted-query mode
        the number of parties whose one-hot votes the circuit checks one by one (their
        shares, in the round's party order, are its inputs)."""
        return self.mechanism.circuit(
            voters * self.max_weight, vote_total, self.frac_bits, vote_parties
        )

    def decode(self, spec: CircuitSpec, outputs: dict[str, NDArray[np.uint64]]) -> Labels:
        """The student's circuit outputs -> labels: (B,) classes, or (B, k) 0/1 for multi-label;
        NOT_ANSWERED (-1) where the mechanism declined (a query, or one label)."""
        return self.mechanism.decode(spec, outputs)


Labels = NDArray[np.int64]


def read_task(path: Path, name: str | None = None) -> TaskConfig:
    """The task in a configuration file (JSON; its name ``name``, by default the file's
    stem). TaskError says what is wrong with the file."""
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise TaskError(f"{path}: not a readable task file ({err})") from None
    if not isinstance(config, dict):
        raise TaskError(f"{path}: a task file is a JSON object")
    return TaskConfig.parse(name or Path(path).stem, config, config_hash(config))
