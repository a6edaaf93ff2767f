"""Command-line pieces every service shares: logging and how to reach the guardian."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def add_tls_args(
    p: argparse.ArgumentParser, insecure_help: str = "plaintext gRPC (development only)"
) -> None:
    """--pki, --server-name and --insecure-dev for a process that dials the guardian."""
    p.add_argument(
        "--pki", type=Path, default=Path("pki"), help="directory with ca.pem and NAME.pem/.key"
    )
    p.add_argument(
        "--server-name", default=None, help="expected name in the guardian's certificate"
    )
    p.add_argument("--insecure-dev", action="store_true", help=insecure_help)


#: The ledger's accountants by name (capc.privacy.accountants.ACCOUNTANTS), kept here so
#: that registering a subcommand imports no numerical library (a test checks they agree).
ACCOUNTANT_NAMES = ("gdp", "rdp")
DEFAULT_ACCOUNTANT_NAME = "gdp"
#: Certificate roles (services.common.pki.ROLES), likewise.
ROLE_NAMES = ("guardian", "answerer", "student", "gateway")
