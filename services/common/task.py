"""A task as the guardian registers it and every party reads it.

The configuration is a JSON object; its SHA-256 (of the canonical JSON) is
the config hash every message carries, so two parties disagreeing on the
task are refused rather than computing different circuits.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from capc.mpc.mechanism_circuits import ConfidentGNMax
from capc.privacy.round_cost import MechanismSpec


class TaskError(ValueError):
    """A task configuration is invalid."""


def config_hash(config: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a task configuration."""
    return hashlib.sha256(
        json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


@dataclass(frozen=True)
class TaskConfig:
    """A task as registered in the ledger: label space, inputs, mechanism, quorum."""

    name: str
    config_hash: str
    num_classes: int
    input_shape: tuple[int, ...]
    mechanism: MechanismSpec
    quorum: int

    @classmethod
    def parse(cls, name: str, config: dict[str, object], config_hash: str) -> TaskConfig:
        try:
            mech = config["mechanism"]
            assert isinstance(mech, dict)
            shape = config["input_shape"]
            assert isinstance(shape, list)
            return cls(
                name=name,
                config_hash=config_hash,
                num_classes=int(str(config["num_classes"])),
                input_shape=tuple(int(x) for x in shape),
                mechanism=MechanismSpec(
                    name=str(mech["name"]),
                    sigma=float(mech["sigma"]),
                    threshold=float(mech.get("threshold", 0.0)),
                    sigma1=float(mech.get("sigma1", 0.0)),
                ),
                quorum=int(str(config.get("quorum", 1))),
            )
        except (KeyError, AssertionError, TypeError, ValueError) as err:
            raise TaskError(f"task {name!r} has an invalid configuration: {err}") from err

    def circuit_spec(self, parties: int) -> ConfidentGNMax:
        m = self.mechanism
        return ConfidentGNMax(
            num_classes=self.num_classes,
            max_votes=parties,
            sigma2=m.sigma,
            threshold=m.threshold,
            sigma1=m.sigma1 if m.name == "confident-gnmax" else 1.0,
            confident=m.name == "confident-gnmax",
        )
