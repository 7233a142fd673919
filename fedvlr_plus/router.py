"""The on-device mixture-of-experts router (private: created on the client, restored every round, never uploaded).

FedVLR (Li et al., "Federated Vision-Language-Recommendation with Personalized Fusion", AAAI-26, Eq. 3):
``w_u = softmax(φ_u(r_u) / T)`` over the fusion experts. Unlike the original release (defects B2 and B9 in
fedvlr-method.md) the router

- is conditioned on the user's own history ``r_u``: the per-view mean of the content views of the user's training
  positives, each passed through the shared view projection and LayerNorm (so the router reads the same latent
  space the experts fuse in), concatenated;
- yields one weight vector per user, computed from positives only, and the same weights score every item, in
  training and at evaluation (sampled negatives never influence routing);
- is a private two-layer MLP whose output layer starts at zero, so every user starts from uniform weights.

All functions broadcast over leading batch dims (one client, a batch of C clients, or B users being scored).
"""
from __future__ import annotations

import torch

from .nn import layer_norm, linear


def router_input(view_means: list[torch.Tensor], p: dict, view_keys: list[str]) -> torch.Tensor:
    """``[..., V * d]`` from the per-view history means ``[..., dv]`` through shared projections + LayerNorm."""
    parts = [layer_norm(linear(m, p[f"{k}.w"], p[f"{k}.b"]), p[f"{k}.ln_g"], p[f"{k}.ln_b"])
             for m, k in zip(view_means, view_keys)]
    return torch.cat(parts, dim=-1)


def router_logits(x: torch.Tensor, p: dict) -> torch.Tensor:
    """Private MLP ``[..., in] -> [..., J]``."""
    h = torch.relu(linear(x, p["router.w1"], p["router.b1"]))
    return linear(h, p["router.w2"], p["router.b2"])


def router_weights(x: torch.Tensor, p: dict, temperature: float = 1.0) -> torch.Tensor:
    return torch.softmax(router_logits(x, p) / temperature, dim=-1)


def entropy(w: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each weight vector ``[..., J] -> [...]``."""
    return -(w * torch.log(w.clamp_min(1e-12))).sum(-1)
