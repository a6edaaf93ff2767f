"""capc tuned on a table dataset (breast-cancer) as on images (:mod:`.capc_tuning`): the
same grid of at most 8 configurations a cell, the same pricing, scored on
``split.tuning`` only; what differs is what a table consortium runs (``capc_runs``):

* Teachers: each hospital's ``m`` MLPs trained from scratch on disjoint parts of its
  ``n`` labelled rows (:func:`.capc_runs.table_teachers`, what its party votes with),
  reading every row with their stored statistics, as a party reads table rows
  (``services.answerer.party``: generated rows are encoded like real records).
* Queries: the DIET student's ``beta`` rows (a = 1, b = 3, the task's schema, the
  split's seed from row 0), as ``capc_runs.submit_diet`` asks for them; PATE with
  public records asks about the split's public rows in their order.
* The student: what the student service trains for a table task, an MLP from scratch
  on the answered queries (``services.student.training.ModelTrainer._fit_scratch``,
  ``CapcConfig.table_epochs`` epochs, seed the split's), scored with its stored
  statistics.
* The loop: hospital 0's model is what the student service trains for a querier
  without a body (``ModelTrainer._fit_scratch`` with ``--own-data``): an MLP from
  scratch for ``CapcConfig.table_loop_epochs`` epochs, seed the split's, on its own
  rows (in the trainer's order, ``own_weight`` times) and then the bought labels;
  hospitals 1 and 2's teachers vote on its unlabelled rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from capc.data.generators import Recipe
from capc.data.schema import parse_records
from capc.learning.supervised import accuracy, fit
from capc.models import build
from capc.models.ensemble.voters import Voters
from capc.privacy.randomness import SecureRandom
from capc.round.central import label_histograms
from experiments.side_by_side.capc_runs import CapcConfig, table_teachers
from experiments.side_by_side.data import task
from experiments.side_by_side.tuner import EPSILONS, Candidate, Tuner, agreement, bought

#: The DIET student's generated rows (``capc_runs.submit_diet`` for a table task).
GENERATOR, PARAMS = "beta", {"a": 1.0, "b": 3.0}


@dataclass
class TableTuner(Tuner):
    """:class:`.tuner.Tuner` for a table split: its rows stand for features (no
    body), its teachers are MLPs, its student an MLP trained from scratch."""

    config: CapcConfig = field(default_factory=CapcConfig)

    def __post_init__(self) -> None:
        self.base_task = dict(task(self.split.dataset) or {})
        if not self.base_task:
            raise ValueError(f"{self.split.dataset} is not a table dataset")
        self.classes = int(self.base_task["num_classes"])
        self.schema = parse_records(self.base_task["records"])
        self._voters: dict[tuple[int, int], list[Voters]] = {}
        self._rows: torch.Tensor | None = None
        idx = self.split.tuning if self.score_on is None else self.score_on
        self.score = (self.split.x[idx], self.split.y[idx])

    def query_rows(self) -> NDArray[np.float32]:
        """(pool, F) generated rows, encoded by the task's schema."""
        width = int(self.split.x.shape[1])
        recipe = Recipe(GENERATOR, self.split.seed, 0, self.pool, (width,), dict(PARAMS))
        return np.asarray(recipe.generate(self.schema), dtype=np.float32)

    def voters(self, n: int, m: int) -> list[Voters]:
        """Each hospital's ``m`` teachers as its party holds them."""
        if (n, m) not in self._voters:
            epochs = self.config.table_teacher_epochs
            voters = []
            for i in range(self.split.hospitals):
                # A model's initial weights come from torch's global generator (``fit``
                # seeds only its batches): seeded here, so a rerun makes the same rows.
                torch.manual_seed(10 * i)
                voters.append(Voters(table_teachers(self.split, n, m, i, epochs)))
            self._voters[(n, m)] = voters
            self.log(f"n={n}: {m} teachers a hospital")
        return self._voters[(n, m)]

    def student(self, n: int, c: Candidate) -> list[dict[str, Any]]:
        """The DIET student of ``c`` at every eps (rows scored on the tuning records)."""
        x = self.query_rows()
        return self._student_rows("capc-diet-student", x, n, c)

    def pate_public(self, n: int, c: Candidate) -> list[dict[str, Any]]:
        """PATE with public records for ``c`` at every eps (the split's public rows)."""
        return self._student_rows("capc-pate-public", self.split.x[self.split.public], n, c)

    def _student_rows(
        self, method: str, x: NDArray[np.float32], n: int, c: Candidate
    ) -> list[dict[str, Any]]:
        predictions = [v.predict(x) for v in self.voters(n, c.teachers)]
        # The queries stand for their features: the student is trained on the rows.
        return self._student(method, torch.from_numpy(x), predictions, n, c)

    def _accuracy(self, qf: torch.Tensor, labels: NDArray[np.int64]) -> float | None:
        """The student service's table student (an MLP from scratch) on the answered rows
        ``qf`` (N, F) and their labels; None with no label (the service trains no job
        without an answered query)."""
        if len(labels) == 0:
            return None
        x = qf.numpy()
        torch.manual_seed(self.split.seed)  # the initial weights (see :meth:`voters`)
        model = fit(
            build("mlp", tuple(x.shape[1:]), self.classes),
            x,
            labels,
            epochs=self.config.table_epochs,
            seed=self.split.seed,
        )
        return float(accuracy(model, *self.score))

    def _mlp(self, x: NDArray[np.float32], y: NDArray[np.int64], epochs: int) -> torch.nn.Module:
        """An MLP from scratch on rows ``x`` (N, F) and labels ``y`` (N,), seeded as the
        student service seeds it (initial weights and batches: the split's seed)."""
        torch.manual_seed(self.split.seed)
        return fit(
            build("mlp", tuple(x.shape[1:]), self.classes),
            x,
            y,
            epochs=epochs,
            seed=self.split.seed,
        )

    def loop(self, n: int, grid: Sequence[Candidate]) -> list[dict[str, Any]]:
        """Hospital 0's CaPC loop for every candidate, and its model alone (rows scored on
        the tuning records; the loop's labels bought for its unlabelled rows in order)."""
        s, epochs = self.split, self.config.table_loop_epochs
        own = s.labelled(0, n)
        order = np.random.default_rng(1).permutation(len(own))  # the trainer's order
        own_x, own_y = s.x[own][order], s.y[own][order].astype(np.int64)
        unlabelled = s.x[s.unlabelled(0, n)]
        truth = s.y[s.unlabelled(0, n)]
        alone_model = self._mlp(own_x, own_y, epochs)
        alone = float(accuracy(alone_model, *self.score))
        with torch.no_grad():
            own_view = alone_model.eval()(torch.from_numpy(unlabelled)).argmax(1).numpy()
        rows = [self._row("alone (hospital 0)", n, None, None, alone, 0, 0)]
        for c in grid:
            mech = c.build(self.classes)
            # Hospital 0's teachers never vote on its own records.
            votes = sum(
                (mech.summed_votes(v.predict(unlabelled)) for v in self.voters(n, c.teachers)[1:]),
                np.zeros((len(unlabelled), mech.outputs)),
            )
            seed = f"side-by-side-capc-tuning-loop-{n}-{c.mechanism}-{s.dataset}"
            rng, voters = SecureRandom.from_seed(seed), (s.hospitals - 1) * c.teachers
            labels, answered = label_histograms(votes, mech, voters, rng, mode="oracle")
            for e in EPSILONS:
                done, use, copies = bought(c, mech, answered, labels, own_view, e)
                x = np.concatenate([*[own_x] * copies, unlabelled[use]])
                y = np.concatenate([*[own_y] * copies, labels[use].astype(np.int64)])
                acc = float(accuracy(self._mlp(x, y, epochs), *self.score))
                row = self._row("capc-loop", n, c, e, acc, done, len(use))
                row["accuracy_alone"], row["gain"] = alone, acc - alone
                row["label_agreement"] = agreement(votes[use], labels[use])
                row["label_accuracy"] = (
                    float((labels[use] == truth[use]).mean()) if len(use) else None
                )
                rows.append(row)
            self.log(
                f"loop n={n} {c.name}: "
                + ", ".join(f"{r['tuning_accuracy']:.3f}" for r in rows[-len(EPSILONS) :])
            )
        return rows
