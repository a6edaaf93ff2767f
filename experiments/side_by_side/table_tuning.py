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
  statistics. Tables have no loop.
"""

from __future__ import annotations

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
from experiments.side_by_side.capc_runs import CapcConfig, table_teachers
from experiments.side_by_side.capc_tuning import Candidate, Tuner
from experiments.side_by_side.data import task

#: The DIET student's generated rows (``capc_runs.submit_diet`` for a table task).
GENERATOR, PARAMS = "beta", {"a": 1.0, "b": 3.0}


@dataclass
class TableTuner(Tuner):
    """:class:`.capc_tuning.Tuner` for a table split: its rows stand for features (no
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
