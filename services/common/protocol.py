"""The wire protocol's version and the checks every service applies to requests.

The protocol version lives here once; every message header carries it. Query
recipes and uploaded query tensors are read and checked by
:mod:`services.common.serde`, the same way wherever they arrive.
"""

from __future__ import annotations

from services.proto.capc.v1 import common_pb2

#: 2 (2026-11-29): a round's work names its task by name and config hash, the task's
#: definition goes once per stream (HubMessage.task), and OpenRoundRequest.mechanism is
#: the job's whole resolved mechanism, not overrides. A party or student of version 1
#: would misread both, so it is refused by its version instead.
PROTOCOL_VERSION = 2


class RequestError(ValueError):
    """A request is malformed; the message says what to fix (INVALID_ARGUMENT)."""


def header(task: str = "", config_hash: str = "") -> common_pb2.Header:
    return common_pb2.Header(protocol_version=PROTOCOL_VERSION, task=task, config_hash=config_hash)


#: Metadata key naming the student's 2PC session (16 bytes, hex) on its round calls.
SESSION_KEY = "capc-session-id"
#: What a student call without a valid session id is told.
NO_SESSION = (
    "open a Compute stream first and send its 16-byte hex 'capc-session-id' in the metadata"
)


#: Who may record a privacy audit (RecordPrivacyAudit), in the words every refusal uses.
WHO_MAY_RECORD = (
    "a privacy audit is recorded by the guardian's operator (a certificate of role "
    "guardian, against any party) or by the audited hospital's own auditor (that "
    "hospital's answerer certificate, against itself only), with `capc audit record "
    "--guardian HOST:PORT --pki DIR --name CERTIFICATE --party PARTY --canaries N "
    "--guesses N --correct N --attack TEXT`"
)


def session_id(metadata: object) -> bytes:
    """The 16-byte session id a call's metadata (key/value pairs) names; b"" if none is valid."""
    sid = dict(metadata or ()).get(SESSION_KEY) if isinstance(metadata, (list, tuple)) else None
    try:
        parsed = bytes.fromhex(sid) if isinstance(sid, str) else b""
    except ValueError:
        return b""
    return parsed if len(parsed) == 16 else b""


def check_version(h: common_pb2.Header, who: str) -> None:
    if h.protocol_version != PROTOCOL_VERSION:
        raise RequestError(
            f"protocol version {h.protocol_version} is not supported; this {who} speaks "
            f"{PROTOCOL_VERSION}: run the same capc release on every party"
        )
