"""The student party's side of a labelling round.

Holds the student's X25519 key (seeds are sealed to it), one long-lived 2PC
session with the guardian over the Compute stream (base OTs once), and opens
rounds batch by batch: OpenRound, open the sealed seeds, sum the expanded
shares, evaluate the garbled circuit, keep the labels. Encrypted-query
rounds (:meth:`StudentClient.label_encrypted`) get the shares from each
party's 2PC over the Relay stream instead (:mod:`services.student.encrypted`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from numpy.typing import ArrayLike, NDArray

from capc.data.generators import FloatImages, Recipe
from capc.mpc.session import EvaluatorSession, new_session_id
from capc.mpc.votes import PartyInputError
from capc.round.messages import QueryBatch, Retry
from capc.round.student import StudentCore, StudentRound
from capc.task_config import TaskConfig
from services.common import protocol, serde, tls
from services.common.limits import DEFAULT_BATCH
from services.common.mpc_stream import StreamChannel
from services.proto.capc.v1 import common_pb2, guardian_pb2_grpc
from services.student.encrypted import RelayRouter, StudentCrypto

log = logging.getLogger("capc.student")


@dataclass
class RoundResult:
    """One round's outcome from the student's side: ``labels`` (B,) classes or (B, k) 0/1
    labels for a multi-label task, -1 where not answered."""

    round_id: int
    labels: NDArray[np.int64]
    parties: tuple[str, ...]
    excluded: dict[str, float]
    open_s: float
    mpc_s: float
    #: Parties whose vote failed its validity proof, with the guardian's reason: left out.
    invalid: dict[str, str] = field(default_factory=dict)
    #: A party whose sealed seed did not open in ``retried``, the round abandoned for it
    #: (0: none), with the reason; this round is the retry without it.
    left_out: dict[str, str] = field(default_factory=dict)
    retried: int = 0


@dataclass
class StudentClient:
    """Connects to the guardian as the student; ``name`` is used only with --insecure-dev."""

    guardian: str
    files: tls.TLSFiles | None
    task: TaskConfig
    server_name: str | None = None
    name: str = "student"
    timeout: float = 300.0
    key: X25519PrivateKey = field(default_factory=X25519PrivateKey.generate)
    #: Answering parties every round leaves out (a hospital querying the consortium: itself).
    exclude: tuple[str, ...] = ()
    #: The hospital this querier belongs to (the CaPC loop), named in every round; the
    #: guardian leaves it out by its own binding and refuses a claim that differs.
    hospital: str = ""

    def __post_init__(self) -> None:
        self._channel = tls.secure_channel(
            self.guardian, self.files, self.server_name, role="guardian"
        )
        self._stub = guardian_pb2_grpc.GuardianHubStub(self._channel)
        self._meta = [] if self.files is not None else [("capc-student", self.name)]
        self._session: EvaluatorSession | None = None
        self._sid = b""
        self._stream: StreamChannel | None = None
        self._relay: RelayRouter | None = None
        self._crypto: StudentCrypto | None = None
        #: The student's round rules.
        self.core = StudentCore(self.name, self.key, self.exclude)

    @property
    def header(self) -> common_pb2.Header:
        return protocol.header(self.task.name, self.task.config_hash)

    def _ensure_session(self) -> EvaluatorSession:
        if self._session is None:
            sid = new_session_id()
            stream = StreamChannel(self.header)
            responses = self._stub.Compute(
                stream.outgoing(), metadata=[*self._meta, ("capc-session-id", sid.hex())]
            )
            stream.attach(responses)
            session = EvaluatorSession(stream, sid, timeout=self.timeout)
            session.setup()
            self._session, self._stream, self._sid = session, stream, sid
        return self._session

    def _ensure_relay(self) -> RelayRouter:
        self._ensure_session()
        if self._relay is None or self._relay.ended.is_set():
            relay = RelayRouter(self.header, self.key, self.timeout)
            responses = self._stub.Relay(
                relay.outgoing(), metadata=[*self._meta, ("capc-session-id", self._sid.hex())]
            )
            relay.attach(responses)
            self._relay = relay
        return self._relay

    @property
    def crypto(self) -> StudentCrypto:
        """The student's CKKS keys for the task (encrypted-query tasks only)."""
        if self.task.encryption is None:
            raise ValueError(f"task {self.task.name} has no encryption settings")
        if self._crypto is None:
            self._crypto = StudentCrypto(
                self.task.encryption, self.task.input_shape, self.task.outputs
            )
        return self._crypto

    def label_encrypted(
        self,
        queries: ArrayLike,
        job: TaskConfig | None = None,
        layout: str | None = None,
    ) -> RoundResult:
        """Label one batch whose queries leave the student only as CKKS ciphertexts.

        ``layout``: "batched" or "single"; by default whichever sends fewer ciphertexts.
        """
        crypto = self.crypto
        batch = crypto.encrypt(queries, layout)
        relay = self._ensure_relay()
        relay.pending = batch
        try:
            return self._round(
                crypto.message(batch),
                QueryBatch("encrypted", batch.batch, batch.ciphertext_hash),
                job,
                # Every party's share, in the guardian's order: the circuit checks each
                # party's one-hot vote on its own (no proof can: a party never sees its vote).
                shares=lambda round_id, parties: np.stack(
                    [batch.share(p, round_id, self.timeout) for p in parties], axis=1
                ),
            )
        finally:
            relay.pending = None
            relay.clear()

    def label_batch(
        self,
        queries: NDArray[np.float32],
        job: TaskConfig | None = None,
        reveal: bool = False,
        revealed_by: str = "",
    ) -> RoundResult:
        """Label one batch (B, *input_shape) through one round; -1 where not answered.

        Labels are (B,) classes, or (B, k) 0/1 vectors for a multi-label task
        with -1 on each label not answered. ``job``: this client's task running the job's
        mechanism (:meth:`TaskConfig.running`, checked once a job by its caller; None: the
        task's own). ``reveal``: the
        queries are the querier's own records, shown to the answering parties by an
        explicit choice (the guardian audits it, naming ``revealed_by``: who chose)."""
        tensor = serde.queries_to_proto(queries)
        return self._round(
            common_pb2.QueryBatch(tensor=tensor),
            QueryBatch("tensor", tensor.shape[0]),
            job,
            reveal=reveal,
            revealed_by=revealed_by,
        )

    def label_recipe(
        self,
        recipe: Recipe,
        job: TaskConfig | None = None,
        images: FloatImages | None = None,
    ) -> RoundResult:
        """Label a batch of programmatic queries: every party regenerates it from the recipe.

        ``images``: the recipe's batch when the caller has generated it already (hashed, not
        generated again)."""
        msg = serde.recipe_to_proto(recipe, images=images, records=self.task.records)
        return self._round(
            common_pb2.QueryBatch(recipe=msg),
            QueryBatch("recipe", recipe.count, bytes(msg.batch_hash)),
            job,
        )

    def _round(
        self,
        batch_msg: common_pb2.QueryBatch,
        queries: QueryBatch,
        job: TaskConfig | None = None,
        shares: Callable[[int, list[str]], NDArray[np.uint64]] | None = None,
        reveal: bool = False,
        retry: Retry | None = None,
        revealed_by: str = "",
    ) -> RoundResult:
        """One round; a round where one party's sealed seed does not open is abandoned
        before its 2PC and retried once without that party (``retry``: the retry)."""
        # The circuit's noise and thresholds follow the job's mechanism, as the guardian's do.
        task = self.task if job is None else job
        if task.config_hash != self.task.config_hash:
            raise ValueError(f"this client labels task {self.task.name}, not {task.name}")
        mechanism = None if task.mechanism == self.task.mechanism else task.mechanism
        session = self._ensure_session()
        start = time.perf_counter()
        request = self.core.request(queries, retry)
        reply = self._stub.OpenRound(
            serde.round_request_to_proto(
                request,
                self.header,
                batch_msg,
                mechanism,
                self.hospital,
                reveal,
                revealed_by,
            ),
            metadata=[*self._meta, ("capc-session-id", self._sid.hex())],
            timeout=self.timeout,
        )
        opened = time.perf_counter()
        batch, encrypted = queries.count, shares is not None
        try:
            rnd = self.core.opened(task, serde.opened_from_proto(reply), batch, encrypted=encrypted)
            if shares is not None:
                student_sum = self.core.encrypted_sum(rnd, shares(rnd.round_id, list(rnd.included)))
            elif rnd.challenge is not None:
                student_sum = self._check_votes(rnd)
            else:
                student_sum = self.core.share_sum(rnd)
        except PartyInputError as err:
            # Abandon the round before its 2PC: the guardian aborts it at once (nothing is
            # released or charged) and records why, naming the party, in its audit log.
            self._drop_session(f"the student abandons round {reply.round_id}: {err}")
            # One party's seed should not stop every round until an operator excludes it by
            # hand: retry once without it (the guardian audits a dispute with that party).
            again = self.core.retry_without(err, retried=retry is not None, encrypted=encrypted)
            if again is None:
                raise
            log.warning("round %d: retrying once without %s: %s", reply.round_id, err.party, err)
            result = self._round(
                batch_msg, queries, job, reveal=reveal, retry=again, revealed_by=revealed_by
            )
            return dataclasses.replace(
                result, left_out={err.party: str(err)}, retried=reply.round_id
            )
        spec, inputs = self.core.evaluator_inputs(rnd, student_sum)
        out = session.run_round(rnd.round_id, spec.circuit(), inputs, batch)
        return RoundResult(
            round_id=rnd.round_id,
            labels=self.core.labels(rnd, spec, out),
            parties=rnd.included,
            excluded=rnd.excluded,
            open_s=opened - start,
            mpc_s=time.perf_counter() - opened,
            invalid=rnd.invalid,
        )

    def _check_votes(self, rnd: StudentRound) -> NDArray[np.uint64]:
        """Check the round's vote validity proofs with the guardian; this side's share of
        the valid votes' histogram (B, width) in Z_2^64."""
        parties, mine = self.core.vote_check(rnd)
        check = self._stub.CheckVotes(
            serde.vote_check_to_proto(self.header, rnd.round_id, parties, mine),
            metadata=[*self._meta, ("capc-session-id", self._sid.hex())],
            timeout=self.timeout,
        )
        return self.core.checked(rnd, serde.vote_verdict_from_proto(check))

    def label(
        self, queries: NDArray[np.float32], batch_size: int = DEFAULT_BATCH
    ) -> tuple[NDArray[np.int64], list[RoundResult]]:
        """Label every query, batch by batch; stops with the RpcError when the consortium refuses."""
        results = [
            self.label_batch(queries[i : i + batch_size])
            for i in range(0, len(queries), batch_size)
        ]
        labels = (
            np.concatenate([r.labels for r in results]) if results else np.zeros(0, dtype=np.int64)
        )
        return labels, results

    def _drop_session(self, reason: str) -> None:
        """Abort the 2PC session, telling the guardian why; the next round opens a new one."""
        session, stream = self._session, self._stream
        self._session = self._stream = None
        if self._relay is not None:
            self._relay.close()
            self._relay = None
        if session is not None:
            session.abort(reason)
        if stream is not None:
            stream.close()

    def close(self, timeout: float = 30.0) -> None:
        """Half-close the 2PC stream, let the guardian finish its last round, then disconnect."""
        if self._relay is not None:
            self._relay.close()
        if self._stream is not None:
            self._stream.close()
            self._stream.ended.wait(timeout)
        self._channel.close()
