"""A paired comparison of two methods over the same seeds (the tables of FedDTL, FedMPT and FedVPA-GP)."""

from __future__ import annotations

import numpy as np


def paired(a, b) -> dict:
    """``a - b`` paired over seeds: mean, standard error, seeds where a is higher, two-sided paired t-test p."""
    from scipy.stats import ttest_rel

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    d = a - b
    out = {
        "diff": d.tolist(),
        "mean": float(d.mean()),
        "higher": int((d > 0).sum()),
        "n": int(len(d)),
        "sem": float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else None,
        "p": None,
    }
    if len(d) > 1 and np.any(d != d[0]):
        out["p"] = float(ttest_rel(a, b).pvalue)
    elif len(d) > 1:
        out["p"] = 0.0 if d[0] != 0 else 1.0  # a constant difference: t is infinite (or 0 / 0 when none)
    return out


def p_text(p) -> str:
    return "–" if p is None else (f"{p:.3f}" if p >= 0.001 else f"{p:.1e}")


def diff_text(t: dict) -> str:
    """``+0.0123 ± 0.0040, 4/5, p 0.021``: a :func:`paired` result in a table cell."""
    sem = "" if t["sem"] is None else f" ± {t['sem']:.4f}"
    return f"{t['mean']:+.4f}{sem}, {t['higher']}/{t['n']}, p {p_text(t['p'])}"


def seeds_cell(values, sd: bool = False) -> str:
    """``0.3012 / 0.2987 / 0.3050 (**0.3016**)``: one figure per seed and their mean, in a table cell; with ``sd``
    the mean carries the seeds' standard deviation, ``(**0.3016 ± 0.0032**)``."""
    spread = f" ± {np.std(values, ddof=1):.4f}" if sd and len(values) > 1 else ""
    return " / ".join(f"{v:.4f}" for v in values) + f" (**{np.mean(values):.4f}{spread}**)"
