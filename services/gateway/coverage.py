"""Whether the answering hospitals' caps cover a whole job: checked before it spends.

Each round of a job needs the task's quorum of answering parties whose caps afford it;
a party that cannot is left out, and once fewer than the quorum can, the job stops part
way (RESOURCE_EXHAUSTED) with the others charged for what was answered and no more
labels to come. The guardian projects, per party, how many more queries of the task's
worst case its remaining cap covers; a job of N queries runs to its end only while at
least a quorum of the parties that answer it (never a CaPC loop's own hospital) cover
N. The gateway refuses a job that cannot before anything is spent, unless it is asked
to label only as many as the caps cover.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.proto.capc.v1 import guardian_pb2


@dataclass(frozen=True)
class Coverage:
    """How many more queries a job can have answered in full (``queries``; None: no
    limit known, as for DP-trained teachers, which are charged nothing per answer), the
    task's ``quorum``, and each answering party's own projection (None: no limit)."""

    queries: int | None
    quorum: int
    parties: dict[str, int | None]


def coverage(spends: guardian_pb2.ListPartiesReply) -> Coverage:
    """The coverage of the guardian's ``spends`` (ListParties with the task in its
    header, and the querier, so that its bound hospital is known and left out)."""
    quorum = max(int(spends.quorum), 1)
    parties: dict[str, int | None] = {
        p.name: None if p.queries_left < 0 else int(p.queries_left)
        for p in spends.parties
        if p.role == "answerer" and p.name != spends.querier_hospital
    }
    if len(parties) < quorum:
        return Coverage(0, quorum, parties)
    # The quorum-th most any of them covers: past it, too few are left to meet the quorum.
    # Most first; a party with no limit (None) before any.
    ranked = sorted(parties.values(), key=lambda left: (left is not None, -(left or 0)))
    return Coverage(ranked[quorum - 1], quorum, parties)


def shortfall(count: int, cover: Coverage, *, pending: int = 0) -> str | None:
    """Why a job of ``count`` queries would stop part way after the ``pending`` queries
    unfinished jobs still have to label, or None when the caps cover both (or no limit
    is known)."""
    if cover.queries is None or pending + count <= cover.queries:
        return None
    each = ", ".join(
        f"{name} {'no limit' if left is None else left}"
        for name, left in sorted(cover.parties.items())
    )
    fit = max(0, cover.queries - pending)
    what = (
        f"only {len(cover.parties)} hospital(s) answer it, fewer than the task's quorum "
        f"of {cover.quorum}"
        if len(cover.parties) < cover.quorum
        else f"its rounds need {cover.quorum} answering hospital(s) whose caps afford them, "
        f"and beyond {cover.queries} queries fewer than {cover.quorum} do (queries each cap "
        f"covers at the task's worst case: {each or 'none'})"
    )
    queued = (
        f"; unfinished jobs will label {pending} of those first (`capcctl jobs list`)"
        if pending
        else ""
    )
    return (
        f"the job asks for {count} queries, but {what}{queued}: it would stop part way, "
        f"with the answering hospitals charged for the rest of the way. Nothing was spent. "
        f"Submit at most {fit} queries, or ask to label only as many as the caps cover "
        "(allow_partial=true; capcctl: --allow-partial), whose answered labels then train "
        "a model as any job's do (capcctl models train JOB)"
    )
