"""Splits for the cold-start protocols.

- :func:`cold_item_loo`: a random fraction of the items is held out of training entirely (their interactions are
  valid/test targets, half of the held-out items for validation and half for test, as in
  :func:`fedvlr_plus.datasets.splits.cold_item_split`); the warm interactions are split leave-one-out by time, so
  the same test also holds warm targets for every user who has any.
- :func:`cold_user_holdout`: a random fraction of the users is held out of federated training entirely; the rest
  are split leave-one-out. The held-out users' histories are kept for :func:`support_query`.
- :func:`support_query`: a held-out user's first ``n`` interactions by time are the support (train), the rest the
  query (test).
"""

from __future__ import annotations

import numpy as np

from ..datasets import InteractionData
from ..datasets.core import TEST, TRAIN, VALID, DataError


def _loo_labels(user: np.ndarray, ts: np.ndarray, n_users: int) -> np.ndarray:
    """Leave-one-out labels by time (stable on ties) for users with >= 3 rows; others stay train."""
    order = np.lexsort((np.arange(len(user)), ts, user))
    su = user[order]
    counts = np.bincount(su, minlength=n_users)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    from_end = counts[su] - 1 - (np.arange(len(order)) - starts[su])
    lab = np.full(len(order), TRAIN, np.int8)
    ok = counts[su] >= 3
    lab[ok & (from_end == 0)] = TEST
    lab[ok & (from_end == 1)] = VALID
    out = np.empty(len(order), np.int8)
    out[order] = lab
    return out


def cold_item_loo(data: InteractionData, fraction: float = 0.2, *, seed: int = 0) -> InteractionData:
    """Hold ``fraction`` of the items out of training; leave-one-out on the warm interactions."""
    if not 0 < fraction < 1:
        raise ValueError(f"the cold-item fraction must be in (0, 1), got {fraction}")
    present = np.unique(data.inter["item"].to_numpy())
    n_cold = max(2, int(round(fraction * len(present))))
    if n_cold >= len(present):
        raise DataError(f"{data.source or data.name}: {len(present)} items are too few to hold {fraction:.0%} out")
    cold = np.random.default_rng(seed).permutation(present)[:n_cold]
    code = np.full(data.n_items, -1, np.int8)
    code[cold[: n_cold // 2]] = VALID
    code[cold[n_cold // 2 :]] = TEST
    item = data.inter["item"].to_numpy()
    labels = code[item]
    warm = labels < 0
    labels[warm] = _loo_labels(
        data.inter["user"].to_numpy()[warm], data.inter["timestamp"].to_numpy()[warm], data.n_users
    )
    out = data.replace(inter=data.inter.assign(split=labels))
    out.require_split(need=("train", "valid", "test"))
    return out


def cold_user_holdout(
    data: InteractionData, fraction: float = 0.2, *, seed: int = 0, min_history: int = 6
) -> tuple[InteractionData, np.ndarray]:
    """``(warm data split leave-one-out, held-out user ids)``. Held-out users are drawn among users with at least
    ``min_history`` interactions (support + at least one query item); their rows are absent from the warm data."""
    if not 0 < fraction < 1:
        raise ValueError(f"the cold-user fraction must be in (0, 1), got {fraction}")
    counts = np.bincount(data.inter["user"].to_numpy(), minlength=data.n_users)
    present = np.flatnonzero(counts > 0)
    eligible = np.flatnonzero(counts >= min_history)
    n_cold = min(len(eligible), max(2, int(round(fraction * len(present)))))
    if n_cold < 2:
        raise DataError(f"{data.source or data.name}: fewer than 2 users have {min_history} interactions")
    cold = np.sort(np.random.default_rng(seed).permutation(eligible)[:n_cold])
    user = data.inter["user"].to_numpy()
    keep = ~np.isin(user, cold)
    inter = data.inter[keep].reset_index(drop=True)
    labels = _loo_labels(inter["user"].to_numpy(), inter["timestamp"].to_numpy(), data.n_users)
    warm = data.replace(inter=inter.assign(split=labels))
    warm.require_split(need=("train", "valid", "test"))
    return warm, cold


def support_query(data: InteractionData, users: np.ndarray, n_support: int) -> InteractionData:
    """Only ``users``' rows: the first ``n_support`` by time are train (support), the rest test (query)."""
    if n_support < 1:
        raise ValueError(f"support size must be >= 1, got {n_support}")
    inter = data.inter[np.isin(data.inter["user"].to_numpy(), users)].reset_index(drop=True)
    user = inter["user"].to_numpy()
    order = np.lexsort((np.arange(len(inter)), inter["timestamp"].to_numpy(), user))
    su = user[order]
    counts = np.bincount(su, minlength=data.n_users)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pos = np.arange(len(order)) - starts[su]
    lab = np.where(pos < n_support, TRAIN, TEST).astype(np.int8)
    labels = np.empty(len(order), np.int8)
    labels[order] = lab
    out = data.replace(inter=inter.assign(split=labels))
    out.require_split(need=("train", "test"))
    return out
