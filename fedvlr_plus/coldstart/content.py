"""The content-only reference ranker: score = cosine between an item's content and the user's profile, the mean
content vector of the user's training items (the classic content-based profile, e.g. Pazzani & Billsus,
"Content-Based Recommendation Systems", The Adaptive Web, 2007). It needs no training and no ID embedding, so it
ranks cold items exactly like warm ones: the bar any use of content on cold items has to clear."""

from __future__ import annotations

import numpy as np

from .rules import content_matrix


class ContentRanker:
    """Scorer ``users [B] -> [B, n_items]``: cosine of each item with the user's mean training-item content."""

    name = "content"

    def __init__(self, data, views: dict[str, np.ndarray]):
        x = content_matrix(views).astype(np.float32)
        self.items = x
        m = data.matrix(["train"]).tocsr().astype(np.float32)
        prof = np.asarray(m @ x)
        norm = np.linalg.norm(prof, axis=1, keepdims=True)
        self.profiles = np.where(norm > 0, prof / np.maximum(norm, 1e-12), 0.0).astype(np.float32)

    def __call__(self, users) -> np.ndarray:
        return self.profiles[np.asarray(users, np.int64)] @ self.items.T


class RestrictedScorer:
    """Wrap a scorer so that only ``candidates`` (bool [n_items]) can be ranked (others get -inf)."""

    def __init__(self, scorer, candidates: np.ndarray):
        self.scorer = scorer
        self.blocked = ~np.asarray(candidates, dtype=bool)

    def __call__(self, users):
        import torch

        s = self.scorer(users)
        if isinstance(s, torch.Tensor):
            s = s.detach().clone().to(torch.float64)
            s[:, torch.as_tensor(self.blocked)] = -torch.inf
            return s
        s = np.array(s, dtype=np.float64, copy=True)
        s[:, self.blocked] = -np.inf
        return s
