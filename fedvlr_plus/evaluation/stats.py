"""Uncertainty for per-user ranking metrics: bootstrap confidence intervals and paired significance tests.

- Confidence intervals: the non-parametric bootstrap over users (Efron & Tibshirani, "An Introduction to the
  Bootstrap", 1993): resamples drawn by :func:`scipy.stats.bootstrap` in bounded batches, BCa by default with
  the jackknife of the mean in closed form, so memory stays O(users) at any scale.
- Paired comparison of two systems on the same users: the paired t-test (:func:`scipy.stats.ttest_rel`) and the
  Wilcoxon signed-rank test (:func:`scipy.stats.wilcoxon`), as recommended for IR evaluation by Smucker, Allan &
  Carterette, "A comparison of statistical significance tests for information retrieval evaluation", CIKM 2007.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from .results import EvalResult


def _scipy():
    """``(scipy.special, scipy.stats)``, imported on first use: seconds of imports that a process which only ranks
    never needs (a Flower ClientApp process serves one message, and it ranks)."""
    from scipy import special, stats

    return special, stats


# Resamples drawn per batch: the index and gathered arrays are RESAMPLE_FLOATS floats each whatever the number
# of users, so an interval costs O(n) memory (SciPy's default batch is all resamples at once).
RESAMPLE_FLOATS = 1 << 21


def _bootstrap_means(columns: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    """The bootstrap distribution of the mean of each row of ``columns`` (``[metrics, users]``): ``[metrics,
    n_resamples]``.

    These are the resamples :func:`scipy.stats.bootstrap` draws for ``numpy.random.default_rng(seed)`` (one
    ``integers(0, n, (batch, n))`` per batch) and the means it takes, drawn here without importing scipy.stats
    (half a second, most of what a run's intervals cost) and once for all the metrics of a group, which used
    to draw the same indices once each. tests/test_bootstrap_scale.py checks the intervals equal SciPy's."""
    n = columns.shape[1]
    batch = max(1, min(n_resamples, RESAMPLE_FLOATS // n))
    rng = np.random.default_rng(seed)
    out = np.empty((columns.shape[0], n_resamples), dtype=np.float64)
    for start in range(0, n_resamples, batch):
        size = min(batch, n_resamples - start)
        idx = rng.integers(0, n, (size, n))
        for row, x in enumerate(columns):
            out[row, start : start + size] = np.mean(x[idx], axis=-1)
    return out


def _bca_levels(x: np.ndarray, means: np.ndarray, alpha: float) -> tuple[float, float]:
    """Quantile levels of the BCa interval (Efron & Tibshirani 1993, 14.3; SciPy's formula).

    The acceleration comes from the jackknife of the mean in closed form: leaving out x_i moves the mean by
    (x_i - mean) / (n - 1), so a = sum(d^3) / (6 sum(d^2)^1.5) with d = x - mean. SciPy forms the n leave-one-out
    samples instead (an n x n array); the two agree to rounding."""
    from scipy import special  # milliseconds, unlike scipy.stats

    theta = float(np.mean(x))
    z0 = special.ndtri((np.count_nonzero(means < theta) + np.count_nonzero(means <= theta)) / (2 * len(means)))
    d = x - theta
    accel = float(np.sum(d**3) / (6.0 * np.sum(d**2) ** 1.5))
    z = special.ndtri(alpha)
    lo = special.ndtr(z0 + (z0 + z) / (1 - accel * (z0 + z)))
    hi = special.ndtr(z0 + (z0 - z) / (1 - accel * (z0 - z)))
    return float(lo), float(hi)


def _check_interval_args(level: float, method: str) -> str:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    kind = method.lower()
    if kind not in ("bca", "percentile", "basic"):
        raise ValueError(f"method must be 'BCa', 'percentile' or 'basic', got {method!r}")
    return kind


def bootstrap_ci(
    values, *, level: float = 0.95, n_resamples: int = 2000, seed: int = 0, method: str = "BCa"
) -> list[float]:
    """``[low, high]`` bootstrap interval for the mean of ``values`` (one value per user).

    ``method``: ``"BCa"`` (default), ``"percentile"`` or ``"basic"``, as in :func:`scipy.stats.bootstrap`, whose
    resamples these are (same seed, same draws). Memory is O(len(values)): resamples are drawn in batches and
    the BCa acceleration uses the jackknife of the mean in closed form. A BCa interval that is undefined (the
    sample mean outside every resample's) falls back to the percentile interval.

    Degenerate samples are handled explicitly instead of returning NaN: no values -> ``[nan, nan]``; one value or
    all values equal -> ``[v, v]`` (every resample has the same mean).
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    return bootstrap_cis({"x": x}, level=level, n_resamples=n_resamples, seed=seed, method=method)["x"]


def bootstrap_cis(
    columns: dict, *, level: float = 0.95, n_resamples: int = 2000, seed: int = 0, method: str = "BCa"
) -> dict[str, list[float]]:
    """:func:`bootstrap_ci` of each column (name -> values of the same users), the users drawn once for all:
    each interval is the one :func:`bootstrap_ci` gives the column alone."""
    kind = _check_interval_args(level, method)
    xs = {name: np.asarray(v, dtype=np.float64).ravel() for name, v in columns.items()}
    out = {name: _degenerate_interval(x) for name, x in xs.items()}
    varied = [name for name, x in xs.items() if out[name] is None]
    if not varied:
        return out
    if len({len(xs[name]) for name in varied}) > 1:
        raise ValueError("bootstrap_cis: every column must hold the same users")
    means = _bootstrap_means(np.stack([xs[name] for name in varied]), int(n_resamples), seed)
    for name, m in zip(varied, means):
        out[name] = _interval(xs[name], m, level, kind)
    return out


def _degenerate_interval(x: np.ndarray) -> list[float] | None:
    """The interval of a sample every resample gives the same mean (empty: NaN), else None."""
    if len(x) == 0:
        return [math.nan, math.nan]
    if np.all(x == x[0]):
        return [float(x[0]), float(x[0])]
    return None


def _interval(x: np.ndarray, means: np.ndarray, level: float, kind: str) -> list[float]:
    """The interval of ``kind`` read from the bootstrap means (linear interpolation between order statistics, as
    SciPy reads it)."""
    alpha = (1.0 - level) / 2
    levels = _bca_levels(x, means, alpha) if kind == "bca" else (math.nan, math.nan)
    if not all(math.isfinite(p) for p in levels):
        levels = (alpha, 1.0 - alpha)
    low, high = (float(q) for q in np.quantile(means, np.asarray(levels)))
    if kind == "basic":
        theta = float(np.mean(x))
        low, high = 2 * theta - high, 2 * theta - low
    return [low, high]


def paired_test(a: EvalResult, b: EvalResult, metric: str, which: str = "all") -> dict:
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
    return paired_frames(fa, fb, metric, which)


def per_user_mean(frames, keys):
    """One row per user (column ``user``): the user's mean of each metric of ``keys`` over ``frames`` (one
    per-user frame per seed), the figure a paired test over users compares."""
    import pandas as pd

    return pd.concat(frames, ignore_index=True).groupby("user")[list(keys)].mean().reset_index()


def paired_frames(fa, fb, metric: str, which: str = "all") -> dict:
    """:func:`paired_test` on two per-user frames (columns ``user`` and ``metric``), over their common users."""
    joined = fa[["user", metric]].merge(fb[["user", metric]], on="user", suffixes=("_a", "_b"))
    xa = joined[f"{metric}_a"].to_numpy(np.float64)
    xb = joined[f"{metric}_b"].to_numpy(np.float64)
    tests = paired_arrays(xa, xb, metric, which)
    # the users one side lacks stand right after the common count, where reports read them
    out = {k: tests[k] for k in ("metric", "which", "n")}
    out.update(n_only_a=int(len(fa) - len(xa)), n_only_b=int(len(fb) - len(xb)))
    out.update(tests)
    return out


def paired_arrays(xa: np.ndarray, xb: np.ndarray, metric: str, which: str = "all") -> dict:
    """The tests of :func:`paired_frames` on two aligned arrays of per-pair figures (pair ``i`` is
    ``(xa[i], xb[i])``), without the users one side lacks."""
    diff = xa - xb
    n = len(diff)
    out = {
        "metric": metric,
        "which": which,
        "n": int(n),
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
    _, stats = _scipy()
    if np.all(diff == diff[0]):
        # Constant non-zero shift: zero variance, the t statistic is infinite; the sign test is decisive.
        t_stat, t_p = math.copysign(math.inf, diff[0]), 0.0
    else:
        t = stats.ttest_rel(xa, xb)
        t_stat, t_p = float(t.statistic), float(t.pvalue)
    w = stats.wilcoxon(xa, xb, zero_method="wilcox")
    out.update(t_stat=t_stat, t_pvalue=t_p, wilcoxon_stat=float(w.statistic), wilcoxon_pvalue=float(w.pvalue))
    return out
