"""``capc demo``'s options: only the standard library is imported here, so ``capc demo
--help`` answers at once (``services.commands.demo`` runs it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from capc.cli_handlers import lazy

#: Each hospital's cap (epsilon at the ledger's delta, 1e-5).
DEMO_CAP = 10.0
DEMO_HOSPITALS = 5
DEMO_TEACHERS = 50


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``capc demo``."""
    p = sub.add_parser("demo", help="run a local DIET-CaPC consortium end to end and report")
    p.add_argument(
        "--dir",
        type=Path,
        default=Path("demo"),
        help="keys, models, databases and results (a directory the demo ran in is not rerun)",
    )
    p.add_argument(
        "--hospitals", type=int, default=DEMO_HOSPITALS, help="hospitals (default %(default)s)"
    )
    p.add_argument(
        "--teachers", type=int, default=DEMO_TEACHERS, help="teachers each hospital hosts"
    )
    p.add_argument(
        "--epsilon", type=float, default=DEMO_CAP, help="each hospital's cap (delta 1e-5)"
    )
    p.add_argument(
        "--queries",
        type=int,
        default=None,
        help="queries to label (default: as many rounds as every hospital's cap covers)",
    )
    p.add_argument(
        "--generator",
        choices=["gaussian", "spectral", "dead_leaves", "fractal", "mix"],
        default="gaussian",
        help="synthetic query generator (default %(default)s)",
    )
    p.add_argument(
        "--body",
        type=Path,
        default=None,
        help="a pretrained body (capc diet pretrain); default the shipped demo-body.pt",
    )
    p.add_argument(
        "--pretrain-steps",
        type=int,
        default=None,
        help="pretrain a small body here for this many SimCLR steps instead of using the "
        "shipped one",
    )
    p.add_argument(
        "--json", action="store_true", help="end with one JSON object of the results on stdout"
    )
    serve = p.add_mutually_exclusive_group()
    serve.add_argument(
        "--serve", action="store_true", help="keep the consortium up afterwards (Ctrl-C stops)"
    )
    serve.add_argument("--no-serve", action="store_true", help="stop as soon as it has reported")
    p.set_defaults(handler=lazy("services.commands.demo", "run"))
