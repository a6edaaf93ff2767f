"""``capc audit record``: record a canary audit's counts with the guardian, signed by who owns it.

A privacy audit stands beside a hospital's budget and may say its claim is refuted, so
only two identities may record one (the guardian checks the caller's certificate on
``RecordPrivacyAudit``):

- the guardian's operator, with a certificate of role ``guardian``, against any party;
- a hospital's own auditor, with that hospital's certificate (role ``answerer``),
  against that hospital only.

The querier side (the gateway and its admin tokens, the student party) reads audits
but cannot write them. The guardian computes the empirical bound itself from the
counts, at its ledger's delta; nothing computed here is taken.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import grpc

from services.common import pki, protocol, tls
from services.proto.capc.v1 import guardian_pb2, guardian_pb2_grpc

#: Seconds to wait for the guardian's answer.
RECORD_TIMEOUT_S = 30.0


class RecordError(RuntimeError):
    """The guardian refused or could not be reached; the message says why."""


def record(
    hub: guardian_pb2_grpc.GuardianHubStub,
    party: str,
    *,
    canaries: int,
    guesses: int,
    correct: int,
    attack: str,
    confidence: float = 0.95,
    note: str = "",
    timeout: float = RECORD_TIMEOUT_S,
) -> dict[str, Any]:
    """Send the counts to the guardian over ``hub`` (dialled with the recording
    identity's certificate); returns what it stored, its claimed epsilon included."""
    try:
        kept = hub.RecordPrivacyAudit(
            guardian_pb2.RecordPrivacyAuditRequest(
                header=protocol.header(),
                party=party,
                canaries=canaries,
                guesses=guesses,
                correct=correct,
                confidence=confidence,
                attack=attack,
                actor=note,
            ),
            timeout=timeout,
        )
    except grpc.RpcError as err:
        code = err.code() if hasattr(err, "code") else None
        details = err.details() if hasattr(err, "details") else str(err)
        name = code.name if code is not None else "UNKNOWN"
        raise RecordError(f"the guardian refused the audit ({name}): {details}") from None
    return {
        "id": kept.id,
        "party": kept.party,
        "actor": kept.actor,
        "claimed_epsilon": kept.claimed_epsilon,
        "delta": kept.delta,
        "accountant": kept.accountant,
        "canaries": kept.canaries,
        "guesses": kept.guesses,
        "correct": kept.correct,
        "empirical_lower": kept.empirical_lower,
        "empirical_upper": kept.empirical_upper if kept.HasField("empirical_upper") else None,
        "refuted": kept.refuted,
    }


def run(args: argparse.Namespace) -> int:
    """Record the counts the arguments give; print what the guardian stored."""
    try:
        files = None if args.insecure_dev else tls.TLSFiles.in_dir(args.pki, args.name)
        if files is not None:
            files.read()
        channel = tls.secure_channel(args.guardian, files, args.server_name, role="guardian")
    except (OSError, pki.PKIError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        kept = record(
            guardian_pb2_grpc.GuardianHubStub(channel),
            args.party,
            canaries=args.canaries,
            guesses=args.guesses,
            correct=args.correct,
            attack=args.attack,
            confidence=args.confidence,
        )
    except RecordError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        channel.close()
    if args.json:
        print(json.dumps(kept, indent=2))
    else:
        upper = "inf" if kept["empirical_upper"] is None else f"{kept['empirical_upper']:.2f}"
        print(
            f"recorded audit {kept['id']} of {kept['party']} as {kept['actor']}: claimed "
            f"epsilon {kept['claimed_epsilon']:.4g} (delta {kept['delta']:g}); empirical >= "
            f"{kept['empirical_lower']:.3f} (CI up to {upper})"
            + ("; CLAIM REFUTED" if kept["refuted"] else "")
        )
    return 0
