"""capc's bytes per labelling job as a line fitted to measured jobs, and the side-by-side
rows made before the counting relay filled from it.

A job of ``q`` queries runs in ``ceil(q / batch)`` rounds, and its bytes to and from
the guardian are ``per_round * rounds + per_query * q``: a round's fixed part (the
round's opening, the hospitals' sealed seeds and settlements, the 2PC's per-round
set-up) and a query's (its shares, vote validity proofs and garbled circuit; a
plain record's upload and relay to every hospital). The two are solved from two
measured jobs, one of one round and one of several, and checked on a third.

A row's jobs are the increments of ``queries`` along its (dataset, method, n, seed)
eps order: the grid labels what eps ``e`` buys beyond what the smaller eps bought
(``capc_runs.counts``), one job each. The first job of a student party also opens
its session with the guardian (connection and base OTs): the DIET student's (the
first method a consortium runs) and the loop's (its own querier) carry the
measured ``session_setup_bytes``, as a row measured through the relay does.

Pure functions over dicts, so a test can build the measurements by hand.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: The grid's batch (``CapcConfig.batch``): rows do not record it.
BATCH = 256
#: How a fitted row's ``bytes_measured`` begins.
FITTED = "fitted from capc_bytes measurements"
#: The grid's budgets (``CapcConfig.epsilons``): a cell's rows step through them.
EPSILONS = (1.0, 2.0, 5.0, 10.0)
#: Methods whose first job opens a student party's session with the guardian.
OPENS_SESSION = ("capc-diet-student", "capc-loop")


def rounds(queries: int, batch: int = BATCH) -> int:
    """Rounds a job of ``queries`` runs in (the student party cuts it into batches)."""
    if queries < 0 or batch < 1:
        raise ValueError(f"a job has >= 0 queries and a batch >= 1, got {queries}, {batch}")
    return math.ceil(queries / batch)


@dataclass(frozen=True)
class Line:
    """Bytes of a job: ``per_round`` bytes a round plus ``per_query`` bytes a query."""

    per_round: float
    per_query: float
    batch: int = BATCH

    def predict(self, queries: int) -> float:
        """Bytes (both ways, through the guardian) of one job of ``queries`` queries."""
        return self.per_round * rounds(queries, self.batch) + self.per_query * queries


def fit(jobs: Sequence[tuple[int, int]], batch: int = BATCH) -> Line:
    """The line through two measured jobs, each (queries, bytes), whose (rounds,
    queries) are independent (e.g. one round and two)."""
    if len(jobs) != 2:
        raise ValueError(f"the line is solved from exactly two jobs, got {len(jobs)}")
    (qa, ba), (qb, bb) = jobs
    ra, rb = rounds(qa, batch), rounds(qb, batch)
    det = ra * qb - rb * qa
    if det == 0:
        raise ValueError(
            f"jobs of {qa} and {qb} queries ({ra} and {rb} rounds) cannot tell a round's "
            "bytes from a query's"
        )
    per_round = (ba * qb - bb * qa) / det
    per_query = (ra * bb - rb * ba) / det
    return Line(per_round, per_query, batch)


def job_sizes(group: Sequence[Mapping[str, Any]]) -> list[list[int]]:
    """For each row of one (dataset, method, n, seed), in eps order, the sizes of the
    jobs that bought its queries (its ``queries`` is their sum)."""
    out: list[list[int]] = []
    jobs: list[int] = []
    done = 0
    for row in group:
        q = int(row["queries"])
        if q < done:
            raise ValueError(
                f"{row['dataset']} {row['method']} n={row['n']} seed={row['seed']}: "
                f"eps {row['epsilon']} holds fewer queries ({q}) than a smaller eps ({done})"
            )
        if q > done:
            jobs = [*jobs, q - done]
            done = q
        out.append(list(jobs))
    return out


def lines(measurements: Mapping[str, Any]) -> dict[tuple[str, int, str], dict[str, Any]]:
    """Each measured (dataset, teachers per hospital, method): its fitted ``line`` and
    ``session_setup_bytes``, refitted from the saved jobs (not copied)."""
    out: dict[tuple[str, int, str], dict[str, Any]] = {}
    batch = int(measurements["batch"])
    for m in measurements["methods"]:
        fitted = [(j["queries"], j["bytes"]) for j in m["jobs"] if j["role"] == "fit"]
        (first,) = [j for j in m["jobs"] if j["role"] == "first"]
        # The first job less a later one of its size: what opening the session took.
        again = [b for q, b in fitted if q == first["queries"]]
        if not again:
            raise ValueError(f"{m['method']}: no fit job of the first job's size to compare")
        key = (m["dataset"], int(m["teachers_per_hospital"]), m["method"])
        out[key] = {"line": fit(fitted, batch), "session_setup_bytes": first["bytes"] - again[0]}
    return out


def _consortia(measurements: Mapping[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(c["dataset"], int(c["teachers_per_hospital"])): c for c in measurements["consortia"]}


def fitted(row: Mapping[str, Any]) -> bool:
    """Whether ``row``'s bytes were fitted here (so a new measurement refits them)."""
    return str(row.get("bytes_measured", "")).startswith(FITTED)


def describe(measurements: Mapping[str, Any]) -> str:
    """What a filled row's ``bytes_sent`` is."""
    return (
        f"{FITTED} (per_round * rounds + per_query * queries "
        "per job, through the counting relay in front of the guardian, on a consortium "
        f"of the same dataset and teachers per hospital; batch {measurements['batch']}; "
        "a student party's first job with its session's set-up)"
    )


def fill(
    rows: Sequence[dict[str, Any]],
    measurements: Mapping[str, Any],
    epsilons: Sequence[float] = EPSILONS,
    datasets: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """``rows`` with every capc row lacking ``bytes_sent`` (or holding fitted bytes)
    given fitted bytes (its jobs' sum, each job by its measured line) and its
    consortium's measured start-up bytes; other rows unchanged. A row whose (dataset, teachers per hospital, method) was not
    measured raises: teacher counts are not extrapolated. A cell (dataset, method, n,
    seed) is filled whole, from rows at every eps of ``epsilons``. ``datasets``: only
    their rows (default every dataset's)."""
    found = lines(measurements)
    consortia = _consortia(measurements)
    if int(measurements["batch"]) != BATCH:
        raise ValueError(f"the grid's batch is {BATCH}, measured {measurements['batch']}")
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        if r["method"].startswith("capc-") and (datasets is None or r["dataset"] in datasets):
            groups[(r["dataset"], r["method"], r["n"], r["seed"])].append(i)
    out = [dict(r) for r in rows]
    note = describe(measurements)
    for (dataset, method, n, seed), members in groups.items():
        members.sort(key=lambda i: float(rows[i]["epsilon"]))
        group = [rows[i] for i in members]
        missing = [r.get("bytes_sent") is None or fitted(r) for r in group]
        if not any(missing):
            continue
        # A job spans the eps a cell's rows step through: a cell is filled whole.
        if not all(missing) or tuple(float(r["epsilon"]) for r in group) != tuple(epsilons):
            raise ValueError(
                f"{dataset} {method} n={n} seed={seed}: a cell is filled whole, from rows "
                f"at every eps of {tuple(epsilons)} and none measured, got "
                f"{[(r['epsilon'], r.get('bytes_sent')) for r in group]}"
            )
        teachers = {int(r["teachers_per_hospital"]) for r in group}
        if len(teachers) != 1:
            raise ValueError(f"{dataset} {method}: one cell with teacher counts {teachers}")
        m = teachers.pop()
        key = (dataset, m, method)
        if key not in found or (dataset, m) not in consortia:
            raise ValueError(
                f"no capc_bytes measurement for {dataset}, {m} teachers per hospital, "
                f"{method}: measure it (teacher counts are not extrapolated)"
            )
        line, session = found[key]["line"], found[key]["session_setup_bytes"]
        consortium = consortia[(dataset, m)]
        for i, sizes in zip(members, job_sizes(group), strict=True):
            costs = [round(line.predict(q)) for q in sizes]
            if costs and method in OPENS_SESSION:
                costs[0] += session
            out[i].update(
                bytes_sent=sum(costs),
                job_bytes=costs,
                bytes_measured=note,
                consortium_setup_bytes=int(consortium["setup_bytes"]),
                consortium_setup_measured="measured by capc_bytes on a consortium of the "
                "same dataset and teachers per hospital",
            )
            if method == "capc-loop":
                out[i]["querier_setup_bytes"] = int(consortium["querier_setup_bytes"])
    return out
