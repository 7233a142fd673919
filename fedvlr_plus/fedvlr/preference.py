"""A user's own preference over projected content (VBPR-style), beside the fused views.

In the paper's form content reaches the score only through the fused views, i.e. through the backbone's head and
the router's mixture, and every fused view ends in a LayerNorm. VBPR (He & McAuley, "VBPR: Visual Bayesian
Personalized Ranking from Implicit Feedback", AAAI 2016) scores content directly instead: a user vector ``θ_u``
against a learnt linear projection of the item's content. With ``content_preference`` the layer adds that term,

    logit(u, i) = head_u(Σ_j w_uj F_ij) + θ_u · P_i,      P_i = Σ_m E_m ĉ_{i,m}

where ``ĉ_{i,m}`` is view ``m`` of item ``i`` scaled to unit L2 norm (views come in any scale: CLIP is normalised,
VGGish is not) and ``E_m`` is a server projection without LayerNorm, so the size of ``P_i`` can carry how strongly
an item's content speaks. ``P`` is computed on the server with the fused views and broadcast beside them (extra
columns of the broadcast table), so clients still never see a projection; ``θ_u`` is private and starts at zero,
so the layer starts exactly where the paper's form does. See docs/method.md.
"""

from __future__ import annotations

import torch

from ..adapters.base import ParamSpec, rowdot
from ..nn import linear

THETA = "preference.theta"


def unit_rows(views: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Each view with rows scaled to unit L2 norm (an all-zero row stays zero)."""
    return [v / v.norm(dim=1, keepdim=True).clamp_min(1e-12) for v in views.values()]


def server_specs(in_dims: list[int], d: int) -> list[ParamSpec]:
    """One projection ``E_m`` per content view (shared, on the server)."""
    out = []
    for i, n_in in enumerate(in_dims):
        out += [
            ParamSpec(f"preference.e{i}.w", (n_in, d), shared=True, init="xavier"),
            ParamSpec(f"preference.e{i}.b", (d,), shared=True, init="zeros"),
        ]
    return out


def client_specs(d: int) -> list[ParamSpec]:
    """``θ_u``: private, zero at the start, so the extra term is off until the user's own data moves it."""
    return [ParamSpec(THETA, (d,), shared=False, init="zeros")]


def projected_content(inputs: list[torch.Tensor], sp: dict) -> torch.Tensor:
    """``P [N, d] = Σ_m E_m ĉ_m`` from the unit-norm views ``inputs``."""
    return torch.stack(
        [linear(x, sp[f"preference.e{i}.w"], sp[f"preference.e{i}.b"]) for i, x in enumerate(inputs)], 0
    ).sum(0)


def preference_logit(p: dict, content: torch.Tensor) -> torch.Tensor:
    """``θ_u · P_i`` for the item rows ``content [..., L, d]``."""
    return rowdot(content, p[THETA])
