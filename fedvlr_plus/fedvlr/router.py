"""The private on-device router (FedVLR Eq. 3): created on the client, restored every round, never uploaded.

Li, Long, Jiang, Zhang, Yang, "Federated Vision-Language-Recommendation with Personalized Fusion", AAAI-26
(arXiv 2410.08478): ``w_u = softmax(φ_u(r_u) / T)`` over the fusion experts. Here

- ``r_u`` is the user's own history: the mean, over the user's training positives, of the round's broadcast fused
  views (constant within a round, so sampled negatives never influence routing, and the same weights score every
  item in training and at evaluation);
- ``φ_u`` is a private two-layer MLP whose output layer starts at zero, so every user starts from uniform weights.

The broadcast views reach the router through the call context (``ctx[VIEWS]``, put there by
:meth:`FusionLayer.round_context` from the round's shared state), never through state left on the layer. All
functions broadcast over leading batch dims (one client, a batch of C clients, or B users being scored). See
docs/method.md.
"""

from __future__ import annotations

import torch

from ..adapters.base import ParamSpec
from ..nn import linear

#: ctx key of the round's broadcast fused views ``[N, J * d]``
VIEWS = "fusion.views"
_INPUT = "fusion.router_input"


def router_specs(n_in: int, hidden: int, n_experts: int) -> list[ParamSpec]:
    return [
        ParamSpec("router.w1", (n_in, hidden), shared=False, init="xavier"),
        ParamSpec("router.b1", (hidden,), shared=False, init="zeros"),
        # zero output layer: every user starts with uniform expert weights
        ParamSpec("router.w2", (hidden, n_experts), shared=False, init="zeros"),
        ParamSpec("router.b2", (n_experts,), shared=False, init="zeros"),
    ]


def history_input(ctx: dict) -> torch.Tensor:
    """``r_u [..., J * d]``: the mean broadcast fused view of the user's history (cached in ``ctx``: constant in
    the round)."""
    views = ctx.get(VIEWS)
    if views is None:
        raise RuntimeError("the call context has no broadcast fused views (FusionLayer.round_context(shared))")
    hist, mask = ctx["hist_global"], ctx["hist_mask"]
    cached = ctx.get(_INPUT)
    if cached is None or cached[0] is not hist or cached[1] is not views:
        w = mask.to(torch.float32)
        w = w / w.sum(-1, keepdim=True).clamp(min=1.0)
        cached = (hist, views, (views[hist] * w.unsqueeze(-1)).sum(-2))
        ctx[_INPUT] = cached
    return cached[2]


#: :func:`history_mean` forms its mean as one [C, N] x [N, J d] product while the catalogue has at most this many
#: items per real history entry of the batch (a GEMM reads a row of the views for far less than a gather copies it)
DENSE_HISTORY_RATIO = 32


def history_mean(ctx: dict) -> torch.Tensor:
    """:func:`history_input`'s ``r_u [C, J d]`` for a batch of users, from the real history entries only (the
    same mean, summed in another order): the padding to the longest history of the batch can be most of
    ``[C, H, J d]`` when users of every size are scored together. Not cached."""
    views = ctx.get(VIEWS)
    if views is None:
        return history_input(ctx)  # (says what is missing)
    hist, mask = ctx["hist_global"], ctx["hist_mask"]
    if hist.dim() == 1:  # one client's history
        return history_mean({VIEWS: views, "hist_global": hist[None], "hist_mask": mask[None]})[0]
    w = mask.to(views.dtype)
    w = w / w.sum(-1, keepdim=True).clamp(min=1.0)
    real = mask.reshape(-1).nonzero().squeeze(1)
    user = torch.div(real, hist.shape[1], rounding_mode="floor")
    c_n, n_items = hist.shape[0], views.shape[0]
    if c_n * n_items <= DENSE_HISTORY_RATIO * len(real):
        # a small catalogue: the users' weights over it [C, N] and one product with the views, instead of
        # gathering a row per history entry
        dense = torch.zeros(c_n * n_items, dtype=views.dtype, device=views.device)
        dense.index_add_(0, user * n_items + hist.reshape(-1)[real], w.reshape(-1)[real])
        return dense.view(c_n, n_items) @ views
    rows = views.index_select(0, hist.reshape(-1)[real]) * w.reshape(-1)[real].unsqueeze(1)
    out = torch.zeros(c_n, views.shape[-1], dtype=views.dtype, device=views.device)
    return out.index_add_(0, user, rows)


def router_logits(x: torch.Tensor, p: dict) -> torch.Tensor:
    """Private MLP ``[..., in] -> [..., J]``."""
    h = torch.relu(linear(x, p["router.w1"], p["router.b1"]))
    return linear(h, p["router.w2"], p["router.b2"])


def router_weights(x: torch.Tensor, p: dict, temperature: float = 1.0) -> torch.Tensor:
    return torch.softmax(router_logits(x, p) / temperature, dim=-1)


def entropy(w: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each weight vector ``[..., J] -> [...]``."""
    return -(w * torch.log(w.clamp_min(1e-12))).sum(-1)
