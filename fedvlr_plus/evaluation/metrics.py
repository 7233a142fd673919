"""Rank statistics and top-K metric formulas (HR, NDCG, Recall, MRR) with exact tie handling.

Every evaluated (user, target) pair is summarised by two counts over the user's candidate items:

- ``greater`` (r): candidates whose score is strictly higher than the target's score;
- ``ties`` (g): candidates whose score equals the target's score, the target included. ``g == 0`` means
  the target is not a candidate (it was masked), which makes it a miss; it still counts in the user's
  number of targets.

**Tie policy: expected value over all orderings of tied items** ("expected over random tie orders").
A ranking with ties is scored as the exact expectation of the metric under a uniformly random order
within each group of equal scores, not by putting the target first (optimistic) or last (pessimistic).
Because tie groups are ordered independently, this stays exact with several targets per user:

- Recall and DCG are linear in the per-target hit indicators. A target in a tie group of size g that starts
  after r items is at a position uniform on r+1..r+g, so P(position <= K) = s/g with s = clamp(K - r, 0, g)
  and E[discount] = (D(r + s) - D(r)) / g, where D(n) = sum_{p<=n} 1/log2(p+1).
- HR: the user misses iff no target lands in the top K. For a tie group holding m targets, s of its g slots
  are inside the top K and P(none of the m targets in those s slots) = C(g-m, s) / C(g, s); groups are
  independent, so HR = 1 - prod over target tie groups of C(g-m, s) / C(g, s).
- MRR: the first relevant item lies in the target tie group with the highest score (r, g, m). The smallest
  of m uniformly random distinct positions among r+1..r+g is r+j with probability C(g-j, m-1) / C(g, m),
  so MRR@K = sum_{j: r+j <= K} C(g-j, m-1) / C(g, m) / (r+j).

Formulas: HR@K (hit ratio, e.g. He et al., "Neural Collaborative Filtering", WWW 2017), NDCG@K with binary
relevance and the ideal DCG over min(#targets, K) positions (Järvelin & Kekäläinen, "Cumulated gain-based
evaluation of IR techniques", TOIS 2002), Recall@K = hits / #targets, MRR@K = 1 / rank of the first relevant
item if it is within the top K, else 0. All values are fractions in [0, 1].
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

TIE_POLICY = "expected over random tie orders"
METRICS = ("hr", "ndcg", "recall", "mrr")
NUMPY_SORT_ON_CPU = True  # False: sort with torch everywhere (the accelerator path); results are identical


def check_ks_metrics(ks: Iterable[int], metrics: Iterable[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Normalise and validate the K list and metric names (raise ValueError with the bad value)."""
    if isinstance(ks, (int, np.integer)):
        ks = (ks,)
    ks = tuple(int(k) for k in ks)
    if not ks:
        raise ValueError("ks must hold at least one cut-off K")
    for k in ks:
        if k < 1:
            raise ValueError(f"every K must be >= 1, got {k}")
    if isinstance(metrics, str):
        metrics = (metrics,)
    metrics = tuple(str(m).lower() for m in metrics)
    if not metrics:
        raise ValueError("metrics must name at least one metric")
    for m in metrics:
        if m not in METRICS:
            raise ValueError(f"unknown metric {m!r}; choose from {', '.join(METRICS)}")
    return ks, metrics


def metric_columns(ks: Sequence[int], metrics: Sequence[str]) -> list[str]:
    """Column names in result order: for each K, each metric (``hr@10, ndcg@10, ..., hr@50, ...``)."""
    return [f"{m}@{k}" for k in ks for m in metrics]


def _discount_prefix(n: int) -> np.ndarray:
    """D[i] = sum_{p=1}^{i} 1/log2(p+1), D[0] = 0."""
    out = np.zeros(n + 1, np.float64)
    out[1:] = np.cumsum(1.0 / np.log2(np.arange(2, n + 2, dtype=np.float64)))
    return out


def _harmonic_prefix(n: int) -> np.ndarray:
    """H[i] = sum_{p=1}^{i} 1/p, H[0] = 0."""
    out = np.zeros(n + 1, np.float64)
    out[1:] = np.cumsum(1.0 / np.arange(1, n + 1, dtype=np.float64))
    return out


def _first_of_min_prob(g: int, m: int) -> np.ndarray:
    """P(min of m distinct uniform positions among 1..g equals j), j = 1..g-m+1: C(g-j, m-1) / C(g, m)."""
    j = np.arange(1, g - m + 2, dtype=np.float64)
    # ratio of binomials via a running product keeps this exact enough for large g (no overflow)
    # C(g-j, m-1)/C(g, m) = m/g * prod_{i=1}^{m-1} (g-j-i+1)/(g-i)
    p = np.full(len(j), m / g)
    for i in range(1, m):
        p *= (g - j - i + 1) / (g - i)
    return p


def expected_metrics(
    pair_user: np.ndarray,
    greater: np.ndarray,
    ties: np.ndarray,
    n_targets: np.ndarray,
    ks: Sequence[int],
    metrics: Sequence[str],
) -> dict[str, np.ndarray]:
    """Per-user metric values (expected over random tie orders) from per-pair rank statistics.

    Args:
        pair_user: ``[P]`` row of the user (0..U-1) each (user, target) pair belongs to.
        greater: ``[P]`` candidates scored strictly above the target (r).
        ties: ``[P]`` candidates scored equal to the target, itself included (g); 0 = target masked (a miss).
        n_targets: ``[U]`` number of targets per user (the Recall denominator and the NDCG ideal length);
            users with 0 targets get 0 for every metric.
        ks, metrics: cut-offs and metric names (see :data:`METRICS`).

    Returns:
        ``{"hr@10": [U], ...}`` in :func:`metric_columns` order.
    """
    ks, metrics = check_ks_metrics(ks, metrics)
    pair_user = np.asarray(pair_user, np.int64)
    r_all = np.asarray(greater, np.int64)
    g_all = np.asarray(ties, np.int64)
    n_targets = np.asarray(n_targets, np.int64)
    _check_pair_stats(pair_user, r_all, g_all, n_targets)
    n_users = len(n_targets)

    # Masked targets (g == 0) never hit; drop them from every numerator.
    keep = g_all > 0
    u, r, g = pair_user[keep], r_all[keep], g_all[keep]
    top = int(max(int((r + g).max()) if len(r) else 0, int(n_targets.max()) if n_users else 0, 1))
    D = _discount_prefix(top)
    H = _harmonic_prefix(top)
    denom = np.maximum(n_targets, 1).astype(np.float64)
    groups = _TieGroups.of(u, r, g)

    out: dict[str, np.ndarray] = {}
    for k in ks:
        s = np.clip(k - r, 0, g)  # slots of the target's tie group inside the top K
        for name in metrics:
            if name == "recall":
                val = np.bincount(u, weights=s / g, minlength=n_users) / denom
            elif name == "ndcg":
                dcg = np.bincount(u, weights=(D[r + s] - D[r]) / g, minlength=n_users)
                idcg = D[np.minimum(n_targets, k)]
                val = np.divide(dcg, idcg, out=np.zeros(n_users), where=idcg > 0)
            elif name == "hr":
                val = _expected_hit(groups, k, n_targets)
            elif name == "mrr":
                val = _expected_reciprocal_rank(groups, k, H, n_users)
            else:  # pragma: no cover - check_ks_metrics rejects it
                raise AssertionError(name)
            out[f"{name}@{k}"] = val
    return {c: out[c] for c in metric_columns(ks, metrics)}


def _check_pair_stats(pair_user: np.ndarray, greater: np.ndarray, ties: np.ndarray, n_targets: np.ndarray) -> None:
    n_users = len(n_targets)
    if not (len(pair_user) == len(greater) == len(ties)):
        raise ValueError("pair_user, greater and ties must have the same length")
    if len(pair_user) and (pair_user.min() < 0 or pair_user.max() >= n_users):
        raise ValueError("pair_user holds a row outside 0..len(n_targets)-1")
    if (greater < 0).any() or (ties < 0).any():
        raise ValueError("greater and ties must be non-negative counts")
    if len(pair_user) and (np.bincount(pair_user, minlength=n_users) > n_targets).any():
        raise ValueError("a user has more (user, target) pairs than n_targets")


@dataclass(frozen=True)
class _TieGroups:
    """A user's targets that tie with each other: equal scores <=> equal r (and then equal g) within a user.

    One entry per group, sorted by user then r: the user ``u``, the candidates above it ``r``, its tie
    group size ``g`` (targets included), the number of targets in it ``m``, and ``first`` (the user's
    best-ranked group).
    """

    u: np.ndarray
    r: np.ndarray
    g: np.ndarray
    m: np.ndarray
    first: np.ndarray

    @classmethod
    def of(cls, u: np.ndarray, r: np.ndarray, g: np.ndarray) -> _TieGroups:
        order = np.lexsort((r, u))
        u_s, r_s, g_s = u[order], r[order], g[order]
        new_group = np.ones(len(u_s), bool)
        if len(u_s) > 1:
            new_group[1:] = (u_s[1:] != u_s[:-1]) | (r_s[1:] != r_s[:-1])
        starts = np.flatnonzero(new_group)
        grp_u = u_s[starts]
        first = np.ones(len(starts), bool)
        if len(starts) > 1:
            first[1:] = grp_u[1:] != grp_u[:-1]
        return cls(grp_u, r_s[starts], g_s[starts], np.diff(np.append(starts, len(u_s))), first)


def _expected_hit(groups: _TieGroups, k: int, n_targets: np.ndarray) -> np.ndarray:
    """HR@k per user: 1 - P(no target in the top k) over random tie orders."""
    grp_g, grp_m = groups.g, groups.m
    max_m = int(grp_m.max()) if len(grp_m) else 0
    gs = np.clip(k - groups.r, 0, grp_g)
    # P(no target of the group in its s top-K slots) = prod_{i<m} (g-s-i)/(g-i)
    p_none = np.ones(len(grp_g))
    for i in range(max_m):
        active = grp_m > i
        p_none[active] *= np.maximum(grp_g[active] - gs[active] - i, 0) / (grp_g[active] - i)
    miss = np.ones(len(n_targets))
    np.multiply.at(miss, groups.u, p_none)
    val = 1.0 - miss
    val[n_targets == 0] = 0.0
    return val


def _expected_reciprocal_rank(groups: _TieGroups, k: int, H: np.ndarray, n_users: int) -> np.ndarray:
    """MRR@k per user: the expected 1/rank of the user's first target, 0 beyond k."""
    first = groups.first
    fr, fg, fm, fu = groups.r[first], groups.g[first], groups.m[first], groups.u[first]
    mrr = np.zeros(len(fr))
    one = fm == 1
    hi = np.minimum(fr[one] + fg[one], k)
    mrr[one] = np.where(fr[one] < k, (H[np.maximum(hi, fr[one])] - H[fr[one]]) / fg[one], 0.0)
    for idx in np.flatnonzero(~one):  # several targets tied at the top: exact small sum
        rr, gg, mm = int(fr[idx]), int(fg[idx]), int(fm[idx])
        if rr >= k:
            continue
        p = _first_of_min_prob(gg, mm)
        pos = rr + np.arange(1, len(p) + 1)
        inside = pos <= k
        mrr[idx] = float(np.sum(p[inside] / pos[inside]))
    val = np.zeros(n_users)
    val[fu] = mrr
    return val


def rank_counts(target_scores, candidate_scores):
    """``greater`` and ``ties`` of each target among its candidates (NaN candidates are not candidates).

    ``target_scores``: ``[P]``; ``candidate_scores``: ``[P, C]`` (torch tensors or numpy arrays). A NaN
    target score marks a masked target and yields ``ties = 0``. Masked candidates are NaN, so they fail both
    comparisons and drop out without a separate boolean mask.
    """
    import torch

    t = torch.as_tensor(target_scores)
    c = torch.as_tensor(candidate_scores)
    greater = (c > t[:, None]).sum(dim=1)
    ties = (c == t[:, None]).sum(dim=1)
    return greater.cpu().numpy().astype(np.int64), ties.cpu().numpy().astype(np.int64)


def _on_device(ids, dev):
    """Target ids as an int64 tensor on ``dev``; an array is copied first, since the split's arrays are read-only
    and torch warns about every such array it is handed."""
    import torch

    if isinstance(ids, torch.Tensor):
        return ids.to(dev)
    return torch.from_numpy(np.array(ids, dtype=np.int64)).to(dev)


def masked_rank_counts(scores, masked, pair_rows, pair_items):
    """``greater``/``ties`` for targets ranked against whole score rows with some items masked out.

    ``scores``: ``[B, n]`` float tensor without NaN; ``masked``: ``[B, n]`` bool (True = not a candidate);
    ``pair_rows`` / ``pair_items``: ``[P]`` row and item of each target. Returns ``(greater, ties, n_candidates)``
    as numpy int64 arrays (``ties = 0`` for a masked target). Cost O(B n log n + P log n): every row is sorted once
    and each target is located by binary search, instead of comparing every target with every item.
    """
    import torch

    dev = scores.device
    n = scores.shape[1]
    n_masked = masked.sum(dim=1)
    # Masked items go to -inf so they are never above a target; when the target itself scores -inf the masked
    # items would join its tie group, so they are subtracted again below.
    S = scores.masked_fill(masked, float("-inf"))
    if S.device.type == "cpu" and NUMPY_SORT_ON_CPU:
        srt = torch.from_numpy(np.sort(S.numpy(), axis=1))  # numpy's row sort is several times faster on CPU
    else:
        srt = torch.sort(S, dim=1).values.contiguous()
    rows, items = _on_device(pair_rows, dev), _on_device(pair_items, dev)
    t = scores[rows, items]
    # one padded query row per user (targets of a user side by side) so searchsorted runs batched per row
    counts = torch.bincount(rows, minlength=scores.shape[0])
    col = torch.arange(len(rows), device=dev) - (torch.cumsum(counts, 0) - counts)[rows]  # rows are sorted
    width = int(counts.max()) if len(rows) else 0
    Q = torch.zeros((scores.shape[0], max(width, 1)), dtype=S.dtype, device=dev)
    Q[rows, col] = t
    lo = torch.searchsorted(srt, Q, right=False)[rows, col]  # candidates strictly below t (masked included)
    hi = torch.searchsorted(srt, Q, right=True)[rows, col]  # ... at or below t
    greater = n - hi
    ties = hi - lo - torch.where(torch.isneginf(t), n_masked[rows], torch.zeros_like(lo))
    ties = torch.where(masked[rows, items], torch.zeros_like(ties), ties)
    return (
        greater.cpu().numpy().astype(np.int64),
        ties.cpu().numpy().astype(np.int64),
        (n - n_masked).cpu().numpy().astype(np.int64),
    )
