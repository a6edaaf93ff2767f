"""``capc pki``'s options: only the standard library is imported here, so ``capc pki
--help`` answers at once (``services.common.pki`` runs it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from capc.cli_handlers import lazy
from services.common.cli_args import ROLE_NAMES

#: services.common.pki.REASONS' names (a test checks they agree).
REVOKE_REASONS = (
    "unspecified",
    "key-compromise",
    "affiliation-changed",
    "superseded",
    "cessation-of-operation",
)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``capc pki``; its handlers import services.common.pki only when run."""
    p = sub.add_parser("pki", help="consortium certificate authority")
    psub = p.add_subparsers(dest="pki_command", required=True)
    init = psub.add_parser("init", help="create the consortium CA and its revocation list")
    init.add_argument("--dir", type=Path, default=Path("pki"), help="where to write the CA")
    init.add_argument("--days", type=int, default=3650, help="the CA's validity in days")
    init.add_argument("--force", action="store_true", help="replace an existing CA")
    init.add_argument(
        "--dev",
        action="store_true",
        help="a development CA: the only kind that issues localhost certificates (issue --dev)",
    )
    init.set_defaults(handler=lazy("services.common.pki.cli", "cmd_init"))
    iss = psub.add_parser("issue", help="issue a certificate with its role bound in it")
    iss.add_argument("--dir", type=Path, default=Path("pki"), help="the CA's directory")
    iss.add_argument("--role", required=True, choices=ROLE_NAMES, help="the role bound in it")
    iss.add_argument("--name", required=True, help="the party's name (NAME.pem/.key)")
    iss.add_argument(
        "--dns",
        action="append",
        default=[],
        metavar="NAME",
        help="host name clients dial this service by (repeatable)",
    )
    iss.add_argument(
        "--ip",
        action="append",
        default=[],
        metavar="ADDRESS",
        help="IP address clients dial this service at (repeatable)",
    )
    iss.add_argument(
        "--dev",
        action="store_true",
        help="development only: also valid for localhost and 127.0.0.1 (needs init --dev)",
    )
    iss.add_argument("--days", type=int, default=365, help="validity in days")
    iss.set_defaults(handler=lazy("services.common.pki.cli", "cmd_issue"))
    rev = psub.add_parser(
        "revoke", help="revoke a certificate: every service refuses it once crl.pem reaches it"
    )
    rev.add_argument("--dir", type=Path, default=Path("pki"), help="the CA's directory")
    which = rev.add_mutually_exclusive_group(required=True)
    which.add_argument("name", nargs="?", help="revoke DIR/NAME.pem")
    which.add_argument("--serial", help="revoke by serial (hexadecimal)")
    rev.add_argument(
        "--reason", choices=list(REVOKE_REASONS), default="unspecified", help="reason in the CRL"
    )
    rev.add_argument("--days", type=int, default=365, help="days until the CRL is due for renewal")
    rev.set_defaults(handler=lazy("services.common.pki.cli", "cmd_revoke"))
    web = psub.add_parser(
        "issue-https",
        help="issue the gateway's HTTPS certificate (NAME-https.pem/.key) for its hosts",
    )
    web.add_argument("--dir", type=Path, default=Path("pki"), help="the CA's directory")
    web.add_argument("--name", default="gateway", help="the gateway's --name")
    web.add_argument(
        "--host",
        action="append",
        required=True,
        help="DNS name or IP analysts reach the gateway by (repeatable)",
    )
    web.add_argument(
        "--dev", action="store_true", help="a development certificate: allows localhost names"
    )
    web.add_argument("--days", type=int, default=365, help="validity in days")
    web.set_defaults(handler=lazy("services.common.pki.cli", "cmd_issue_https"))
