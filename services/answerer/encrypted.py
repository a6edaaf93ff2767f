"""An answering party's side of an encrypted-query round.

Over the sealed relay channel (:mod:`services.common.relay`) the party
receives the student's public context (unless cached under its id) and the
round's ciphertexts, checks them against the hashes the round names,
evaluates its HE-friendly teacher (:mod:`capc.he`), re-randomises the
logits and masks them uniformly modulo the whole output modulus
(:mod:`capc.he.masking`), returns them, and runs the logits-to-shares 2PC as
garbler on the slots the round's declared batch pays for, and no others.
Its fresh output share becomes its guardian share; the student's output is
the other share of the same one-hot vote, exactly as in plain mode.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tenseal.sealapi as seal
from numpy.typing import NDArray

from capc.he.batched import BatchedEvaluator
from capc.he.ckks import MAX_CIPHERTEXT_BYTES, MAX_CONTEXT_BYTES, PublicContext, to_bytes
from capc.he.masking import mask_batched, mask_single
from capc.he.plan import Plan, compile_model
from capc.he.single import SingleEvaluator
from capc.models import Teacher
from capc.mpc.mechanism_circuits import LogitsToSharesCircuit
from capc.mpc.session import GarblerSession
from capc.privacy.randomness import SecureRandom
from capc.round.messages import RoundWork
from capc.task_config import Encryption
from services.common.relay import CHUNK, RelayChannel, relay_session_id
from services.proto.capc.v1 import common_pb2

#: Public contexts kept per party (each can be tens of MB).
CACHED_CONTEXTS = 2


@dataclass
class Answer:
    """What the party sends the guardian: its share (B, K) and the ciphertexts' hash."""

    share: NDArray[np.uint64]
    ciphertext_hash: bytes


def evaluate_and_mask(
    ctx: PublicContext,
    evaluator: BatchedEvaluator | SingleEvaluator,
    cts: list[seal.Ciphertext],
    batch: int,
    rng: SecureRandom,
) -> tuple[list[seal.Ciphertext], NDArray[np.uint64]]:
    """The party's work on one round's checked ciphertexts: what goes back, and its 2PC masks.

    Returns the masked logit ciphertexts (K batched, or one per query) and the
    garbler masks (batch, K) of the ``batch`` queries the round declares.
    Every slot of every returned ciphertext is masked, and only the declared
    queries' slots are decoded: a batched round decodes the first ``batch``
    slots, whatever the other slots hold.
    """
    if isinstance(evaluator, BatchedEvaluator):
        outputs = evaluator.evaluate(cts)
        return outputs, mask_batched(ctx, outputs, batch, rng)
    per = evaluator.layout.input_ciphertexts
    if len(cts) != batch * per:
        raise ValueError(f"{batch} queries take {batch * per} ciphertexts, got {len(cts)}")
    outputs = [evaluator.evaluate(cts[q * per : (q + 1) * per]) for q in range(batch)]
    return outputs, mask_single(ctx, outputs, evaluator.layout.plan.num_classes, rng)


class EncryptedAnswerer:
    """Evaluates one teacher on encrypted rounds; caches contexts and compiled evaluators."""

    def __init__(self, name: str, teacher: Teacher, timeout: float = 300.0) -> None:
        self.name = name
        self.teacher = teacher
        self.timeout = timeout
        self._plan: Plan | None = None
        self._contexts: OrderedDict[str, PublicContext] = OrderedDict()
        self._evaluators: dict[tuple[str, str], BatchedEvaluator | SingleEvaluator] = {}
        self._lock = threading.Lock()
        self._rng = SecureRandom()

    def plan(self, settings: Encryption) -> Plan:
        """The teacher compiled for CKKS, after checking it is the task's architecture."""
        t = self.teacher
        if t.architecture != settings.architecture:
            raise ValueError(
                f"the task evaluates {settings.architecture} teachers under encryption, "
                f"this party has {t.architecture}; retrain on the HE-friendly architecture"
            )
        if settings.width is not None and t.width not in (None, settings.width):
            raise ValueError(
                f"the task's {settings.architecture} has width {settings.width}, this teacher {t.width}"
            )
        if self._plan is None:
            self._plan = compile_model(t.model.cpu().eval(), t.input_shape)
        return self._plan

    def answer(
        self,
        work: RoundWork,
        batch: common_pb2.EncryptedBatch,
        channel: RelayChannel,
        hello: bytes,
        send_hello: Callable[[bytes], None],
    ) -> Answer:
        """Run the whole exchange for one round (decoded once, by the caller) whose
        ciphertexts ``batch`` names; raises ValueError with what was wrong."""
        mech = work.mechanism
        settings = Encryption.parse(json.loads(batch.settings_json))
        if (
            mech.multi_label
            or work.participation is not None
            or work.frac_bits
            or work.vote_weight != 1.0
        ):
            raise ValueError("encrypted rounds carry single-label votes of weight 1")
        plan = self.plan(settings)
        if mech.outputs != plan.num_classes:
            raise ValueError(
                f"the task has {mech.outputs} classes, this teacher {plan.num_classes}"
            )
        with self._lock:
            ctx = self._contexts.get(batch.context_id)
        send_hello(hello + (b"\x01" if ctx is not None else b"\x00"))
        if ctx is None:
            data = channel.recv_blob(MAX_CONTEXT_BYTES, self.timeout)
            if hashlib.sha256(data).hexdigest() != batch.context_id:
                raise ValueError("the public context does not match the id the round names")
            ctx = PublicContext.from_bytes(data, expected=settings.params)
            with self._lock:
                self._contexts[batch.context_id] = ctx
                while len(self._contexts) > CACHED_CONTEXTS:
                    old, _ = self._contexts.popitem(last=False)
                    self._evaluators = {k: v for k, v in self._evaluators.items() if k[0] != old}
        evaluator = self._evaluator(ctx, plan, batch.layout)
        digest = hashlib.sha256()
        cts = []
        scale = float(2**ctx.params.scale_bits)
        for i in range(batch.ciphertexts):
            blob = channel.recv_blob(MAX_CIPHERTEXT_BYTES, self.timeout)
            digest.update(blob)
            cts.append(
                ctx.load_ciphertext(
                    blob, level=ctx.params.input_level, scale=scale, what=f"ciphertext {i}"
                )
            )
        if digest.digest() != batch.ciphertext_hash:
            raise ValueError("the ciphertexts received do not match the hash the round names")
        b, k = int(batch.batch), plan.num_classes
        outputs, masks = evaluate_and_mask(ctx, evaluator, cts, b, self._rng)
        for ct in outputs:
            channel.send_blob(to_bytes(ct))
        share = self._rng.uint64((b, k))
        spec = LogitsToSharesCircuit(k, ctx.params.share_bits)
        session = GarblerSession(
            channel,
            relay_session_id(work.round_id, self.name, hello),
            timeout=self.timeout,
            max_frame=CHUNK,
        )
        session.setup()
        session.run_round(work.round_id, spec.circuit(), spec.garbler_inputs(masks, share), b)
        return Answer(share, digest.digest())

    def _evaluator(
        self, ctx: PublicContext, plan: Plan, layout: str
    ) -> BatchedEvaluator | SingleEvaluator:
        key = (ctx.context_id, layout)
        with self._lock:
            ev = self._evaluators.get(key)
            if ev is None:
                if layout == "batched":
                    ev = BatchedEvaluator(ctx, plan)
                elif layout == "single":
                    ev = SingleEvaluator(ctx, plan)
                else:
                    raise ValueError(f"unknown layout {layout!r}")
                self._evaluators[key] = ev
            return ev
