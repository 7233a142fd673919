"""Every item's score for a batch of users of a RecBole model behind the FedVLR layer.

Behind the layer each user scores through the model with item tables of their own (their router's mixture of the
broadcast fused views), so the model still runs once per user. What the users of a batch share is done once for
the batch: their private states are read (or drawn) as one block, their router weights and mixtures come from
one matrix product (:func:`fedvlr_plus.fedvlr.experts.mix` with ``[B, J]`` weights), and the users' rows are
placed into the model's user tables with one copy per batch instead of one per user. The scores are the one-user
path's up to the order of float summation; ``bench eval --check`` times that path
(``ModuleSimulator.score_users_together = False``) and compares the figures.
"""

from __future__ import annotations

import numpy as np
import torch

from ...client import _tensor
from ..batched_scoring import history_ctx

#: floats of one batch's per-user item tables (the mixtures): users are scored together up to this budget, at
#: least one at a time (larger batches were slower on Toys: the mixtures leave the cache)
TABLE_FLOATS = 1 << 23


def together_refusal(sim) -> str | None:
    """Why ``sim``'s users cannot be scored together (None where they can): only a RecBole model behind the
    layer without a graph, whole private tensors or layer parts kept per user on the item side."""
    layer, base = sim.bb, sim.base
    if layer is base:
        return "no FedVLR layer"
    if base.graph or any(k == "private" for k in base.kinds.values()):
        return "a graph model or whole private tensors: each user runs the model on its own"
    personal = (
        getattr(layer, "additive", ()),
        getattr(layer, "offset", False),
        getattr(layer, "content_preference", False),
    )
    if any(personal):
        return "personal item parts or a content preference"
    return None


def users_per_batch(sim) -> int:
    """Users scored together: as many as keep their mixtures and item tables within :data:`TABLE_FLOATS`."""
    width = sum(int(sim.base.template.get_parameter(n).shape[1]) for n in sim.base.item_table_names)
    return max(1, TABLE_FLOATS // max(1, 2 * sim.bb.n_items * width))


def scores_together(sim, users: np.ndarray, shared: dict) -> torch.Tensor:
    """Scores ``[len(users), n_items]`` of ``users`` (our ids), a batch of users at a time."""
    base, layer = sim.base, sim.bb
    shared = {k: _tensor(v, sim.dtype) for k, v in shared.items()}
    step, out = users_per_batch(sim), []
    for b0 in range(0, len(users), step):
        bu = users[b0 : b0 + step]
        p = dict(shared)
        p.update({name: v.to(sim.dtype) for name, v in sim.private_block(bu).items()})
        ctx = {
            "items_global": torch.arange(layer.n_items),
            **layer.round_context(shared),
            **history_ctx(sim.indptr, sim.indices, bu),
        }
        with torch.no_grad():
            rep = layer.item_repr(p, None, ctx)  # [B, n_items, D], or [n_items, D] where no user mixes
            tables = base.split_item_repr(rep)
            params = base.module_params(p, torch.as_tensor(bu), leave_out=tables)
            same = {} if rep.dim() == 3 else {name: base.item_table(name, t) for name, t in tables.items()}
            for j, u in enumerate(bu.tolist()):
                own = dict(params, **(same or {name: base.item_table(name, t[j]) for name, t in tables.items()}))
                out.append(base.scores(own, torch.tensor([u]))[0])
    return torch.stack(out) if out else torch.zeros(0, layer.n_items, dtype=sim.dtype)
