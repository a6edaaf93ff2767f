"""``capcctl``: drive a capc gateway from the shell.

    capcctl jobs submit --count 1024 [--generator mix] [--wait]
    capcctl jobs submit --file queries.npz
    capcctl jobs watch ID | show ID | list | results ID -o labelled.npz
    capcctl models train JOB... | show ID | list | download ID -o student.pt
    capcctl models predict ID records.json|records.npy
    capcctl budget | parties | ledger [--party P] | audit
    capcctl loop run --records own-unlabelled.npz [--reveal-records-to-answerers] | loop show

The gateway, token and CA come from --url/--token/--ca or CAPC_URL/CAPC_TOKEN/
CAPC_CA; the gateway's certificate must verify against that CA (the consortium's
ca.pem). Every command takes --json for machine-readable output.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from capc_client.models import Job, Loop, PartyLedger, StudentModel, Training
from capc_client.sdk import DEFAULT_BATCH, ApiError, Client

BAR = 30


def _print(args: argparse.Namespace, value: Any, lines: list[str]) -> None:
    if args.json:
        if isinstance(value, BaseModel):
            value = value.model_dump()
        elif isinstance(value, list):
            value = [v.model_dump() if isinstance(v, BaseModel) else v for v in value]
        print(json.dumps(value, indent=None, sort_keys=True))
    else:
        print("\n".join(lines))


def _job_line(j: Job) -> str:
    line = f"{j.id}  {j.state:8} {j.processed}/{j.requested} processed, {j.answered} answered, {j.rounds} rounds"
    return line + (f"  error: {j.error}" if j.error else "")


def rate_text(done: int, total: int, seconds: float, unit: str) -> str:
    """``done`` of ``total`` ``unit`` in ``seconds``: the rate and an estimate of the time
    left ("12.5 queries/s, about 40 s left"); "" before anything is done."""
    if done <= 0 or seconds <= 0:
        return ""
    rate = done / seconds
    left = max(total - done, 0) / rate
    return f"{rate:.3g} {unit}/s, about {left:.0f} s left"


class JobProgress:
    """A job's progress bar on stderr (so --json output on stdout stays clean), with
    the rate since it was first seen and an estimate of the time left."""

    def __init__(self, clock: Any = None) -> None:
        import time

        self.clock = clock or time.monotonic
        self.first: tuple[float, int] | None = None

    def __call__(self, job: Job) -> None:
        now = self.clock()
        if self.first is None:
            self.first = (now, job.processed)
        began, start = self.first
        done = int(BAR * job.progress)
        speed = rate_text(job.processed - start, job.requested - start, now - began, "queries")
        sys.stderr.write(
            f"\r[{'#' * done}{'.' * (BAR - done)}] {job.processed}/{job.requested} "
            f"answered {job.answered} ({job.state}{', ' + speed if speed else ''})   "
        )
        if job.finished:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _quiet(args: argparse.Namespace) -> bool:
    """No progress on stderr: --quiet, or --json (whose command prints only its JSON)."""
    return bool(args.quiet or args.json)


class TrainingWatch:
    """A model's training on stderr, a line at each change the student party reports:
    its state, the seconds so far, and while it trains how far it is ("3/10 epochs"),
    at what rate and about how long is left (measured from the wait's start, or from
    the first report of a later unit: the loop's "before" counts candidate fits, a
    plain model its epochs). ``clock``: seconds."""

    def __init__(self, what: str, clock: Any = None) -> None:
        import time

        self.what = what
        self.clock = clock or time.monotonic
        self.began = self.clock()
        #: (unit, seconds, done) when the current unit's counting was first seen.
        self.first: tuple[str, float, int] | None = None

    def line(self, model: StudentModel) -> str:
        now = self.clock()
        text = f"{self.what} {model.id}: {model.state} after {now - self.began:.0f} s"
        done, total, unit = model.progress_done, model.progress_total, model.progress_unit
        if not total:
            return text
        if self.first is None:
            # The first unit counts from when the wait began, at nothing done.
            self.first = (unit, self.began, 0)
        elif self.first[0] != unit or done < self.first[2]:
            self.first = (unit, now, done)
        _, since, start = self.first
        text += f", {done}/{total} {unit}"
        speed = rate_text(done - start, total - start, now - since, unit)
        return text + (f" ({speed})" if speed else "")

    def __call__(self, model: StudentModel) -> None:
        sys.stderr.write(self.line(model) + "\n")
        sys.stderr.flush()


def _training(what: str) -> Any:
    """Progress of a model's training on stderr (:class:`TrainingWatch`)."""
    return TrainingWatch(what)


def _watch(client: Client, args: argparse.Namespace, job_id: str) -> int:
    job = client.wait(job_id, on_progress=None if _quiet(args) else JobProgress())
    _print(args, job, [_job_line(job)])
    if job.state != "done" and job.answered:
        # A job stopped part way (its caps spent, --allow-partial) keeps what it bought.
        print(
            f"capcctl: its {job.answered} answered labels stay usable: "
            f"capcctl models train {job.id} --wait",
            file=sys.stderr,
        )
    return 0 if job.state == "done" else 1


def _mechanism(args: argparse.Namespace) -> dict[str, float]:
    """``--raise NAME=VALUE`` pairs: mechanism parameters to raise above the task's."""
    out: dict[str, float] = {}
    for item in args.raise_param or []:
        name, sep, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise SystemExit(f"--raise takes NAME=VALUE (e.g. sigma=2.5), got {item!r}")
    return out


def cmd_jobs_submit(client: Client, args: argparse.Namespace) -> int:
    if args.file is not None:
        job = client.submit_file(
            args.file,
            batch_size=args.batch_size,
            mechanism=_mechanism(args),
            reveal_records_to_answerers=args.reveal_records_to_answerers,
            allow_partial=args.allow_partial,
        )
    else:
        if args.count is None:
            raise SystemExit("capcctl: jobs submit needs --count (or --file)")
        params = json.loads(args.params) if args.params else {}
        job = client.submit_recipe(
            args.generator,
            args.count,
            params=params,
            seed=args.seed,
            batch_size=args.batch_size,
            mechanism=_mechanism(args),
            allow_partial=args.allow_partial,
        )
    if args.watch:
        return _watch(client, args, job.id)
    _print(args, job, [_job_line(job)])
    return 0


def cmd_jobs_watch(client: Client, args: argparse.Namespace) -> int:
    return _watch(client, args, args.id)


def cmd_jobs_show(client: Client, args: argparse.Namespace) -> int:
    job = client.job(args.id)
    _print(args, job, [_job_line(job)])
    return 0


def cmd_jobs_list(client: Client, args: argparse.Namespace) -> int:
    jobs = client.jobs(args.limit, args.offset)
    _print(args, jobs, [_job_line(j) for j in jobs] or ["no jobs"])
    return 0


def cmd_jobs_results(client: Client, args: argparse.Namespace) -> int:
    path = client.download_results(args.id, args.output)
    _print(args, {"job": args.id, "path": str(path)}, [f"wrote {path}"])
    return 0


def cmd_models_train(client: Client, args: argparse.Namespace) -> int:
    model = client.train(
        args.jobs,
        args.architecture,
        args.epochs,
        args.seed,
        l2=args.l2,
        semi_supervised=args.semi_supervised,
        own_weight=args.own_weight,
    )
    if args.wait:
        shown = None if _quiet(args) else _training("training model")
        model = client.wait_model(model.id, on_progress=shown)
    _print(args, model, [f"{model.id}  {model.state}  {json.dumps(model.metrics)} {model.error}"])
    return 0 if model.state != "failed" else 1


def cmd_models_show(client: Client, args: argparse.Namespace) -> int:
    model = client.model(args.id)
    _print(args, model, [f"{model.id}  {model.state}  {json.dumps(model.metrics)} {model.error}"])
    return 0


def cmd_models_list(client: Client, args: argparse.Namespace) -> int:
    models = client.models()
    _print(args, models, [f"{m.id}  {m.state}  {json.dumps(m.metrics)}" for m in models])
    return 0


def cmd_models_download(client: Client, args: argparse.Namespace) -> int:
    path = client.download_model(args.id, args.output)
    card = client.model_card(args.id)
    _print(args, {"path": str(path), "card": card}, [f"wrote {path}", json.dumps(card, indent=2)])
    return 0


def _records(path: Path) -> Any:
    """Records from a .json file (a list of records, or one record) or, where numpy is
    installed, an .npy file or an .npz file's ``x``."""
    if path.suffix in (".npy", ".npz"):
        try:
            import numpy as np  # optional: the light client does not depend on it
        except ImportError:
            raise SystemExit(
                f"capcctl: reading {path.suffix} files needs numpy; install it or pass a .json "
                "file of records"
            ) from None
        with open(path, "rb") as f:
            data = np.load(f, allow_pickle=False)
            return data["x"] if path.suffix == ".npz" else data
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(f"capcctl: cannot read records from {path}: {err}") from None


def _true_labels(path: Path) -> list[Any] | None:
    """An .npz file's ``y`` (its records' true labels, as ``capc data pack`` writes a
    labelled file), as a list; None for any other file or one without ``y``."""
    if path.suffix != ".npz":
        return None
    import numpy as np  # _records has read this file, so numpy is installed

    with open(path, "rb") as f, np.load(f, allow_pickle=False) as data:
        return None if "y" not in data.files else np.asarray(data["y"]).tolist()


def prediction_accuracy(predicted: Sequence[Any], truth: Sequence[Any]) -> float:
    """The share of records whose predicted label (a class, or a multi-label task's 0/1
    list) equals the true one; ValueError when the counts differ."""
    if len(predicted) != len(truth):
        raise ValueError(f"{len(predicted)} predictions for {len(truth)} true labels")
    if not truth:
        return 0.0
    right = sum(1 for p, t in zip(predicted, truth, strict=True) if p == t)
    return right / len(truth)


def cmd_models_predict(client: Client, args: argparse.Namespace) -> int:
    records = _records(args.records)
    if args.one:
        records = [records]
    out = client.predict(args.id, records)
    lines = [
        f"{i:6}  {label}  {max(scores):.3f}"
        for i, (label, scores) in enumerate(zip(out.labels, out.scores, strict=True))
    ]
    truth = None if args.one else _true_labels(args.records)
    value: Any = out
    if truth is not None:
        acc = prediction_accuracy(out.labels, truth)
        lines.append(f"accuracy {acc:.3f} on {len(truth)} labelled records (the file's y)")
        value = {**out.model_dump(), "accuracy": acc, "labelled": len(truth)}
    _print(args, value, lines)
    return 0


def guarantee(eps: float, ledger_delta: float, rounds: int | None, full: float | None) -> str:
    """A party's guarantee as users read it: (eps, delta with the noise cut-off + R 2^-40),
    R its rounds asked."""
    if rounds is None or full is None:
        return f"(eps {eps:.4f}, delta {ledger_delta:g} + R 2^-40; R not reported by this gateway)"
    return (
        f"(eps {eps:.4f}, delta {ledger_delta:g} with the noise cut-off + {rounds} x 2^-40 "
        f"= {full:.12g})"
    )


def charges(trainings: list[Training], rounds: float | None) -> list[str]:
    """A party's DP-SGD trainings (charged once each) apart from its round charges."""
    if not trainings:
        return []
    out = [f"\n{'':16} training: eps {t.epsilon:.4f} ({t.described})" for t in trainings]
    if rounds is not None:
        out.append(f"\n{'':16} rounds:   eps {rounds:.4f}")
    return out


def own_ledger_text(own: PartyLedger, guardian_spent: float) -> str:
    """A hospital's own ledger beside the guardian's, as capcctl budget prints it.

    The two are compared only through ``own.through_round``, the last round the
    hospital has reported: a hospital reports at most every few seconds once rounds
    settle, so right after a round the guardian's total includes rounds its report does
    not yet cover. "agree (eps 0.0000, gap 0)" beside a guardian spend of 6.57 meant
    exactly that; the line now says through which round they agree, and that the
    later rounds' report is still pending."""
    if own.state == "unreported":
        return "unreported"
    text = (
        f"{own.state} through round {own.through_round} "
        f"(its eps {own.epsilon_spent:.4f}, gap {own.gap:.3g})"
    )
    # A report behind the guardian: rounds settled since are not compared yet.
    if guardian_spent > own.epsilon_spent + max(1e-9, abs(own.gap)) * (1 + 1e-9):
        text += (
            "; its report of the later rounds is pending (sent within seconds of a "
            "round): run capcctl budget again to compare them"
        )
    return text


def cmd_budget(client: Client, args: argparse.Namespace) -> int:
    b = client.budgets()
    lines = (
        [
            f"task {b.task}, ledger delta {b.delta:g}: {b.accounting}",
            "each party's guarantee is (eps, ledger delta with the noise cut-off + R 2^-40), R "
            "the rounds it was asked to vote in (the validity proofs' ring conversion fails at "
            "most 2^-40 a round; a noise value beyond 9 sigma fails its round, (delta + e^eps p) "
            "/ (1 - p) for that chance p)",
        ]
        + [
            f"{x.party:16} eps {x.epsilon_spent:10.4f} of {x.epsilon_cap:<10g} remaining {x.epsilon_remaining:10.4f}"
            f"  order {x.best_order:g}"
            + f"  guarantee {guarantee(x.epsilon_spent, x.delta, x.rounds_asked, x.full_delta)}"
            + ("" if x.queries_left is None else f"  ~{x.queries_left} queries left")
            + f"  own ledger: {own_ledger_text(x.own_ledger, x.epsilon_spent)}"
            + "".join(charges(x.trainings, x.rounds_epsilon))
            for x in b.budgets
        ]
        + [f"warning: {w}" for w in b.plan_warnings]
    )
    _print(args, b, lines)
    return 1 if any(x.own_ledger.state == "diverged" for x in b.budgets) else 0


def cmd_parties(client: Client, args: argparse.Namespace) -> int:
    parties = client.parties()
    lines = [
        f"{p.name:16} {p.role:9} {'connected' if p.connected else 'offline':9} eps {p.epsilon_spent:.4f}/{p.epsilon_cap:g}"
        f"  last seen {p.last_seen or 'never'}"
        for p in parties
    ]
    _print(args, parties, lines)
    return 0


def cmd_ledger(client: Client, args: argparse.Namespace) -> int:
    page = client.ledger(args.party, args.round, args.limit, args.offset)
    head = []
    if page.ledger_delta is not None:
        head = [f"epsilons at the ledger's delta {page.ledger_delta:g}"] + [
            f"{name}: guarantee delta {page.ledger_delta:g} with the noise cut-off + "
            f"{page.rounds_asked[name]} x 2^-40 = {full:.12g}"
            for name, full in sorted(page.full_delta.items())
        ]
    # A round's epsilon alone is not shown: rounds compose to less than their sum, so
    # a column of them would invite adding it up. Each party's total, composed over
    # every round, follows the entries (capcctl budget has it too).
    lines = head + [
        f"round {e.round_id:6} {e.party:16} {e.kind:11} {e.mechanism:16} {e.queries:5} queries  {e.at}"
        for e in page.entries
    ]
    if page.entries and not args.json:
        parties = {e.party for e in page.entries}
        lines.append("epsilon spent, composed over every round (not the sum of rounds):")
        lines += [
            f"  {b.party:16} eps {b.epsilon_spent:.4f} of {b.epsilon_cap:g}"
            for b in client.budgets().budgets
            if b.party in parties
        ]
    _print(args, page, lines or ["no entries"])
    return 0


def cmd_audit(client: Client, args: argparse.Namespace) -> int:
    page = client.audit(args.limit, args.offset)
    lines = [f"audit chain {'valid' if page.chain_valid else 'BROKEN'}"] + [
        f"{e.seq:6} {e.at} {e.actor:20} {e.action:10} {json.dumps(e.detail, sort_keys=True)}"
        + ("" if e.note is None else f"  note (untrusted): {e.note!r}")
        for e in page.entries
    ]
    if page.disputes:
        # Either side of a pair can fail its check: the pattern, not one entry, points.
        lines.append("disputes (failed checks per querier and party; either side can cause one):")
        lines += [
            f"  {d.querier:20} {d.party:20} {d.failures:5} failed  party fails with "
            f"{d.party_queriers} querier(s), querier with {d.querier_parties} party(ies)  "
            f"points to: {d.points_to}"
            for d in page.disputes
        ]
    _print(args, page, lines)
    return 0 if page.chain_valid else 1


def cmd_privacy_audits(client: Client, args: argparse.Namespace) -> int:
    audits = client.privacy_audits(args.party, args.limit)
    lines = [
        f"{a.party:16} claimed {a.claimed_epsilon:.4g}  empirical >= {a.empirical_lower:.3f} "
        f"(95% up to {'inf' if a.empirical_upper is None else f'{a.empirical_upper:.2f}'})  "
        f"{a.correct}/{a.guesses}/{a.canaries}  {'REFUTED' if a.refuted else 'consistent'}  {a.at}"
        for a in audits
    ]
    _print(args, audits, lines or ["no privacy audits"])
    return 1 if any(a.refuted for a in audits) else 0


def _accuracy(value: float | None) -> str:
    return "not trained" if value is None else f"{value:.3f}"


def before_text(model: StudentModel | None) -> str:
    """Which model "before" is: the best the hospital fitted on its own labelled records
    alone, and what it was chosen among (the student party's metrics)."""
    if model is None:
        return "not trained"
    chosen = model.metrics.get("before_model")
    if chosen is None:
        return f"{model.architecture} on {model.examples} own records (no choice reported)"
    text = f"{chosen} on {model.examples} own records"
    choice = model.metrics.get("before_choice")
    if isinstance(choice, dict) and choice:
        scores = ", ".join(
            f"{name} {'failed' if acc is None else f'{float(acc):.3f}'}"
            for name, acc in choice.items()
        )
        text += f", the best on its own held-out part of them ({scores})"
    return text


def _loop_lines(loop: Loop) -> list[str]:
    """The loop's report for people: one fact a line."""
    if not loop.hospital:
        return ["this gateway's student party queries for no hospital (capc student --hospital)"]
    spent = ", ".join(f"{p} {e:.4g}" for p, e in sorted(loop.epsilon_by_party.items()))
    gain = "" if loop.gain is None else f"{loop.gain:+.3f}"
    return [
        f"hospital {loop.hospital} (querier {loop.querier}; guardian binding: "
        f"{loop.bound_hospital or 'none'})",
        f"accuracy on its own held-out records: before {_accuracy(loop.accuracy_before)}, "
        f"after {_accuracy(loop.accuracy_after)}, gain {gain or 'n/a'}",
        f"before: {before_text(loop.before)}",
        f"labels bought {loop.labels_bought} over {loop.jobs} jobs; own records sent in the "
        f"clear {loop.records_revealed}",
        f"epsilon the others spent for it, each one's total over every round: "
        f"{spent or 'none'} (largest {loop.epsilon_spent:.4g})",
    ]


def _trained(client: Client, args: argparse.Namespace, job_ids: list[str]) -> StudentModel:
    """Train the hospital's model on its own records plus ``job_ids``' labels, waited for
    (with labels, its own records ``--own-weight`` times; the model before has no labels
    to weigh them against, so it is trained as it always was)."""
    weight = args.own_weight if job_ids else None
    model = client.train(job_ids, None, args.epochs, args.seed, own_weight=weight)
    what = "training the model after" if job_ids else "training the model before"
    return client.wait_model(model.id, on_progress=None if _quiet(args) else _training(what))


def loop_shortfall(loop: Loop, records: int) -> str | None:
    """Why a loop on ``records`` records cannot finish within the answering hospitals'
    remaining caps (the least of ``loop.queries_left``), or None when it can (or the
    gateway does not report them). Checked before anything is spent: a loop refused
    half way leaves the others charged and no model after."""
    if not loop.queries_left:
        return None
    party, left = min(loop.queries_left.items(), key=lambda item: (item[1], item[0]))
    if records <= left:
        return None
    if left < 1:
        return (
            f"{party}'s cap covers no more queries, so no record can be labelled; nothing "
            "was spent. Ask the consortium for more budget, or stop looping"
        )
    return (
        f"the loop would label {records} records, but {party}'s cap covers only {left} more "
        f"queries: it would stop part way, with the others charged and no model after. "
        f"Nothing was spent: pass a file of at most {left} records (e.g. the first {left} "
        "rows of x)"
    )


def _count(records: Path) -> int | None:
    """How many records ``records`` holds; None where it cannot be told here (no numpy,
    an unreadable file: the gateway's refusal then says why)."""
    try:
        data = _records(records)
    except SystemExit:
        return None
    return len(data) if hasattr(data, "__len__") else None


def cmd_loop_run(client: Client, args: argparse.Namespace) -> int:
    """The CaPC loop in one command: the model of own records alone, a job labelling the
    hospital's unlabelled records through the others, the model of both, the report.

    The whole loop's budget is checked first: a file the others' caps cannot label in
    full is refused before anything is trained or spent."""
    count = _count(args.records)
    if count is not None:
        why = loop_shortfall(client.loop(), count)
        if why is not None:
            print(f"capcctl: {why}", file=sys.stderr)
            return 1
    before = _trained(client, args, [])
    if before.state != "done":
        print(f"capcctl: the model of own records alone failed: {before.error}", file=sys.stderr)
        return 1
    job = client.submit_file(
        args.records,
        batch_size=args.batch_size,
        reveal_records_to_answerers=args.reveal_records_to_answerers,
    )
    job = client.wait(job.id, on_progress=None if _quiet(args) else JobProgress())
    if job.state != "done":
        print(f"capcctl: job {job.id} failed: {job.error}", file=sys.stderr)
        if job.answered:
            # What was bought is not lost: the job's answered labels train a model.
            weight = "" if args.own_weight is None else f" --own-weight {args.own_weight}"
            print(
                f"capcctl: its {job.answered} labels bought so far stay usable: "
                f"capcctl models train {job.id}{weight} --wait",
                file=sys.stderr,
            )
        return 1
    after = _trained(client, args, [job.id])
    if after.state != "done":
        print(f"capcctl: the retrained model failed: {after.error}", file=sys.stderr)
        return 1
    loop = client.loop()
    head = f"job {job.id}: {job.answered} of {job.requested} labelled"
    _print(args, loop, [head, *_loop_lines(loop)])
    return 0


def cmd_loop_show(client: Client, args: argparse.Namespace) -> int:
    loop = client.loop()
    _print(args, loop, _loop_lines(loop))
    return 0


def _add_loop(sub: Any, common: argparse.ArgumentParser) -> None:
    loop = sub.add_parser(
        "loop", help="the CaPC loop: label your hospital's own records, retrain its model"
    ).add_subparsers(dest="sub", required=True)
    run = loop.add_parser(
        "run",
        parents=[common],
        help="train on own records, label RECORDS through the other hospitals, retrain, report",
    )
    run.add_argument(
        "--records",
        type=Path,
        required=True,
        help="the hospital's own unlabelled records: .npy, or .npz with x: (N, C, H, W) images or (N, F) table rows",
    )
    _reveal_flag(run)
    run.add_argument("--batch-size", type=int, default=DEFAULT_BATCH, help="records per round")
    run.add_argument(
        "--epochs", type=int, default=10, help="training epochs of the before and after models"
    )
    run.add_argument("--seed", type=int, default=0, help="training seed of both models")
    run.add_argument(
        "--own-weight",
        type=int,
        default=None,
        help="the retrained model takes the hospital's own labelled records this many times "
        "beside the bought labels (1 to 16; default 1)",
    )
    run.add_argument("--wait", action="store_true", help="accepted for clarity: run always waits")
    run.set_defaults(run=cmd_loop_run)
    loop.add_parser("show", parents=[common], help="before/after accuracy and spend").set_defaults(
        run=cmd_loop_show
    )


def _reveal_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--reveal-records-to-answerers",
        "--clear-queries",
        dest="reveal_records_to_answerers",
        action="store_true",
        help="the file holds your hospital's own records: send them to the answering "
        "hospitals in the clear (the guardian's audit log records it, naming your token's "
        "holder; needs an admin token). Without it, a hospital's student party refuses "
        "them unless its task is encrypted",
    )


def build_parser() -> argparse.ArgumentParser:
    """The full ``capcctl`` argument parser (also read by tests/unit/test_docs_commands.py)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=os.environ.get("CAPC_URL", "https://127.0.0.1:8080"),
        help="the gateway (default CAPC_URL, else https://127.0.0.1:8080)",
    )
    common.add_argument(
        "--token", default=os.environ.get("CAPC_TOKEN"), help="bearer token (default CAPC_TOKEN)"
    )
    common.add_argument(
        "--ca",
        default=os.environ.get("CAPC_CA"),
        help="CA certificate the gateway's certificate must verify against (the "
        "consortium's ca.pem; default CAPC_CA, else the system's CAs)",
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("--quiet", action="store_true", help="no progress bar")
    parser = argparse.ArgumentParser(prog="capcctl", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    jobs = sub.add_parser("jobs", help="labelling jobs").add_subparsers(dest="sub", required=True)
    submit = jobs.add_parser("submit", parents=[common], help="create a labelling job")
    submit.add_argument(
        "--generator",
        choices=["gaussian", "spectral", "dead_leaves", "fractal", "mix", "uniform", "beta"],
        default=None,
        help="synthetic queries in the task's input shape: images gaussian, spectral, "
        "dead_leaves, fractal, mix; table rows from the task's public feature ranges: "
        "uniform, beta (default: gaussian for images, what the DIET teachers of `capc up` "
        "and the demo label best; beta for tables)",
    )
    submit.add_argument("--count", type=int, help="queries to generate")
    submit.add_argument("--params", default="", help="generator parameters as JSON")
    submit.add_argument("--seed", type=int, default=0, help="the generator's seed")
    submit.add_argument("--file", type=Path, help="unlabelled dataset: .npy or .npz with x")
    submit.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH,
        help="queries per round (the gateway's refusal names its largest)",
    )
    submit.add_argument(
        "--raise",
        dest="raise_param",
        action="append",
        metavar="NAME=VALUE",
        help="raise one of the task mechanism's parameters (more noise or a higher "
        "threshold only), e.g. --raise sigma=2.5; repeatable",
    )
    _reveal_flag(submit)
    submit.add_argument(
        "--allow-partial",
        action="store_true",
        help="label only as many queries as the answering hospitals' caps cover, and "
        "stop (without it the gateway refuses a job they cannot cover in full, before "
        "anything is spent)",
    )
    submit.add_argument(
        "--wait",
        "--watch",
        dest="watch",
        action="store_true",
        help="follow it until it ends and print the result (with --json only the job's JSON)",
    )
    submit.set_defaults(run=cmd_jobs_submit)
    for name, fn, helptext in (
        ("watch", cmd_jobs_watch, "follow a job with a progress bar"),
        ("show", cmd_jobs_show, "one job's state"),
    ):
        p = jobs.add_parser(name, parents=[common], help=helptext)
        p.add_argument("id", help="the job's id")
        p.set_defaults(run=fn)
    lst = jobs.add_parser("list", parents=[common], help="recent jobs")
    lst.add_argument("--limit", type=int, default=20, help="at most this many jobs")
    lst.add_argument("--offset", type=int, default=0, help="skip this many, newest first")
    lst.set_defaults(run=cmd_jobs_list)
    res = jobs.add_parser("results", parents=[common], help="download labelled queries (.npz)")
    res.add_argument("id", help="the job's id")
    res.add_argument("-o", "--output", type=Path, required=True, help=".npz file to write")
    res.set_defaults(run=cmd_jobs_results)

    models = sub.add_parser("models", help="student models").add_subparsers(
        dest="sub", required=True
    )
    train = models.add_parser("train", parents=[common], help="train on finished jobs")
    train.add_argument("jobs", nargs="+", help="ids of finished jobs")
    train.add_argument(
        "--architecture",
        default=None,
        help="pretrained (last layer on the student's body), or small-cnn, mlp, resnet10, "
        "resnet18 from scratch; default: the student's choice",
    )
    train.add_argument("--epochs", type=int, default=10, help="training epochs")
    train.add_argument("--seed", type=int, default=0, help="training seed")
    train.add_argument("--wait", action="store_true", help="wait until it is trained")
    train.add_argument(
        "--l2", type=float, default=None, help="pretrained students: the head's L2 penalty"
    )
    train.add_argument(
        "--semi-supervised",
        choices=["none", "self-training", "pseudo-label-head", "fixmatch", "pseudo-labels"],
        default="none",
        help="also learn from the jobs' unanswered queries: a pretrained student's head by "
        "self-training or pseudo-label-head; a student trained from scratch by fixmatch "
        "(image tasks); pseudo-labels is deprecated (read as pseudo-label-head or fixmatch)",
    )
    train.add_argument(
        "--own-weight",
        type=int,
        default=None,
        help="a hospital's own model in the CaPC loop: how many times its own labelled "
        "records enter the fit beside the bought labels (1 to 16; default 1)",
    )
    train.set_defaults(run=cmd_models_train)
    predict = models.add_parser(
        "predict",
        parents=[common],
        help="predict records with a trained model (each record on its own)",
    )
    predict.add_argument("id", help="the model's id")
    predict.add_argument(
        "records",
        type=Path,
        help=".json list of records (or .npy, .npz with x, where numpy is installed); an "
        ".npz with y too is also scored: the accuracy follows the predictions",
    )
    predict.add_argument("--one", action="store_true", help="the file holds a single record")
    predict.set_defaults(run=cmd_models_predict)
    show = models.add_parser("show", parents=[common], help="one model's state and metrics")
    show.add_argument("id", help="the model's id")
    show.set_defaults(run=cmd_models_show)
    models.add_parser("list", parents=[common], help="trained models").set_defaults(
        run=cmd_models_list
    )
    dl = models.add_parser("download", parents=[common], help="weights and model card")
    dl.add_argument("id", help="the model's id")
    dl.add_argument("-o", "--output", type=Path, required=True, help="weights file to write")
    dl.set_defaults(run=cmd_models_download)

    sub.add_parser("budget", parents=[common], help="every party's epsilon").set_defaults(
        run=cmd_budget
    )
    sub.add_parser("parties", parents=[common], help="parties and status").set_defaults(
        run=cmd_parties
    )
    ledger = sub.add_parser("ledger", parents=[common], help="ledger entries")
    ledger.add_argument("--party", help="only this party's entries")
    ledger.add_argument("--round", type=int, help="only this round's entries")
    ledger.add_argument("--limit", type=int, default=50, help="at most this many entries")
    ledger.add_argument("--offset", type=int, default=0, help="skip this many entries")
    ledger.set_defaults(run=cmd_ledger)
    audit = sub.add_parser("audit", parents=[common], help="the audit log")
    audit.add_argument("--limit", type=int, default=50, help="at most this many entries")
    audit.add_argument("--offset", type=int, default=0, help="skip this many entries")
    audit.set_defaults(run=cmd_audit)
    pa = sub.add_parser(
        "privacy-audits",
        parents=[common],
        help="claimed against empirical epsilon (canary audits); exit 1 if one refutes its claim",
    )
    pa.add_argument("--party", help="only this party's audits")
    pa.add_argument("--limit", type=int, default=100, help="at most this many audits")
    pa.set_defaults(run=cmd_privacy_audits)
    _add_loop(sub, common)
    return parser


def _fail(args: argparse.Namespace, message: str, status: int | None, code: int) -> int:
    """Report a failure on stderr (and, with --json, as a JSON object on stdout)."""
    if args.json:
        print(json.dumps({"error": message, "status": status}, sort_keys=True))
    print(f"capcctl: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the command against the gateway; with --json, stdout holds
    exactly one JSON value, an ``{"error": ..., "status": ...}`` object on failure."""
    args = build_parser().parse_args(argv)
    # The SDK's DeprecationWarnings (the gateway's Deprecation header) are for this
    # command's user: shown on stderr, which --json leaves out of stdout.
    warnings.simplefilter("default", DeprecationWarning)
    if not args.token:
        return _fail(args, "no token; pass --token or set CAPC_TOKEN", None, 2)
    try:
        with Client(args.url, args.token, ca=args.ca) as client:
            return int(args.run(client, args))
    except ApiError as err:
        if args.json:
            print(json.dumps({"error": err.detail, "status": err.status}))
        print(f"capcctl: {err}", file=sys.stderr)
        return 1
    except SystemExit as err:
        if not isinstance(err.code, str):
            raise
        return _fail(args, err.code.removeprefix("capcctl: "), None, 2)


if __name__ == "__main__":
    sys.exit(main())
