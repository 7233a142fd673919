"""RecBole's BPR on the flat tables of a chunk of module clients, with its gradients in closed form.

BPR scores a pair by dot products of embedding rows, ``x = <e_u, e_i> - <e_u, e_j>``, and its loss per row is
``-log(γ + σ(x))`` (RecBole's ``BPRLoss``, γ = 1e-10). For a chunk's weighted sum of row losses (weight ``a``)
the gradients are, with ``g = ∂/∂x = -a σ(x) (1 - σ(x)) / (γ + σ(x))``,

    ∂/∂e_u = g e_i - g e_j,   ∂/∂e_i = g e_u,   ∂/∂e_j = -g e_u,

summed over the rows that look a table row up. That is what autograd computes through the model's forward on the
generic flat path (:meth:`~.module_chunk.ChunkTraining._flat_gradients`), in the same order of operations, without
the ``vmap`` and the graph: a few gathers and ``index_add_`` calls per step. It applies to RecBole's own BPR class
only (a subclass may score or regularise otherwise); every other model keeps the generic path.
"""

from __future__ import annotations

import torch


def closed_form_bpr(base) -> tuple[str, str, float] | None:
    """``(user table, item table, γ)`` when ``base``'s template is RecBole's BPR itself, with its own loss and
    one user and one item embedding; else None."""
    try:
        from recbole.model.general_recommender.bpr import BPR
        from recbole.model.loss import BPRLoss
    except ImportError:  # recbole missing: no model of it can be here either
        return None
    m = base.template
    if type(m) is not BPR or type(getattr(m, "loss", None)) is not BPRLoss:
        return None
    kinds = {name: base.kinds[name] for name, _ in m.named_parameters()}
    users = [n for n, k in kinds.items() if k == "user"]
    items = [n for n, k in kinds.items() if k == "item"]
    if len(kinds) != 2 or len(users) != 1 or len(items) != 1:
        return None
    return users[0], items[0], float(m.loss.gamma)


@torch.no_grad()
def bpr_gradients(tables: dict, names: tuple[str, str, float], user, pos, neg, weight, item_rows: bool = False):
    """Gradients of ``Σ_r weight_r loss_r`` with respect to the flat tables (``{name: [rows, d]}``) and each
    row's weighted loss, for rows whose user, positive and negative are rows ``user``, ``pos``, ``neg`` of them.
    ``item_rows``: the item table's gradient as ``(table rows [2 R], their gradients [2 R, d])``, positives
    then negatives, not summed into a table."""
    uname, iname, gamma = names
    users, items = tables[uname], tables[iname]
    e_u = users.index_select(0, user)
    apart = items.index_select(0, pos).sub_(items.index_select(0, neg))  # e_i - e_j
    sig = torch.sigmoid((e_u * apart).sum(dim=1))
    loss = -torch.log(gamma + sig)
    g = ((-weight / (gamma + sig)) * ((1.0 - sig) * sig)).unsqueeze(1)
    g_users = torch.zeros_like(users).index_add_(0, user, apart.mul_(g))
    if item_rows:  # written in place: positives' rows, then the negatives'
        rows = torch.empty((2 * len(pos),) + tuple(e_u.shape[1:]), dtype=e_u.dtype, device=e_u.device)
        torch.mul(e_u, g, out=rows[: len(pos)])
        torch.neg(rows[: len(pos)], out=rows[len(pos) :])
        return {uname: g_users, iname: (torch.cat([pos, neg]), rows)}, loss * weight
    g_e = e_u.mul_(g)
    g_items = torch.zeros_like(items).index_add_(0, pos, g_e).index_add_(0, neg, g_e.neg_())
    return {uname: g_users, iname: g_items}, loss * weight
