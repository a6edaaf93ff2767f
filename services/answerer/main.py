"""``capc answerer``: load the hospital's teachers (capc checkpoints or its own ONNX,
TorchScript or PyTorch models), check them against the task when given, open the
hospital's own ledger, serve the guardian's rounds within the hospital's own cap."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

from capc.models.ensemble import Voters
from capc.models.foreign import Interface
from capc.round.errors import LedgerRefusedError
from capc.task_config import TaskConfig, read_task
from services.answerer.attestation import attestation
from services.answerer.budget import OwnBudget
from services.answerer.party import AnsweringParty, answer_pool
from services.common import pki, tls
from services.common.cli_args import setup_logging
from services.common.ledger import Ledger

STATUS_EVERY_S = 5.0


def run(args: argparse.Namespace) -> int:
    setup_logging()
    names: list[str] = args.name
    if len(set(names)) != len(names):
        print("error: each --name may be given once", file=sys.stderr)
        return 2
    if args.status_file is not None and len(names) > 1 and "{name}" not in str(args.status_file):
        print(
            "error: --status-file reports one party: with several --name, put {name} in it "
            "(e.g. --status-file status/{name}) so that each party reports its own",
            file=sys.stderr,
        )
        return 2
    try:
        if args.ledger is not None and len(names) > 1 and "{name}" not in args.ledger:
            raise ValueError(
                "--ledger names one party's ledger: with several --name, put {name} in it "
                "(e.g. --ledger ledgers/{name}.db) so that each party keeps its own"
            )
        task = None if args.task is None else read_task(args.task)
        want = None if task is None else interface(task)
        voters = Voters.load(args.model, want, trust_code=args.trust_model_code)
        if task is not None and want is not None:
            voters.check(" and ".join(names), want)
            check_encryption(voters, task)
        attested = attestation(args.model, voters, args.dp_training)
        parties = []
        pool = answer_pool()  # one for every party here: see answer_pool
        for name in names:
            files = None if args.insecure_dev else tls.TLSFiles.in_dir(args.pki, name)
            if files is not None:
                files.read()
            # Each party keeps its own ledger, even several in one process.
            where = (args.ledger or "{name}-ledger.db").replace("{name}", name)
            ledger = Ledger(where, accountant=args.accountant, delta=args.delta)
            budget = OwnBudget(
                name, ledger, args.epsilon_cap, args.guardian_audit_key, args.cap_reason
            )
            if attested is not None:
                # Charged durably before the party registers: a crash in between
                # over-counts (the next start finds the digest charged), never under.
                charge = budget.attest(attested)
                print(
                    f"{name}: DP-SGD training ({attested.describe()}): "
                    f"{'charged' if charge.charged else 'charged before,'} "
                    f"{charge.epsilon:.4g} eps in its own ledger",
                    flush=True,
                )
            parties.append(
                AnsweringParty(
                    name, voters, args.guardian, files, budget, args.server_name, pool=pool
                )
            )
    except (ValueError, pki.PKIError, LedgerRefusedError) as err:
        # TaskError is a ValueError: a bad --task file exits 2 like a bad model; a
        # training past the hospital's own cap too (it must not answer with it).
        print(f"error: {err}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(
        f"answering part{'y' if len(names) == 1 else 'ies'} {', '.join(names)} dialling "
        f"{args.guardian} ({len(voters)} {'teacher' if len(voters) == 1 else 'teachers'}: "
        f"{voters.architecture}, device {voters.device}); own ledger "
        f"{parties[0].budget.ledger.url if len(parties) == 1 else 'one per party'}, cap "
        f"{args.epsilon_cap:g} eps",
        flush=True,
    )
    if args.status_file is not None:
        for party in parties:
            path = Path(str(args.status_file).replace("{name}", party.name))
            threading.Thread(target=_keep_status, args=(party, path, stop), daemon=True).start()
    threads = [
        threading.Thread(target=party.run, args=(stop,), name=f"capc-party-{party.name}")
        for party in parties
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return 0


def interface(task: TaskConfig) -> Interface:
    """What ``task`` asks of a teacher: its inputs and outputs."""
    return Interface(task.name, task.input_shape, task.outputs, task.multi_label)


def check_encryption(voters: Voters, task: TaskConfig) -> None:
    """ValueError unless ``voters`` can answer ``task``'s encrypted queries, if it has them:
    one capc checkpoint of the task's HE-friendly architecture."""
    enc = task.encryption
    if enc is None:
        return
    single = voters.single
    if single is None or single.architecture != enc.architecture:
        raise ValueError(
            f"task {task.name} sends encrypted queries, which only one capc {enc.architecture} "
            f"checkpoint can answer; this party votes with {len(voters)} teacher(s): "
            f"{voters.architecture}"
        )


def _keep_status(party: AnsweringParty, path: Path, stop: threading.Event) -> None:
    # A hospital opens no port, so its health is this file's age, not a probe. It is
    # written the moment the party is connected (whoever waits for it, a container's
    # healthcheck or services.harness, goes on at once), then every STATUS_EVERY_S;
    # it is removed while the party is not connected.
    while not stop.is_set():
        if party.connected.wait(STATUS_EVERY_S):
            # Written beside and renamed: a reader never sees a half-written time.
            fresh = path.with_name(f".{path.name}.new")
            fresh.write_text(f"{time.time():.0f}\n")
            os.replace(fresh, path)
            stop.wait(STATUS_EVERY_S)
        else:
            path.unlink(missing_ok=True)
