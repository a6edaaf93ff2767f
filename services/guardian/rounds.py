"""The guardian's round engine (design section 2), independent of gRPC.

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

Every party that was sent a round is told how it ended (:mod:`services.guardian.budgets`):
charged for what it released, or nothing; its own ledger charges itself the same.

Personalized budgets: with weighting, each party's vote weight comes from its
cap (``vote_weights``) and it is charged w**2 times; with vanishing, the
guardian draws per query who votes (``participation_rates``) and charges a
party only for the queries it voted on. Both are functions of the caps and of
the guardian's randomness, never of the data.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from capc.mpc.channel import Channel
from capc.mpc.session import GarblerSession
from capc.privacy.randomness import SecureRandom
from services.common import protocol, serde
from services.common.ledger import Ledger, QuorumError
from services.common.limits import MAX_BATCH, MAX_CIPHERTEXTS, count_refusal
from services.common.protocol import RequestError, check_version, query_recipe
from services.common.serde import mechanism_to_proto, overrides_from_proto
from services.common.task import TaskConfig, TaskError, canonical_json
from services.guardian import budgets
from services.proto.capc.v1 import common_pb2, guardian_pb2

log = logging.getLogger("capc.guardian.rounds")


class RoundInputError(RequestError):
    """A share message is malformed or does not belong to the round; maps to INVALID_ARGUMENT."""


class RoundRefusedError(RuntimeError):
    """The round cannot run (quorum lost, unknown round); maps to FAILED_PRECONDITION."""


class DuplicateLinkError(RuntimeError):
    """The party is connected already: a second stream under its identity is refused."""

    def __init__(self, name: str, connected_from: str) -> None:
        super().__init__(f"{name} is already connected from {connected_from or 'elsewhere'}")
        self.name = name
        self.connected_from = connected_from


# A party sends a heartbeat every 10 s; a stream silent for this long is dead even
# if its transport has not noticed yet (a host that lost power sends no FIN).
SILENT_AFTER_S = 35.0


def _always() -> bool:
    return True


@dataclass
class PartyLink:
    """An answering party's live stream: what the hub sends it goes through ``outbox``.

    ``peer`` is the stream's network address; ``active`` says whether its RPC
    is still open (the servicer context's ``is_active``).
    """

    name: str
    peer: str = ""
    active: Callable[[], bool] = _always
    outbox: queue.Queue[guardian_pb2.HubMessage | None] = field(default_factory=queue.Queue)
    last_heard: float = field(default_factory=time.monotonic)

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
    complete: threading.Event = field(default_factory=threading.Event)
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

    def weight(self, party: str) -> float:
        return self.weights.get(party, 1.0)

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
    ) -> None:
        self.ledger = ledger
        self.share_timeout = share_timeout
        self.silent_after = silent_after
        self._rng = rng or SecureRandom()
        self._links: dict[str, PartyLink] = {}
        self._rounds: dict[int, _Round] = {}
        # Opened rounds wait here for the 2PC session the student named.
        self._ready: dict[tuple[str, bytes], queue.Queue[int]] = {}
        # Encrypted-query mode: each student session's Relay stream.
        self._relays: dict[tuple[str, bytes], queue.Queue[guardian_pb2.RelayFrame | None]] = {}
        self._lock = threading.Lock()

    # -- answering parties ----------------------------------------------------
    def attach(self, name: str, peer: str = "", active: Callable[[], bool] = _always) -> PartyLink:
        """A party's stream opened.

        While the party's earlier stream is alive (open and heard from within
        ``silent_after``), the new one is refused with :class:`DuplicateLinkError`:
        two streams under one identity mean a copied key, and a silent takeover
        would hand the thief the party's rounds. A dead or silent earlier
        stream is ended and replaced, so a party that lost its connection
        gets back in.
        """
        link = PartyLink(name, peer, active)
        with self._lock:
            old = self._links.get(name)
            if old is not None and old.alive(self.silent_after):
                raise DuplicateLinkError(name, old.peer)
            self._links[name] = link
        if old is not None:
            log.info(
                "party %s reconnected from %s; its old stream (%s) was dead", name, peer, old.peer
            )
            old.outbox.put(None)
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
        try:
            share = serde.shares_from_proto(msg, (rnd.batch, rnd.task.vote_width))
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
            rnd.seeds[name] = bytes(msg.sealed_seed)
            if set(rnd.shares) | rnd.failed >= set(rnd.included):
                rnd.complete.set()

    # -- student --------------------------------------------------------------
    def open_round(
        self, querier: str, request: guardian_pb2.OpenRoundRequest, session_id: bytes
    ) -> guardian_pb2.OpenRoundReply:
        """Reserve, distribute, collect; raises QuorumError, RoundInputError or RoundRefusedError."""
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
        batch = _check_queries(request.queries, task)
        encrypted = request.queries.WhichOneof("source") == "encrypted"
        if encrypted and (querier, session_id) not in self._relays:
            raise RequestError(
                "encrypted queries travel over the Relay stream: open it (with the same "
                "capc-session-id) before opening the round"
            )
        candidates = self.connected()
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
        )
        with self._lock:
            self._rounds[rnd.round_id] = rnd
            links = {p: self._links.get(p) for p in rnd.included}
            rnd.sent = {p: link for p, link in links.items() if link is not None}
        header = protocol.header(task.name, digest)
        for name, link in links.items():
            if link is None:
                self._party_failed(rnd, name)
                continue
            mask = votes_on.get(name)
            link.outbox.put(
                guardian_pb2.HubMessage(
                    header=header,
                    work=guardian_pb2.RoundWork(
                        round_id=rnd.round_id,
                        queries=request.queries,
                        mechanism=mechanism_to_proto(task.mechanism),
                        student_public_key=request.student_public_key,
                        vote_weight=rnd.weight(name),
                        frac_bits=task.frac_bits,
                        participation=serde.participation_to_bytes(mask),
                        task_json=canonical_json(config),
                    ),
                )
            )
        rnd.complete.wait(self.share_timeout)
        with self._lock:
            rnd.complete.set()  # late shares are refused from here on
            used = tuple(sorted(rnd.shares))
        if len(used) < task.quorum:
            self.ledger.abort(
                rnd.round_id, reason=f"only {len(used)} parties answered, quorum {task.quorum}"
            )
            with self._lock:
                del self._rounds[rnd.round_id]
            self._notify(rnd)
            missing = sorted(set(rnd.included) - set(used))
            raise RoundRefusedError(
                f"round aborted: {len(used)} of {len(rnd.included)} parties answered (quorum {task.quorum}); missing {missing}; nothing was charged"
            )
        rnd.used = used
        total = np.zeros((batch, task.vote_width), dtype=np.uint64)
        for p in used:
            total += rnd.shares[p]
        rnd.guardian_sum = total
        rnd.shares.clear()
        self._ready_queue(querier, session_id).put(rnd.round_id)
        return guardian_pb2.OpenRoundReply(
            round_id=rnd.round_id,
            included=list(used),
            excluded_remaining_epsilon=dict(reservation.excluded),
            seeds=[
                guardian_pb2.SealedSeed(party=p, sealed=rnd.seeds[p])
                for p in used
                if p in rnd.seeds
            ],
        )

    # -- encrypted-query mode: relayed frames ----------------------------------
    def open_relay(
        self, querier: str, session_id: bytes
    ) -> queue.Queue[guardian_pb2.RelayFrame | None]:
        """The student's Relay stream opened: frames from its rounds' parties go here."""
        box: queue.Queue[guardian_pb2.RelayFrame | None] = queue.Queue()
        with self._lock:
            old = self._relays.get((querier, session_id))
            self._relays[(querier, session_id)] = box
        if old is not None:
            old.put(None)
        return box

    def close_relay(
        self, querier: str, session_id: bytes, box: queue.Queue[guardian_pb2.RelayFrame | None]
    ) -> None:
        """The Relay stream that opened ``box`` ended (a newer stream keeps its own)."""
        with self._lock:
            if self._relays.get((querier, session_id)) is box:
                del self._relays[(querier, session_id)]
        box.put(None)

    def _encrypted_round(self, round_id: int, party: str) -> _Round:
        with self._lock:
            rnd = self._rounds.get(round_id)
        if rnd is None or rnd.ciphertext_hash is None or party not in rnd.included:
            raise RoundInputError(
                f"round {round_id} is not an open encrypted round with {party or 'no party'}"
            )
        return rnd

    def relay_to_party(
        self, querier: str, session_id: bytes, frame: guardian_pb2.RelayFrame
    ) -> None:
        """A student's frame for one party of one of its rounds."""
        rnd = self._encrypted_round(frame.round_id, frame.party)
        if (rnd.querier, rnd.session_id) != (querier, session_id):
            raise RoundInputError(f"round {frame.round_id} belongs to another student session")
        if frame.hello:
            raise RoundInputError("only answering parties send hellos")
        with self._lock:
            link = self._links.get(frame.party)
        if link is None:
            raise RoundInputError(f"{frame.party} is not connected")
        link.outbox.put(
            guardian_pb2.HubMessage(
                header=protocol.header(rnd.task.name, rnd.task.config_hash),
                relay=guardian_pb2.RelayFrame(round_id=frame.round_id, payload=frame.payload),
            )
        )

    def relay_to_student(self, party: str, frame: guardian_pb2.RelayFrame) -> None:
        """A party's frame for the student of its round; the guardian names the party."""
        rnd = self._encrypted_round(frame.round_id, party)
        with self._lock:
            box = self._relays.get((rnd.querier, rnd.session_id))
        if box is None:
            raise RoundInputError(f"the student of round {frame.round_id} closed its relay")
        box.put(
            guardian_pb2.RelayFrame(
                header=protocol.header(rnd.task.name, rnd.task.config_hash),
                round_id=frame.round_id,
                party=party,
                payload=frame.payload,
                hello=frame.hello,
            )
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
        idle_since = time.monotonic()
        while True:
            try:
                round_id = ready.get(timeout=0.25)
            except queue.Empty:
                if ended() or time.monotonic() - idle_since > idle_timeout:
                    return done
                continue
            self._compute(session, round_id)
            done += 1
            idle_since = time.monotonic()

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
        w = pers.weights(caps, task.mechanism, acct, delta, task.frac_bits)
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
        draws = self._rng.uniform((batch, len(parties)))
        return {}, {p: draws[:, i] < rates[p][1] for i, p in enumerate(parties)}

    def _ready_queue(self, querier: str, session_id: bytes) -> queue.Queue[int]:
        with self._lock:
            return self._ready.setdefault((querier, session_id), queue.Queue())

    def _compute(self, session: GarblerSession, round_id: int) -> None:
        with self._lock:
            rnd = self._rounds.get(round_id)
        if rnd is None or rnd.guardian_sum is None:
            raise RoundRefusedError(f"round {round_id} is not ready for the 2PC")
        task, b = rnd.task, rnd.batch
        total = sum(rnd.weight(p) for p in rnd.used)
        spec = task.circuit_spec(len(rnd.used), total)
        mech = task.mechanism
        noise = mech.draw_noise(b, self._rng)
        theta = None
        if rnd.votes_on and mech.per_label:  # vanishing: the majority of those who voted
            theta = np.sum([rnd.voting(p) for p in rnd.used], axis=0) / 2.0
        inputs = mech.garbler_inputs(spec, rnd.guardian_sum, noise, theta)
        start = time.perf_counter()
        out = session.run_round(
            round_id, spec.circuit(), inputs, b, on_release=lambda: self.ledger.release(round_id)
        )
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
        with self._lock:
            del self._rounds[round_id]
        self._notify(rnd)

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
        for round_id in round_ids:
            settled = budgets.settlement(self.ledger, name, round_id)
            if settled is not None:
                link.outbox.put(guardian_pb2.HubMessage(header=protocol.header(), settled=settled))
                sent += 1
        return sent


LAYOUTS = ("batched", "single")


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
