"""``python -m capc.learning diet ...``: the DIET commands without the services installed.

A GPU box that only pretrains bodies or runs the central-mode experiment
needs neither gRPC nor the ledger; this is the same parser ``capc diet`` uses.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from capc.learning import cli


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (``diet pretrain|run|show ...``) and run the chosen command."""
    parser = argparse.ArgumentParser(prog="python -m capc.learning")
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
