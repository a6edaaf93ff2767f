"""``capc privacy``'s options: only the standard library is imported here, so ``capc
privacy --help`` answers at once (``capc.planning.cli`` runs it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from capc.cli_handlers import lazy

#: capc.mechanisms.MECHANISMS' names and capc.privacy.conversion.Conversion's values,
#: kept here so that registering imports no numerical library (a test checks they agree).
MECHANISM_NAMES = (
    "binary",
    "confident-gnmax",
    "dp-trained",
    "gnmax",
    "powerset",
    "robust-confident-gnmax",
    "tau",
)
CONVERSIONS = ("basic", "improved")
#: The Laplace mechanism, planned here beside the aggregation mechanisms.
LAPLACE = "laplace"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``privacy plan``, ``privacy cost`` and ``privacy advise``."""
    p = sub.add_parser("privacy", help="plan queries and report privacy cost (no services needed)")
    psub = p.add_subparsers(dest="privacy_command", required=True)
    for name, helptext in (
        ("plan", "how many queries fit a budget, and the noise a query count needs"),
        ("cost", "the privacy cost of a run given its vote histograms"),
    ):
        q = psub.add_parser(name, help=helptext)
        q.add_argument(
            "--mechanism",
            choices=[*MECHANISM_NAMES, LAPLACE],
            default="confident-gnmax",
            help="the aggregation mechanism (default confident-gnmax)",
        )
        q.add_argument(
            "--teachers",
            type=int,
            help="number of teachers (checks vote files, bounds the threshold)",
        )
        q.add_argument("--sigma", type=float, help="answer (or decision) noise std, votes")
        q.add_argument("--threshold", type=float, help="threshold (votes) of a confident mechanism")
        q.add_argument("--sigma1", type=float, help="threshold-test noise std, votes")
        q.add_argument("--tau", type=float, help="tau-voting clipping norm")
        q.add_argument("--scale", type=float, help="Laplace noise scale")
        q.add_argument("--classes", type=int, default=10, help="number of classes K (single label)")
        q.add_argument("--labels", type=int, help="number of labels k (multi-label)")
        q.add_argument("--delta", type=float, default=1e-5, help="target delta (default 1e-5)")
        q.add_argument(
            "--conversion",
            choices=CONVERSIONS,
            default="improved",
            help="RDP to (eps, delta) conversion (default improved)",
        )
        q.add_argument("--json", action="store_true", help="print JSON")
        if name == "plan":
            q.add_argument(
                "--epsilon", type=float, required=True, help="the budget: epsilon at --delta"
            )
            q.add_argument(
                "--queries", type=int, help="also solve for the noise this many queries need"
            )
        else:
            q.add_argument("--votes", type=Path, help=".npy: a (queries, classes) vote histogram")
            q.add_argument(
                "--answered", type=Path, help=".npy of booleans: which queries were answered"
            )
            q.add_argument(
                "--sanitise",
                action="store_true",
                help="release the data-dependent epsilon with smooth sensitivity",
            )
            q.add_argument(
                "--seed", help="seed the sanitising noise (reproducible; never for real releases)"
            )
    a = psub.add_parser(
        "advise",
        help="recommend Binary, tau or Powerset voting and its noise from label statistics",
    )
    a.add_argument(
        "--labels-file", type=Path, help=".npy of (N, k) 0/1 non-sensitive label vectors"
    )
    a.add_argument("--labels", type=int, help="k, if no labels file")
    a.add_argument("--mean-l2", type=float, help="mean l2 norm of a label vector, if no file")
    a.add_argument("--subsets", type=int, help="how many label subsets occur, if no file")
    a.add_argument("--teachers", type=int, required=True, help="answering parties voting")
    a.add_argument("--queries", type=int, required=True, help="queries the plan must answer")
    a.add_argument("--epsilon", type=float, required=True, help="each party's epsilon")
    a.add_argument("--delta", type=float, default=1e-5, help="target delta (default 1e-5)")
    a.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=lazy("capc.planning.cli", "run"))
