"""Preprocessing and splits. Every function takes and returns an :class:`InteractionData` (never in place).

- :func:`implicit` keeps interactions with rating >= threshold (implicit feedback) and sets ratings to 1.
- :func:`dedup` removes repeated (user, item) pairs, keeping the earliest (default) or the latest.
- :func:`k_core` iteratively removes users and items with fewer than k interactions.
- :func:`leave_one_out` per user by time: last = test, second-to-last = valid, the rest = train.
- :func:`ratio_split` by time, per user (default) or by a global time cut.
- :func:`cold_item_split` / :func:`cold_user_split` hold a fraction of items / users out of training entirely.
- :func:`predefined` keeps split labels that came with the data (e.g. a feature folder's ``split_label``).

Ties in time are broken by the original row order (a stable sort), so splits are deterministic.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .core import TEST, TRAIN, UNSPLIT, VALID, DataError, InteractionData, compact
from .sanity import dropped_duplicates, k_core_cut, merge_notes


def implicit(data: InteractionData, threshold: float | None = None) -> InteractionData:
    """Keep interactions with ``rating >= threshold`` (all when None) and set their rating to 1."""
    inter = data.inter
    if threshold is not None:
        inter = inter[inter["rating"].to_numpy() >= threshold]
    inter = inter.assign(rating=np.float32(1.0)).reset_index(drop=True)
    return data.replace(inter=inter)


def dedup(data: InteractionData, keep: str = "first") -> InteractionData:
    """Remove repeated (user, item) pairs, keeping the earliest (``first``) or latest (``last``) by time.

    The count removed (and the split labels those rows carried) is recorded in ``notes`` as
    ``duplicates_dropped``, so :meth:`InteractionData.sanity` reports it.
    """
    if keep not in ("first", "last"):
        raise ValueError("keep must be 'first' or 'last'")
    order = np.lexsort((np.arange(len(data.inter)), data.inter["timestamp"].to_numpy()))
    inter = data.inter.iloc[order]
    repeated = inter.duplicated(["user", "item"], keep=keep).to_numpy()
    notes = data.notes
    if repeated.any():
        notes = merge_notes(
            notes, dropped_duplicates(inter["split"].to_numpy()[repeated], "earliest" if keep == "first" else "latest")
        )
    inter = inter[~repeated]
    return data.replace(inter=inter.sort_index().reset_index(drop=True), notes=notes)


def k_core(data: InteractionData, k: int = 5, *, users: bool = True, items: bool = True) -> InteractionData:
    """Iteratively drop users/items with fewer than ``k`` interactions, then renumber ids contiguously."""
    inter = data.inter
    while True:
        keep = np.ones(len(inter), bool)
        if users:
            cu = inter.groupby("user")["item"].transform("size").to_numpy()
            keep &= cu >= k
        if items:
            ci = inter.groupby("item")["user"].transform("size").to_numpy()
            keep &= ci >= k
        if keep.all():
            break
        inter = inter[keep]
    if len(inter) == 0:
        raise DataError(f"{data.source or data.name}: no interaction survives the {k}-core filter")
    notes = [*data.notes, k_core_cut(k, data.inter, inter)] if len(inter) < len(data.inter) else data.notes
    return compact(data.replace(inter=inter.reset_index(drop=True), notes=notes))


def _time_order(inter: pd.DataFrame) -> np.ndarray:
    """Row order by (user, timestamp, original row): stable and deterministic."""
    return np.lexsort((np.arange(len(inter)), inter["timestamp"].to_numpy(), inter["user"].to_numpy()))


def leave_one_out(data: InteractionData, *, min_train: int = 1) -> InteractionData:
    """Per user, by time: the last interaction is test, the second-to-last valid, the rest train.

    Users with fewer than ``min_train + 2`` interactions keep everything in train (they can still be
    trained on but are not evaluated), which is the usual leave-one-out convention.
    """
    inter = data.inter
    order = _time_order(inter)
    sorted_users = inter["user"].to_numpy()[order]
    counts = np.bincount(sorted_users, minlength=data.n_users)
    # position of each sorted row counted from the end of its user's history (0 = last)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pos = np.arange(len(order)) - starts[sorted_users]
    from_end = counts[sorted_users] - 1 - pos
    split = np.full(len(order), TRAIN, np.int8)
    eligible = counts[sorted_users] >= min_train + 2
    split[eligible & (from_end == 0)] = TEST
    split[eligible & (from_end == 1)] = VALID
    labels = np.empty(len(order), np.int8)
    labels[order] = split
    out = data.replace(inter=inter.assign(split=labels))
    if not (labels == TEST).any():
        raise DataError(
            f"{data.source or data.name}: leave-one-out left the test split empty "
            f"(no user has {min_train + 2} or more interactions)"
        )
    return out


def ratio_split(data: InteractionData, ratios=(0.8, 0.1, 0.1), *, by: str = "user") -> InteractionData:
    """Split by time into train/valid/test fractions, per user (``by='user'``) or by a global time cut."""
    r = np.asarray(ratios, dtype=np.float64)
    if len(r) != 3 or (r < 0).any() or r.sum() <= 0:
        raise ValueError("ratios must be three non-negative numbers")
    r = r / r.sum()
    inter = data.inter
    labels = np.empty(len(inter), np.int8)
    if by == "user":
        order = _time_order(inter)
        su = inter["user"].to_numpy()[order]
        counts = np.bincount(su, minlength=data.n_users)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        pos = np.arange(len(order)) - starts[su]
        n = counts[su]
        n_train = np.floor(n * r[0] + 1e-9).astype(np.int64)
        n_valid = np.floor(n * (r[0] + r[1]) + 1e-9).astype(np.int64)
        lab = np.where(pos < n_train, TRAIN, np.where(pos < n_valid, VALID, TEST)).astype(np.int8)
        labels[order] = lab
    elif by == "time":
        order = np.lexsort((np.arange(len(inter)), inter["timestamp"].to_numpy()))
        n = len(order)
        c1, c2 = int(np.floor(n * r[0])), int(np.floor(n * (r[0] + r[1])))
        lab = np.full(n, TEST, np.int8)
        lab[:c1] = TRAIN
        lab[c1:c2] = VALID
        labels[order] = lab
    else:
        raise ValueError("by must be 'user' or 'time'")
    out = data.replace(inter=inter.assign(split=labels))
    if not (labels == TEST).any():
        raise DataError(f"{data.source or data.name}: the ratio split {tuple(ratios)} left the test split empty")
    return out


def predefined(data: InteractionData) -> InteractionData:
    """Use the split labels the data came with; every row must carry one."""
    if not data.is_split:
        rows = np.flatnonzero(data.inter["split"].to_numpy() == UNSPLIT)
        raise DataError(f"{data.source or data.name}: {len(rows)} rows have no split label (first: row {rows[0]})")
    return data


def cold_item_split(
    data: InteractionData, fraction: float = 0.2, *, seed: int = 0, valid_fraction: float = 0.5
) -> InteractionData:
    """Hold a random ``fraction`` of items out of training entirely.

    Every interaction with a held-out item goes to valid or test: the held-out items themselves are split
    ``valid_fraction`` / rest between valid and test (so that model selection sees other cold items than
    the test), all other interactions are train.
    """
    labels = _held_out_labels(data, "item", data.n_items, fraction, seed, valid_fraction)
    out = data.replace(inter=data.inter.assign(split=labels))
    if not (labels == TEST).any():
        raise DataError(f"{data.source or data.name}: the cold-item split left the test split empty")
    return out


def cold_user_split(
    data: InteractionData, fraction: float = 0.2, *, seed: int = 0, valid_fraction: float = 0.5
) -> InteractionData:
    """Hold a random ``fraction`` of users out of training entirely (their rows become valid or test)."""
    labels = _held_out_labels(data, "user", data.n_users, fraction, seed, valid_fraction)
    return data.replace(inter=data.inter.assign(split=labels))


def _held_out_labels(
    data: InteractionData, column: str, n_ids: int, fraction: float, seed: int, valid_fraction: float
) -> np.ndarray:
    """Each interaction's split when a random ``fraction`` of the ids in ``column`` (at least two) is held out of
    training: the first ``valid_fraction`` of the held-out ids (in the seeded draw's order) go to valid, the rest
    to test, every other interaction to train."""
    if not 0 < fraction < 1:
        raise ValueError("fraction must be in (0, 1)")
    rng = np.random.default_rng(seed)
    present = np.unique(data.inter[column].to_numpy())
    n_held = max(2, int(round(fraction * len(present))))
    held = rng.permutation(present)[:n_held]
    n_valid = int(round(valid_fraction * n_held))
    code = np.full(n_ids, TRAIN, np.int8)
    code[held[:n_valid]] = VALID
    code[held[n_valid:]] = TEST
    return code[data.inter[column].to_numpy()]


def standard(
    data: InteractionData,
    *,
    threshold: float | None = None,
    k: int = 0,
    split: str = "loo",
    keep: str = "first",
    seed: int = 0,
) -> InteractionData:
    """The usual pipeline: implicit feedback, dedup, k-core, then the named split.

    ``split``: ``loo`` (leave-one-out by time), ``ratio`` (8:1:1 per user by time), ``predefined``,
    ``cold-items`` or ``cold-users`` (20 %).
    """
    if split == "predefined":
        return predefined(data)
    data = dedup(implicit(data, threshold), keep=keep)
    if k and k > 1:
        data = k_core(data, k)
    if split == "loo":
        return leave_one_out(data)
    if split == "ratio":
        return ratio_split(data)
    if split == "cold-items":
        return cold_item_split(data, seed=seed)
    if split == "cold-users":
        return cold_user_split(data, seed=seed)
    raise ValueError(f"unknown split {split!r} (loo, ratio, predefined, cold-items, cold-users)")
