"""Bootstrap intervals cost O(users) memory and agree with SciPy's own BCa computation on small samples."""

import math
import tracemalloc

import numpy as np
import pytest
from scipy import stats

from fedvlr_plus.evaluation.stats import bootstrap_ci, bootstrap_cis


def _rng_kwarg(seed: int) -> dict:
    # SciPy >= 1.15 takes ``rng``; older releases only ``random_state``.
    import inspect

    name = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
    return {name: np.random.default_rng(seed)}


def _scipy_interval(x, method, seed):
    """The computation bootstrap_ci used to do: SciPy's defaults (all resamples and the n x n jackknife at once)."""
    res = stats.bootstrap(
        (x,), np.mean, confidence_level=0.95, n_resamples=2000, method=method, vectorized=True, **_rng_kwarg(seed)
    )
    return [float(res.confidence_interval.low), float(res.confidence_interval.high)]


@pytest.mark.parametrize("n", [2, 9, 50, 204, 1000])
@pytest.mark.parametrize("method", ["BCa", "percentile", "basic"])
def test_same_interval_as_scipy_on_small_samples(n, method):
    g = np.random.default_rng(n)
    for x in (g.random(n), (g.random(n) < 0.3).astype(float), np.where(g.random(n) < 0.1, g.random(n), 0.0)):
        if np.all(x == x[0]):
            continue
        old = _scipy_interval(x, method, seed=n)
        if not all(math.isfinite(v) for v in old):
            continue  # SciPy's BCa is undefined here; bootstrap_ci falls back to the percentile interval
        assert bootstrap_ci(x, method=method, seed=n) == pytest.approx(old, abs=1e-12, rel=0)


def test_metrics_drawn_together_get_the_interval_each_gets_alone():
    g = np.random.default_rng(3)
    cols = {
        "hr": (g.random(700) < 0.2).astype(float),
        "ndcg": np.where(g.random(700) < 0.2, g.random(700), 0.0),
        "flat": np.full(700, 0.5),
        "none": [],
    }
    together = bootstrap_cis(cols, seed=11)
    for name, values in cols.items():
        alone = bootstrap_ci(values, seed=11)
        assert together[name] == alone or all(math.isnan(v) for v in alone + together[name]), name
    assert together["hr"] != together["ndcg"]
    with pytest.raises(ValueError, match="same users"):
        bootstrap_cis({"a": [0.0, 1.0], "b": [0.0, 1.0, 1.0]})


def test_hundred_thousand_users_in_small_memory():
    n = 100_000
    x = (np.random.default_rng(0).random(n) < 0.1).astype(np.float64)
    tracemalloc.start()
    try:
        low, high = bootstrap_ci(x)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # SciPy's defaults would allocate n x n (80 GB) for the jackknife and 2000 x n for the resamples
    assert peak < 128 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    mean, se = x.mean(), x.std(ddof=1) / math.sqrt(n)
    assert low < mean < high
    assert (high - low) == pytest.approx(2 * 1.96 * se, rel=0.15)  # the normal interval, for a large sample


def test_degenerate_samples_and_bad_arguments():
    assert all(math.isnan(v) for v in bootstrap_ci([]))
    assert bootstrap_ci([0.25]) == [0.25, 0.25]
    assert bootstrap_ci([1.0] * 7) == [1.0, 1.0]
    with pytest.raises(ValueError):
        bootstrap_ci([0.0, 1.0], method="studentized")
    with pytest.raises(ValueError):
        bootstrap_ci([0.0, 1.0], level=1.5)
