"""How well the users' router weights recover a planted modality preference (the truth a synthetic set knows).

With ``router_over="views"`` an expert is a view (``view:<name>``), so a user's argmax names a modality and is
right or wrong. Operator experts (sum / mlp / gate) name no modality; they are scored generously: each expert is
read as the modality most of the users it wins for were planted with (the best labelling there is), so a router
that sends every user to the same expert scores the largest group's share and no more. Rank correlation: per
modality, Spearman's rho between a user's weight on that modality's expert and the indicator "planted with it",
averaged over modalities (for operators, the best expert's |rho| per modality). Undefined (None) where every
user was planted with the same modality.
"""

from __future__ import annotations

import numpy as np

from .view_experts import PREFIX


def _view_labels(experts: list[str]) -> list[str] | None:
    """The modality of every expert, or None when they are not views."""
    if not all(e.startswith(PREFIX) for e in experts):
        return None
    return [e[len(PREFIX) :] for e in experts]


def _best_labels(winner: np.ndarray, truth: np.ndarray, n_experts: int) -> list[str | None]:
    """Each expert read as the planted modality most common among the users it is the argmax of."""
    labels = []
    for k in range(n_experts):
        mine = truth[winner == k]
        values, counts = np.unique(mine, return_counts=True)
        labels.append(values[counts.argmax()] if len(mine) else None)
    return labels


def _rho(x: np.ndarray, y: np.ndarray) -> float:
    from scipy import stats

    if np.all(x == x[0]) or np.all(y == y[0]):
        return 0.0
    return float(stats.spearmanr(x, y).statistic)


def weight_recovery(weights: np.ndarray, experts: list[str], truth: np.ndarray) -> dict:
    """``weights [U, J]`` of the users whose planted modalities are ``truth [U]`` (strings): the argmax's accuracy,
    the mean weight of the planted modality's expert (views only), and the rank correlation."""
    weights, truth = np.asarray(weights, dtype=np.float64), np.asarray(truth).astype(str)
    winner = weights.argmax(1)
    named = _view_labels(experts)
    labels = named if named is not None else _best_labels(winner, truth, len(experts))
    predicted = np.asarray([labels[k] for k in winner], dtype=object)
    out = {
        "accuracy": float(np.mean(predicted == truth)),
        "users": int(len(truth)),
        "labelling": "views" if named is not None else "best expert per modality",
    }
    modalities = sorted(set(truth))
    if named is not None:
        own = np.asarray([named.index(m) if m in named else -1 for m in truth])
        out["mean_weight_on_planted"] = float(np.mean(np.where(own >= 0, weights[np.arange(len(truth)), own], 0.0)))
    if len(modalities) < 2:
        out["spearman"] = None
        return out
    rhos = []
    for m in modalities:
        hit = (truth == m).astype(float)
        if named is not None and m in named:
            rhos.append(_rho(weights[:, named.index(m)], hit))
        else:
            rhos.append(max(abs(_rho(weights[:, k], hit)) for k in range(len(experts))))
    out["spearman"] = float(np.mean(rhos))
    return out
