"""Reference rankers to report beside every model: popularity, anti-popularity and random.

- ``pop``: items ranked by their number of training interactions (the classic most-popular baseline, e.g.
  Cremonesi, Koren & Turrin, "Performance of recommender algorithms on top-N recommendation tasks", RecSys 2010).
  Items with equal counts tie and are scored by the evaluator's expected-over-tie-orders policy.
- ``antipop``: fewest training interactions first (items never trained on come first). On KU this exploits a
  split artifact (most cold test targets), so it is the sanity bar every KU figure must be shown against.
- ``random``: i.i.d. uniform scores, seeded per (seed, user) so a user's scores do not depend on batching;
  its expected HR@K under full ranking is K / |candidates|.

Each scorer maps int64 user ids ``[B]`` to ``[B, n_items]`` float64 scores and also offers
``score_items(users [B], items [B, C]) -> [B, C]`` (same values, fewer computed) for the sampled protocol.
"""

from __future__ import annotations

import numpy as np

from ..datasets import InteractionData

RANKERS = ("pop", "antipop", "random")


class _ItemScoreRanker:
    """Same score vector for every user."""

    def __init__(self, name: str, item_scores: np.ndarray):
        self.name = name
        self.item_scores = np.asarray(item_scores, np.float64)

    def __call__(self, users) -> np.ndarray:
        users = np.asarray(users, np.int64)
        return np.broadcast_to(self.item_scores, (len(users), len(self.item_scores))).copy()

    def score_items(self, users, items) -> np.ndarray:
        return self.item_scores[np.asarray(items, np.int64)]

    def __repr__(self):
        return f"<reference ranker {self.name}>"


class _RandomRanker:
    """Uniform [0, 1) scores from ``default_rng([seed, user])``: reproducible and independent of batching."""

    def __init__(self, n_items: int, seed: int):
        self.name = "random"
        self.n_items = int(n_items)
        self.seed = int(seed)

    def _row(self, user: int) -> np.ndarray:
        return np.random.default_rng([self.seed, int(user)]).random(self.n_items)

    def __call__(self, users) -> np.ndarray:
        users = np.asarray(users, np.int64)
        out = np.empty((len(users), self.n_items), np.float64)
        for i, u in enumerate(users):
            out[i] = self._row(u)
        return out

    def score_items(self, users, items) -> np.ndarray:
        users = np.asarray(users, np.int64)
        items = np.asarray(items, np.int64)
        return (
            np.stack([self._row(u)[it] for u, it in zip(users, items)])
            if len(users)
            else np.zeros(items.shape, np.float64)
        )

    def __repr__(self):
        return f"<reference ranker random seed={self.seed}>"


def reference_scorer(name: str, data: InteractionData, seed: int = 0):
    """A reference :data:`~fedvlr_plus.evaluation.protocols.Scorer`: ``"pop"``, ``"antipop"`` or ``"random"``.

    Popularity is counted on the TRAIN split only (valid/test interactions would leak the targets).
    """
    if name == "pop":
        return _ItemScoreRanker("pop", data.item_popularity("train").astype(np.float64))
    if name == "antipop":
        return _ItemScoreRanker("antipop", -data.item_popularity("train").astype(np.float64))
    if name == "random":
        return _RandomRanker(data.n_items, seed)
    raise ValueError(f"unknown reference ranker {name!r}; choose from {', '.join(RANKERS)}")
