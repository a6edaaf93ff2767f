"""The shipped breast-cancer table task: its schema, classes and privacy plan."""

from __future__ import annotations

import numpy as np

from capc.data.offline import breast_cancer_records
from capc.data.schema import NumericFeature, TableSchema
from capc.privacy.accountants import DEFAULT_ACCOUNTANT, make
from capc.task_config import TaskConfig, config_hash
from services import tasks

#: Each hospital's cap and the ledger's delta (docs/usage.md: the tabular task).
EPSILON, DELTA = 10.0, 1e-5
#: Queries a student must be able to label within every hospital's cap.
MIN_QUERIES = 1000


def _task() -> TaskConfig:
    config = tasks.load("breast-cancer")
    return TaskConfig.parse("breast-cancer", config, config_hash(config))


def test_schema_names_every_sklearn_feature_with_a_range_around_the_data() -> None:
    task = _task()
    schema = task.records
    assert isinstance(schema, TableSchema) and task.input_shape == (30,)
    assert task.class_names == ("malignant", "benign")
    columns, labels = breast_cancer_records()
    assert schema.columns == list(columns)
    for f in schema.features:
        assert isinstance(f, NumericFeature)
        # The stand-in for a data dictionary: the data's min and max, rounded outward.
        assert f.low <= columns[f.name].min() and columns[f.name].max() <= f.high
    x = schema.encode(columns, "breast-cancer")
    assert x.shape == (569, 30) and x.min() >= 0.0 and x.max() <= 1.0
    assert set(np.unique(labels)) == {0, 1}


def test_sigma_lets_a_thousand_queries_fit_each_hospitals_cap() -> None:
    """The planner of the guardian's ledger (its default accountant): every hospital is
    charged a Gaussian of sensitivity sqrt(2) per query, whatever its number of teachers
    (one record sits in one teacher's data and moves one vote)."""
    mech = _task().mechanism
    accountant = make(DEFAULT_ACCOUNTANT)
    fits = accountant.max_count(mech.per_query(), EPSILON, DELTA)
    assert fits >= MIN_QUERIES
    # and not needlessly noisy: a tenth less noise would not fit them
    quieter = mech.scaled_noise(0.9)
    assert accountant.max_count(quieter.per_query(), EPSILON, DELTA) < MIN_QUERIES
