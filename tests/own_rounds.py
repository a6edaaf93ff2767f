"""A hospital's own budget fed as its stream feeds it: the task defined once, then each
round's work decoded and admitted (services.answerer.party does the same)."""

from __future__ import annotations

from collections.abc import Mapping

from capc.round.messages import RoundWork
from capc.task_config import canonical_json
from services.answerer.budget import OwnBudget
from services.proto.capc.v1 import common_pb2, guardian_pb2


def define(own: OwnBudget, config: Mapping[str, object], header: common_pb2.Header) -> None:
    """The guardian's definition of the header's task, ``config``, as the stream sends it."""
    own.define(guardian_pb2.TaskDefinition(config_json=canonical_json(dict(config))), header)


def admit(
    own: OwnBudget,
    work: guardian_pb2.RoundWork,
    header: common_pb2.Header,
    config: Mapping[str, object] | None = None,
) -> RoundWork:
    """Decode ``work`` once and reserve it in ``own``'s ledger; the decoded core work.
    ``config``: the task's configuration, defined first (as a stream's first round)."""
    if config is not None:
        define(own, config, header)
    decoded = own.decode(work, header).work
    own.admit(decoded)
    return decoded
