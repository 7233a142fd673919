"""The sequential simulator: the plain reference every batched path is tested against.

One :class:`~fedvlr_plus.federation.client.RecClient` at a time, ordinary autograd on full tables; slow, and
kept that way on purpose, so that it stays obviously what a client computes.
"""

from __future__ import annotations

import numpy as np
import torch

from ...adapters.base import Backbone
from ..client import RecClient
from ..messages import ClientUpdate


class SequentialSimulator:
    """The plain reference: one :class:`RecClient` at a time, ordinary autograd on full tables."""

    name = "sequential"

    def __init__(
        self, bb: Backbone, indptr: np.ndarray, indices: np.ndarray, store, *, seed: int = 0, dtype=torch.float32, **_
    ):
        self.bb = bb
        self.indptr, self.indices = indptr, indices
        self.store = store
        self.seed = int(seed)
        self.dtype = dtype

    def client(self, cid: int) -> RecClient:
        pos = self.indices[self.indptr[cid] : self.indptr[cid + 1]]
        return RecClient(int(cid), self.bb, pos, self.store, seed=self.seed, dtype=self.dtype)

    def fit(self, cids, shared, config) -> list[ClientUpdate]:
        return [self.client(int(c)).fit(shared, config) for c in cids]

    def scores(self, users, shared) -> torch.Tensor:
        rows = [self.client(int(u)).scores(shared) for u in np.asarray(users, dtype=np.int64)]
        return torch.stack(rows) if rows else torch.zeros(0, self.bb.n_items, dtype=self.dtype)
