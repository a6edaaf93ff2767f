"""A mechanism on the wire (name, outputs, every parameter)."""

from __future__ import annotations

from capc.mechanisms import Mechanism, MechanismError, mechanism_class
from services.common.protocol import RequestError
from services.proto.capc.v1 import common_pb2


def mechanism_to_proto(mechanism: Mechanism) -> common_pb2.Mechanism:
    """A job's mechanism, as its rounds, the answering parties and the jobs API carry it."""
    return common_pb2.Mechanism(
        name=mechanism.name,
        outputs=mechanism.outputs,
        params={k: float(v) for k, v in mechanism.params.model_dump().items()},
    )


def mechanism_from_proto(msg: common_pb2.Mechanism) -> Mechanism:
    """The mechanism a message names; RequestError if the message is not a valid one
    (whether a task allows it is :meth:`capc.task_config.TaskConfig.running`'s to say)."""
    if not msg.name or not msg.outputs:
        raise RequestError(
            "the message names no mechanism or label space (a sender from before the job's "
            "mechanism travelled in full?)"
        )
    try:
        return mechanism_class(msg.name).from_params(msg.outputs, dict(msg.params))
    except MechanismError as err:
        raise RequestError(str(err)) from err
