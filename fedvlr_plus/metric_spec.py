"""Metric lists as users write them (``hr@10,ndcg@50``): parsed into metric names, cut-offs and keys.

Torch- and numpy-free: the command line checks ``--metrics`` with it while it is parsed. A malformed list raises
``ValueError`` with one sentence that says what is wrong.
"""

from __future__ import annotations

METRIC_NAMES = ("hr", "ndcg", "recall", "mrr")
DEFAULT_METRICS = "hr@10,ndcg@10,hr@50,ndcg@50"


def parse_metrics(text: str) -> tuple[tuple[str, ...], tuple[int, ...], list[str]]:
    """``"hr@10,ndcg@50"`` -> (metric names, cut-offs, the requested keys in order)."""
    names, ks, keys = [], [], []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        name, k = metric_at_k(part)
        names.append(name)
        ks.append(k)
        keys.append(f"{name}@{k}")
    if not keys:
        raise ValueError("no metric given (e.g. hr@10,ndcg@10)")
    return tuple(dict.fromkeys(names)), tuple(sorted(set(ks))), keys


def metric_at_k(part: str) -> tuple[str, int]:
    """One ``metric@K`` (already lower-cased) -> (metric name, K)."""
    if "@" not in part:
        raise ValueError(f"metric {part!r} needs a cut-off, e.g. {part}@10")
    name, k = part.split("@", 1)
    if name not in METRIC_NAMES:
        raise ValueError(f"unknown metric {name!r} ({', '.join(METRIC_NAMES)})")
    try:
        k_int = int(k)
    except ValueError:
        raise ValueError(f"cut-off of {part!r} is not an integer") from None
    if k_int < 1:
        raise ValueError(f"cut-off of {part!r} must be >= 1")
    return name, k_int
