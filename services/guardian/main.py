"""``capc guardian``: open the ledger, recover after a crash, serve the hub."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from capc.privacy.randomness import SecureRandom
from capc.round.errors import LedgerRefusedError
from capc.task_config import TaskConfig, TaskError, config_hash
from services.common import pki, tls
from services.common.cli_args import setup_logging
from services.common.db import normalise_url
from services.common.ledger import Ledger, audit
from services.common.limits import MAX_TEACHERS_PER_PARTY
from services.guardian.hub import serve
from services.guardian.loop import bind_querier, declare_outside, keep_clear_policy, parse_querier

log = logging.getLogger("capc.guardian")


NOISE_SEED_REFUSED = (
    "--noise-seed needs --insecure-dev: a seeded guardian draws the same noise again "
    "after every restart, so its answers repeat their noise and differential privacy "
    "no longer holds. With real data, drop --noise-seed (the guardian then draws from "
    "the operating system's CSPRNG); only a test that replays the noise may add "
    "--insecure-dev."
)


def start_up_error(args: argparse.Namespace) -> str | None:
    """Why the guardian must not start with ``args``, or None; checked before the ledger opens."""
    if args.noise_seed is not None and not args.insecure_dev:
        return NOISE_SEED_REFUSED
    if args.round_timeout <= args.share_timeout:
        return (
            f"--round-timeout ({args.round_timeout:g} s) must exceed --share-timeout "
            f"({args.share_timeout:g} s): a round collects its shares before its 2PC can "
            "start. Raise --round-timeout or lower --share-timeout"
        )
    return None


def parse_register(item: str) -> tuple[str, float, int]:
    """``PARTY=EPS:TEACHERS`` -> (party, epsilon ceiling, pinned teacher count).

    The teacher count has no default: it is the party's vote weight, which the
    consortium agrees and only the operator can vouch for. A party's own Register
    names its teachers, and its validity proofs hold it to that count and no
    further, so a count the guardian assumed (even 1) would be a weight nobody
    agreed to; an operator who leaves it out is told the exact form to write instead.
    ValueError saying what was wrong and what to write.
    """
    name, eq, value = item.partition("=")
    eps, colon, teachers = value.partition(":")
    example = f"--register {name or 'hospital-a'}=4:1 (epsilon ceiling 4, one teacher)"
    if not name or not eq:
        raise ValueError(f"--register expects PARTY=EPS:TEACHERS, got {item!r}; e.g. {example}")
    if not colon:
        raise ValueError(
            f"--register {item} pins no teacher count: write PARTY=EPS:TEACHERS, the most "
            f"teachers {name} may vote with, as the consortium agreed; e.g. {example}"
        )
    try:
        cap = float(eps)
    except ValueError:
        raise ValueError(
            f"--register {item}: {eps!r} is not an epsilon ceiling; e.g. {example}"
        ) from None
    try:
        count = int(teachers)
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_TEACHERS_PER_PARTY:
        raise ValueError(
            f"--register {item}: the teacher count must be a whole number from 1 to "
            f"{MAX_TEACHERS_PER_PARTY}, got {teachers!r}; e.g. {example}"
        )
    return name, cap, count


def transport(args: argparse.Namespace) -> tls.TLSFiles | None:
    """The TLS files to serve with, or None for plaintext (--insecure-dev without --pki).

    An explicit --pki keeps mutual TLS on even under --insecure-dev, so a test that
    replays seeded noise still exercises the certificates and the role policy.
    """
    if args.insecure_dev and args.pki is None:
        return None
    return tls.TLSFiles.in_dir(Path("pki") if args.pki is None else args.pki, args.name)


def audit_signer(args: argparse.Namespace) -> Ed25519PrivateKey:
    """The key that signs the audit log's heads. Under --insecure-dev without a PKI a
    missing key is created beside a SQLite ledger (else in the working directory);
    otherwise it must exist (it comes with the guardian's certificate)."""
    path = args.audit_key or pki.audit_key_path(
        Path("pki") if args.pki is None else args.pki, args.name
    )
    if args.insecure_dev and args.pki is None and args.audit_key is None:
        url = normalise_url(args.db)
        where = (
            Path(url.removeprefix("sqlite:///")).parent if url.startswith("sqlite:///") else Path()
        )
        path = where / f"{args.name}{pki.AUDIT_KEY_SUFFIX}"
        if not path.exists():
            log.warning("--insecure-dev: created an audit signing key at %s", path)
            return audit.create_key(path)
    return audit.load_key(path)


def run(args: argparse.Namespace) -> int:
    setup_logging()
    refused = start_up_error(args)
    if refused is not None:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    try:
        registrations = [parse_register(item) for item in args.register]
        bindings = [parse_querier(item) for item in args.querier]
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        signer = audit_signer(args)
        ledger = Ledger(args.db, accountant=args.accountant, delta=args.delta, signer=signer)
        if args.migrate:
            print(f"ledger at {ledger.url} is at the newest schema")
            return 0
        # A ledger with no party and no round yet is a new consortium's.
        fresh = not ledger.budgets() and ledger.last_round() == 0
        for name, cap, teachers in registrations:
            ledger.register_party(name, cap, teachers=teachers, actor="guardian-cli")
        for querier, hospital in bindings:
            bind_querier(ledger, querier, hospital, actor="guardian-cli")
        for querier in args.outside_querier:
            declare_outside(ledger, querier, actor="guardian-cli")
        keep_clear_policy(ledger, args.clear_records_from_unbound, fresh, actor="guardian-cli")
        for item in args.task:
            task_name, _, path = item.partition("=")
            if not task_name or not path:
                print(f"error: --task expects NAME=FILE, got {item!r}", file=sys.stderr)
                return 2
            try:
                config = json.loads(Path(path).read_text())
                TaskConfig.parse(task_name, config, config_hash(config))
            except (ValueError, TaskError) as err:
                print(f"error: task {task_name}: {err}", file=sys.stderr)
                return 2
            ledger.create_task(task_name, config, actor="guardian-cli")
        for item in args.allowance:
            querier, _, eps = item.partition("=")
            try:
                ledger.set_allowance(querier, float(eps), actor="guardian-cli")
            except ValueError:
                print(f"error: --allowance expects QUERIER=EPS, got {item!r}", file=sys.stderr)
                return 2
        aborted, committed = ledger.recover()
        if aborted or committed:
            log.warning(
                "recovered after a restart: %d unreleased rounds aborted, %d released rounds charged",
                aborted,
                committed,
            )
        files = transport(args)
        if args.insecure_dev and files is not None:
            log.warning(
                "--insecure-dev with --pki: mutual TLS stays on, development-only options "
                "are allowed. Never use this with real patient data."
            )
        rng = None
        if args.noise_seed is not None:
            log.warning(
                "--noise-seed: the guardian's noise is predictable and repeats after a "
                "restart. This is for tests only."
            )
            rng = SecureRandom.from_seed(args.noise_seed)
        server = serve(
            ledger,
            args.listen,
            files,
            share_timeout=args.share_timeout,
            rng=rng,
            round_timeout=args.round_timeout,
        )
    except (LedgerRefusedError, pki.PKIError, audit.AuditKeyError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"guardian serving on port {server.port} (ledger {ledger.url})", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop()
    ledger.close()
    return 0
