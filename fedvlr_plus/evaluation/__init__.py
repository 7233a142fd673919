"""Honest ranking evaluation: full-sort and sampled-negative protocols, HR/NDCG/Recall/MRR@K with ties scored
by their exact expectation over random tie orders, per-user results (all / warm / cold targets), bootstrap
confidence intervals, paired tests and reference rankers (pop, antipop, random).
"""

from .metrics import METRICS, TIE_POLICY, expected_metrics, metric_columns, rank_counts
from .protocols import Scorer, evaluate, sample_negatives, sampled_unavailable
from .rankers import RANKERS, reference_scorer
from .results import EvalResult
from .stats import bootstrap_ci, paired_test

__all__ = [
    "METRICS",
    "RANKERS",
    "TIE_POLICY",
    "EvalResult",
    "Scorer",
    "bootstrap_ci",
    "evaluate",
    "expected_metrics",
    "metric_columns",
    "paired_test",
    "rank_counts",
    "reference_scorer",
    "sample_negatives",
    "sampled_unavailable",
]
