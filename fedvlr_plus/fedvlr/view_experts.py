"""Routing over the server's candidate views: one expert per content view, each the ID row plus that view.

The method (FedVLR, Li et al., AAAI-26, arXiv 2410.08478) has the server make a few candidate *views* of every
item with different modality emphasis, and each user's private router weigh them. With ``router_over="views"``
the layer's experts are those views:

    F_ij = z_id,i + z_j,i        (z_m = LN(W_m x_m + b_m), the per-modality projection of :mod:`.experts`)

so ``Σ_j w_uj F_ij = z_id,i + Σ_j w_uj z_j,i``: the ID part is the same for every user and the weights say how
much of each view the user's item vectors carry: a user who chooses by looks can put the image view's weight
near one. Without the ID modality an expert is ``z_j`` alone.

Every expert is a sum of two LayerNorm outputs, so the experts are the same size and none wins the router's
gradient by being larger (the operator experts' ``sum`` has norm ``√M`` times the others', one reason the router
collapses onto it; docs/method.md). The client side does not change: the broadcast table is ``J`` blocks of ``d``
as with the operator experts, so the router, the closed form and the batched simulator cover this mode as they
are.
"""

from __future__ import annotations

import torch

#: what the router (and ``uniform``) mixes: the views, the fusion operators of :mod:`.experts` (the original
#: release's form), or ``auto``: the views where there are two or more content views, else the operators (one
#: view leaves nothing to route between)
ROUTER_OVER = ("auto", "views", "operators")
#: an expert's name in this mode: ``view:<view name>``
PREFIX = "view:"


def view_expert_names(view_names: list[str]) -> list[str]:
    return [f"{PREFIX}{name}" for name in view_names]


def view_expert_outputs(zs: list[torch.Tensor], use_id: bool) -> list[torch.Tensor]:
    """One ``[N, d]`` expert per content view from the projected modalities ``zs`` (the ID row's first when
    ``use_id``)."""
    if not use_id:
        return list(zs)
    return [zs[0] + z for z in zs[1:]]


def resolve(router_over: str, mode: str, n_views: int) -> str:
    """What a layer of ``mode`` with ``n_views`` content views routes over: single-expert modes are operators."""
    if mode not in ("fedvlr", "uniform"):
        return "operators"
    if router_over == "auto":
        return "views" if n_views >= 2 else "operators"
    return router_over


def refusal(router_over: str, mode: str, n_views: int) -> str | None:
    """Why ``router_over`` cannot hold for a layer of ``mode`` with ``n_views`` content views (None when it can)."""
    if router_over not in ROUTER_OVER:
        return f"--router-over must be one of {', '.join(ROUTER_OVER)}, got {router_over!r}"
    if router_over == "views" and mode in ("fedvlr", "uniform") and n_views < 2:
        return (
            f"--router-over views routes between content views and the layer has {n_views}; pass at least two "
            "with --fusion-views (e.g. text,image) or use --router-over operators"
        )
    return None
