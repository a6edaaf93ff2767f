"""``capc student``'s options: only the standard library is imported here, so ``capc
student --help`` answers at once (``services.student.main`` runs it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from capc.cli_handlers import lazy
from services.common.cli_args import add_tls_args


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``capc student``; its handler imports services.student.main only when run."""
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
    p.add_argument("--name", default="student", help="this party's name (its certificate NAME.pem)")
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
        help="needed with --body: unlabelled real records (.npz with x, or .npy; 16 to 1024, "
        "256 advised) drawn as deployed inputs are; a pretrained student stores their "
        "statistics so each prediction depends on its record alone (with --own-data, default: "
        "a batch of those records; never the test set)",
    )
    p.add_argument(
        "--own-data",
        type=Path,
        default=None,
        help="the querier's own labelled records (.npz with x and y): a hospital that queries "
        "the consortium (the CaPC loop) fits its student on them plus the labels its jobs "
        "bring back (with --body its pretrained student's last layer, else a model from "
        "scratch, e.g. a table task's MLP); a model of no jobs is fitted on them alone",
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
        "--hospital",
        default="",
        metavar="PARTY",
        help="the hospital this student party queries for (the CaPC loop): its rounds name "
        "it and leave it out (the guardian must bind this certificate to it: capc guardian "
        "--querier NAME=PARTY), and uploaded records count as its own: sent in the clear "
        "only by a job's explicit, audited reveal_records_to_answerers",
    )
    p.add_argument(
        "--body",
        type=Path,
        default=None,
        help="pretrained body (capc diet pretrain): student models fit its last layer (DIET)",
    )
    add_tls_args(p)
    p.set_defaults(handler=lazy("services.student.main", "run"))
