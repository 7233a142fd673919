"""The paper table by users' history length: every row's test figures per bucket of training interactions, and
each FedVLR row against its like-for-like row (the backbone with FedVLR's aggregation) and the backbone alone,
paired over the bucket's users. It shows where the layer helps: a sparse user's vector, and the rows of the items
it touched, learn from a handful of interactions, and content is what a fusion layer adds for them.

Buckets are the cold-start study's (:data:`fedvlr_plus.coldstart.experiment.BUCKETS`); a user's value is the
seed-averaged per-user figure, as in the table's paired tests, on warm targets where the test split has cold ones
(a cold target's rank says how the item was filled in, not how well the user is known), else on all targets."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...api import ExperimentResult
from ...coldstart.experiment import BUCKETS, bucket_labels, history_bucket
from ...evaluation.stats import paired_frames


def sparsity_section(
    tests: ExperimentResult, train_counts: np.ndarray, pairs: list[tuple[str, str]], edges=BUCKETS
) -> dict:
    """``targets`` ("warm" or "all") and ``buckets``: one dict per non-empty bucket, with ``bucket``, ``n_users``,
    ``means`` (model -> metric -> mean over the bucket's users) and ``paired`` ("a vs b" -> metric ->
    :func:`paired_frames` result) for each of ``pairs``."""
    keys = list(tests.metrics)
    which = "warm" if any(len(tests.per_user(m, "cold")) for m in tests.models) else "all"
    per_user = {m: tests.per_user(m, which) for m in tests.models}
    bucket = {m: history_bucket(train_counts, f["user"].to_numpy(), edges) for m, f in per_user.items()}
    rows = []
    for b, label in enumerate(bucket_labels(edges)):
        sub = {m: f[bucket[m] == b] for m, f in per_user.items()}
        n = max((len(f) for f in sub.values()), default=0)
        if not n:
            continue
        means = {m: {k: float(f[k].mean()) for k in keys} for m, f in sub.items() if len(f)}
        paired = {
            f"{a} vs {c}": {k: paired_frames(sub[a], sub[c], k) for k in keys}
            for a, c in pairs
            if a in sub and c in sub and len(sub[a]) and len(sub[c])
        }
        rows.append({"bucket": label, "n_users": int(n), "means": means, "paired": paired})
    return {"targets": which, "buckets": rows}


def sparsity_markdown(section: dict, metric: str) -> list[str]:
    """The section's Markdown lines for ``metric``: a bucket × model table, then the paired differences."""
    rows = section.get("buckets", [])
    if not rows:
        return []
    models = list(dict.fromkeys(m for r in rows for m in r["means"]))
    lines = [
        "",
        f"## By history length ({section['targets']} test targets, {metric}; users bucketed by training interactions)",
        "",
        "| training interactions | users | " + " | ".join(models) + " |",
        "|---" * (len(models) + 2) + "|",
    ]
    for r in rows:
        cells = [f"{r['means'][m][metric]:.4f}" if m in r["means"] else "–" for m in models]
        lines.append(f"| {r['bucket']} | {r['n_users']} | " + " | ".join(cells) + " |")
    comparisons = list(dict.fromkeys(c for r in rows for c in r["paired"]))
    if comparisons:
        lines += [
            "",
            "| training interactions | " + " | ".join(f"{c}: diff (t-test p)" for c in comparisons) + " |",
            "|---" * (len(comparisons) + 1) + "|",
        ]
        for r in rows:
            cells = [_diff_cell(r["paired"].get(c, {}).get(metric)) for c in comparisons]
            lines.append(f"| {r['bucket']} | " + " | ".join(cells) + " |")
    return lines


def sparsity_frame(section: dict) -> pd.DataFrame:
    """Long form for ``sparsity.csv``: one line per bucket, model and metric."""
    out = [
        {
            "targets": section["targets"],
            "bucket": r["bucket"],
            "n_users": r["n_users"],
            "model": m,
            "metric": k,
            "mean": v,
        }
        for r in section["buckets"]
        for m, per in r["means"].items()
        for k, v in per.items()
    ]
    return pd.DataFrame(out, columns=["targets", "bucket", "n_users", "model", "metric", "mean"])


def _diff_cell(t: dict | None) -> str:
    if not t or t.get("n", 0) < 2:
        return "–"
    return f"{t['mean_diff']:+.4f} ({t['t_pvalue']:.2g})"
