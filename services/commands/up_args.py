"""``capc up``'s options: only the standard library is imported here, so ``capc up --help``
answers at once (``services.commands.up`` runs it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from capc.cli_handlers import lazy

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
        help="a pretrained body (capc diet pretrain); default the shipped one. Image tasks "
        "only: a table task's students are MLPs trained from scratch",
    )
    p.add_argument(
        "--test-data",
        type=Path,
        default=None,
        metavar="FILE.npz",
        help="the consortium student's labelled test set (x, y; capc data pack); default: "
        "the offline data's held-out images. Required when the task's input shape is not "
        "the offline data's 1x28x28",
    )
    p.add_argument(
        "--reference-data",
        type=Path,
        default=None,
        metavar="FILE.npz",
        help="the student's unlabelled reference batch (x; capc data pack --unlabelled); "
        "default: offline held-out images. Required with an image task not on 1x28x28 "
        "inputs; a table task's student (an MLP) needs none",
    )
    p.add_argument(
        "--loop",
        default=None,
        metavar="HOSPITAL",
        help="also start HOSPITAL's CaPC loop (e.g. hospital-0): the guardian binds "
        "HOSPITAL-querier to it, its querier student party and a second gateway with its "
        "own analyst token; needs --own-data and --own-test",
    )
    p.add_argument(
        "--own-data",
        type=Path,
        default=None,
        metavar="OWN.npz",
        help="--loop: the hospital's own labelled records (x, y) its model starts from",
    )
    p.add_argument(
        "--own-test",
        type=Path,
        default=None,
        metavar="TEST.npz",
        help="--loop: the hospital's held-out labelled records (x, y) its model is measured on",
    )
    p.add_argument(
        "--json", action="store_true", help="print one JSON object on stdout (progress on stderr)"
    )
    p.set_defaults(handler=lazy("services.commands.up", "run"))
