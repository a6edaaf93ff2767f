"""``capc student``: run labelling jobs for the gateway against the guardian."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from capc.models import load_teacher
from services.common import pki, tls
from services.common.cli_args import add_tls_args, setup_logging
from services.common.task import TaskConfig, TaskError, config_hash
from services.proto.capc.v1 import student_pb2_grpc
from services.student.client import StudentClient
from services.student.servicer import POLICY, SERVICE, JobRunner, StudentParty
from services.student.store import JobStore
from services.student.training import ModelTrainer, load_reference, load_test_set

log = logging.getLogger("capc.student")


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("student", help="run the student party (jobs API for the gateway)")
    p.add_argument("--guardian", required=True, help="guardian address host:port")
    p.add_argument(
        "--task",
        type=Path,
        required=True,
        help="task configuration JSON (as registered with the guardian)",
    )
    p.add_argument("--task-name", default=None, help="task name (default: the file's stem)")
    p.add_argument("--db", default="student.db", help="SQLite path or URL, or postgresql://...")
    p.add_argument("--listen", default="127.0.0.1:50061", help="host:port of the jobs API")
    p.add_argument("--name", default="student")
    p.add_argument(
        "--test-data",
        type=Path,
        default=None,
        help="the student's own labelled test set (.npz with x and y) to evaluate student models",
    )
    p.add_argument(
        "--reference-data",
        type=Path,
        default=None,
        help="unlabelled records (.npz with x, or .npy; 16 to 1024) drawn as deployed inputs are: "
        "a pretrained student stores their statistics so each prediction depends on its record "
        "alone (default: the inputs of --test-data)",
    )
    p.add_argument(
        "--own-data",
        type=Path,
        default=None,
        help="the querier's own labelled records (.npz with x and y): a hospital that queries "
        "the consortium (the CaPC loop) fits its pretrained student on them plus the labels "
        "its jobs bring back; a model of no jobs is fitted on them alone",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="PARTY",
        help="an answering party every round leaves out: a hospital querying the consortium "
        "names its own, so its teachers do not vote on its queries; repeatable",
    )
    p.add_argument(
        "--body",
        type=Path,
        default=None,
        help="pretrained body (capc diet pretrain): student models fit its last layer (DIET)",
    )
    add_tls_args(p)
    p.set_defaults(handler=run)


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


def run(args: argparse.Namespace) -> int:
    setup_logging()
    try:
        config = json.loads(args.task.read_text())
        task = TaskConfig.parse(args.task_name or args.task.stem, config, config_hash(config))
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
        ),
        records=task.records,
    )
    try:
        trainer = ModelTrainer(store, task, test_set, body, reference, own)
        server, port = serve_jobs(StudentParty(store, runner, task, trainer), args.listen, files)
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
