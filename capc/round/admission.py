"""What a round must pass before anything is reserved for it: an offset-robust mechanism,
a bounded list of parties left out, a safe ring conversion of its proven votes, and at
most MAX_NOISE_VALUES noise values (what bounds the noise cut-off's delta)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from capc.mpc import validity
from capc.mpc.mechanism_circuits import MAX_NOISE_VALUES
from capc.round.errors import RoundRequestError
from capc.round.task import RoundTask

#: Most parties one request may leave out.
MAX_EXCLUDED = 1024


def check_conversion(
    task: RoundTask, batch: int, teachers: Mapping[str, int], candidates: Sequence[str]
) -> None:
    """Refuse a round whose proven votes' conversion to the circuit's ring could go wrong
    with probability above 2^-40 (public sizes only: batch, counts, teachers)."""
    counts = [teachers.get(p, 1) for p in candidates]
    relation = task.mechanism.vote_relation(1)  # its width: the counts per query
    if relation is None:
        return
    # A count is at most its party's teachers times one teacher's largest vote on the grid.
    largest = [m << relation.grid_bits for m in counts]
    bound = validity.conversion_failure(batch, relation.width, largest)
    if bound > validity.MAX_CONVERSION_FAILURE:
        most = int(batch * validity.MAX_CONVERSION_FAILURE / bound)
        what = (
            f"send at most {most} queries per round"
            if most >= 1
            else "no batch fits: the consortium's hospitals must register fewer teachers"
        )
        raise RoundRequestError(
            f"a round of {batch} queries over {len(counts)} parties with {sum(counts)} "
            f"teachers could convert its shared counts wrongly with probability {bound:.1e}, "
            f"above 2^-40: {what}"
        )


def noise_values(task: RoundTask, batch: int) -> int:
    """Noise values a round of ``batch`` queries draws, at most: every mechanism draws an
    answer noise and at most one test noise per vote column and query."""
    return 2 * batch * task.mechanism.vote_width


def check_noise_values(task: RoundTask, batch: int) -> None:
    """Refuse a round drawing more than MAX_NOISE_VALUES noise values: each could leave the
    circuit's range, and every party's full delta counts MAX_NOISE_VALUES a round."""
    drawn = noise_values(task, batch)
    if drawn > MAX_NOISE_VALUES:
        most = MAX_NOISE_VALUES // noise_values(task, 1)
        raise RoundRequestError(
            f"a round of {batch} queries of task {task.name} draws up to {drawn} noise "
            f"values, above the {MAX_NOISE_VALUES} a round may draw (each one bounded to "
            f"9 standard deviations counts in every party's delta): send at most {most} "
            "queries per round"
        )


def check_task(task: RoundTask) -> None:
    """Refuse a task whose mechanism is not offset-robust: a distributed round cannot run it."""
    if not task.mechanism.offset_robust:
        raise RoundRequestError(
            f"task {task.name} uses {task.mechanism.name} with one threshold-test noise "
            "shared by every class: a deviating student or hospital could offset the "
            "histogram and turn its test into a noiseless comparison of two counts. "
            "Distributed rounds take offset-robust mechanisms only: register the task "
            "with robust-confident-gnmax (independent test noise per class)"
        )


def check_excluded(names: Sequence[str] | frozenset[str]) -> frozenset[str]:
    """The parties a round request leaves out, checked: names, at most MAX_EXCLUDED."""
    if len(names) > MAX_EXCLUDED:
        raise RoundRequestError(
            f"a round may leave out at most {MAX_EXCLUDED} parties, got {len(names)}"
        )
    if any(not 1 <= len(n) <= 128 for n in names):
        raise RoundRequestError("exclude: party names are 1 to 128 characters")
    return frozenset(names)


__all__ = ["MAX_EXCLUDED", "check_conversion", "check_excluded", "check_task"]
