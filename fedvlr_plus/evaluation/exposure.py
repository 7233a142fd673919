"""Exposure of one item: how often it reaches a user's top K, among the users who never interacted with it.

For each such user every item is scored, the user's training items are masked (as at test), and the item's hit
at K is the probability that it ranks in the top K when ties are broken uniformly at random: with ``g`` items
scored higher and ``e`` others tied with it, ``max(0, min(e + 1, K - g)) / (e + 1)`` (the expectation over tie
orders that the library's other metrics use). The exposure at K is the mean hit over those users; an attack that
promotes the item raises it.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch


def item_hits(scores: torch.Tensor, masked: sp.csr_matrix, item: int, ks) -> dict[int, np.ndarray]:
    """Per-user hit probability of ``item`` at each K, from ``scores`` ``[B, n_items]`` with row ``b``'s items
    in ``masked[b]`` excluded (``item`` itself is never excluded)."""
    s = scores.detach().to(torch.float64).clone()
    m = masked.tocoo()
    keep = m.col != item
    s[torch.as_tensor(m.row[keep], dtype=torch.long), torch.as_tensor(m.col[keep], dtype=torch.long)] = -torch.inf
    own = s[:, int(item)].unsqueeze(1)
    higher = (s > own).sum(1).numpy()
    tied = ((s == own).sum(1) - 1).numpy()
    return {int(k): np.clip(k - higher, 0, tied + 1) / (tied + 1) for k in ks}


def non_interacting_users(data, item: int) -> np.ndarray:
    """Users with no interaction with ``item`` in any split (train, valid or test) and some training item."""
    every = data.matrix(["train", "valid", "test"]).tocsc()
    touched = every.indices[every.indptr[item] : every.indptr[item + 1]]
    train = data.matrix(["train"]).tocsr()
    has_train = np.diff(train.indptr) > 0
    users = np.setdiff1d(np.flatnonzero(has_train), touched)
    return users.astype(np.int64)


def exposure(data, score, item: int, ks=(10, 50), chunk: int = 512) -> dict:
    """``{"users": n, "hr@K": mean hit, "per_user": {K: hits}}`` of ``item`` over the users who never
    interacted with it; ``score(users)`` returns their logits for every item."""
    users = non_interacting_users(data, item)
    train = data.matrix(["train"]).tocsr()
    hits = {int(k): [] for k in ks}
    for a in range(0, len(users), chunk):
        part = users[a : a + chunk]
        for k, h in item_hits(score(part), train[part], item, ks).items():
            hits[k].append(h)
    per_user = {k: np.concatenate(v) if v else np.zeros(0) for k, v in hits.items()}
    out = {"users": int(len(users)), "per_user": per_user}
    out.update({f"hr@{k}": float(v.mean()) if len(v) else float("nan") for k, v in per_user.items()})
    return out
