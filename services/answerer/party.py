"""An answering party: dials out to the guardian, answers rounds with vote shares.

The hospital opens no port. It keeps one Connect stream to the guardian,
opened by a Register message with one entry per teacher it votes with;
when the stream breaks (guardian restart, network) it reconnects with
exponential backoff and jitter, so the hospital never needs a restart.
For each round it runs batched inference with every teacher (one, or an
ensemble of m: :class:`capc.models.ensemble.Voters`), turns each teacher's
predictions into the votes the round's mechanism asks for (one-hot, k-hot,
tau-clipped or one-hot over label subsets; weighted and zeroed where it sits
a query out under personalized budgets), sums them over its teachers, and
sends the guardian share in the clear and the seed sealed to the student
(capc.mpc.votes). Encrypted rounds run through
:mod:`services.answerer.encrypted` over a sealed channel to the student.

Before it votes, the party reserves the round's worst case in its own ledger
and refuses once its own cap would be exceeded; when the guardian says how
the round ended it charges itself the same (:mod:`services.answerer.budget`).
Those rules and the vote itself are the party's role (:mod:`capc.round.party`):
this process runs the teachers, keeps the stream and converts each message once.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import grpc
import numpy as np
from sqlalchemy.exc import SQLAlchemyError

from capc.models.ensemble import Voters
from capc.models.foreign import Interface
from capc.round.errors import LedgerRefusedError, VoteRefusedError
from capc.round.messages import PartyShares, RoundWork
from capc.task_config import TaskConfig
from services.answerer.budget import OwnBudget
from services.common import pki, protocol, serde, tls
from services.common.buffers import BoundedBuffer
from services.common.limits import PARTY_OUTGOING_MESSAGES
from services.common.relay import RelayChannel
from services.proto.capc.v1 import common_pb2, guardian_pb2, guardian_pb2_grpc

if TYPE_CHECKING:
    from capc.models import Teacher
    from services.answerer.encrypted import EncryptedAnswerer

log = logging.getLogger("capc.answerer")

HEARTBEAT_S = 10.0
#: Seconds between spend reports while rounds settle: at most one a period, sent with
#: the settlements it covers written just before (one ledger write a round, not two).
REPORT_S = 5.0
REFUSALS = (
    grpc.StatusCode.PERMISSION_DENIED,
    # The guardian refused the party's DP-SGD training past its cap there.
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.ALREADY_EXISTS,
)


class Beat:
    """A session's periodic messages to the guardian, one :meth:`step` every
    :data:`REPORT_S` seconds: the spend report once a settlement made one due, and a
    heartbeat (naming the rounds still open here) every :data:`HEARTBEAT_S` seconds."""

    def __init__(
        self, name: str, budget: OwnBudget, outgoing: BoundedBuffer[guardian_pb2.PartyMessage]
    ) -> None:
        self.name = name
        self.budget = budget
        self.outgoing = outgoing
        self.report_due = threading.Event()
        self.last_heartbeat = time.monotonic()

    def step(self, now: float) -> None:
        """Send what is due at ``now`` (monotonic seconds). A ledger that fails a read or
        a write leaves its rounds reserved (an over-count) and the report due again: the
        beat goes on, and the next step tries again."""
        try:
            if self.report_due.is_set():
                self.report_due.clear()
                self.report()
            if now - self.last_heartbeat < HEARTBEAT_S:
                return
            self.last_heartbeat = now
            self.outgoing.put(
                guardian_pb2.PartyMessage(
                    header=protocol.header(""),
                    heartbeat=guardian_pb2.Heartbeat(
                        sent_unix_ms=int(time.time() * 1000),
                        # Rounds whose settlement went missing are asked for again.
                        open_rounds=self.budget.open_rounds(),
                    ),
                )
            )
        except (LedgerRefusedError, SQLAlchemyError) as err:
            self.report_due.set()
            log.error("%s could not read or write its own ledger: %s", self.name, err)

    def report(self) -> None:
        """Send this party's own ledger (its held settlements are written first)."""
        self.outgoing.put(
            guardian_pb2.PartyMessage(header=protocol.header(""), report=self.budget.report())
        )


def answer_pool() -> ThreadPoolExecutor:
    """One thread that answers plain rounds (admit, infer, vote) in order.

    The parties of one process share one: they vote with the same teachers, and a
    round reaches all of them at once. With a thread each, dozens of runnable threads
    contend for the interpreter lock, and switching between them cost as much CPU as
    the answers (benchmarks/scale.py, 50 parties a process: 8 ms of CPU a party a round
    with a thread each, 4 with one shared)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="capc-inference")


class AnsweringParty:
    """One hospital's party process."""

    def __init__(
        self,
        name: str,
        teacher: Teacher | Voters,
        guardian: str,
        files: tls.TLSFiles | None,
        budget: OwnBudget,
        server_name: str | None = None,
        max_backoff: float = 30.0,
        pool: ThreadPoolExecutor | None = None,
    ) -> None:
        """``pool``: where plain rounds are answered; the parties of one process share
        one (:func:`answer_pool`), a party alone gets its own."""
        self.name = name
        self.budget = budget
        self.voters = teacher if isinstance(teacher, Voters) else Voters([teacher])
        self.guardian = guardian
        self.files = files
        self.server_name = server_name
        self.max_backoff = max_backoff
        self.rounds_answered = 0
        self.connected = threading.Event()
        self._pool = pool or answer_pool()
        # An encrypted round waits on the student's relayed frames while it runs: on a
        # thread of this party's own, so that it never holds up the shared pool.
        self._encrypted_pool: ThreadPoolExecutor | None = None
        # A message the stream has no room for waits on a thread of this party's own, not
        # on the shared pool (see _send); made the first time one must wait.
        self._waiting_pool: ThreadPoolExecutor | None = None
        self._waiting_lock = threading.Lock()
        single = self.voters.single
        # Encrypted rounds evaluate one HE-friendly teacher; an ensemble answers plain ones.
        self._encrypted: EncryptedAnswerer | None = None
        if single is not None:
            # Imported only for a capc teacher (torch and TenSEAL): a party of ONNX
            # teachers, which never answers encrypted rounds, runs without either.
            from services.answerer.encrypted import EncryptedAnswerer

            self._encrypted = EncryptedAnswerer(name, single)
        # Encrypted rounds in progress: relayed frames from the student go to their channel.
        self._relays: dict[int, RelayChannel] = {}
        # Hashing every teacher takes a while for a large ensemble: once, not per connection.
        self._infos = self.voters.infos()

    def _header(self, task: str = "") -> common_pb2.Header:
        return protocol.header(task)

    def run(self, stop: threading.Event) -> None:
        """Stay connected until ``stop`` is set, reconnecting with backoff."""
        delay = 0.5
        while not stop.is_set():
            try:
                self._session(stop)
            except grpc.RpcError as err:
                code = err.code() if hasattr(err, "code") else None
                if code in REFUSALS:
                    # Refusals an operator must act on: a wrong or revoked certificate on
                    # either side, or this identity already connected from elsewhere.
                    log.error(
                        "%s: connection to the guardian refused: %s",
                        self.name,
                        err.details() if hasattr(err, "details") else err,
                    )
                else:
                    log.warning("stream to the guardian broke (%s); reconnecting", code)
            except pki.PKIError as err:
                # This party's own files: the operator may replace them while it retries.
                log.error("%s cannot dial the guardian: %s", self.name, err)
            finally:
                was_up = self.connected.is_set()
                self.connected.clear()
            if was_up:
                delay = 0.5  # the guardian had accepted us: start backing off afresh
            stop.wait(delay * (0.5 + random.random()))
            delay = min(self.max_backoff, delay * 2)

    def _session(self, stop: threading.Event) -> None:
        channel = tls.secure_channel(self.guardian, self.files, self.server_name, role="guardian")
        outgoing: BoundedBuffer[guardian_pb2.PartyMessage] = BoundedBuffer(PARTY_OUTGOING_MESSAGES)
        infos = [
            guardian_pb2.TeacherInfo(
                architecture=architecture,
                input_shape=list(self.voters.input_shape),
                num_classes=self.voters.num_classes,
                model_hash=model_hash,
            )
            for architecture, model_hash in self._infos
        ]
        outgoing.put(
            guardian_pb2.PartyMessage(header=self._header(), register=self.budget.register(infos))
        )

        def requests() -> Iterator[guardian_pb2.PartyMessage]:
            while True:
                item = outgoing.get()
                if item is None:
                    return
                yield item

        beat = Beat(self.name, self.budget, outgoing)

        def beating() -> None:
            # This session's beat only: a reconnected stream starts its own.
            while not stop.wait(REPORT_S) and self.connected.is_set() and not ended.is_set():
                beat.step(time.monotonic())

        metadata = None if self.files is not None else [("capc-party", self.name)]
        responses = guardian_pb2_grpc.GuardianHubStub(channel).Connect(
            requests(), metadata=metadata
        )
        ended = threading.Event()

        def watch() -> None:
            # Cancel the stream when the party stops, or when the guardian's certificate
            # is revoked while it is open; return when this session ends.
            while not ended.is_set():
                if stop.wait(0.5):
                    responses.cancel()
                    return
                why = channel.revoked() if isinstance(channel, tls.PinnedChannel) else None
                if why is not None:
                    log.error("%s leaves the guardian: %s", self.name, why)
                    responses.cancel()
                    return

        threading.Thread(target=watch, daemon=True).start()

        def registered(msg: guardian_pb2.HubMessage) -> None:
            log.info(
                "%s connected to the guardian (cap %.3g eps)",
                self.name,
                msg.registered.epsilon_cap,
            )
            self.budget.welcome(msg.registered)
            beat.report()
            self.connected.set()
            threading.Thread(target=beating, daemon=True).start()

        def task(msg: guardian_pb2.HubMessage) -> None:
            self.budget.define(msg.task, msg.header)

        def work(msg: guardian_pb2.HubMessage) -> None:
            # Decoded once, here; answered on the pool its kind of queries runs on.
            try:
                decoded = self.budget.decode(msg.work, msg.header)
            except VoteRefusedError as refusal:
                self._refuse(outgoing, msg.header.task, msg.work.round_id, refusal)
                return
            self._pool_for(decoded.work).submit(self._answer, decoded, outgoing)

        def settled(msg: guardian_pb2.HubMessage) -> None:
            if self.budget.settle(msg.settled):
                beat.report_due.set()

        def relay(msg: guardian_pb2.HubMessage) -> None:
            channel_of = self._relays.get(msg.relay.round_id)
            if channel_of is None:
                log.warning(
                    "a relayed frame for round %d, which is not open here", msg.relay.round_id
                )
                return
            channel_of.feed(bytes(msg.relay.payload))

        def cancelled(msg: guardian_pb2.HubMessage) -> None:
            log.warning(
                "guardian cancelled round %d: %s", msg.cancelled.round_id, msg.cancelled.reason
            )
            stale = self._relays.get(msg.cancelled.round_id)
            if stale is not None:
                stale.feed(None)

        # The guardian's message kind -> its handler (a kind this party does not know is
        # ignored: a newer guardian may send more).
        handlers: dict[str, Callable[[guardian_pb2.HubMessage], None]] = {
            "registered": registered,
            "task": task,
            "work": work,
            "settled": settled,
            "relay": relay,
            "cancelled": cancelled,
        }
        try:
            for msg in responses:
                handler = handlers.get(msg.WhichOneof("body") or "")
                if handler is not None:
                    handler(msg)
        finally:
            ended.set()
            outgoing.close()
            channel.close()
            self._flush()

    def _pool_for(self, work: RoundWork) -> ThreadPoolExecutor:
        if work.queries is None or not work.queries.encrypted:
            return self._pool
        if self._encrypted_pool is None:
            self._encrypted_pool = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"capc-encrypted-{self.name}"
            )
        return self._encrypted_pool

    def _send(
        self,
        outgoing: BoundedBuffer[guardian_pb2.PartyMessage],
        message: guardian_pb2.PartyMessage,
    ) -> None:
        """Queue a round's answer for the guardian without waiting on the thread it runs on.

        Plain rounds run on a thread every party of the process shares: a stream that
        takes nothing (a guardian held back by a student that stopped reading this party's
        relayed frames, a stalled connection) must hold up this party only. A message that
        finds no room waits for it on this party's own thread (each names its round: the
        guardian takes them in any order), as many as waited on the party's own pool
        before; it is dropped when the stream ends (the round stays reserved: an
        over-count the guardian settles again)."""
        try:
            outgoing.put_nowait(message)
        except queue.Full:
            with self._waiting_lock:
                if self._waiting_pool is None:
                    self._waiting_pool = ThreadPoolExecutor(
                        max_workers=1, thread_name_prefix=f"capc-waiting-{self.name}"
                    )
                waiting = self._waiting_pool
            waiting.submit(outgoing.put, message)

    def _flush(self) -> None:
        """Write the settlements this party holds; a ledger that fails is logged, and
        their rounds stay reserved (an over-count the guardian settles again)."""
        try:
            self.budget.flush()
        except (LedgerRefusedError, SQLAlchemyError) as err:
            log.error("%s could not write its settlements: %s", self.name, err)

    def _refuse(
        self,
        outgoing: BoundedBuffer[guardian_pb2.PartyMessage],
        task: str,
        round_id: int,
        refusal: VoteRefusedError,
    ) -> None:
        log.warning("%s", refusal)
        self._send(
            outgoing,
            guardian_pb2.PartyMessage(
                header=self._header(task),
                failure=guardian_pb2.RoundFailure(
                    round_id=round_id, reason=str(refusal), budget_refused=refusal.budget
                ),
            ),
        )

    def _answer(
        self, decoded: serde.PartyWork, outgoing: BoundedBuffer[guardian_pb2.PartyMessage]
    ) -> None:
        work, task = decoded.work, decoded.task
        try:
            # Reserved durably before anything derived from the data leaves this party.
            self.budget.admit(work)
        except VoteRefusedError as refusal:
            self._refuse(outgoing, task.name, work.round_id, refusal)
            return
        core = self.budget.core
        try:
            # The one branch on the queries' kind.
            match decoded.queries:
                case serde.EncryptedQueries(batch):
                    shares = self._answer_encrypted(work, batch, task.name, outgoing)
                case serde.RecipeQueries(recipe):
                    # Synthetic queries: regenerate, check the hash.
                    x = serde.regenerate(recipe, task.records)
                    shares = self._vote(work, self._predict(task, x, self._synthetic(x)))
                case serde.TensorQueries(x):
                    shares = self._vote(work, self._predict(task, x, False))
            self._send(
                outgoing,
                guardian_pb2.PartyMessage(
                    header=self._header(task.name), shares=serde.party_shares_to_proto(shares)
                ),
            )
            self.rounds_answered += 1
        except Exception as err:
            core.forget(work.round_id)
            log.warning("could not answer round %d: %s", work.round_id, err)
            self._send(
                outgoing,
                guardian_pb2.PartyMessage(
                    header=self._header(task.name),
                    failure=guardian_pb2.RoundFailure(round_id=work.round_id, reason=str(err)),
                ),
            )

    def _vote(self, work: RoundWork, predictions: np.ndarray) -> PartyShares:
        """The shares of the teachers' ``predictions`` on the round's queries."""
        core = self.budget.core
        core.check_teachers(work, len(self.voters))
        return core.vote(work, predictions, self.voters.num_classes)

    def _predict(self, task: TaskConfig, x: np.ndarray, own_statistics: bool) -> np.ndarray:
        """Every teacher's predictions on queries ``x`` (B, *input_shape): (B, m) or
        (B, m, k); ``own_statistics``: normalised with the batch's own statistics."""
        self._check_fits(task, tuple(x.shape[1:]))
        return self.voters.predict(x, current_statistics=own_statistics)

    def _synthetic(self, x: np.ndarray) -> bool:
        """Whether a recipe's batch ``x`` is read with its own statistics: images are
        (DIET), unless the teachers are DP-trained; table rows are encoded like real
        records, so the teachers read them with their own data's statistics."""
        return len(x.shape) > 2 and not self._trained

    @property
    def _trained(self) -> bool:
        """DP-trained teachers read every query with the stored statistics they were
        trained on (the pretrained body's, public: docs/privacy.md), recipes too."""
        return self.budget.attestation is not None

    def _check_fits(self, task: TaskConfig, input_shape: tuple[int, ...]) -> None:
        """ValueError saying which model does not fit the round's task and how (the same
        check ``capc answerer --task`` makes at start, here from the round itself)."""
        want = Interface(task.name or "(unnamed)", input_shape, task.outputs, task.multi_label)
        why = self.voters.misfit(self.name, want)
        if why is not None:
            log.error("%s", why)
            raise ValueError(why)

    def _answer_encrypted(
        self,
        work: RoundWork,
        batch: common_pb2.EncryptedBatch,
        task: str,
        outgoing: BoundedBuffer[guardian_pb2.PartyMessage],
    ) -> PartyShares:
        header = self._header(task)

        def send(payload: bytes, hello: bool = False) -> None:
            frame = guardian_pb2.RelayFrame(
                header=header, round_id=work.round_id, payload=payload, hello=hello
            )
            outgoing.put(guardian_pb2.PartyMessage(header=header, relay=frame))

        if self._encrypted is None:
            raise ValueError(
                f"encrypted rounds evaluate one HE-friendly capc checkpoint; this party votes "
                f"with {len(self.voters)} teacher(s): {self.voters.architecture}"
            )
        channel, key = RelayChannel.for_party(
            work.student_public_key, work.round_id, self.name, send
        )
        self._relays[work.round_id] = channel
        try:
            answer = self._encrypted.answer(
                work, batch, channel, key, lambda p: send(p, hello=True)
            )
        finally:
            self._relays.pop(work.round_id, None)
            channel.close()
        return self.budget.core.encrypted_vote(work, answer.share, answer.ciphertext_hash)
