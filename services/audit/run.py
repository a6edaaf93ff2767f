"""``capc audit run``: an empirical privacy audit of a local networked consortium.

The topology of ``capc up`` (services/local.py): the guardian, every hospital
and the student party run as separate processes over mutual TLS. Before the
hospitals train their teachers, canaries (records given a random wrong label,
:mod:`capc.audit.canaries`) are planted in the data of the audited hospitals.
Then, as any student would:

1. a labelling job over the network sends the canaries' images, mixed with
   held-out images, to the consortium (the features are public under
   label-DP; the labels are what the ledger protects);
2. the student party trains its model on the answered queries;
3. the attack reads what the student received, the released labels and the
   model's class probabilities on each canary, and guesses each canary's
   label between its two candidates, abstaining where neither is pointed at;
4. the counts go to the guardian (``RecordPrivacyAudit``, with the guardian's
   own certificate: the operator who runs this consortium records them), which computes the empirical lower bound on epsilon with its
   Clopper-Pearson interval at its ledger's delta and stores it beside the
   epsilon its ledger claims for that hospital. The admin API
   (``GET /v1/admin/privacy-audits``) and the dashboard show them side by side.

What is released here are integer labels (argmax and threshold outputs of
the secure circuits; the noisy counts never leave them), so the support-set
attack of :func:`capc.audit.canaries.guess_by_support`, which reads the
floating-point bits of released noisy vectors, has nothing to read: it runs
where vectors are released (``capc labeldp alibi``).

The run prints one JSON object (``--json``) or a line per hospital; with
``--serve`` it starts the gateway as well and keeps the consortium up.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional

from capc.audit import canaries as canary_audit
from capc.cli_output import stdout_to_stderr
from capc.models import load_teacher
from capc.models.inference import logits
from services.audit.record import RecordError, record
from services.common import protocol, serde, tls
from services.gateway.backends import Backends
from services.local import TASK_NAME, CanarySpec, LocalConsortium
from services.proto.capc.v1 import common_pb2, guardian_pb2_grpc, student_pb2

#: What the attack saw and did, as the guardian records it.
ATTACK = (
    "canary labels: the released label, else the student model's top class, when it is one "
    "of the two candidates; abstain otherwise"
)


class AuditError(RuntimeError):
    """The audit could not run to the end; the message says where."""


def _backends(c: LocalConsortium) -> Backends:
    """The student's jobs API and the guardian's admin API, as the gateway reaches them."""
    return Backends(
        f"127.0.0.1:{c.student_port}",
        f"127.0.0.1:{c.port}",
        tls.TLSFiles.in_dir(c.pki_dir, "gateway"),
        "localhost",
        TASK_NAME,
        timeout=120.0,
    )


def _tensor(x: np.ndarray) -> common_pb2.QueryBatch:
    return common_pb2.QueryBatch(tensor=serde.queries_to_proto(x))


def label(b: Backends, queries: np.ndarray, batch: int, timeout: float) -> tuple[str, np.ndarray]:
    """Run one labelling job; returns its id and the (N,) labels (-1: not answered)."""
    header = protocol.header(TASK_NAME)
    job = b.student_call(
        b.jobs.CreateJob,
        student_pb2.CreateJobRequest(header=header, queries=_tensor(queries), batch_size=batch),
    )
    watch = student_pb2.WatchJobRequest(header=header, id=job.id)
    states = [j for j in b.jobs.WatchJob(watch, timeout=timeout)]
    if not states or states[-1].state != "done":
        last = states[-1] if states else None
        raise AuditError(
            f"labelling job {job.id} ended {last.state if last else 'without news'}: "
            f"{last.error if last else ''}"
        )
    results = b.student_call(
        b.jobs.GetResults, student_pb2.GetResultsRequest(header=header, id=job.id)
    )
    return job.id, np.frombuffer(results.labels.data, dtype="<i8").copy()


def student_model(
    b: Backends, job_id: str, epochs: int, directory: Path, timeout: float
) -> torch.nn.Module:
    """Train the student party's model on the job's answered queries and fetch it."""
    header = protocol.header(TASK_NAME)
    model = b.student_call(
        b.jobs.TrainModel,
        student_pb2.TrainModelRequest(header=header, job_ids=[job_id], epochs=epochs),
    )
    deadline = time.monotonic() + timeout
    while model.state not in ("done", "failed"):
        if time.monotonic() > deadline:
            raise AuditError(f"student model {model.id} was not trained within {timeout:.0f} s")
        time.sleep(0.5)
        model = b.student_call(
            b.jobs.GetModel, student_pb2.GetModelRequest(header=header, id=model.id)
        )
    if model.state != "done":
        raise AuditError(f"the student party could not train its model: {model.error}")
    file = b.student_call(
        b.jobs.DownloadModel, student_pb2.GetModelRequest(header=header, id=model.id)
    )
    path = directory / f"student-{model.id}.pt"
    path.write_bytes(file.checkpoint)
    return load_teacher(path).model


def audit_consortium(
    c: LocalConsortium,
    hospitals: tuple[int, ...],
    extra_queries: int,
    batch: int,
    epochs: int,
    seed: int = 0,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Steps 1-4 of the module docstring on a running consortium with its student party."""
    planted = {h: c.planted(h) for h in hospitals}
    images = np.concatenate([p.images for p in planted.values()])
    extra = c.queries[:extra_queries]
    queries = np.concatenate([images, extra])
    order = np.random.default_rng(seed).permutation(len(queries))
    b = _backends(c)
    # The counts are recorded as the guardian's operator, who runs this consortium: the
    # gateway's certificate, which the jobs go through, may not record audits.
    operator = tls.secure_channel(
        f"127.0.0.1:{c.port}",
        tls.TLSFiles.in_dir(c.pki_dir, "guardian"),
        "localhost",
        role="guardian",
    )
    hub = guardian_pb2_grpc.GuardianHubStub(operator)
    try:
        job_id, labels_shuffled = label(b, queries[order], batch, timeout)
        labels = np.empty_like(labels_shuffled)
        labels[order] = labels_shuffled
        model = student_model(b, job_id, epochs, c.directory, timeout)
        out = []
        start = 0
        for h, p in planted.items():
            m = len(p.canaries)
            released = labels[start : start + m]
            with torch.no_grad():
                probs = functional.softmax(logits(model, p.images).double(), dim=1).numpy()
            start += m
            guesses = canary_audit.guess(p.canaries, probs, released)
            kept = record(
                hub,
                f"hospital-{h}",
                canaries=m,
                guesses=guesses.count,
                correct=guesses.correct,
                attack=ATTACK,
                note="capc audit run",
            )
            out.append(kept)
        answered = int((labels >= 0).sum())
    except RecordError as err:
        raise AuditError(str(err)) from None
    finally:
        b.close()
        operator.close()
    return {
        "consortium": str(c.directory),
        "parties": c.parties,
        "queries": len(queries),
        "answered": answered,
        "job": job_id,
        "audits": out,
    }


def run(args: argparse.Namespace) -> int:
    """Run the audit the arguments describe; print its results."""
    hospitals = tuple(sorted(set(args.hospital or [0])))
    if args.parties < 1 or max(hospitals) >= args.parties:
        print(f"error: --hospital must name hospitals 0..{args.parties - 1}", file=sys.stderr)
        return 2
    if args.canaries < 1 or args.queries < 0 or args.batch < 1:
        print("error: --canaries and --batch must be positive, --queries >= 0", file=sys.stderr)
        return 2
    say = (lambda s: print(s, file=sys.stderr, flush=True)) if args.json else print
    c = LocalConsortium(
        args.dir,
        parties=args.parties,
        epsilon_cap=args.epsilon,
        epochs=args.teacher_epochs,
        canaries=CanarySpec(hospitals, args.canaries, args.seed),
        log=say,
    )
    with stdout_to_stderr(args.json) as emit:
        return _audit_and_report(args, c, hospitals, say, emit)


def _audit_and_report(
    args: argparse.Namespace,
    c: LocalConsortium,
    hospitals: tuple[int, ...],
    say: Callable[[str], None],
    emit: Callable[[str], None],
) -> int:
    """Start ``c``, audit ``hospitals``, report through ``emit`` (stdout), then serve when
    asked; progress goes through ``say``."""
    stop = threading.Event()
    with c:
        c.start_student()
        say(
            f"auditing {', '.join(f'hospital-{h}' for h in hospitals)} with {args.canaries} canaries each"
        )
        try:
            result = audit_consortium(
                c, hospitals, args.queries, args.batch, args.student_epochs, args.seed
            )
        except AuditError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        if args.json:
            emit(json.dumps(result, indent=2))
        else:
            for a in result["audits"]:
                upper = "inf" if a["empirical_upper"] is None else f"{a['empirical_upper']:.2f}"
                emit(
                    f"{a['party']}: claimed epsilon {a['claimed_epsilon']:.4g} (ledger, delta "
                    f"{a['delta']:g}); empirical >= {a['empirical_lower']:.3f} (95% CI "
                    f"{a['empirical_lower']:.2f}-{upper}) from {a['correct']} right of "
                    f"{a['guesses']} guesses on {a['canaries']} canaries"
                    + ("; CLAIM REFUTED" if a["refuted"] else "")
                )
        if args.serve:
            c.start_gateway()
            token = c.token("admin", "auditor")
            say(f"dashboard: {c.gateway_url}/dashboard#token={token}")
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            stop.wait()
    return 0
