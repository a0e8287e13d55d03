"""The statistics of the experiment commands live in algorithms/experiment/stats.py; this module re-exports them
for importers of `algorithms.stats` (benchmarks)."""

from algorithms.experiment.stats import (
    aggregate_estimates,
    bootstrap_description,
    describe,
    fraction_estimate,
    improvement_estimate,
    iqm,
    mann_whitney,
    mean_ci_curves,
    probability_of_improvement,
)

__all__ = [
    "aggregate_estimates",
    "bootstrap_description",
    "describe",
    "fraction_estimate",
    "improvement_estimate",
    "iqm",
    "mann_whitney",
    "mean_ci_curves",
    "probability_of_improvement",
]
