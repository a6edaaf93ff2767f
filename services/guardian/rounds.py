"""The guardian's round engine (docs/architecture.md, "One labelling round"), independent of gRPC.

open_round: check the request, reserve every connected party's worst case in
the ledger (parties that cannot afford it are left out; below quorum nothing
is spent), send the work to the included parties, collect their guardian
shares and sealed seeds until all arrive or the share timeout passes, abort
below quorum, and hand the student the sealed seeds of the parties used.

Encrypted-query mode: the round names ciphertexts that the student sends
each party itself, over the Relay stream; the guardian forwards those
frames by round and party (sealed end to end, it cannot read them), and
each party's guardian share comes out of its own 2PC with the student.
Everything else, ledger and circuit, is as in plain mode.

compute: run the garbled circuit as garbler on the student's stream, with the
guardian's secure noise folded into its share sum; record the round as
released right before the first garbled input leaves; charge the actual cost
after the outputs.

reap: a round that is not released within ``round_timeout`` seconds of its
opening (the student never ran its 2PC, or vanished) is aborted and its
reservations go back to the parties, without a restart. A 2PC that breaks
settles its round at once: aborted before the release, charged at its
reservation after it. Released rounds are never aborted.

Every party that was sent a round is told how it ended (:mod:`services.guardian.budgets`):
charged for what it released, or nothing; its own ledger charges itself the same.

Personalized budgets: with weighting, each party's vote weight comes from its
cap (``Personalization.weights``) and it is charged w**2 times; with vanishing,
the guardian draws per query who votes (``Personalization.rates`` and
``Personalization.participation``) and charges a party only for the queries it
voted on. Both are functions of the caps and of
the guardian's randomness, never of the data.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from capc.mechanisms import Personalization
from capc.mpc import validity
from capc.mpc.channel import Channel
from capc.mpc.mechanism_circuits import HistogramViolationError, violations
from capc.mpc.session import GarblerSession
from capc.mpc.votes import accepted, proven_vote_sum, verifier_shares
from capc.privacy.randomness import SecureRandom
from services.common import protocol, serde
from services.common.buffers import BoundedBuffer, Signal
from services.common.ledger import Ledger, QuorumError, RoundStateError
from services.common.ledger import disputes as dispute_log
from services.common.ledger.models import RoundState
from services.common.limits import (
    MAX_BATCH,
    MAX_CIPHERTEXTS,
    MAX_EXCLUDED,
    MAX_OPEN_ROUNDS_PER_QUERIER,
    MAX_RELAY_FRAME_BYTES,
    MAX_STREAMS_PER_IDENTITY,
    MAX_TEACHERS_PER_PARTY,
    PARTY_OUTBOX_MESSAGES,
    RELAY_BUFFER_FRAMES,
    ROUND_TIMEOUT_S,
    count_refusal,
)
from services.common.protocol import RequestError, check_version, query_recipe
from services.common.serde import mechanism_to_proto, overrides_from_proto
from services.common.task import TaskConfig, TaskError, canonical_json
from services.guardian import budgets
from services.guardian.loop import LoopTerms, loop_terms
from services.proto.capc.v1 import common_pb2, guardian_pb2

log = logging.getLogger("capc.guardian.rounds")


class RoundInputError(RequestError):
    """A share message is malformed or does not belong to the round; maps to INVALID_ARGUMENT."""


class RoundRefusedError(RuntimeError):
    """The round cannot run (quorum lost, unknown round); maps to FAILED_PRECONDITION."""


class LimitError(RuntimeError):
    """One identity holds as many streams or open rounds as it may; maps to RESOURCE_EXHAUSTED."""


class DuplicateLinkError(RuntimeError):
    """The party is connected already: a second stream under its identity is refused."""

    def __init__(self, name: str, connected_from: str) -> None:
        super().__init__(f"{name} is already connected from {connected_from or 'elsewhere'}")
        self.name = name
        self.connected_from = connected_from


# A party sends a heartbeat every 10 s; a stream silent for this long is dead even
# if its transport has not noticed yet (a host that lost power sends no FIN).
SILENT_AFTER_S = 35.0
#: Rounds remembered for a retry without a party (ids, queriers and seeded parties only).
RECENT_ROUNDS = 4096


def _always() -> bool:
    return True


@dataclass
class PartyLink:
    """An answering party's live stream: what the hub sends it goes through ``outbox``
    (bounded: a party that stops reading cannot make the guardian hold more).

    ``peer`` is the stream's network address; ``active`` says whether its RPC
    is still open (the servicer context's ``is_active``).
    """

    name: str
    peer: str = ""
    active: Callable[[], bool] = _always
    outbox: BoundedBuffer[guardian_pb2.HubMessage] = field(
        default_factory=lambda: BoundedBuffer(PARTY_OUTBOX_MESSAGES)
    )
    last_heard: float = field(default_factory=time.monotonic)
    #: Teachers the party votes with (its Register): its counts of a query sum to this.
    teachers: int = 1

    def heard(self) -> None:
        """The party sent something on this stream."""
        self.last_heard = time.monotonic()

    def alive(self, silent_after: float = SILENT_AFTER_S) -> bool:
        return self.active() and time.monotonic() - self.last_heard < silent_after


@dataclass
class _Round:
    round_id: int
    task: TaskConfig
    querier: str
    batch: int
    included: tuple[str, ...]
    shares: dict[str, NDArray[np.uint64]] = field(default_factory=dict)
    seeds: dict[str, bytes] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    complete: Signal = field(default_factory=Signal)
    guardian_sum: NDArray[np.uint64] | None = None
    used: tuple[str, ...] = ()
    # Personalized budgets: vote weight and, with vanishing, who votes on which query.
    weights: dict[str, float] = field(default_factory=dict)
    votes_on: dict[str, NDArray[np.bool_]] = field(default_factory=dict)
    # Encrypted-query mode: the student's 2PC session and the ciphertexts' hash.
    session_id: bytes = b""
    ciphertext_hash: bytes | None = None
    # The stream each party's work went out on: only its end fails the party here.
    sent: dict[str, PartyLink] = field(default_factory=dict)
    # Parties the reservation left out, with the epsilon each has left.
    excluded: dict[str, float] = field(default_factory=dict)
    # Monotonic seconds at opening; the reaper aborts rounds not released in time.
    opened_at: float = field(default_factory=time.monotonic)
    released: bool = False
    # Teachers of each included party, as registered when the round opened.
    teachers: dict[str, int] = field(default_factory=dict)
    # Vote validity proofs: each party's statement, its proof shares (bit shares are in
    # ``shares``), the challenge drawn once every share arrived, and the votes left out.
    relations: dict[str, validity.VoteRelation] = field(default_factory=dict)
    proofs: dict[str, NDArray[np.uint64]] = field(default_factory=dict)
    challenge: validity.Challenge | None = None
    invalid: dict[str, str] = field(default_factory=dict)
    checked: bool = False

    def weight(self, party: str) -> float:
        return self.weights.get(party, 1.0)

    def left_out(self, party: str) -> bool:
        """The party failed, or its vote did (unprovable or invalid): it takes no further
        part in the round, neither shares nor relayed frames. Call under the engine's lock."""
        return party in self.failed or party in self.invalid

    def voters(self, party: str) -> int:
        return self.teachers.get(party, 1)

    def voting(self, party: str) -> NDArray[np.bool_]:
        """(batch,) mask of the queries ``party`` voted on."""
        mask = self.votes_on.get(party)
        return np.ones(self.batch, dtype=bool) if mask is None else mask


class RoundEngine:
    """Rounds in flight and the answering parties' links."""

    def __init__(
        self,
        ledger: Ledger,
        share_timeout: float = 60.0,
        rng: SecureRandom | None = None,
        silent_after: float = SILENT_AFTER_S,
        round_timeout: float = ROUND_TIMEOUT_S,
    ) -> None:
        if round_timeout <= share_timeout:
            raise ValueError(
                f"the round timeout ({round_timeout:g} s) must exceed the share timeout "
                f"({share_timeout:g} s): a round collects shares before its 2PC can start"
            )
        self.ledger = ledger
        self.share_timeout = share_timeout
        self.round_timeout = round_timeout
        self.silent_after = silent_after
        self._rng = rng or SecureRandom()
        self._links: dict[str, PartyLink] = {}
        self._rounds: dict[int, _Round] = {}
        # Opened rounds wait here for the 2PC session the student named.
        self._ready: dict[tuple[str, bytes], queue.Queue[int]] = {}
        # Encrypted-query mode: each student session's Relay stream.
        self._relays: dict[tuple[str, bytes], BoundedBuffer[guardian_pb2.RelayFrame]] = {}
        # Per identity: streams held open, and rounds being opened (not yet in _rounds).
        self._streams: dict[str, int] = {}
        self._opening: dict[str, int] = {}
        # Rounds whose sealed seeds went to their student, newest last (at most
        # RECENT_ROUNDS): (querier, parties whose seeds it got, retried already).
        self._recent: OrderedDict[int, tuple[str, frozenset[str], bool]] = OrderedDict()
        self._lock = threading.Lock()

    # -- per-identity limits ---------------------------------------------------
    def admit_stream(self, identity: str, what: str) -> Callable[[], None]:
        """Count one more stream for ``identity``; returns what to call when it ends.

        Raises :class:`LimitError` when the identity holds MAX_STREAMS_PER_IDENTITY already.
        """
        with self._lock:
            held = self._streams.get(identity, 0)
            if held >= MAX_STREAMS_PER_IDENTITY:
                raise LimitError(
                    f"{identity} already holds {held} streams to the guardian, the most one "
                    f"identity may (MAX_STREAMS_PER_IDENTITY); this {what} stream is refused. "
                    "Close idle clients before opening more (a student client holds one "
                    "Compute stream, and one Relay stream in encrypted mode; an answering "
                    "party one Connect stream)"
                )
            self._streams[identity] = held + 1
        released = threading.Event()

        def release() -> None:
            if released.is_set():
                return
            released.set()
            with self._lock:
                left = self._streams.get(identity, 1) - 1
                if left:
                    self._streams[identity] = left
                else:
                    self._streams.pop(identity, None)

        return release

    def streams(self, identity: str) -> int:
        with self._lock:
            return self._streams.get(identity, 0)

    def _admit_round(self, querier: str) -> list[bool]:
        """Count a round being opened for ``querier``; returns its token for _admitted_round."""
        with self._lock:
            held = self._opening.get(querier, 0) + sum(
                1 for r in self._rounds.values() if r.querier == querier
            )
            if held >= MAX_OPEN_ROUNDS_PER_QUERIER:
                raise LimitError(
                    f"{querier} holds {held} rounds opened but not yet computed, the most one "
                    f"querier may (MAX_OPEN_ROUNDS_PER_QUERIER); this round is refused and "
                    "nothing was reserved. Run the 2PC of the open rounds first; a round "
                    f"never computed is aborted {self.round_timeout:g} s after its opening"
                )
            self._opening[querier] = self._opening.get(querier, 0) + 1
        return [False]

    def _admitted_round(self, querier: str, token: list[bool]) -> None:
        """The round admitted for ``querier`` is in _rounds now, or failed to open.

        Call with the lock held; ``token`` makes a second call do nothing.
        """
        if token[0]:
            return
        token[0] = True
        left = self._opening.get(querier, 1) - 1
        if left:
            self._opening[querier] = left
        else:
            self._opening.pop(querier, None)

    # -- answering parties ----------------------------------------------------
    def attach(
        self,
        name: str,
        peer: str = "",
        active: Callable[[], bool] = _always,
        teachers: int = 1,
    ) -> PartyLink:
        """A party's stream opened; the party votes with ``teachers`` teachers.

        While the party's earlier stream is alive (open and heard from within
        ``silent_after``), the new one is refused with :class:`DuplicateLinkError`:
        two streams under one identity mean a copied key, and a silent takeover
        would hand the thief the party's rounds. A dead or silent earlier
        stream is ended and replaced, so a party that lost its connection
        gets back in.
        """
        if not 1 <= teachers <= MAX_TEACHERS_PER_PARTY:
            raise RequestError(
                f"a party votes with 1 to {MAX_TEACHERS_PER_PARTY} teachers, {name} "
                f"registered {teachers}"
            )
        link = PartyLink(name, peer, active, teachers=teachers)
        with self._lock:
            old = self._links.get(name)
            if old is not None and old.alive(self.silent_after):
                raise DuplicateLinkError(name, old.peer)
            self._links[name] = link
        if old is not None:
            log.info(
                "party %s reconnected from %s; its old stream (%s) was dead", name, peer, old.peer
            )
            old.outbox.close()
        self.ledger.touch(name)
        return link

    def detach(self, link: PartyLink) -> None:
        """A party's stream closed: it is left out of rounds still waiting for it there."""
        with self._lock:
            if self._links.get(link.name) is link:
                del self._links[link.name]
            waiting = [
                r
                for r in self._rounds.values()
                if r.sent.get(link.name) is link and not r.complete.is_set()
            ]
        for r in waiting:
            self._party_failed(r, link.name)

    def connected(self) -> list[str]:
        with self._lock:
            return sorted(self._links)

    def reachable(self) -> list[str]:
        """Connected parties heard from within ``silent_after`` s: those a round can ask.

        A hospital behind a partition keeps its stream open until its transport
        notices; it sends no heartbeat meanwhile, so it is left out of new rounds
        (and not reserved for) instead of holding each round to its share timeout.
        """
        with self._lock:
            return sorted(n for n, link in self._links.items() if link.alive(self.silent_after))

    def teachers(self) -> dict[str, int]:
        """Teachers of every connected party."""
        with self._lock:
            return {n: link.teachers for n, link in self._links.items()}

    def _party_failed(self, rnd: _Round, name: str) -> None:
        rnd.failed.add(name)
        if set(rnd.shares) | rnd.failed >= set(rnd.included):
            rnd.complete.set()

    def report_failure(self, name: str, round_id: int, reason: str) -> bool:
        """A party cannot answer a round; False when the round did not ask it."""
        with self._lock:
            rnd = self._rounds.get(round_id)
        if rnd is not None and name in rnd.included:
            log.warning("party %s could not answer round %d: %s", name, round_id, reason)
            self._party_failed(rnd, name)
            return True
        return False

    def receive_shares(self, name: str, msg: guardian_pb2.Shares) -> None:
        """Accept one party's shares for a round; replays and wrong shapes are refused."""
        with self._lock:
            rnd = self._rounds.get(msg.round_id)
        if rnd is None or name not in rnd.included:
            raise RoundInputError(f"round {msg.round_id} did not ask {name} for shares")
        with self._lock:
            # A party left out votes no more in this round: unproven shares would count.
            left_out = rnd.left_out(name)
        if left_out:
            raise RoundInputError(
                f"{name} was left out of round {msg.round_id}: its shares are refused"
            )
        relation = rnd.relations.get(name)
        if relation is None and rnd.relations and rnd.ciphertext_hash is None:
            raise RoundInputError(
                f"round {msg.round_id} takes proven votes only; {name} has no proof statement"
            )
        proof = None
        try:
            if relation is None:
                share = serde.shares_from_proto(msg, (rnd.batch, rnd.task.vote_width))
            else:
                # Bit shares in F_p and the proof share: checked jointly with the student.
                # The proof first: a party sending plain shares is told proofs are needed.
                proof = serde.proof_from_proto(msg, (rnd.batch, relation.proof_elements))
                share = serde.shares_from_proto(msg, (rnd.batch, relation.elements), field=True)
        except RequestError as err:
            raise RoundInputError(str(err)) from None
        if rnd.ciphertext_hash is not None:
            if msg.batch_hash != rnd.ciphertext_hash:
                raise RoundInputError(
                    f"{name} evaluated other ciphertexts than round {msg.round_id} named: refused"
                )
        elif not msg.sealed_seed:
            raise RoundInputError("shares without a sealed seed cannot be used")
        with self._lock:
            if name in rnd.shares or rnd.complete.is_set():
                raise RoundInputError(
                    f"{name} already sent shares for round {msg.round_id}, or the round closed: duplicate refused"
                )
            rnd.shares[name] = share
            if proof is not None:
                rnd.proofs[name] = proof
            rnd.seeds[name] = bytes(msg.sealed_seed)
            if set(rnd.shares) | rnd.failed >= set(rnd.included):
                rnd.complete.set()

    # -- student --------------------------------------------------------------
    def open_round(
        self, querier: str, request: guardian_pb2.OpenRoundRequest, session_id: bytes
    ) -> guardian_pb2.OpenRoundReply:
        """Reserve, distribute, collect; raises QuorumError, RoundInputError or RoundRefusedError."""
        rnd = self.begin_round(querier, request, session_id)
        rnd.complete.wait(self.share_timeout)
        return self.finish_round(rnd)

    def begin_round(
        self, querier: str, request: guardian_pb2.OpenRoundRequest, session_id: bytes
    ) -> _Round:
        """Check the request, reserve and send the work; the round collects shares until
        ``complete`` is set or the share timeout passes, then :meth:`finish_round`."""
        header = request.header
        check_version(header, "guardian")
        config, digest = self.ledger.task(header.task)
        task = TaskConfig.parse(header.task, config, digest)
        if header.config_hash != digest:
            raise RequestError(
                f"task {task.name} has config hash {digest}, the request {header.config_hash or 'none'}; fetch the task again"
            )
        if not request.round_key:
            raise RequestError("a round needs a round_key chosen by the student, used once")
        if len(request.student_public_key) != 32:
            raise RequestError("student_public_key must be a 32-byte X25519 key")
        try:
            task = task.overridden(
                overrides_from_proto(request.mechanism if request.HasField("mechanism") else None)
            )
        except TaskError as err:
            raise RequestError(str(err)) from err
        if not task.mechanism.offset_robust:
            raise RequestError(
                f"task {task.name} uses {task.mechanism.name} with one threshold-test noise "
                "shared by every class: a deviating student or hospital could offset the "
                "histogram and turn its test into a noiseless comparison of two counts. "
                "Distributed rounds take offset-robust mechanisms only: register the task "
                "with robust-confident-gnmax (independent test noise per class)"
            )
        batch = _check_queries(request.queries, task)
        encrypted = request.queries.WhichOneof("source") == "encrypted"
        if encrypted and (querier, session_id) not in self._relays:
            raise RequestError(
                "encrypted queries travel over the Relay stream: open it (with the same "
                "capc-session-id) before opening the round"
            )
        loop = loop_terms(self.ledger, querier, request, batch)
        if request.HasField("retry"):
            self._retry_without(querier, request)
        token = self._admit_round(querier)
        try:
            return self._begin_round(
                querier, request, session_id, task, config, digest, batch, encrypted, token, loop
            )
        finally:
            with self._lock:
                self._admitted_round(querier, token)

    def _retry_without(self, querier: str, request: guardian_pb2.OpenRoundRequest) -> None:
        """The student retries a round of its own without a party whose sealed seed it
        says it could not open: check the claim's shape, settle the old round if its
        abort has not arrived yet, and audit a dispute (either side can cause a seed
        that does not open: the party by sealing garbage, the student by saying so)."""
        retry = request.retry
        party, old = retry.party, int(retry.round_id)
        if party not in request.exclude:
            raise RequestError(
                f"a retry without {party or 'no party'} must leave it out: name it in exclude"
            )
        with self._lock:
            seen = self._recent.get(old)
            if seen is None or seen[0] != querier or party not in seen[1]:
                raise RequestError(
                    f"round {old} is not a recent round of {querier} that sent it {party}'s "
                    "sealed seed: a retry names the round it retries and the party it leaves out"
                )
            if seen[2]:
                raise RequestError(f"round {old} was retried already; a round is retried once")
            rnd = self._rounds.get(old)
            if rnd is not None and rnd.released:
                raise RequestError(
                    f"round {old} was computed: its seeds opened, so it cannot be retried"
                )
            self._recent[old] = (seen[0], seen[1], True)
        why = f"the student retries it without {party}"
        if rnd is not None:  # the student's abandonment may still be on its way
            self.abandon_round(rnd, why)
        else:
            # Out of ``_rounds`` but maybe not settled yet (the student's session ending
            # settles it a moment later): nobody can release it any more, so settle it here.
            with contextlib.suppress(RoundStateError):
                if self.ledger.round_state(old) == RoundState.RESERVED:
                    self.ledger.abort(old, reason=why)
        # A computed round has left ``_rounds`` too (and a release may race the
        # abandonment above): the ledger says whether its output left. Only a round
        # aborted before its 2PC released nothing, so only that one is answered again.
        state = self.ledger.round_state(old)
        if state != RoundState.ABORTED:
            raise RequestError(
                f"round {old} was computed or is still open ({state}): its seeds opened, "
                "so it cannot be retried; open a new round"
            )
        self.ledger.record(
            "guardian",
            dispute_log.DISPUTE,
            {"round": old, "querier": querier, "party": party, "check": "sealed_seed"},
            note=retry.reason,
        )
        log.warning("round %d: %s retries it without %s: %s", old, querier, party, retry.reason)

    def _begin_round(
        self,
        querier: str,
        request: guardian_pb2.OpenRoundRequest,
        session_id: bytes,
        task: TaskConfig,
        config: dict[str, Any],
        digest: str,
        batch: int,
        encrypted: bool,
        token: list[bool],
        loop: LoopTerms,
    ) -> _Round:
        # The querier's own hospital is left out by the guardian's binding, not its word.
        excluded = _excluded(request.exclude) | loop.left_out
        candidates = [p for p in self.reachable() if p not in excluded]
        if not encrypted:
            _check_conversion(task, batch, self.teachers(), candidates)
        weights, votes_on = self.personalize(task, candidates, batch)
        # Each party's own worst case: every query it votes on answered, at its weight.
        worst = {
            p: task.mechanism.worst_case(
                int(votes_on[p].sum()) if p in votes_on else batch, weights.get(p, 1.0)
            )
            for p in candidates
        }
        reservation = self.ledger.reserve(
            request.round_key,
            task.name,
            querier,
            batch,
            worst,
            mechanism=task.mechanism.name,
            quorum=task.quorum,
            disclosure=loop.disclosure,
        )
        rnd = _Round(
            reservation.round_id,
            task,
            querier,
            batch,
            reservation.included,
            weights=weights,
            votes_on=votes_on,
            session_id=session_id,
            ciphertext_hash=bytes(request.queries.encrypted.ciphertext_hash) if encrypted else None,
            excluded=dict(reservation.excluded),
        )
        with self._lock:
            self._rounds[rnd.round_id] = rnd
            self._admitted_round(querier, token)  # counted in _rounds from here on
            links = {p: self._links.get(p) for p in rnd.included}
            rnd.sent = {p: link for p, link in links.items() if link is not None}
            rnd.teachers = {p: link.teachers for p, link in rnd.sent.items()}
            unprovable: set[str] = set()
            refused: RequestError | None = None
            if not encrypted:
                # Checked again on the counts the round uses: a party may have reconnected
                # with another count since the first check.
                try:
                    _check_conversion(task, batch, rnd.teachers, list(rnd.teachers))
                except RequestError as err:
                    refused = err
            if not encrypted:
                # Every vote carries its proof: a plaintext task has a statement at one
                # teacher (TaskConfig.parse refuses one without). A party whose teacher count
                # makes the statement too large to prove would vote unchecked shares: it is
                # left out instead (its count is its own claim).
                for p, m in rnd.teachers.items():
                    relation = task.mechanism.vote_relation(m)
                    if relation is not None:
                        rnd.relations[p] = relation
                    else:
                        unprovable.add(p)
        if refused is not None:
            with self._lock:
                self._rounds.pop(rnd.round_id, None)
            self.ledger.abort(rnd.round_id, reason=str(refused))
            raise refused
        header = protocol.header(task.name, digest)
        for name, link in links.items():
            if link is None:
                self._party_failed(rnd, name)
                continue
            if name in unprovable:
                self._unprovable(rnd, name)
                continue
            mask = votes_on.get(name)
            work = guardian_pb2.HubMessage(
                header=header,
                work=guardian_pb2.RoundWork(
                    round_id=rnd.round_id,
                    queries=request.queries,
                    mechanism=mechanism_to_proto(task.mechanism),
                    student_public_key=request.student_public_key,
                    vote_weight=rnd.weight(name),
                    frac_bits=task.frac_bits,
                    participation=serde.participation_to_bytes(mask),
                    teachers=rnd.voters(name),
                    task_json=canonical_json(config),
                ),
            )
            try:
                link.outbox.put_nowait(work)
            except queue.Full:
                log.warning(
                    "%s is not reading its stream (%d messages waiting): left out of round %d",
                    name,
                    link.outbox.qsize(),
                    rnd.round_id,
                )
                self._party_failed(rnd, name)
        return rnd

    def finish_round(self, rnd: _Round) -> guardian_pb2.OpenRoundReply:
        """After the shares are in (or the share timeout): abort below quorum, or sum the
        guardian shares, queue the round for its 2PC and reply with the sealed seeds."""
        task, batch = rnd.task, rnd.batch
        with self._lock:
            rnd.complete.set()  # late shares are refused from here on
            used = tuple(sorted(rnd.shares))
        if len(used) < task.quorum:
            with contextlib.suppress(RoundStateError):  # the reaper may have been first
                self.ledger.abort(
                    rnd.round_id, reason=f"only {len(used)} parties answered, quorum {task.quorum}"
                )
            with self._lock:
                self._rounds.pop(rnd.round_id, None)
            self._notify(rnd)
            missing = sorted(set(rnd.included) - set(used))
            raise RoundRefusedError(
                f"round aborted: {len(used)} of {len(rnd.included)} parties answered (quorum {task.quorum}); missing {missing}; nothing was charged"
            )
        rnd.used = used
        challenge = b""
        if any(p in rnd.relations for p in used):
            # Drawn now that every share is in, so no party could adapt its proof to it;
            # from the OS, not the noise source, so a seeded noise stream replays unchanged.
            rnd.challenge = validity.Challenge.draw(secrets.token_bytes(24))
            challenge = rnd.challenge.to_bytes()
        elif rnd.ciphertext_hash is not None:
            # Encrypted mode: no proof is possible (a party never sees its vote), so the
            # circuit checks each party's one-hot vote: it takes every share, in ``used`` order.
            rnd.guardian_sum = np.stack([rnd.shares[p] for p in used], axis=1)
            rnd.shares.clear()
            self._ready_queue(rnd.querier, rnd.session_id).put(rnd.round_id)
        else:
            total = np.zeros((batch, task.vote_width), dtype=np.uint64)
            for p in used:
                total += rnd.shares[p]
            rnd.guardian_sum = total
            rnd.shares.clear()
            self._ready_queue(rnd.querier, rnd.session_id).put(rnd.round_id)
        with self._lock:
            self._recent[rnd.round_id] = (
                rnd.querier,
                frozenset(p for p in used if p in rnd.seeds),
                False,
            )
            while len(self._recent) > RECENT_ROUNDS:
                self._recent.popitem(last=False)
        return guardian_pb2.OpenRoundReply(
            round_id=rnd.round_id,
            included=list(used),
            excluded_remaining_epsilon=dict(rnd.excluded),
            seeds=[
                guardian_pb2.SealedSeed(party=p, sealed=rnd.seeds[p])
                for p in used
                if p in rnd.seeds
            ],
            teachers={p: rnd.voters(p) for p in used},
            challenge=challenge,
        )

    def weight_on_grid(self, rnd: _Round, party: str) -> int:
        """``party``'s vote weight on the shares' fixed-point grid, rounded down as the
        party rounds its own votes (:meth:`Mechanism.encode_votes`)."""
        return int(np.floor(rnd.weight(party) * (1 << rnd.task.weight_bits)))

    def check_votes(
        self, querier: str, session_id: bytes, msg: guardian_pb2.VoteCheck
    ) -> guardian_pb2.VoteCheckReply:
        """Verify the round's vote validity proofs with the student's verifier shares.

        An invalid vote is left out of the round: the circuit's histogram and its
        voters' total are computed without it, the party is named in the audit log
        and in the reply, and the guardian charges it nothing for the round. Below
        quorum the round is aborted. Then the round is queued for its 2PC.
        Raises RoundInputError (malformed message) or RoundRefusedError.
        """
        with self._lock:
            rnd = self._rounds.get(msg.round_id)
            if rnd is None or (rnd.querier, rnd.session_id) != (querier, session_id):
                raise RoundRefusedError(
                    f"round {msg.round_id} is not open for this student session: it was never "
                    "opened here, was aborted, or belongs to another session"
                )
            challenge = rnd.challenge
            if challenge is None or rnd.checked:
                raise RoundInputError(
                    f"round {msg.round_id} has no vote validity proofs to check, or they were "
                    "checked already"
                )
            # Parties whose statement is too large for a proof sent plain ring shares.
            parties = [p for p in rnd.used if p in rnd.relations]
            plain = [p for p in rnd.used if p not in rnd.relations]
            if list(msg.parties) != parties:
                raise RoundInputError(
                    f"the vote check must name the round's proven parties in the reply's "
                    f"order {parties}"
                )
            try:
                student = serde.vote_check_from_proto(msg, rnd.batch)
            except RequestError as err:
                raise RoundInputError(str(err)) from None
            rnd.checked = True  # once: a well-formed check is the only one
        constants = {p: rnd.voters(p) * rnd.voting(p).astype(np.uint64) for p in parties}
        mine = verifier_shares(rnd.relations, challenge, parties, rnd.shares, rnd.proofs, constants)
        valid = accepted(rnd.relations, challenge, parties, mine, student)
        for p in parties:
            if not valid[p]:
                self._exclude_vote(rnd, p)
        proven = [p for p in parties if valid[p]]
        used = tuple(sorted([*proven, *plain]))
        weights = {p: self.weight_on_grid(rnd, p) for p in proven}
        if len(used) < rnd.task.quorum:
            with contextlib.suppress(RoundStateError):
                self.ledger.abort(
                    rnd.round_id,
                    reason=f"{len(used)} valid votes, quorum {rnd.task.quorum}; "
                    f"invalid: {sorted(rnd.invalid)}",
                )
            with self._lock:
                self._rounds.pop(rnd.round_id, None)
            self._notify(rnd)
            raise RoundRefusedError(
                f"round {rnd.round_id} aborted: {len(used)} of {len(parties)} votes are valid "
                f"(quorum {rnd.task.quorum}); invalid: {sorted(rnd.invalid)}; nothing was charged"
            )
        rnd.used = used
        total = np.zeros((rnd.batch, rnd.task.vote_width), dtype=np.uint64)
        if proven:
            total += proven_vote_sum(
                {p: rnd.relations[p] for p in proven}, rnd.shares, weights, student=False
            )
        for p in plain:
            total += rnd.shares[p]
        rnd.guardian_sum = total
        rnd.shares.clear()
        rnd.proofs.clear()
        self._ready_queue(rnd.querier, rnd.session_id).put(rnd.round_id)
        return guardian_pb2.VoteCheckReply(
            round_id=rnd.round_id,
            included=list(used),
            excluded=[
                guardian_pb2.ExcludedVote(party=p, reason=why)
                for p, why in sorted(rnd.invalid.items())
            ],
            vote_weights=weights,
            teachers={p: rnd.voters(p) for p in used},
        )

    def _exclude_vote(self, rnd: _Round, party: str) -> None:
        """``party``'s vote failed its validity check: leave it out and audit a dispute."""
        why = (
            f"its vote validity proof did not check with {rnd.querier}'s verifier message: not a valid "
            f"{rnd.task.mechanism.name} vote of {rnd.voters(party)} teachers, or a wrong "
            f"message from the student; its vote was left out of round {rnd.round_id}"
        )
        rnd.invalid[party] = why
        # Either side can fail the check (the student by changing its verifier message), so
        # the guardian, which saw it fail, records a dispute naming both, not a culprit.
        self.ledger.record(
            "guardian",
            dispute_log.DISPUTE,
            {
                "round": rnd.round_id,
                "querier": rnd.querier,
                "party": party,
                "check": "vote_validity",
                "mechanism": rnd.task.mechanism.name,
            },
        )
        log.warning("round %d: %s %s", rnd.round_id, party, why)

    def _unprovable(self, rnd: _Round, party: str) -> None:
        """Leave ``party`` out of ``rnd``: its vote's statement is too large for a proof."""
        self._party_failed(rnd, party)
        rnd.invalid[party] = (
            f"{rnd.voters(party)} teachers make its {rnd.task.mechanism.name} vote too large to "
            f"prove valid; it was left out of round {rnd.round_id}: register fewer teachers "
            "(split the ensemble over several answering parties)"
        )
        self.ledger.record(
            party,
            "unprovable_vote",
            {"round": rnd.round_id, "querier": rnd.querier, "teachers": rnd.voters(party)},
        )
        log.warning("round %d: %s %s", rnd.round_id, party, rnd.invalid[party])

    # -- encrypted-query mode: relayed frames ----------------------------------
    def open_relay(self, querier: str, session_id: bytes) -> BoundedBuffer[guardian_pb2.RelayFrame]:
        """The student's Relay stream opened: frames from its rounds' parties go here."""
        box: BoundedBuffer[guardian_pb2.RelayFrame] = BoundedBuffer(RELAY_BUFFER_FRAMES)
        with self._lock:
            old = self._relays.get((querier, session_id))
            self._relays[(querier, session_id)] = box
        if old is not None:
            old.close()
        return box

    def close_relay(
        self, querier: str, session_id: bytes, box: BoundedBuffer[guardian_pb2.RelayFrame]
    ) -> None:
        """The Relay stream that opened ``box`` ended (a newer stream keeps its own)."""
        with self._lock:
            if self._relays.get((querier, session_id)) is box:
                del self._relays[(querier, session_id)]
        box.close()

    def _encrypted_round(self, round_id: int, party: str) -> _Round:
        with self._lock:
            rnd = self._rounds.get(round_id)
            left_out = rnd is not None and rnd.left_out(party)
        if rnd is None or rnd.ciphertext_hash is None or party not in rnd.included or left_out:
            raise RoundInputError(
                f"round {round_id} is not an open encrypted round with {party or 'no party'}"
            )
        return rnd

    def relay_to_party(
        self, querier: str, session_id: bytes, frame: guardian_pb2.RelayFrame
    ) -> tuple[BoundedBuffer[guardian_pb2.HubMessage], guardian_pb2.HubMessage]:
        """A student's frame for one party of one of its rounds: where it goes and what.

        The caller puts it there, waiting for room: the student is held back while
        the party reads slowly, and nothing piles up in the guardian.
        """
        _check_relay_size(frame)
        rnd = self._encrypted_round(frame.round_id, frame.party)
        if (rnd.querier, rnd.session_id) != (querier, session_id):
            raise RoundInputError(f"round {frame.round_id} belongs to another student session")
        if frame.hello:
            raise RoundInputError("only answering parties send hellos")
        with self._lock:
            link = self._links.get(frame.party)
        if link is None:
            raise RoundInputError(f"{frame.party} is not connected")
        return link.outbox, guardian_pb2.HubMessage(
            header=protocol.header(rnd.task.name, rnd.task.config_hash),
            relay=guardian_pb2.RelayFrame(round_id=frame.round_id, payload=frame.payload),
        )

    def relay_to_student(
        self, party: str, frame: guardian_pb2.RelayFrame
    ) -> tuple[BoundedBuffer[guardian_pb2.RelayFrame], guardian_pb2.RelayFrame]:
        """A party's frame for the student of its round, naming the party: where it goes
        and what (the caller puts it there, waiting for room)."""
        _check_relay_size(frame)
        rnd = self._encrypted_round(frame.round_id, party)
        with self._lock:
            box = self._relays.get((rnd.querier, rnd.session_id))
        if box is None:
            raise RoundInputError(f"the student of round {frame.round_id} closed its relay")
        return box, guardian_pb2.RelayFrame(
            header=protocol.header(rnd.task.name, rnd.task.config_hash),
            round_id=frame.round_id,
            party=party,
            payload=frame.payload,
            hello=frame.hello,
        )

    def serve_compute(
        self,
        querier: str,
        channel: Channel,
        session_id: bytes,
        ended: Callable[[], bool] = lambda: False,
        idle_timeout: float = 600.0,
    ) -> int:
        """Garble every round this querier opens, over one 2PC session; returns rounds done.

        Returns when the student ends its stream (``ended``) or stays idle for ``idle_timeout`` s.
        """
        session = GarblerSession(channel, session_id, timeout=self.share_timeout + 60)
        session.setup()
        ready = self._ready_queue(querier, session_id)
        done = 0
        farewell: str | None = None
        idle_since = time.monotonic()
        try:
            while True:
                try:
                    round_id = ready.get(timeout=0.25)
                except queue.Empty:
                    if ended():
                        # Rounds awaiting their vote check end with the student's reason.
                        farewell = session.parting_words()
                        return done
                    if time.monotonic() - idle_since > idle_timeout:
                        return done
                    continue
                self._compute(session, round_id)
                done += 1
                idle_since = time.monotonic()
        except Exception as err:
            session.abort(str(err))
            raise
        finally:
            self._end_session(querier, session_id, farewell)

    def _end_session(self, querier: str, session_id: bytes, farewell: str | None = None) -> None:
        """The 2PC session ended: rounds still waiting for it can never run, so abort them
        now; ``farewell``: the reason the student gave, if it aborted the session."""
        with self._lock:
            ready = self._ready.pop((querier, session_id), None)
            unchecked = [
                r
                for r in self._rounds.values()
                if (r.querier, r.session_id) == (querier, session_id)
                and r.challenge is not None
                and not r.checked
            ]
            for r in unchecked:
                self._rounds.pop(r.round_id, None)
        for r in unchecked:
            why = farewell or "the student's 2PC session ended"
            self._settle(r, f"{why}, before the round's vote check")
            self._notify(r)
        while ready is not None:
            try:
                round_id = ready.get_nowait()
            except queue.Empty:
                return
            with self._lock:
                rnd = self._rounds.pop(round_id, None)
            if rnd is not None:
                self._settle(rnd, "the student's 2PC session ended before the round was computed")

    def _settle(self, rnd: _Round, why: str) -> None:
        """A round that will not finish: abort it before its release, charge its reservation after.

        The ledger decides under its row lock, so a reaper racing a release cannot
        return a reservation whose noisy output has left.
        """
        try:
            if rnd.released:
                self.ledger.commit_at_reservation(rnd.round_id, actor="guardian")
                log.warning("round %d charged at its reservation: %s", rnd.round_id, why)
            else:
                self.ledger.abort(rnd.round_id, reason=why)
                log.warning("round %d aborted, nothing charged: %s", rnd.round_id, why)
        except RoundStateError:
            pass  # settled already: committed, aborted by the reaper, or released meanwhile

    def abandon_round(self, rnd: _Round, why: str) -> None:
        """Nobody will compute ``rnd`` (its opener went away): settle it now, not at the timeout."""
        rnd.complete.set()
        with self._lock:
            self._rounds.pop(rnd.round_id, None)
        self._settle(rnd, why)
        self._notify(rnd)

    def reap(self) -> list[int]:
        """Abort every round not released within ``round_timeout`` s of opening; returns their ids.

        Such a round was opened but never computed: its reservations go back to
        the parties. A round released meanwhile is left alone (the ledger
        refuses to abort it) and stays charged.
        """
        now = time.monotonic()
        with self._lock:
            stale = [
                r
                for r in self._rounds.values()
                if not r.released and now - r.opened_at > self.round_timeout
            ]
        reaped = []
        for rnd in stale:
            try:
                self.ledger.abort(
                    rnd.round_id,
                    reason=f"not computed within {self.round_timeout:g} s of opening "
                    f"(--round-timeout); nothing was released",
                )
            except RoundStateError:
                continue  # released or settled meanwhile: whoever holds it finishes it
            rnd.complete.set()
            with self._lock:
                self._rounds.pop(rnd.round_id, None)
            self._notify(rnd)
            log.warning(
                "round %d of %s aborted: not computed within %g s; reservations returned",
                rnd.round_id,
                rnd.querier,
                self.round_timeout,
            )
            reaped.append(rnd.round_id)
        return reaped

    def rates(
        self, task: TaskConfig, parties: list[str] | None = None
    ) -> dict[str, tuple[float, float]]:
        """(vote weight, participation rate) per party for ``task``, from the parties' caps.

        ``parties`` default to every registered answering party. Weights are
        rounded down to the shares' fixed-point grid, so a party is charged for
        exactly the weight it votes with. Without personalization: (1, 1).
        """
        budgets = {b.name: b for b in self.ledger.budgets()}
        names = (
            [n for n, b in budgets.items() if b.role == "answerer"] if parties is None else parties
        )
        pers = task.personalization
        if pers is None or not names:
            return {n: (1.0, 1.0) for n in names}
        caps = [budgets[n].cap if n in budgets else 0.0 for n in names]
        acct, delta = self.ledger.accounting, self.ledger.delta
        w = pers.weights(caps, task.mechanism, acct, delta, task.weight_bits)
        p = pers.rates(caps, task.mechanism, acct, delta)
        return {n: (float(w[i]), float(p[i])) for i, n in enumerate(names)}

    def personalize(
        self, task: TaskConfig, parties: list[str], batch: int
    ) -> tuple[dict[str, float], dict[str, NDArray[np.bool_]]]:
        """This round's vote weights (weighting) or (batch,) participation masks (vanishing).

        Both empty without personalization; masks come from the guardian's secure randomness.
        """
        if task.personalization is None or not parties:
            return {}, {}
        rates = self.rates(task, parties)
        if task.weighting:
            return {p: rates[p][0] for p in parties}, {}
        mask = Personalization.participation([rates[p][1] for p in parties], batch, self._rng)
        return {}, {p: mask[:, i] for i, p in enumerate(parties)}

    def _ready_queue(self, querier: str, session_id: bytes) -> queue.Queue[int]:
        with self._lock:
            return self._ready.setdefault((querier, session_id), queue.Queue())

    def _compute(self, session: GarblerSession, round_id: int) -> None:
        with self._lock:
            rnd = self._rounds.get(round_id)
        if rnd is None or rnd.guardian_sum is None:
            raise RoundRefusedError(
                f"round {round_id} is no longer open: it was not computed within "
                f"{self.round_timeout:g} s of opening and was aborted; nothing was charged. "
                "Open a new round"
            )
        try:
            self._garble(session, rnd, rnd.guardian_sum)
        except BaseException as err:
            self._settle(rnd, f"the 2PC broke: {err}")
            raise
        finally:
            with self._lock:
                self._rounds.pop(round_id, None)
            self._notify(rnd)

    def _garble(
        self, session: GarblerSession, rnd: _Round, guardian_sum: NDArray[np.uint64]
    ) -> None:
        round_id, task, b = rnd.round_id, rnd.task, rnd.batch
        # A party with m teachers adds m votes (times its weight) to every query.
        total = sum(rnd.voters(p) * rnd.weight(p) for p in rnd.used)
        filtered = len(rnd.used) if rnd.ciphertext_hash is not None else 0
        spec = task.circuit_spec(sum(rnd.voters(p) for p in rnd.used), total, filtered)
        mech = task.mechanism
        noise = mech.draw_noise(b, self._rng)
        theta = None
        if rnd.votes_on and mech.per_label:  # vanishing: the majority of the teachers who voted
            theta = np.sum([rnd.voters(p) * rnd.voting(p) for p in rnd.used], axis=0) / 2.0
        # Every query's counts total the weight of the teachers who voted on it (the checks).
        vote_total = np.sum(
            [rnd.voters(p) * rnd.weight(p) * rnd.voting(p) for p in rnd.used], axis=0
        ).astype(np.float64)
        inputs = mech.garbler_inputs(spec, guardian_sum, noise, theta, vote_total)
        start = time.perf_counter()

        def release() -> None:
            try:
                self.ledger.release(round_id)
            except RoundStateError as err:
                # The reaper was first: nothing may leave for an aborted round.
                raise RoundRefusedError(
                    f"round {round_id} was aborted before its 2PC ({err}): it was not computed "
                    f"within {self.round_timeout:g} s of opening; nothing was charged. "
                    "Open a new round"
                ) from None
            rnd.released = True

        out = session.run_round(round_id, spec.circuit(), inputs, b, on_release=release)
        bad = violations(out)
        if bad.size:
            # Released already: charged at its reservation, the worst case, never less.
            self.ledger.commit_at_reservation(round_id, actor="guardian")
            self.ledger.record(
                "guardian",
                "histogram_violation",
                {
                    "round": round_id,
                    "queries": [int(q) for q in bad[:20]],
                    "violations": int(bad.size),
                    "parties": list(rnd.used),
                },
            )
            log.warning("round %d aborted: %s", round_id, HistogramViolationError(bad))
            return
        answered = mech.answered(spec, out, b)
        charges = {p: mech.event(answered[rnd.voting(p)], rnd.weight(p)) for p in rnd.used}
        self.ledger.commit(round_id, charges, outcome=budgets.outcome(answered))
        log.info(
            "round %d: %d of %d answered by %d parties in %.2f s",
            round_id,
            int(answered.reshape(b, -1).any(axis=1).sum()),
            b,
            len(rnd.used),
            time.perf_counter() - start,
        )

    # -- the parties' own ledgers ----------------------------------------------
    def _notify(self, rnd: _Round) -> None:
        """Tell every party the round was sent to how it ended for it."""
        for name in sorted(rnd.sent):
            self.settle(name, [rnd.round_id])

    def settle(self, name: str, round_ids: list[int]) -> int:
        """Send ``name`` the settlement of each of ``round_ids`` that has ended (rounds
        still open, or unknown here, get none); returns how many were sent."""
        with self._lock:
            link = self._links.get(name)
        if link is None:
            return 0
        sent = 0
        head = self.ledger.audit_head()  # one read for every round a heartbeat names
        for round_id in round_ids:
            settled = budgets.settlement(self.ledger, name, round_id, head)
            if settled is None:
                continue
            try:
                link.outbox.put_nowait(
                    guardian_pb2.HubMessage(header=protocol.header(), settled=settled)
                )
            except queue.Full:
                # A party that reads nothing is told later: its heartbeats name the rounds
                # its ledger still holds open, and each is settled again then.
                break
            sent += 1
        return sent


def _check_relay_size(frame: guardian_pb2.RelayFrame) -> None:
    if len(frame.payload) > MAX_RELAY_FRAME_BYTES:
        raise RoundInputError(
            f"a relayed frame of {len(frame.payload)} bytes exceeds the limit of "
            f"{MAX_RELAY_FRAME_BYTES} (MAX_RELAY_FRAME_BYTES); send blobs in chunks"
        )


LAYOUTS = ("batched", "single")


def _check_conversion(
    task: TaskConfig, batch: int, teachers: dict[str, int], candidates: list[str]
) -> None:
    """Refuse, before anything is reserved, a round whose proven votes' conversion to the
    circuit's ring could go wrong with probability above the statistical security
    parameter (public sizes only: the batch, the counts per query, the teachers)."""
    counts = [teachers.get(p, 1) for p in candidates]
    relation = task.mechanism.vote_relation(1)  # its width: the counts per query
    if relation is None:
        return
    # A count is at most its party's teachers times one teacher's largest vote on the grid.
    largest = [m << relation.grid_bits for m in counts]
    bound = validity.conversion_failure(batch, relation.width, largest)
    if bound > validity.MAX_CONVERSION_FAILURE:
        most = int(batch * validity.MAX_CONVERSION_FAILURE / bound)
        what = (
            f"send at most {most} queries per round"
            if most >= 1
            else "no batch fits: the consortium's hospitals must register fewer teachers"
        )
        raise RequestError(
            f"a round of {batch} queries over {len(counts)} parties with {sum(counts)} "
            f"teachers could convert its shared counts wrongly with probability {bound:.1e}, "
            f"above 2^-40: {what}"
        )


def _excluded(names: Sequence[str]) -> frozenset[str]:
    """The parties a round request leaves out, checked: names, at most MAX_EXCLUDED."""
    if len(names) > MAX_EXCLUDED:
        raise RequestError(
            f"a round may leave out at most {MAX_EXCLUDED} parties, got {len(names)}"
        )
    bad = [n for n in names if not 1 <= len(n) <= 128]
    if bad:
        raise RequestError("exclude: party names are 1 to 128 characters")
    return frozenset(names)


def _check_encrypted(batch: common_pb2.EncryptedBatch, task: TaskConfig) -> int:
    if task.encryption is None:
        raise RequestError(
            f"task {task.name} takes no encrypted queries (it has no encryption settings)"
        )
    if batch.settings_json != task.encryption.to_json():
        raise RequestError(
            f"the ciphertexts were made for encryption settings {batch.settings_json or 'none'}, "
            f"the task has {task.encryption.to_json()}"
        )
    if batch.layout not in LAYOUTS:
        raise RequestError(f"layout must be one of {', '.join(LAYOUTS)}, got {batch.layout!r}")
    # One query a slot: a CKKS ciphertext holds no more queries than it has slots.
    refusal = count_refusal(
        batch.batch, min(MAX_BATCH, task.encryption.params.slots), "an encrypted batch"
    )
    if refusal is not None:
        raise RequestError(refusal)
    if not 1 <= batch.ciphertexts <= MAX_CIPHERTEXTS:
        raise RequestError(
            f"a round names 1 to {MAX_CIPHERTEXTS} ciphertexts, got {batch.ciphertexts}"
        )
    if len(batch.ciphertext_hash) != 32:
        raise RequestError("ciphertext_hash must be the 32-byte SHA-256 of the ciphertexts")
    if len(batch.context_id) != 64 or any(c not in "0123456789abcdef" for c in batch.context_id):
        raise RequestError("context_id must be the hex SHA-256 of the public context")
    return int(batch.batch)


def _check_queries(queries: common_pb2.QueryBatch, task: TaskConfig) -> int:
    """Batch size of a valid query batch; recipes must carry the batch hash parties check."""
    source = queries.WhichOneof("source")
    if source == "encrypted":
        return _check_encrypted(queries.encrypted, task)
    if source == "tensor" and task.encryption is not None:
        raise RequestError(
            f"task {task.name} takes its private queries encrypted only; send CKKS ciphertexts"
        )
    if source == "recipe":
        recipe = query_recipe(queries.recipe, task.input_shape, MAX_BATCH)
        if len(queries.recipe.batch_hash) != 32:
            raise RequestError(
                "a recipe must carry the 32-byte SHA-256 of its batch, for every party to check"
            )
        return recipe.count
    if source != "tensor":
        raise RequestError("queries must be a float32 tensor, a recipe or an encrypted batch")
    return len(serde.queries_from_proto(queries.tensor, task.input_shape, MAX_BATCH))


__all__ = ["QuorumError", "RoundEngine", "RoundInputError", "RoundRefusedError", "TaskConfig"]
