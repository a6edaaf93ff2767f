"""``capc answerer``: load a teacher checkpoint and serve the guardian's rounds."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

from capc.models.ensemble import Voters
from services.answerer.party import AnsweringParty
from services.common import pki, tls
from services.common.cli_args import add_tls_args, setup_logging

STATUS_EVERY_S = 5.0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("answerer", help="run a hospital's answering party")
    p.add_argument(
        "--model",
        type=Path,
        required=True,
        action="append",
        help="a teacher checkpoint (capc.models.save_teacher) or an ensemble of teachers "
        "(capc.models.ensemble.save_ensemble); repeat it to vote with several: the party "
        "sends the sum of all its teachers' votes",
    )
    p.add_argument("--guardian", required=True, help="guardian address host:port")
    p.add_argument("--name", required=True, help="this party's certificate name")
    p.add_argument(
        "--status-file",
        type=Path,
        default=None,
        help="kept fresh while connected to the guardian (for `capc health --file`)",
    )
    add_tls_args(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    setup_logging()
    try:
        voters = Voters.load(args.model)
        files = None if args.insecure_dev else tls.TLSFiles.in_dir(args.pki, args.name)
        if files is not None:
            files.read()
    except (ValueError, pki.PKIError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    party = AnsweringParty(args.name, voters, args.guardian, files, args.server_name)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(
        f"answering party {args.name} dialling {args.guardian} ({len(voters)} "
        f"{'teacher' if len(voters) == 1 else 'teachers'}: {voters.architecture}, device "
        f"{voters.device})",
        flush=True,
    )
    if args.status_file is not None:
        threading.Thread(
            target=_keep_status, args=(party, args.status_file, stop), daemon=True
        ).start()
    party.run(stop)
    return 0


def _keep_status(party: AnsweringParty, path: Path, stop: threading.Event) -> None:
    # A hospital opens no port, so its health is this file's age, not a probe.
    while not stop.wait(STATUS_EVERY_S):
        if party.connected.is_set():
            path.write_text(f"{time.time():.0f}\n")
        else:
            path.unlink(missing_ok=True)
