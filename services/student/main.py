"""``capc student``: run labelling jobs for the gateway against the guardian."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from capc.models import load_teacher
from capc.task_config import TaskError, read_task
from services.common import pki, tls
from services.common.cli_args import setup_logging
from services.common.limits import MAX_REFERENCE_RECORDS
from services.proto.capc.v1 import student_pb2_grpc
from services.student.client import StudentClient
from services.student.loop import LoopIdentity
from services.student.servicer import POLICY, SERVICE, JobRunner, StudentParty
from services.student.store import JobStore
from services.student.training import ModelTrainer, load_reference, load_test_set

log = logging.getLogger("capc.student")


def serve_jobs(
    party: StudentParty, listen: str, files: tls.TLSFiles | None
) -> tuple[grpc.Server, int]:
    """Start the jobs API on ``listen`` (port 0 picks one): role policy and revocation checked
    on every call, unless ``files`` is None (--insecure-dev). Returns the server and its port."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=16),
        interceptors=[tls.server_interceptor(POLICY, files)],
        options=list(tls.SERVER_OPTIONS),
    )
    student_pb2_grpc.add_StudentPartyServicer_to_server(party, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if files is None:
        log.warning(tls.INSECURE_WARNING)
        port = server.add_insecure_port(listen)
    else:
        port = server.add_secure_port(listen, tls.server_credentials(files))
    if port == 0:
        raise OSError(f"could not listen on {listen}")
    server.start()
    health_servicer.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
    return server, port


def data_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the data options (a missing reference batch), or None: checked
    before anything is loaded or started. ``--own-data`` goes with or without ``--body``:
    a pretrained student fits its last layer on the querier's own records and its labels,
    one trained from scratch (a table task's MLP) its whole model on them."""
    if args.body is not None and args.reference_data is None and args.own_data is None:
        return (
            "--body needs --reference-data FILE: a pretrained student reads each record "
            "through the statistics of a reference batch, 256 real unlabelled records (16 to "
            f"{MAX_REFERENCE_RECORDS}) drawn as the inputs it will be asked about are, saved as "
            "an .npz with x (or an .npy); take them from the same source as those inputs, "
            "never from the labelled test set (capc up and capc demo write "
            "DIR/student-reference.npz)"
        )
    return None


def run(args: argparse.Namespace) -> int:
    """Serve the student party until SIGTERM or SIGINT; 2 on a bad option or file."""
    setup_logging()
    problem = data_error(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        task = read_task(args.task, args.task_name)
        files = None if args.insecure_dev else tls.TLSFiles.in_dir(args.pki, args.name)
        if files is not None:
            tls.server_credentials(files)  # refuse to start with a bad or revoked certificate
        test_set = None if args.test_data is None else load_test_set(args.test_data, task)
        body = None if args.body is None else load_teacher(args.body)
        reference = (
            None if args.reference_data is None else load_reference(args.reference_data, task)
        )
        own = None if args.own_data is None else load_test_set(args.own_data, task)
    except (OSError, ValueError, TaskError, pki.PKIError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    store = JobStore(args.db)
    runner = JobRunner(
        store,
        lambda: StudentClient(
            args.guardian,
            files,
            task,
            server_name=args.server_name,
            name=args.name,
            exclude=tuple(args.exclude),
            hospital=args.hospital,
        ),
        records=task.records,
    )
    try:
        trainer = ModelTrainer(store, task, test_set, body, reference, own)
        identity = LoopIdentity(args.hospital, args.name)
        party = StudentParty(store, runner, task, trainer, identity)
        server, port = serve_jobs(party, args.listen, files)
    except (ValueError, OSError, pki.PKIError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"student serving jobs on port {port} for task {task.name}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop(2).wait()
    return 0
