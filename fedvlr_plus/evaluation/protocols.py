"""Ranking evaluation protocols: full-sort over the catalogue and the sampled-negative (e.g. 99) protocol.

- ``protocol="full"`` (all-item ranking with the user's training items masked, as in FedVLR / MMRec and the
  FedVLR paper's evaluation, docs/method.md, "Evaluation protocol"). Per user, every item is scored; the user's
  TRAIN items are removed from the candidates. With ``split="test"`` the user's valid items stay candidates unless
  ``mask_history="all"`` (then train and valid are masked, which is what RecBole does); ``mask_history="none"``
  masks nothing. Only the (user, item) pairs of the user's own history are masked; no item is masked for
  everyone (masking a whole column would hide that item from every user, as the FedVLR code release did with
  item 0). A target that is itself masked is a miss and still counts in the user's number of targets.
- ``protocol="sampled"`` (leave-one-out with sampled negatives, He et al., "Neural Collaborative Filtering",
  WWW 2017; used by FedNCF, PFedRec, FedRAP). For every (user, target) pair, ``n_negatives`` items are drawn
  uniformly without replacement from the items the user never interacted with in any split, with
  ``numpy.random.default_rng(seed)`` in (user, item) order, so every scorer sees the same negatives. The
  target is ranked among itself and its negatives; metrics are computed per pair and averaged per user.

Targets are the distinct items of the user in ``split``. Ties are scored by the exact expectation over random
tie orders (:mod:`fedvlr_plus.evaluation.metrics`). Users weigh equally in every mean.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..datasets import InteractionData
from ..datasets.core import DataError
from .metrics import TIE_POLICY, check_ks_metrics, expected_metrics, masked_rank_counts, metric_columns, rank_counts
from .results import EvalResult
from .row_ranks import TENSOR_COMPARE_UP_TO, compared_rank_counts, tensor_rank_counts

Scorer = Callable[[np.ndarray], np.ndarray | torch.Tensor]
"""int64 user ids ``[B]`` -> scores ``[B, n_items]``, higher is better (+-inf allowed, NaN is an error). May also offer
``score_items(users [B], items [B, C]) -> [B, C]``, which the sampled protocol uses when present."""

PROTOCOLS = ("full", "sampled")
#: the most scores (float32: 16 MB) one full-protocol batch holds by default: a larger block is mapped fresh from
#: the system at every batch (glibc maps blocks over 32 MB anew), and faulting its pages in cost a third of a
#: 35,598-user evaluation's CPU time on the development machine
SCORE_BATCH_FLOATS = 1 << 22
MASK_HISTORY = ("train", "all", "none")


def evaluate(
    data: InteractionData,
    scorer: Scorer,
    *,
    split: str = "test",
    protocol: str = "full",
    ks=(10, 50),
    metrics=("hr", "ndcg", "recall", "mrr"),
    mask_history: str = "train",
    n_negatives: int = 99,
    seed: int = 0,
    batch_size: int | None = None,
    cache: dict | None = None,
) -> EvalResult:
    """Evaluate ``scorer`` on the users with at least one interaction in ``split``.

    Args:
        data: a split :class:`~fedvlr_plus.datasets.InteractionData` (train plus the evaluated split non-empty).
        scorer: int64 user ids ``[B]`` -> scores ``[B, n_items]`` (numpy or torch; higher = better; no NaN).
        split: ``"test"`` or ``"valid"``.
        protocol: ``"full"`` (rank all items, history masked) or ``"sampled"`` (target vs ``n_negatives``).
        ks, metrics: cut-offs and metric names from ``hr, ndcg, recall, mrr``. K may exceed the candidates.
        mask_history: full protocol only. ``"train"`` masks the user's training items; ``"all"`` masks
            every split before ``split`` (train + valid at test, train at valid); ``"none"`` masks nothing.
        n_negatives, seed: sampled protocol only.
        batch_size: users per scorer call (default: 512, fewer where a full-protocol batch of scores would pass
            ``SCORE_BATCH_FLOATS``).
        cache: a dict the caller keeps across calls on unchanged data: targets and masks are read once.

    Returns:
        :class:`EvalResult` with per-user values for all, warm and cold targets. Tie policy: expected value over
        random orderings of tied scores.
    """
    ks, metrics = check_ks_metrics(ks, metrics)
    batch_size = users_per_batch(protocol, data.n_items) if batch_size is None else batch_size
    _check_options(split, protocol, mask_history, batch_size, n_negatives)
    _cached(cache, ("checked", split), lambda: data.require_split(need=("train", split)))
    pairs = _cached(cache, ("pairs", split), lambda: _TargetPairs.of(data, split))
    meta = {
        "protocol": protocol,
        "split": split,
        "ks": list(ks),
        "metrics": list(metrics),
        "seed": int(seed),
        "tie_policy": TIE_POLICY,
        "n_items": int(data.n_items),
    }
    if protocol == "full":
        mask_splits = {"train": ["train"], "none": [], "all": ["train", "valid"] if split == "test" else ["train"]}[
            mask_history
        ]
        mask = _cached(cache, ("mask", *mask_splits), lambda: data.matrix(mask_splits) if mask_splits else None)
        frames, n_cand = _evaluate_full(data, scorer, pairs, mask, ks, metrics, int(batch_size))
        meta.update(mask_history=mask_history, masked_splits=mask_splits)
    else:
        frames, n_cand = _evaluate_sampled(data, scorer, pairs, int(n_negatives), seed, ks, metrics, int(batch_size))
        meta.update(n_negatives=int(n_negatives))
    meta["n_candidates"] = n_cand
    meta["mean_candidates"] = float(n_cand.mean()) if len(n_cand) else float("nan")
    return EvalResult(frames[0], frames[1], frames[2], metric_names=metric_columns(ks, metrics), meta=meta)


def _cached(cache: dict | None, key: tuple, make):
    """``make()``, kept in ``cache`` under ``key`` where the caller keeps one."""
    if cache is None:
        return make()
    if key not in cache:
        cache[key] = make()
    return cache[key]


def users_per_batch(protocol: str, n_items: int) -> int:
    """Users per scorer call by default: 512, or as many as keep a full-protocol batch within
    ``SCORE_BATCH_FLOATS`` scores."""
    if protocol != "full":
        return 512
    return int(min(512, max(1, SCORE_BATCH_FLOATS // max(int(n_items), 1))))


def _check_options(split: str, protocol: str, mask_history: str, batch_size: int, n_negatives: int) -> None:
    if split not in ("valid", "test"):
        raise ValueError(f"split must be 'valid' or 'test', got {split!r}")
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    if mask_history not in MASK_HISTORY:
        raise ValueError(f"mask_history must be one of {', '.join(MASK_HISTORY)}, got {mask_history!r}")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if protocol == "sampled" and int(n_negatives) < 1:
        raise ValueError(f"n_negatives must be >= 1, got {n_negatives}")


@dataclass(frozen=True)
class _TargetPairs:
    """The distinct (user, target item) pairs of a split, sorted by user then item.

    ``users``: the evaluated users (sorted ids); ``row``: each pair's index into ``users``; ``user`` /
    ``item``: each pair's ids; ``cold``: the target never occurs in training.
    """

    users: np.ndarray
    row: np.ndarray
    user: np.ndarray
    item: np.ndarray
    cold: np.ndarray

    @classmethod
    def of(cls, data: InteractionData, split: str) -> _TargetPairs:
        tgt = data.part(split)[["user", "item"]].drop_duplicates().sort_values(["user", "item"], kind="stable")
        pair_user_id = tgt["user"].to_numpy(np.int64)
        pair_item = tgt["item"].to_numpy(np.int64)
        users, pair_row = np.unique(pair_user_id, return_inverse=True)
        return cls(users, pair_row.astype(np.int64), pair_user_id, pair_item, data.cold_items()[pair_item])

    def selections(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Masks over pairs: all targets, warm targets, cold targets."""
        return np.ones(len(self.row), bool), ~self.cold, self.cold


def _evaluate_full(data, scorer, pairs: _TargetPairs, mask, ks, metrics, batch_size):
    """Per-user frames (all, warm, cold) and candidates per user, ranking every item (``mask``: the masked history
    as a users x items CSR matrix, or None)."""
    greater, ties, n_cand = _full_rank_stats(data, scorer, pairs.users, pairs.row, pairs.item, mask, batch_size)
    frames = [_per_user_full(pairs.users, pairs.row, greater, ties, sel, ks, metrics) for sel in pairs.selections()]
    return frames, n_cand


def _evaluate_sampled(data, scorer, pairs: _TargetPairs, n_negatives, seed, ks, metrics, batch_size):
    """Per-user frames (all, warm, cold) and candidates per user, ranking each target among its negatives."""
    neg = sample_negatives(data, pairs.user, n_negatives, seed)
    cand = np.concatenate([pairs.item[:, None], neg], axis=1)
    greater, ties = _sampled_rank_stats(scorer, pairs.users, pairs.row, cand, data.n_items, batch_size)
    n_cand = np.full(len(pairs.users), cand.shape[1], np.int64)
    n_pairs = len(pairs.row)
    per_pair = expected_metrics(np.arange(n_pairs), greater, ties, np.ones(n_pairs, np.int64), ks, metrics)
    frames = [_per_user_sampled(pairs.users, pairs.row, per_pair, sel) for sel in pairs.selections()]
    return frames, n_cand


# ---------------------------------------------------------------------- full protocol
def _full_rank_stats(data, scorer, users, pair_row, pair_item, mask, batch_size):
    n_items = data.n_items
    P = len(pair_row)
    greater = np.zeros(P, np.int64)
    ties = np.zeros(P, np.int64)
    n_cand = np.zeros(len(users), np.int64)
    pair_start = np.searchsorted(pair_row, np.arange(len(users) + 1))  # pairs are sorted by user row
    for b0 in range(0, len(users), batch_size):
        b1 = min(b0 + batch_size, len(users))
        bu = users[b0:b1]
        S = _scores(scorer, bu, n_items)
        # only this user's own history is masked: a column masked for everybody would hide that item from every user
        sub = mask[bu] if mask is not None else None
        p0, p1 = int(pair_start[b0]), int(pair_start[b1])
        rows, items = pair_row[p0:p1] - b0, pair_item[p0:p1]
        counts = compared_rank_counts(S, sub, rows, items, total_scores=len(users) * n_items)
        if counts is None:
            few = len(rows) <= TENSOR_COMPARE_UP_TO * max(len(bu), 1)
            counts = (tensor_rank_counts if few else masked_rank_counts)(S, _mask_tensor(sub, S), rows, items)
        greater[p0:p1], ties[p0:p1], n_cand[b0:b1] = counts
    return greater, ties, n_cand


def _mask_tensor(sub, S: torch.Tensor) -> torch.Tensor:
    """The batch's masked (user, item) pairs (CSR ``sub``, or None) as a boolean tensor shaped like ``S``."""
    masked = torch.zeros(S.shape, dtype=torch.bool, device=S.device)
    if sub is not None:
        rows = np.repeat(np.arange(sub.shape[0]), np.diff(sub.indptr))
        masked[
            torch.as_tensor(rows, device=S.device), torch.as_tensor(sub.indices.astype(np.int64), device=S.device)
        ] = True
    return masked


def _per_user_full(users, pair_row, greater, ties, sel, ks, metrics) -> pd.DataFrame:
    n_t = np.bincount(pair_row[sel], minlength=len(users))
    vals = expected_metrics(pair_row[sel], greater[sel], ties[sel], n_t, ks, metrics)
    keep = n_t > 0
    # one frame from all its columns at once: adding them one by one cost a third of a small evaluation
    return pd.DataFrame({"user": users[keep], "n_targets": n_t[keep], **{name: v[keep] for name, v in vals.items()}})


# ---------------------------------------------------------------------- sampled protocol
#: the draws of the last few (positives, pairs, count, seed) asked for: a run evaluates the same split with the same
#: seed every round, and a per-pair draw is a Python loop (a third of an evaluation on a 3k-user set)
_DRAWN: OrderedDict[bytes, np.ndarray] = OrderedDict()
_DRAWN_KEPT = 4


def sample_negatives(data: InteractionData, pair_user: np.ndarray, n_negatives: int, seed: int) -> np.ndarray:
    """``[P, n_negatives]`` distinct items per pair, uniform over items the user never interacted with (any split).

    Pairs are processed in the given order with one ``numpy.random.default_rng(seed)``. The j-th item of the
    user's complement is found from the sorted positives p_0 < p_1 < ... as j + #{i : p_i - i <= j}, so only
    the positives are stored, never the complement. The same inputs give the same draw, which is kept: the key is
    a digest of the positives, the pairs, the count and the seed, so edited data never reads a stale draw.
    """
    pos = data.matrix(["train", "valid", "test", "unsplit"])
    pair_user = np.asarray(pair_user, np.int64)
    key = _draw_key(pos, data.n_items, pair_user, n_negatives, seed)
    if key in _DRAWN:
        _DRAWN.move_to_end(key)
        return _DRAWN[key].copy()
    out = _draw_negatives(data, pos, pair_user, n_negatives, seed)
    _DRAWN[key] = out.copy()
    while len(_DRAWN) > _DRAWN_KEPT:
        _DRAWN.popitem(last=False)
    return out


def _draw_key(pos, n_items: int, pair_user: np.ndarray, n_negatives: int, seed: int) -> bytes:
    digest = hashlib.blake2b(digest_size=20)
    for part in (pos.indptr, pos.indices, pair_user):
        digest.update(np.ascontiguousarray(part, dtype=np.int64).tobytes())
        digest.update(b"|")
    digest.update(f"{n_items}|{n_negatives}|{seed}".encode())
    return digest.digest()


def _draw_negatives(data: InteractionData, pos, pair_user: np.ndarray, n_negatives: int, seed: int) -> np.ndarray:
    """The draw itself (:func:`sample_negatives`)."""
    rng = np.random.default_rng(seed)
    n_items = data.n_items
    out = np.empty((len(pair_user), n_negatives), np.int64)
    for p, u in enumerate(np.asarray(pair_user, np.int64)):
        own = np.sort(pos.indices[pos.indptr[u] : pos.indptr[u + 1]]).astype(np.int64)
        n_free = n_items - len(own)
        if n_free < n_negatives:
            raise DataError(
                f"{data.name}: user {data.user_ids[u]}",
                f"has only {n_free} items it never interacted with; cannot sample {n_negatives} negatives",
                "the sampled protocol needs a larger catalogue; use the full protocol, --protocol full",
            )
        j = rng.choice(n_free, size=n_negatives, replace=False).astype(np.int64)
        shift = own - np.arange(len(own))
        out[p] = j + np.searchsorted(shift, j, side="right")
    return out


def sampled_unavailable(data: InteractionData, n_negatives: int = 99, split: str = "test") -> str | None:
    """Why the sampled protocol cannot run on ``split`` (some user has fewer than ``n_negatives`` items it never
    interacted with: a small catalogue), or None when it can. Reports that add sampled figures beside the full
    ones print this instead of failing."""
    pos = data.matrix(["train", "valid", "test", "unsplit"]).tocsr()
    users = np.unique(data.part(split)["user"].to_numpy(np.int64))
    if not len(users):
        return None
    free = data.n_items - np.diff(pos.indptr)[users]
    if int(free.min()) >= int(n_negatives):
        return None
    return (
        f"{int((free < n_negatives).sum())} {split} users have fewer than "
        f"{int(n_negatives)} items they never interacted with ({data.n_items} items in all)"
    )


def _sampled_rank_stats(scorer, users, pair_row, cand, n_items, batch_size):
    P = len(pair_row)
    greater = np.zeros(P, np.int64)
    ties = np.zeros(P, np.int64)
    pair_start = np.searchsorted(pair_row, np.arange(len(users) + 1))
    score_items = getattr(scorer, "score_items", None)
    for b0 in range(0, len(users), batch_size):
        b1 = min(b0 + batch_size, len(users))
        p0, p1 = int(pair_start[b0]), int(pair_start[b1])
        items = cand[p0:p1]
        if callable(score_items):
            pu = users[pair_row[p0:p1]]
            with torch.no_grad():
                sc = _as_tensor(score_items(pu, items), (len(pu), items.shape[1]), "scorer.score_items")
            _check_finite(sc, pu)
        else:
            S = _scores(scorer, users[b0:b1], n_items)
            local = torch.as_tensor(pair_row[p0:p1] - b0, device=S.device)
            sc = S[local[:, None], torch.as_tensor(items, device=S.device)]
        greater[p0:p1], ties[p0:p1] = rank_counts(sc[:, 0], sc)
    return greater, ties


def _per_user_sampled(users, pair_row, per_pair: dict, sel) -> pd.DataFrame:
    rows = pair_row[sel]
    n_t = np.bincount(rows, minlength=len(users))
    keep = n_t > 0
    means = {
        name: np.bincount(rows, weights=v[sel], minlength=len(users))[keep] / n_t[keep] for name, v in per_pair.items()
    }
    return pd.DataFrame({"user": users[keep], "n_targets": n_t[keep], **means})


# ---------------------------------------------------------------------- scorer output
def _as_tensor(out, shape, what) -> torch.Tensor:
    """The scorer's output as a detached floating tensor of ``shape``; never modified in place afterwards."""
    if isinstance(out, torch.Tensor):
        S = out.detach()
    else:
        arr = np.asarray(out)
        # torch.from_numpy shares memory and warns on read-only arrays (e.g. np.broadcast_to views): copy those
        S = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
    if tuple(S.shape) != tuple(shape):
        raise ValueError(f"{what} returned shape {tuple(S.shape)}, expected {tuple(shape)}")
    if not S.is_floating_point():
        S = S.to(torch.float64)  # exact for integers below 2**53 (popularity counts, ranks)
    elif S.dtype in (torch.float16, torch.bfloat16):
        S = S.to(torch.float32)  # comparisons are exact after widening; CPU half kernels are incomplete
    return S


def _check_finite(S: torch.Tensor, users) -> None:
    # a NaN makes its row's sum NaN: one reduction clears the usual batch (a NaN sum may also be +inf - inf)
    if not bool(torch.isnan(S.sum(dim=1)).any()):
        return
    bad = torch.isnan(S).any(dim=1)
    if bool(bad.any()):
        row = int(torch.nonzero(bad)[0, 0])
        raise ValueError(f"scorer returned NaN scores for user {int(users[row])}")


def _scores(scorer, users: np.ndarray, n_items: int) -> torch.Tensor:
    with torch.no_grad():
        S = _as_tensor(scorer(users), (len(users), n_items), "scorer")
    _check_finite(S, users)
    return S
