"""``capc answerer``'s options: only the standard library is imported here, so ``capc answerer
--help`` answers at once (``services.answerer.main`` runs it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from capc.cli_handlers import lazy
from services.common.cli_args import ACCOUNTANT_NAMES, DEFAULT_ACCOUNTANT_NAME, add_tls_args


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``capc answerer``; its handler imports services.answerer.main only when run."""
    p = sub.add_parser("answerer", help="run a hospital's answering party")
    p.add_argument(
        "--model",
        required=True,
        action="append",
        metavar="MODEL",
        help="a teacher: a capc checkpoint (capc.models.save_teacher) or ensemble "
        "(capc.models.ensemble.save_ensemble), an ONNX file, a TorchScript file "
        "(torch.jit.save; files are told apart by content; with --trust-model-code only), or "
        "the hospital's own PyTorch code as pkg.module:factory@weights.pt (pkg.module.factory() "
        "returns the nn.Module, weights.pt holds its state dict; pkg must be importable; with "
        "--trust-model-code only). Every model maps (B, "
        "*input_shape) float32 to (B, K) scores. Repeat it to vote with several: the party "
        "sends the sum of all its teachers' votes",
    )
    p.add_argument(
        "--task",
        type=Path,
        default=None,
        metavar="FILE",
        help="the task's configuration JSON (as the guardian registers it; its name is the "
        "file's stem): the models are checked against its input shape and classes, and run "
        "once on a batch of its shape, before dialling; a mismatch exits 2. TorchScript and "
        "module:factory models need it (they declare no shape)",
    )
    p.add_argument(
        "--dp-training",
        type=Path,
        default=None,
        metavar="RECORD.json",
        help="the DP-SGD record (capc.privacy.dp_training, JSON) of every --model that "
        "carries none on its card, e.g. the hospital's own ONNX model trained with full-batch "
        "DP-SGD elsewhere. When every teacher is attested, the training is charged once in "
        "this hospital's ledger and the guardian's (refused past the cap) and the party may "
        "vote in rounds for DP-trained teachers, which charge nothing per answer",
    )
    p.add_argument(
        "--trust-model-code",
        action="store_true",
        help="load TorchScript and module:factory models: they are code that runs with this "
        "party's rights (files, TLS key, ledger), so give it only for models whose authors "
        "you trust as your own code; without it they are refused before anything in them "
        "runs. A model from anyone else comes as ONNX",
    )
    p.add_argument("--guardian", required=True, help="guardian address host:port")
    p.add_argument(
        "--name",
        required=True,
        action="append",
        help="this party's certificate name; repeat it to run several parties in one "
        "process with the same model, each with its own certificate and stream (load tests)",
    )
    p.add_argument(
        "--epsilon-cap",
        type=float,
        required=True,
        metavar="EPS",
        help="this hospital's own privacy budget (epsilon at the ledger's delta): it stops "
        "voting there, whatever the guardian says, and the guardian never holds a larger cap "
        "for it. A changed value is audited in the hospital's ledger",
    )
    p.add_argument(
        "--cap-reason",
        default=None,
        metavar="TEXT",
        help="why --epsilon-cap is above the cap this hospital's ledger holds: required for "
        "a raise, audited in the hospital's ledger and at the guardian",
    )
    p.add_argument(
        "--ledger",
        default=None,
        help="this hospital's own ledger: SQLite path or URL, or postgresql://... "
        "(default: NAME-ledger.db); {name} in it stands for the party's name",
    )
    p.add_argument(
        "--accountant",
        choices=list(ACCOUNTANT_NAMES),
        help=f"the ledger's accountant, fixed at creation (default {DEFAULT_ACCOUNTANT_NAME}); it "
        "must be the guardian's, or this party refuses to vote",
    )
    p.add_argument(
        "--delta", type=float, default=1e-5, help="delta the ledger accounts at (the guardian's)"
    )
    p.add_argument(
        "--guardian-audit-key",
        default=None,
        metavar="HEX",
        help="the guardian's audit signing key (Ed25519 public key, hex); by default it is "
        "pinned on first contact, and a different key later is refused",
    )
    p.add_argument(
        "--status-file",
        type=Path,
        default=None,
        help="kept fresh while connected to the guardian (for `capc health --file`); with "
        "several --name, put {name} in it for one file per party",
    )
    add_tls_args(p)
    p.set_defaults(handler=lazy("services.answerer.main", "run"))
