"""Uncertainty for per-user ranking metrics: bootstrap confidence intervals and paired significance tests.

- Confidence intervals: the non-parametric bootstrap over users (Efron & Tibshirani, "An Introduction to the
  Bootstrap", 1993), computed with :func:`scipy.stats.bootstrap` (BCa by default).
- Paired comparison of two systems on the same users: the paired t-test (:func:`scipy.stats.ttest_rel`) and the
  Wilcoxon signed-rank test (:func:`scipy.stats.wilcoxon`), as recommended for IR evaluation by Smucker, Allan &
  Carterette, "A comparison of statistical significance tests for information retrieval evaluation", CIKM 2007.
"""
from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import numpy as np
from scipy import stats

if TYPE_CHECKING:  # pragma: no cover
    from .results import EvalResult


def _rng_kwarg(seed: int) -> dict:
    # SciPy >= 1.15 takes ``rng``; older releases only ``random_state``.
    import inspect

    name = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
    return {name: np.random.default_rng(seed)}


def bootstrap_ci(values, *, level: float = 0.95, n_resamples: int = 2000, seed: int = 0,
                 method: str = "BCa") -> list[float]:
    """``[low, high]`` bootstrap interval for the mean of ``values`` (one value per user).

    Degenerate samples are handled explicitly instead of returning NaN: no values -> ``[nan, nan]``; one value or
    all values equal -> ``[v, v]`` (every resample has the same mean).
    """
    x = np.asarray(values, dtype=np.float64)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if len(x) == 0:
        return [math.nan, math.nan]
    if np.all(x == x[0]):
        return [float(x[0]), float(x[0])]
    with warnings.catch_warnings():
        # BCa warns when the acceleration is undefined for nearly constant data; we fall back below.
        warnings.simplefilter("ignore", category=stats.DegenerateDataWarning)
        res = stats.bootstrap((x,), np.mean, confidence_level=level, n_resamples=n_resamples,
                              method=method, vectorized=True, **_rng_kwarg(seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(low) and math.isfinite(high)) and method.lower() != "percentile":
        return bootstrap_ci(x, level=level, n_resamples=n_resamples, seed=seed, method="percentile")
    return [low, high]


def paired_test(a: "EvalResult", b: "EvalResult", metric: str, which: str = "all") -> dict:
    """Compare ``a`` and ``b`` on ``metric`` over the users both evaluated (inner join on ``user``).

    Returns ``n`` (common users), ``n_only_a``/``n_only_b`` (users one side lacks), ``mean_a``, ``mean_b``,
    ``mean_diff`` (a - b), the paired t-test statistic/p-value and the Wilcoxon signed-rank statistic/p-value.
    When every difference is zero both tests are undefined; the function then reports statistic 0 and p-value 1
    (no evidence of a difference) rather than NaN.
    """
    fa, fb = a.frame(which), b.frame(which)
    for name, f in (("a", fa), ("b", fb)):
        if metric not in f.columns:
            raise KeyError(f"metric {metric!r} not in result {name} (has {', '.join(a.metric_names)})")
    joined = fa[["user", metric]].merge(fb[["user", metric]], on="user", suffixes=("_a", "_b"))
    xa = joined[f"{metric}_a"].to_numpy(np.float64)
    xb = joined[f"{metric}_b"].to_numpy(np.float64)
    diff = xa - xb
    n = len(diff)
    out = {
        "metric": metric,
        "which": which,
        "n": int(n),
        "n_only_a": int(len(fa) - n),
        "n_only_b": int(len(fb) - n),
        "mean_a": float(xa.mean()) if n else math.nan,
        "mean_b": float(xb.mean()) if n else math.nan,
        "mean_diff": float(diff.mean()) if n else math.nan,
    }
    if n < 2:
        out.update(t_stat=math.nan, t_pvalue=math.nan, wilcoxon_stat=math.nan, wilcoxon_pvalue=math.nan)
        return out
    if np.all(diff == 0):
        out.update(t_stat=0.0, t_pvalue=1.0, wilcoxon_stat=0.0, wilcoxon_pvalue=1.0)
        return out
    if np.all(diff == diff[0]):
        # Constant non-zero shift: zero variance, the t statistic is infinite; the sign test is decisive.
        t_stat, t_p = math.copysign(math.inf, diff[0]), 0.0
    else:
        t = stats.ttest_rel(xa, xb)
        t_stat, t_p = float(t.statistic), float(t.pvalue)
    w = stats.wilcoxon(xa, xb, zero_method="wilcox")
    out.update(t_stat=t_stat, t_pvalue=t_p, wilcoxon_stat=float(w.statistic), wilcoxon_pvalue=float(w.pvalue))
    return out
