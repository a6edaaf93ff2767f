"""``capc up``'s options: only the standard library is imported here, so ``capc up --help``
answers at once (``services.up`` runs it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from services.common.cli_args import lazy

#: Queries the default task's sigma must let every hospital's cap cover.
PLANNED_QUERIES = 1024
#: Teachers per hospital without a file of its own: the demo's 50.
TEACHERS_PER_HOSPITAL = 50


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``capc up``."""
    p = sub.add_parser(
        "up",
        help="run a local consortium (guardian, hospitals, student party, gateway) until "
        "interrupted, and print how to reach it with capcctl",
    )
    p.add_argument("--parties", type=int, default=5, help="hospitals (hospital-0, ...)")
    p.add_argument("--dir", type=Path, default=Path("consortium"), help="keys, models, ledgers")
    p.add_argument("--epsilon", type=float, default=10.0, help="each hospital's cap (delta 1e-5)")
    p.add_argument(
        "--task",
        type=Path,
        default=None,
        help="a task JSON file, used as it is; default: GNMax with sigma planned for the "
        "voters and caps (--queries)",
    )
    p.add_argument(
        "--teachers",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="a hospital's own teacher file (capc checkpoint or ensemble), e.g. "
        "hospital-0=teachers.pt; repeatable. Other hospitals get DIET teachers fitted on "
        "their share of the offline data",
    )
    p.add_argument(
        "--teachers-per-hospital",
        type=int,
        default=TEACHERS_PER_HOSPITAL,
        help="DIET teachers each hospital without its own file votes with, each on a "
        "disjoint part of its data",
    )
    p.add_argument(
        "--queries",
        type=int,
        default=PLANNED_QUERIES,
        help="queries the default task's sigma lets every hospital's cap cover",
    )
    p.add_argument(
        "--body",
        type=Path,
        default=None,
        help="a pretrained body (capc diet pretrain); default the shipped one",
    )
    p.add_argument(
        "--json", action="store_true", help="print one JSON object on stdout (progress on stderr)"
    )
    p.set_defaults(handler=lazy("services.up", "run"))
