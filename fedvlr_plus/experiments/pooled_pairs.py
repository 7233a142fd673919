"""Paired comparisons on several draws of a split, pooled (``experiment paired A B --also A2 B2 ...``).

A comparison on one draw of a split (which items are cold, which users join late: ``coldstart --split-seed``)
pairs two runs over that draw's test users. Another draw may answer differently, and a test paired over users
does not count that. Here each pair of run folders is first tested over its own users, then every (draw, user)
difference A − B goes into one t-test: the draws pooled, each weighted by its number of users. A user drawn into
several draws counts once per draw, which makes the pooled test too confident when draws share users (draws of
cold items share nearly all of them, and the variation between item draws is not counted at all); the number of
distinct users is reported beside it.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import RunFolderError
from .paired_runs import check_same_data, per_user_of_run


def pooled_pairs(pairs, metrics=None) -> dict:
    """``pairs``: ``(folder_a, folder_b)`` per draw. Returns ``draws`` (per pair and metric: ``n``, ``mean_diff``,
    ``se``, ``t_pvalue``), ``pooled`` (the same over every draw's users, and ``draws``) and the users counted
    (``n_users``, ``n_distinct_users``)."""
    frames = [(per_user_of_run(a)[0], per_user_of_run(b)[0], a, b) for a, b in pairs]
    for fa, fb, a, b in frames:  # each draw pairs two runs of one data set (draws may differ from each other)
        check_same_data(a, fa, b, fb)
    common = [m for m in frames[0][0].columns if "@" in m and all(m in fa and m in fb for fa, fb, _, _ in frames)]
    wanted = list(metrics) if metrics else common
    missing = [m for m in wanted if m not in common]
    if missing:
        raise RunFolderError(
            str(pairs[0][0]),
            f"not every folder has per-user {', '.join(missing)}",
            f"choose from {', '.join(common) or 'no metric they share'}",
        )
    draws, users, pairs_of = [], [], {m: ([], []) for m in wanted}
    for fa, fb, a, b in frames:
        joined = fa.merge(fb, on="user", suffixes=("_a", "_b"))
        users.append(set(joined["user"].tolist()))
        for m in wanted:
            pairs_of[m][0].append(joined[f"{m}_a"].to_numpy(np.float64))
            pairs_of[m][1].append(joined[f"{m}_b"].to_numpy(np.float64))
        draws.append(
            {
                "a": str(a),
                "b": str(b),
                "tests": {m: _difference_test(pairs_of[m][0][-1], pairs_of[m][1][-1], m) for m in wanted},
            }
        )
    pooled = {
        m: dict(_difference_test(np.concatenate(xa), np.concatenate(xb), m), draws=len(pairs))
        for m, (xa, xb) in pairs_of.items()
    }
    return {
        "draws": draws,
        "pooled": pooled,
        "n_users": sum(len(u) for u in users),
        "n_distinct_users": len(set().union(*users)),
    }


def _difference_test(xa: np.ndarray, xb: np.ndarray, metric: str) -> dict:
    """:func:`~fedvlr_plus.evaluation.stats.paired_arrays` of the pairs, with the standard error of their mean
    difference."""
    from ..evaluation.stats import paired_arrays

    out = paired_arrays(xa, xb, metric)
    n = len(xa)
    out["se"] = float((xa - xb).std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    return out


def format_pooled(result: dict) -> str:
    """A console table: each draw's line per metric, then the pooled line."""
    lines = [
        "",
        f"pooled over {len(result['draws'])} pairs of runs ({result['n_users']} paired users, "
        f"{result['n_distinct_users']} distinct; one t-test over every draw's users):",
        f"{'pair':<6}{'metric':<12}{'A - B':>10}{'se':>9}{'p':>11}{'users':>8}",
    ]
    for i, draw in enumerate(result["draws"], 1):
        lines += [
            f"{i:<6}{m:<12}{t['mean_diff']:>+10.4f}{t['se']:>9.4f}{t['t_pvalue']:>11.3g}{t['n']:>8}"
            for m, t in draw["tests"].items()
        ]
    lines += [
        f"{'all':<6}{m:<12}{t['mean_diff']:>+10.4f}{t['se']:>9.4f}{t['t_pvalue']:>11.3g}{t['n']:>8}"
        for m, t in result["pooled"].items()
    ]
    return "\n".join(lines)
