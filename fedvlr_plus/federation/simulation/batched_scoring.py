"""Scoring with the batched simulator: the users' restored private states, a chunk of users at a time, against
every item (full sort) or against chosen items (the sampled protocol's candidates).

:class:`BatchedScoring` is the scoring half of :class:`~fedvlr_plus.federation.simulation.batched.BatchedSimulator`;
it reads
the simulator's backbone ``bb``, private ``store``, ``device``, ``dtype``, ``chunk_floats``, ``table_width``,
training CSR ``indptr``/``indices`` and its ``_private_block(users)``.
"""

from __future__ import annotations

import numpy as np
import torch

from ...adapters.base import Backbone
from ..client import scoring_params
from ..state.store import load_block


def history_ctx(indptr: np.ndarray, indices: np.ndarray, cids) -> dict:
    """The users' training positives (CSR ``indptr``/``indices``) as global ids, padded, with a mask: the input
    of backbones that read a user's history (the FedVLR router)."""
    cids = np.asarray(cids, dtype=np.int64)
    n = indptr[cids + 1] - indptr[cids]
    h_max = max(int(n.max()) if len(n) else 1, 1)
    owner = np.repeat(np.arange(len(cids)), n)
    pos = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    hist = np.zeros((len(cids), h_max), dtype=np.int64)
    hmask = np.zeros((len(cids), h_max), dtype=bool)
    hist[owner, pos] = indices[np.repeat(indptr[cids], n) + pos]
    hmask[owner, pos] = True
    return {"hist_global": torch.from_numpy(hist), "hist_mask": torch.from_numpy(hmask)}


class BatchedScoring:
    """The batched simulator's scoring (the module docstring lists what it reads of the simulator)."""

    maps_private = True  # scores() takes ``private_map``
    #: False: the sampled protocol scores every item even where its candidates alone would be cheaper (the
    #: reference path ``fedvlr-plus bench eval --check`` times and compares against)
    score_candidates = True

    @property
    def prefers_candidates(self) -> bool:
        """Whether the sampled protocol should score its candidates with :meth:`score_items`: yes, unless every
        item's score is one matrix product here (a dot-product head, or the FedVLR layer's closed form), which is
        as fast as gathering the candidates' rows and rounds as the full-sort pass does."""
        return self.score_candidates and self.bb.dot_head is None and self._closed_form() is None

    def _closed_form(self):
        """The backbone's closed form (:mod:`fedvlr_plus.fedvlr.closed_form`), or None where it has none."""
        closed_form = getattr(self.bb, "closed_form", None)
        return closed_form() if closed_form is not None else None

    def scores(self, users, shared: dict[str, torch.Tensor], private_map=None) -> torch.Tensor:
        """Logits ``[B, n_items]`` of every item for each user, from their restored private states.

        ``private_map(name, stacked)``, when given, may replace each stacked private array (``[B, ...]``) before
        scoring (used to apply a cold-item rule to private item tables); it must not change the stored states."""
        users = np.asarray(users, dtype=np.int64)
        n_items = self.bb.n_items
        kernel = self._closed_form()
        # the closed form makes only the [B, N] scores; the generic forward holds [B, N, k] item vectors
        width = 2 if kernel is not None else self.bb.scoring_floats_per_item(self.table_width)
        per_chunk = max(1, self.chunk_floats // max(n_items * width, 1))
        out = []
        for _, p, ctx in self._scoring_chunks(users, shared, per_chunk, private_map):
            ctx["items_global"] = torch.arange(n_items, device=self.device)
            with torch.no_grad():
                if kernel is not None:
                    logits = kernel.scores(p[kernel.table], p, ctx)
                else:
                    logits = self.bb.logits(p, None, ctx)
                out.append(logits.cpu())
        if len(out) == 1:  # (a batch of one chunk: torch.cat would copy it)
            return out[0]
        return torch.cat(out) if out else torch.zeros(0, n_items, dtype=self.dtype)

    def score_items(self, users, items, shared: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits ``[B, C]`` of the items ``items [B, C]`` (global ids) for each user ``users [B]``: the values
        :meth:`scores` gives those items, up to float summation order, without scoring the rest of the catalogue
        (the sampled protocol ranks each target against 99 items, not against all of them)."""
        users = np.asarray(users, dtype=np.int64)
        items = torch.as_tensor(np.asarray(items, dtype=np.int64))
        # the generic forward on [B, C] items holds their vectors and the head's activations: the contract's
        # default estimate (a backbone's own estimate describes its full-sort path), and the logits
        width = Backbone.scoring_floats_per_item(self.bb, self.table_width) + 2
        per_chunk = max(1, self.chunk_floats // max(items.shape[1] * width, 1))
        out = []
        for start, p, ctx in self._scoring_chunks(users, shared, per_chunk, None):
            chunk_items = items[start : start + per_chunk].to(self.device)
            ctx["items_global"] = chunk_items
            with torch.no_grad():
                out.append(self.bb.logits(p, chunk_items, ctx).cpu())
        return torch.cat(out) if out else torch.zeros(0, items.shape[1], dtype=self.dtype)

    def _scoring_chunks(self, users: np.ndarray, shared: dict[str, torch.Tensor], per_chunk: int, private_map):
        """``(start, p, ctx)`` for each ``per_chunk`` users from ``start`` on: the parameters they score with (the
        round's shared ones, their restored private states and personal copies) and their forward's context (the
        round's constants and, for a backbone that reads it, their history)."""
        dev = self.device
        shared = {k: v.to(self.dtype) for k, v in shared.items()}
        shared_dev = {k: v.to(dev) for k, v in shared.items()}
        ctx_shared = self.bb.round_context(shared_dev)  # the same for every chunk of this call
        for start in range(0, len(users), per_chunk):
            chunk = users[start : start + per_chunk]
            private = self._private_block(chunk)
            copies = load_block(self.store, chunk, list(self.bb.personal_copies.values()))
            for shared_name, personal in self.bb.personal_copies.items():
                vals, has = copies[personal]
                if has.any():  # clients without a personal copy score with the global table
                    vals = vals.to(self.dtype)
                    vals[torch.from_numpy(~has)] = shared[shared_name]
                    private[personal] = vals
            if private_map is not None:
                private = {k: private_map(k, v) for k, v in private.items()}
            p = scoring_params(self.bb, shared_dev, {k: v.to(dev) for k, v in private.items()})
            ctx = dict(ctx_shared)
            if self.bb.uses_history:
                ctx.update({k: v.to(dev) for k, v in history_ctx(self.indptr, self.indices, chunk).items()})
            yield start, p, ctx
