"""What a hospital attests about its teachers' training, read from its teacher files.

A capc teacher file trained with DP-SGD carries its record on its card
(``card["dp_training"]``: :data:`capc.privacy.dp_training.CARD_KEY`; an ensemble
file once, a checkpoints file on every member). A model without a card (the
hospital's own ONNX, TorchScript or PyTorch model, trained with DP-SGD elsewhere)
is attested with ``capc answerer --dp-training RECORD.json``.

The party claims the DP-trained kind only when every teacher it votes with is
attested: one teacher without a record would vote unnoised in a round that
charges nothing per answer. Then the attestation is one record per ``--model``
and the SHA-256 of the files' bytes with those records
(:func:`capc.round.training.file_digest`): the same files restarted charge
nothing more, a retrained one (other bytes) is a new charge.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from capc.models.ensemble.voters import Voters, is_ensemble, is_teacher, model_hashes
from capc.models.foreign import FACTORY_SPEC, file_sha256, is_factory_spec
from capc.privacy.dp_training import CARD_KEY, DpTraining, DpTrainingError
from capc.round.training import Attestation, file_digest

if TYPE_CHECKING:
    from torch import nn

log = logging.getLogger("capc.answerer.attestation")


def model_file(spec: str) -> Path:
    """The file a ``--model`` names: the weights of ``pkg.mod:factory@weights.pt``, else
    the spec itself."""
    if is_factory_spec(spec):
        m = FACTORY_SPEC.match(spec)
        if m is not None:
            return Path(m["weights"])
    return Path(spec)


def read_record(path: Path) -> DpTraining:
    """A DP-training record from a JSON file (``capc answerer --dp-training``)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"--dp-training {path}: no such file") from None
    except (OSError, ValueError) as err:
        raise ValueError(f"--dp-training {path} is not a JSON record: {err}") from None
    try:
        return DpTraining.from_dict(data)
    except DpTrainingError as err:
        raise ValueError(f"--dp-training {path}: {err}") from None


def carried(voters: Voters, spec: str) -> DpTraining | None:
    """The record the teacher file ``spec`` carries on its card(s), or None when it carries
    none. ValueError when its members carry different records or only some do."""
    cards = [
        m.card for m, origin in zip(voters.members, voters.origins, strict=True) if origin == spec
    ]
    found = [c.get(CARD_KEY) for c in cards]
    if all(r is None for r in found):
        return None
    if any(r is None for r in found) or any(r != found[0] for r in found):
        raise ValueError(
            f"--model {spec}: its teachers carry different DP-training records (or only some "
            "carry one): train them in one run (capc teacher fit --dp-epsilon), or vote with "
            "them as separate answering parties"
        )
    try:
        return DpTraining.from_dict(found[0])
    except DpTrainingError as err:
        raise ValueError(f"--model {spec}: its DP-training record is invalid: {err}") from None


def _stored(module: nn.Module) -> bool:
    """Whether ``module`` holds statistics over records: a BatchNorm's, or an InstanceNorm
    that tracks running statistics (read in evaluation mode)."""
    from torch import nn  # a capc model's module: torch is loaded already

    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return True
    return isinstance(module, nn.modules.instancenorm._InstanceNorm) and bool(
        module.track_running_stats
    )


def stored_statistics(voters: Voters) -> str | None:
    """Why an attested party would read stored BatchNorm statistics (which may be fitted on
    its records, outside the DP-SGD accounting), or None when it reads none.

    An attested party reads every query with its teachers' stored statistics, as their
    heads were trained (docs/privacy.md). Those are public only in a file that
    ``capc teacher fit --dp-epsilon`` wrote (its card carries the record): the fit keeps
    the pretrained body's statistics, fitted on synthetic images, and refuses any other
    body. Any other attested capc model holding stored statistics is refused, and so is
    a standardising head (fitted on records) or an InstanceNorm tracking running
    statistics anywhere. A foreign model is run as it is: its attestation
    (--dp-training) is the hospital's own word."""
    for member, source in zip(voters.members, voters.sources, strict=True):
        if is_teacher(member):
            modules = list(member.model.named_modules())
        elif is_ensemble(member):
            # The ensemble's heads are its weights and biases: the body's own head is unused.
            modules = [
                (n, m)
                for n, m in member.body.named_modules()
                if not (n == "head" or n.startswith("head."))
            ]
        else:
            continue
        # Only capc's own models reach here: torch is loaded already.
        from torch import nn

        from capc.models.heads import BatchStandardiser

        norms = [m for _, m in modules if _stored(m)]
        if any(isinstance(m, nn.modules.instancenorm._InstanceNorm) for m in norms):
            return (
                f"{source} has an InstanceNorm that tracks running statistics, which every "
                "query reads"
            )
        if any(isinstance(m, BatchStandardiser) for m in norms):
            return (
                f"{source} has a standardising head, whose stored statistics a one-query "
                "round reads"
            )
        # The DP fit writes image teachers as ensembles carrying the record, with the
        # pretrained body's statistics; it never writes BatchNorm into a plain teacher.
        fitted = is_ensemble(member) and CARD_KEY in (member.card or {})
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in norms) and not fitted:
            return (
                f"{source} holds BatchNorm statistics that every query would read, and it "
                "was not written by capc teacher fit --dp-epsilon (which keeps the pretrained "
                "body's public statistics): they may be fitted on the records"
            )
    return None


def attestation(
    specs: Sequence[str], voters: Voters, record_file: Path | None = None
) -> Attestation | None:
    """The party's attestation, or None when not every teacher is DP-trained (it votes
    as ordinary teachers, charged per round as usual). ``record_file``: the record of
    every ``--model`` that carries none (``--dp-training``). ValueError says what is wrong."""
    given = None if record_file is None else read_record(record_file)
    records: list[DpTraining] = []
    missing: list[str] = []
    for spec in specs:
        rec = carried(voters, str(spec))
        if rec is None:
            missing.append(str(spec))
            rec = given
        if rec is not None:
            records.append(rec)
    if given is not None and not missing:
        raise ValueError(
            f"--dp-training {record_file}: every --model carries its own DP-training record; "
            "the option is for models without one (e.g. ONNX trained with DP-SGD elsewhere)"
        )
    if len(records) < len(specs):
        if records:
            log.warning(
                "%s carr%s no DP-training record: this party votes as ordinary teachers "
                "(charged per round) and is not asked in rounds for DP-trained teachers; "
                "pass --dp-training RECORD.json for a model trained with DP-SGD elsewhere",
                ", ".join(missing),
                "ies" if len(missing) == 1 else "y",
            )
        return None
    why = stored_statistics(voters)
    if why is not None:
        # Full-batch DP-SGD refuses BatchNorm (a batch statistic mixes records), so such
        # statistics were fitted outside the training's accounting: answering with them
        # for free would release them uncharged.
        raise ValueError(
            f"{why}; they may be fitted on the hospital's records, outside its DP-SGD "
            "training's charge, so the party cannot claim DP-trained teachers: train a "
            "model without BatchNorm (capc teacher fit --dp-epsilon), or drop the "
            "DP-training record and answer as ordinary teachers (charged per round)"
        )
    files = []
    for spec in specs:
        try:
            on_disk = bytes.fromhex(file_sha256(model_file(str(spec))))
        except OSError as err:
            raise ValueError(f"--model {spec}: cannot read it to hash it: {err}") from None
        files.append(loaded_sha256(voters, str(spec), on_disk))
    return Attestation(tuple(records), file_digest(files, records))


def loaded_sha256(voters: Voters, spec: str, on_disk: bytes) -> bytes:
    """SHA-256 of the file's bytes (``on_disk``) and of the weights loaded from it, which
    are what answer: a file rewritten (retrained) between loading and hashing gives a
    digest of neither version alone, so neither version's training goes uncharged when
    the new one starts later (an over-count at worst)."""
    h = hashlib.sha256(on_disk)
    for member, origin in zip(voters.members, voters.origins, strict=True):
        if origin != spec:
            continue
        for one in model_hashes(member):
            h.update(one.encode())
    return h.digest()


__all__ = [
    "attestation",
    "carried",
    "loaded_sha256",
    "model_file",
    "read_record",
    "stored_statistics",
]
