"""The planted-preference benchmark: the view-routing ablation (:mod:`.view_routing`) on synthetic data whose
users each choose items by one known modality (:mod:`fedvlr_plus.federation.planted`), so that routing has a
right answer.

It reports, for a ``mixed`` set (half the users choose by image, half by text) and a control where every user
shares one modality:

1. weight recovery: each routed row's argmax accuracy and rank correlation against the planted modality, per seed;
2. every row's test figures, with paired tests of ``FedVLR (views)`` against each row over users (seed-averaged),
   beside two oracles that know each user's modality: ``oracle kNN`` (the content ranker on the user's own
   modality) and ``oracle view`` (each user scored by the single-view row of their own modality);
3. the control, where routing should buy nothing.

Selection is on validation only; the oracles read the planted truth, never a test figure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .view_routing import (
    CONTENT_ROW,
    OPERATORS_ROW,
    VIEWS_ROW,
    RowRun,
    ViewRoutingOptions,
    as_result,
    by_lean,
    paired_against,
    per_user,
    row_summary,
    train_rows,
)

ORACLE_KNN, ORACLE_VIEW = "oracle kNN", "oracle view"


@dataclass
class PlantedOptions:
    users: int = 1600
    items: int = 1200
    #: the control's shared modality (None: no control)
    control: str | None = "image"
    data_seed: int = 0
    #: train the mixed set (False: the control only, e.g. in a second process)
    mixed: bool = True


class OracleContentRanker:
    """The content ranker each user gets on their own planted modality: cosine of an item's vector in that
    modality with the mean vector of the user's training items."""

    def __init__(self, data):
        from ..coldstart.content import ContentRanker

        self.truth = data.users["planted"].to_numpy()
        self.rankers = {m: ContentRanker(data, {m: v}) for m, v in data.features.items()}

    def __call__(self, users) -> np.ndarray:
        users = np.asarray(users, np.int64)
        out = None
        for m, ranker in self.rankers.items():
            mine = self.truth[users] == m
            if mine.any():
                s = ranker(users[mine])
                out = np.zeros((len(users), s.shape[1]), s.dtype) if out is None else out
                out[mine] = s
        return out


def oracle_view(data, rows: dict[str, RowRun]) -> RowRun:
    """Each user's figures from the single-view row of their planted modality, seed by seed."""
    import pandas as pd

    from ..evaluation import EvalResult

    truth = data.users["planted"].to_numpy()
    out = RowRun()
    for s in range(len(rows[VIEWS_ROW].results)):
        per = {m: rows[f"view {m}"].results[s] for m in data.features}
        frames = []
        for which in ("all", "warm", "cold"):
            parts = [r.frame(which)[truth[r.frame(which)["user"].to_numpy()] == m] for m, r in per.items()]
            frames.append(pd.concat(parts).sort_values("user").reset_index(drop=True))
        first = next(iter(per.values()))
        out.results.append(EvalResult(*frames, metric_names=list(first.metric_names), meta=dict(first.meta)))
    return out


def recovery(data, rows: dict[str, RowRun]) -> dict[str, dict]:
    """Per routed row: each seed's :func:`~fedvlr_plus.fedvlr.recovery.weight_recovery`, and their mean."""
    from ..fedvlr.recovery import weight_recovery

    truth = data.users["planted"].to_numpy()
    out = {}
    for label, row in rows.items():
        if not row.weights:
            continue
        seeds = [weight_recovery(w, row.experts, truth[u]) for w, u in zip(row.weights, row.users)]
        mean = {k: _mean([s.get(k) for s in seeds]) for k in ("accuracy", "spearman", "mean_weight_on_planted")}
        out[label] = {
            "experts": row.experts,
            "seeds": seeds,
            **mean,
            "mean_weights": np.mean([w.mean(0) for w in row.weights], 0).round(4).tolist(),
        }
    return out


def _mean(values):
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def planted_setting(data, opts: ViewRoutingOptions) -> dict:
    """One planted data set: every row, the oracles, recovery, and the paired tests of FedVLR (views)."""
    from ..api import Experiment

    rows = train_rows(data, data.features, opts)
    exp = Experiment(data, [], metrics=list(opts.metrics), references=False, progress=False, **opts.training)
    rows[ORACLE_KNN] = RowRun(results=[exp.test(OracleContentRanker(data), opts.seed + i) for i in range(opts.seeds)])
    if "single" in opts.rows:  # (each user's own single view: those rows must have been trained)
        rows[ORACLE_VIEW] = oracle_view(data, rows)
    result = as_result(data.name, rows, opts.metrics)
    metric = opts.metrics[0]
    return {
        "data": data.name,
        "users": int(data.n_users),
        "items": int(data.n_items),
        "result": result,
        "recovery": recovery(data, rows),
        "paired": paired_against(result, VIEWS_ROW, metric),
        "metric": metric,
        "rows": row_summary(rows),
        "planted": _group_sizes(data),
        "by_lean": by_lean(result, rows, metric),
        "per_user": per_user(result, rows, metric, group=data.users["planted"].to_numpy()),
    }


def _group_sizes(data) -> dict[str, int]:
    values, counts = np.unique(data.users["planted"].to_numpy(), return_counts=True)
    return {str(v): int(c) for v, c in zip(values, counts)}


def run_planted(planted: PlantedOptions, opts: ViewRoutingOptions) -> dict:
    """The mixed set and, unless ``planted.control`` is None, the one-modality control (both settings' runs in
    the same worker processes, started once)."""
    from ..federation.planted import planted_data
    from ..federation.runs.parallel import shared_workers

    out = {}
    with shared_workers():
        if planted.mixed:
            out["mixed"] = planted_setting(
                planted_data(planted.users, planted.items, preference="mixed", seed=planted.data_seed), opts
            )
        if planted.control is not None:
            control = planted_data(planted.users, planted.items, preference=planted.control, seed=planted.data_seed)
            out["control"] = planted_setting(control, opts)
    return out


__all__ = [
    "PlantedOptions",
    "run_planted",
    "planted_setting",
    "OracleContentRanker",
    "ORACLE_KNN",
    "ORACLE_VIEW",
    "CONTENT_ROW",
    "OPERATORS_ROW",
    "VIEWS_ROW",
]
