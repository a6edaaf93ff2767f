"""A hospital's own privacy budget: its ledger, its cap, its charges.

The hospital, not the guardian or the querier, is the authority on what its
data may still be asked. It keeps its own ledger (the same store as the
guardian's: SQLite by default, PostgreSQL by URL) with one party, itself, and
the cap set in its own configuration:

- Before it votes in a round it computes the round's worst case from the
  mechanism and parameters the round carries (its vote weight, the queries
  it votes on) with the same accountant as the guardian, and reserves it
  durably. If that would take it past its own cap it refuses to vote,
  whatever the guardian's ledger says.
- When the guardian tells it how the round ended, it computes the actual
  charge itself from the round's mechanism and what the round released (the
  answered mask), and replaces the reservation with it. A round it is never
  told about keeps its reservation: a crash may over-count, never under-count.
- It keeps the guardian's signed audit head of every round it settles, so a
  history the guardian's database later shows differently is caught
  (``capc audit verify``).

The first two rules are the party's role (:class:`capc.round.party.PartyCore`, over
this ledger through :mod:`services.answerer.ledger_port`); this module is their
adapter: it converts the guardian's messages (in :mod:`services.common.serde`), and
keeps what is the service's own: the cap's registration, the guardian's audit key and
heads, and the spend reports.

What the hospital trusts the guardian for: whether its vote was used and
what a round released. A guardian that lied about those would already have
broken the protocol it is trusted to follow (it could hand its share sum to
the student); it is never trusted with the hospital's cap or spend.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict

from capc.round import trust
from capc.round.errors import LedgerRefusedError

# Re-exported: a refusal is the party role's own.
from capc.round.errors import VoteRefusedError as VoteRefusedError
from capc.round.ledger import KeptSetting
from capc.round.messages import RoundWork
from capc.round.party import PartyCore
from capc.round.training import Attestation, TrainingCharge
from capc.task_config import TaskConfig
from services.answerer.ledger_port import SqlPartyLedger
from services.common import serde
from services.common.ledger import Ledger
from services.common.ledger.audit import AuditHead, head_signed
from services.common.limits import MAX_DEFINED_TASKS
from services.common.protocol import RequestError
from services.proto.capc.v1 import common_pb2, guardian_pb2

log = logging.getLogger("capc.answerer.budget")

#: Settings this ledger keeps about its guardian.
GUARDIAN_KEY = "guardian_audit_key"
GUARDIAN_HEAD = "guardian_head"
#: Open rounds a heartbeat asks the guardian about (oldest first).
MAX_ASKED = 256


class CapRaiseError(LedgerRefusedError):
    """A hospital raised its own cap without saying why; the message says how."""


class OwnBudget:
    """Party ``name``'s ledger at ``url`` with its own ``cap`` (epsilon at the ledger's delta)."""

    def __init__(
        self,
        name: str,
        ledger: Ledger,
        cap: float,
        guardian_key: str | None = None,
        cap_reason: str | None = None,
    ) -> None:
        self.name = name
        self.ledger = ledger
        # The hospital's configuration is the authority: a changed cap is audited, and a
        # raise must say why (its guarantee is weaker than a cap fixed in advance).
        before = next((b.registered_cap for b in ledger.budgets() if b.name == name), None)
        if before is not None and cap > before and not (cap_reason or "").strip():
            raise CapRaiseError(
                f"{name}'s own cap was {before:g} eps and {cap:g} raises it: a raise must say "
                "why (`capc answerer --cap-reason TEXT`); the reason is audited in this "
                "ledger and sent to the guardian with the new cap. A cap raised after rounds "
                "ran gives no guarantee at the new cap unless that cap was fixed in advance "
                "(docs/privacy.md, the budget filter)"
            )
        ledger.register_party(name, cap, actor=name, reason=cap_reason)
        self.cap = ledger.budget(name).cap
        #: Sent with every Register; the guardian audits it when the declared cap rises.
        self.cap_reason = (cap_reason or "").strip()
        # The guardian's pinned audit key (read once: only _pin changes it).
        self._key: str | None = None
        if guardian_key is not None:
            self._pin(guardian_key, "configured")
        #: This ledger as the party's role takes it (it holds settlements until the next
        #: round's reservation: one durable write a round).
        self.port = SqlPartyLedger(ledger, name)
        # The newest guardian head this party accepted (the stored one lags
        # behind the heads kept with held settlements): a later head is checked against
        # it, so a history that went back or was rewritten is caught while heads are held.
        self._seen: AuditHead | None = None
        #: The party's round rules, over this ledger.
        self.core = PartyCore(name, self.port)
        #: The DP-SGD training of its teachers, once charged (:meth:`attest`).
        self.attestation: Attestation | None = None
        # The tasks the guardian defined (:meth:`define`), and their configurations, by
        # name and config hash (two names may share a configuration): a round names its
        # task by these only. Oldest first, at most MAX_DEFINED_TASKS.
        self._tasks: OrderedDict[tuple[str, str], tuple[TaskConfig, dict[str, object]]] = (
            OrderedDict()
        )

    def attest(self, attestation: Attestation) -> TrainingCharge:
        """Charge the teachers' DP-SGD training in this ledger (once per digest), durably,
        before the party registers it with the guardian. TrainingRefusedError past the
        party's own cap: it must not answer with those teachers."""
        charge = self.core.attest(attestation)
        self.attestation = attestation
        log.info(
            "%s: DP-SGD training (%s) %s %.4g eps in its own ledger",
            self.name,
            attestation.describe(),
            "charged" if charge.charged else "charged before:",
            charge.epsilon,
        )
        return charge

    @property
    def refusing(self) -> str | None:
        """Why this party refuses every round for now (a guardian it cannot account with)."""
        return self.core.refusing

    @refusing.setter
    def refusing(self, why: str | None) -> None:
        self.core.refusing = why

    # -- the guardian ------------------------------------------------------------
    def register(self, teachers: list[guardian_pb2.TeacherInfo]) -> guardian_pb2.Register:
        """The first message of a stream: the cap, the accounting and the open rounds."""
        self.flush()
        return serde.register_to_proto(
            teachers,
            self.cap,
            self.ledger.accounting_json(),
            self.ledger.open_rounds()[:MAX_ASKED],
            self.cap_reason,
            self.attestation,
        )

    def open_rounds(self) -> list[int]:
        """Rounds reserved here and not yet settled, oldest first (at most MAX_ASKED)."""
        return self.port.open_rounds()[:MAX_ASKED]

    def flush(self) -> None:
        """Write the settlements this party holds (:mod:`services.answerer.ledger_port`)."""
        self.port.flush()

    def _pin(self, key: str, how: str) -> None:
        try:
            if len(bytes.fromhex(key)) != 32:
                raise ValueError
        except ValueError:
            raise LedgerRefusedError(
                f"a guardian audit key is 32 bytes in hex (64 characters), got {key!r}"
            ) from None
        self.ledger.keep_setting(
            GUARDIAN_KEY, key, actor=self.name, detail={"public_key": key, "how": how}
        )
        self._key = key

    def welcome(self, registered: guardian_pb2.Registered) -> None:
        """Check the guardian's Registered: the same accounting, the same audit key as
        pinned before (pinned now on first contact), and its head."""
        key = registered.audit_public_key.hex()
        verdict = trust.welcome(
            self.ledger.accounting_json(),
            registered.accounting_json,
            key,
            self.ledger.setting(GUARDIAN_KEY),
        )
        self.refusing = verdict.refusing
        if verdict.pin:
            self._pin(key, "first contact over mutual TLS")
            log.info("%s pinned the guardian's audit key %s", self.name, key)
        if self.refusing is None:
            self.keep_head(registered.head, 0)
        else:
            log.error("%s refuses to vote: %s", self.name, self.refusing)
        log.info(
            "%s: own cap %.6g eps (spent %.6g); the guardian holds %.6g",
            self.name,
            self.cap,
            self.ledger.budget(self.name).spent,
            registered.epsilon_cap,
        )

    # -- rounds -------------------------------------------------------------------
    def define(self, msg: guardian_pb2.TaskDefinition, header: common_pb2.Header) -> None:
        """Keep a task the guardian's stream defines, by its name and config hash (rounds
        name it by those only); a definition that does not check is logged and dropped (the
        rounds naming it are then refused)."""
        try:
            task, config = serde.task_definition_from_proto(msg, header)
        except RequestError as err:
            log.error(
                "%s: the guardian sent a task definition that does not check: %s", self.name, err
            )
            return
        key = (task.name, task.config_hash)
        self._tasks[key] = (task, config)
        self._tasks.move_to_end(key)
        while len(self._tasks) > MAX_DEFINED_TASKS:
            self._tasks.popitem(last=False)

    def decode(self, msg: guardian_pb2.RoundWork, header: common_pb2.Header) -> serde.PartyWork:
        """The round's work, decoded once, against the task its stream defined: the job's
        mechanism checked against the task's policy, the queries by kind. VoteRefusedError
        when it cannot be accounted."""
        self.core.willing()
        known = self._tasks.get((header.task, header.config_hash))
        try:
            if known is None:
                raise RequestError(
                    f"the guardian defined no task {header.task!r} with config hash "
                    f"{header.config_hash} on this stream"
                )
            return serde.round_work_from_proto(msg, self.name, header, *known)
        except (RequestError, ValueError) as err:
            raise VoteRefusedError(f"round {msg.round_id} cannot be accounted: {err}") from None

    def admit(self, work: RoundWork) -> None:
        """Reserve the round's worst case in this party's ledger before it votes.
        VoteRefusedError if it must not vote (``budget`` when its own cap would be
        exceeded)."""
        self.core.admit(work)

    def settle(self, msg: guardian_pb2.RoundSettled) -> bool:
        """Charge a round as the guardian says it ended; False when there was nothing to do
        (a round this party never reserved, or one settled already), or when the
        guardian's audit head shown with it does not check (the reservation stays)."""
        rid = int(msg.round_id)
        settled = serde.settlement_from_proto(msg, self.name)
        if settled is None:
            log.error("round %d: an unknown settlement %d; kept reserved", rid, msg.settlement)
            return False
        # The head is kept in the settlement's own transaction: one durable write a round.
        return self.core.settle(settled, lambda: self.checked_head(msg.head, rid))

    def keep_head(self, msg: guardian_pb2.AuditHead, round_id: int) -> bool:
        """Store the guardian's signed audit head shown with ``round_id`` (0: at connection),
        after checking its signature and that the guardian's history only grows; False
        (recorded in this party's audit log) when the check fails."""
        head = self.checked_head(msg, round_id)
        if head is not None:
            self.ledger.keep_setting(
                head.key, head.value, actor=head.actor, action=head.action, detail=head.detail
            )
        return head is not None

    def checked_head(self, msg: guardian_pb2.AuditHead, round_id: int) -> KeptSetting | None:
        """The guardian's audit head shown with ``round_id`` as the setting to keep, once
        its signature and growth check; None (recorded in this party's audit log) when
        they fail."""
        head = AuditHead(int(msg.seq), msg.hash, msg.signature)
        if self._key is None:
            self._key = self.ledger.setting(GUARDIAN_KEY)
        key = self._key
        if key is None or not head_signed(key, head):
            log.error(
                "round %d: the guardian's audit head %d is not signed by its key",
                round_id,
                head.seq,
            )
            self.ledger.record(
                self.name, "guardian_head_invalid", {"round": round_id, **head.to_dict()}
            )
            return None
        before = self._newest_head()
        if before is not None and trust.goes_back((before.seq, before.hash), (head.seq, head.hash)):
            log.error(
                "the guardian's audit log went back from entry %d to %d, or was rewritten: "
                "run `capc audit verify`",
                before.seq,
                head.seq,
            )
            self.ledger.record(
                self.name,
                "guardian_head_conflict",
                {"round": round_id, "before": before.to_dict(), "now": head.to_dict()},
            )
            return None
        self._seen = head
        return KeptSetting(
            GUARDIAN_HEAD,
            json.dumps(head.to_dict(), sort_keys=True),
            actor=self.name,
            action="guardian_head",
            detail={"round": round_id, **head.to_dict()},
        )

    def _newest_head(self) -> AuditHead | None:
        """The newer of the stored guardian head and the newest accepted since (kept with
        a settlement still held). Only this party writes its ledger, and every head it
        stores it accepted here first: once one is accepted, it is the newest."""
        if self._seen is not None:
            return self._seen
        stored = self.ledger.setting(GUARDIAN_HEAD)
        before = None if stored is None else AuditHead(**json.loads(stored))
        if self._seen is not None and (before is None or self._seen.seq > before.seq):
            return self._seen
        return before

    # -- reports ------------------------------------------------------------------
    def report(self) -> guardian_pb2.SpendReport:
        """This party's ledger as the guardian's admin view compares it (the settlements
        it holds written first)."""
        self.flush()
        opened, through, settled, spent = self.ledger.spend_report(self.name)
        return serde.spend_report_to_proto(
            through,
            settled.tolist(),
            spent.spent,
            spent.cap,
            len(opened),
            self.ledger.accounting_json(),
        )
