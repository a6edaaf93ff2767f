"""``capc pki``'s subcommands (options in :mod:`services.common.pki_args`): each prints
what it wrote, or the error, and returns the exit status."""

from __future__ import annotations

import argparse

from services.common.ledger import audit
from services.common.pki.ca import init_ca
from services.common.pki.issuing import issue, issue_https
from services.common.pki.model import PKIError
from services.common.pki.revocation import parse_serial, revoke
from services.common.pki.store import CA_KEY, CRL_FILE, audit_key_path


def cmd_init(args: argparse.Namespace) -> int:
    try:
        path = init_ca(args.dir, days=args.days, force=args.force, dev=args.dev)
    except PKIError as err:
        print(f"error: {err}")
        return 2
    kind = "development CA (localhost certificates; never for real data)" if args.dev else "CA"
    print(
        f"consortium {kind} written to {path} (key {args.dir / CA_KEY}, mode 0600): keep the key "
        f"offline; revocation list {args.dir / CRL_FILE}"
    )
    return 0


def cmd_issue(args: argparse.Namespace) -> int:
    try:
        cert, key = issue(
            args.dir,
            args.role,
            args.name,
            tuple(args.dns),
            tuple(args.ip),
            dev=args.dev,
            days=args.days,
        )
    except PKIError as err:
        print(f"error: {err}")
        return 2
    print(f"{args.role} certificate for {args.name}: {cert} (key {key})")
    if args.role == "guardian":
        signing = audit_key_path(args.dir, args.name)
        public = audit.public_hex(audit.load_key(signing))
        print(f"audit signing key {signing} (mode 0600), public key {public}")
    return 0


def cmd_issue_https(args: argparse.Namespace) -> int:
    try:
        cert, key = issue_https(args.dir, args.name, tuple(args.host), args.days, args.dev)
    except PKIError as err:
        print(f"error: {err}")
        return 2
    print(f"HTTPS certificate for {', '.join(args.host)}: {cert} (key {key})")
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    try:
        serial = None if args.serial is None else parse_serial(args.serial)
        revoked, crl = revoke(args.dir, args.name, serial, args.reason, args.days)
    except PKIError as err:
        print(f"error: {err}")
        return 2
    print(
        f"revoked {args.name or 'certificate'} (serial {revoked:x}); copy {crl} next to ca.pem "
        "in every service's PKI directory: services reload it without a restart"
    )
    return 0
