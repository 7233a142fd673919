"""The cold-item rule of the FedVLR layer: what the fusion reads as the ID row of an item nobody trained.

A cold item (flagged new: no training interaction) would enter the fusion with an untrained, random ID row. The
server replaces that row by the mean ID row of the item's nearest warm content neighbours (found from the views,
no user data), or by the mean warm ID row when there is no content view to search with, so a cold item is ranked
on its content plus collaborative signal borrowed from similar items, never on noise. This extends FedVLR
(Li et al., "Federated Vision-Language-Recommendation with Personalized Fusion", AAAI-26, arXiv 2410.08478),
which does not treat cold items; see docs/method.md.

The layer takes the rule as one constructor argument (``cold_items=ColdItemRule(cold, neighbours=10)``) and fits
it on its own views. Any other rule with the same contract, a callable ``[N, d] -> [N, d]`` that replaces only the
cold rows (e.g. :class:`fedvlr_plus.coldstart.rules.ColdRule`), can be passed for one computation of the fused
views (:meth:`FusionLayer.fused_views`); that is how the cold-start study compares rules after training.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..nn import gather_rows


def content_neighbours(views: dict[str, np.ndarray], cold: np.ndarray, k: int = 10) -> np.ndarray:
    """For each cold item, its ``k`` nearest warm items by mean cosine similarity over the views.

    ``cold`` is a boolean mask over items. Returns ``[n_cold, k]`` item ids. Exact inner-product search with
    faiss on L2-normalised vectors concatenated over views (each view weighted equally).
    """
    if not views:
        raise ValueError("content_neighbours needs at least one content view")
    cold = np.asarray(cold, dtype=bool)
    warm_ids, cold_ids = np.flatnonzero(~cold), np.flatnonzero(cold)
    if len(cold_ids) == 0 or len(warm_ids) == 0:
        return np.zeros((len(cold_ids), 0), dtype=np.int64)
    x = _content_rows(views)
    return warm_ids[_search(x[warm_ids], x[cold_ids], min(k, len(warm_ids)))]


def warm_neighbours(views: dict[str, np.ndarray], cold: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Each warm item's ``k`` nearest *other* warm items, searched as :func:`content_neighbours` searches:
    ``(warm_ids [W], neighbours [W, k])``, what a warm item's ID row would be estimated from were it cold."""
    warm_ids = np.flatnonzero(~np.asarray(cold, dtype=bool))
    k = min(k, len(warm_ids) - 1)
    if not views or k < 1:
        return warm_ids, np.zeros((len(warm_ids), 0), dtype=np.int64)
    x = _content_rows(views)[warm_ids]
    found = _search(x, x, k + 1)
    # drop each item's own row (its best match, unless an exact duplicate came first)
    own = found == np.arange(len(warm_ids))[:, None]
    own[~own.any(1), -1] = True
    return warm_ids, warm_ids[found[~own].reshape(len(warm_ids), k)]


def _content_rows(views: dict[str, np.ndarray]) -> np.ndarray:
    """Views concatenated, each row L2-normalised and weighted by 1/sqrt(#views), as float32."""
    parts = []
    for v in views.values():
        v = np.asarray(v, dtype=np.float32)
        parts.append(v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12) / np.sqrt(len(views)))
    return np.ascontiguousarray(np.concatenate(parts, axis=1))


def _search(base: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Row numbers of ``base`` with the ``k`` largest inner products with each query (exact, faiss)."""
    import faiss

    index = faiss.IndexFlatIP(base.shape[1])
    index.add(np.ascontiguousarray(base))
    _, nn = index.search(np.ascontiguousarray(queries), k)
    return nn


class NeighbourFill:
    """The fitted rule: ``x [N, d] -> x`` with each cold row replaced by the mean of its neighbours' rows (or, with
    ``neighbours=None``, by the mean of every warm row)."""

    def __init__(self, cold_ids: np.ndarray, neighbours: np.ndarray | None, n_items: int):
        self.cold_idx = torch.as_tensor(cold_ids, dtype=torch.long)
        self.neighbours = None if neighbours is None else torch.as_tensor(neighbours, dtype=torch.long)
        self.warm_idx = None
        if neighbours is None:
            warm = np.ones(n_items, dtype=bool)
            warm[np.asarray(cold_ids)] = False
            self.warm_idx = torch.as_tensor(np.flatnonzero(warm), dtype=torch.long)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[self.cold_idx] = (
            gather_rows(x, self.neighbours).mean(1)
            if self.neighbours is not None
            else x[self.warm_idx].mean(0).expand(len(self.cold_idx), -1)
        )
        return x

    def counts(self) -> dict[str, int]:
        n = int(len(self.cold_idx))
        return {
            "cold_items_with_neighbours": n if self.neighbours is not None else 0,
            "cold_items_with_warm_mean": n if self.neighbours is None else 0,
        }


@dataclass(frozen=True)
class ColdItemRule:
    """Which items are cold (a boolean mask over items) and how many content neighbours each borrows from
    (0: rule off)."""

    cold: np.ndarray
    neighbours: int = 10

    def fit(self, views: dict[str, np.ndarray], n_items: int) -> NeighbourFill | None:
        """The rule on these views; ``None`` when it has nothing to do (no cold item, ``neighbours`` 0, or no
        warm item to borrow from)."""
        cold = np.asarray(self.cold, dtype=bool)
        if self.neighbours <= 0 or not cold.any():
            return None
        if not views:  # no content to search with (e.g. every view dropped): the mean warm row
            return NeighbourFill(np.flatnonzero(cold), None, n_items)
        nbrs = content_neighbours(views, cold, self.neighbours)
        return NeighbourFill(np.flatnonzero(cold), nbrs, n_items) if nbrs.shape[1] else None


NO_COLD_RULE = {"cold_items_with_neighbours": 0, "cold_items_with_warm_mean": 0}
