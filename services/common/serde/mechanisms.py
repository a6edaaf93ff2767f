"""A mechanism and a job's overrides on the wire (name, outputs, parameters)."""

from __future__ import annotations

from collections.abc import Mapping

from capc.mechanisms import Mechanism, MechanismError, mechanism_class
from services.common.protocol import RequestError
from services.proto.capc.v1 import common_pb2


def mechanism_to_proto(mechanism: Mechanism) -> common_pb2.Mechanism:
    """A round's mechanism, as the answering parties and the jobs API receive it."""
    return common_pb2.Mechanism(
        name=mechanism.name,
        outputs=mechanism.outputs,
        params={k: float(v) for k, v in mechanism.params.model_dump().items()},
    )


def mechanism_from_proto(msg: common_pb2.Mechanism) -> Mechanism:
    """The mechanism a round names; RequestError if the message is not a valid one."""
    if not msg.name or not msg.outputs:
        raise RequestError("the round names no mechanism or label space; is the guardian current?")
    try:
        return mechanism_class(msg.name).from_params(msg.outputs, dict(msg.params))
    except MechanismError as err:
        raise RequestError(str(err)) from err


def overrides_to_proto(overrides: Mapping[str, float] | None) -> common_pb2.Mechanism | None:
    """A job's overrides (parameter -> value) as a request carries them; None when empty."""
    if not overrides:
        return None
    return common_pb2.Mechanism(params={k: float(v) for k, v in overrides.items()})


def overrides_from_proto(msg: common_pb2.Mechanism | None) -> dict[str, float] | None:
    """A request's overrides; name, outputs and zero values mean 'keep the task's'."""
    if msg is None:
        return None
    if msg.name or msg.outputs:
        raise RequestError(
            "a job may only raise mechanism parameters; the mechanism and its label space are the task's"
        )
    out = {k: float(v) for k, v in msg.params.items() if v != 0.0}
    return out or None
