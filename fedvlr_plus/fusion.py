"""The FedVLR layer: personalised multimodal fusion wrapped around any backbone adapter.

Li, Long, Jiang, Zhang, Yang, "Federated Vision-Language-Recommendation with Personalized Fusion", AAAI-26
(arXiv 2410.08478), Eqs. 1-5. Per item, the backbone's ID representation and the server's content views are
projected into the backbone's latent size (Linear + LayerNorm per modality) and fused by experts:

- ``sum``:  ``Σ_m z_m``;
- ``mlp``:  ``LN(W2 · relu(W1 · [z_1; ...; z_M]))``;
- ``gate``: ``LN(W · [σ(G_1 z_1) ⊙ z_1; ...; σ(G_M z_M) ⊙ z_M])`` — a real gate that multiplies its inputs
  (the original release's "gate" never did, defect B9).

Projections and experts are **shared** (aggregated by the backbone's strategy). With ``mode="fedvlr"`` a
**private** router (:mod:`fedvlr_plus.router`) weights the experts per user from that user's history, and the
backbone's head scores the mixture. Single-expert modes (``sum``, ``mlp``, ``gate``) use one expert and no router.

Cold items (no training interaction) have untrained ID embeddings. At scoring time their ID representation is
replaced by the mean ID representation of their nearest *warm* content neighbours (``cold_neighbours``, found by
the server from the views, no user data involved), so they are ranked on content plus collaborative signal
borrowed from similar items, never on untrained noise. Training never sees a cold item as a positive.
"""
from __future__ import annotations

import numpy as np
import torch

from .adapters.base import Backbone, ParamSpec
from .nn import layer_norm, linear
from .router import entropy, router_input, router_weights

MODES = ("sum", "mlp", "gate", "fedvlr")
EXPERTS = ("sum", "mlp", "gate")


def content_neighbours(views: dict[str, np.ndarray], cold: np.ndarray, k: int = 10) -> np.ndarray:
    """For each cold item, its ``k`` nearest warm items by mean cosine similarity over the views.

    ``cold`` is a boolean mask over items. Returns ``[n_cold, k]`` item ids (fewer warm items -> all of them).
    Exact search with faiss (inner product on L2-normalised vectors, concatenated over views).
    """
    import faiss

    cold = np.asarray(cold, dtype=bool)
    warm_ids = np.flatnonzero(~cold)
    cold_ids = np.flatnonzero(cold)
    if len(cold_ids) == 0 or len(warm_ids) == 0:
        return np.zeros((len(cold_ids), 0), dtype=np.int64)
    parts = []
    for v in views.values():
        v = np.asarray(v, dtype=np.float32)
        parts.append(v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12) / np.sqrt(len(views)))
    x = np.ascontiguousarray(np.concatenate(parts, axis=1))
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x[warm_ids])
    k = min(k, len(warm_ids))
    _, nn = index.search(x[cold_ids], k)
    return warm_ids[nn]


class FusionLayer(Backbone):
    """Wrap ``base``: its item representation becomes a (router-weighted) fusion of ID and content views."""

    def __init__(self, base: Backbone, views: dict[str, np.ndarray], *, mode: str = "fedvlr",
                 temperature: float = 1.0, router_hidden: int = 64, use_id: bool = True,
                 balance: float = 0.0, cold_neighbours: tuple[np.ndarray, np.ndarray] | None = None):
        if mode not in MODES:
            raise ValueError(f"fusion mode must be one of {', '.join(MODES)}, got {mode!r}")
        if not views and not use_id:
            raise ValueError("the fusion layer needs at least one modality (views or the ID embedding)")
        if mode == "fedvlr" and not views:
            raise ValueError("the FedVLR router reads the user's history through content views: give at least one")
        super().__init__(base.n_items, base.dim)
        self.base = base
        self.mode = mode
        self.temperature = float(temperature)
        self.router_hidden = int(router_hidden)
        self.use_id = bool(use_id)
        self.balance = float(balance)
        self.name = f"{base.name}+{mode}"
        self.default_strategy = base.default_strategy
        self.default_lr = base.default_lr
        self.default_item_lr_scale = base.default_item_lr_scale
        self.personal_copies = dict(base.personal_copies)
        self.uses_history = base.uses_history or mode == "fedvlr"
        self.view_names = list(views)
        self.views = {}
        for name, v in views.items():
            v = np.asarray(v, dtype=np.float32)
            if v.ndim != 2 or v.shape[0] != base.n_items:
                raise ValueError(f"view {name!r}: expected [{base.n_items}, d], got {tuple(v.shape)}")
            if not np.isfinite(v).all():
                raise ValueError(f"view {name!r}: contains NaN or inf")
            self.views[name] = torch.from_numpy(v)
        self.d = self._probe_dim()
        self.keys = (["proj.id"] if use_id else []) + [f"proj.v{i}" for i in range(len(self.view_names))]
        self.in_dims = ([self.d] if use_id else []) + [v.shape[1] for v in self.views.values()]
        self.view_keys = [f"proj.v{i}" for i in range(len(self.view_names))]
        self.experts = list(EXPERTS) if mode == "fedvlr" else [mode]
        self.cold_idx = self.cold_nbrs = None
        if cold_neighbours is not None and len(cold_neighbours[0]) and cold_neighbours[1].shape[1]:
            self.cold_idx = torch.as_tensor(cold_neighbours[0], dtype=torch.long)
            self.cold_nbrs = torch.as_tensor(cold_neighbours[1], dtype=torch.long)
        self._last_weights = None

    def _probe_dim(self) -> int:
        g = torch.Generator().manual_seed(0)
        from .adapters.base import init_shared

        p = {s.name: init_shared(s, g) for s in self.base.all_specs()}
        items = torch.zeros(1, dtype=torch.long)
        ctx = {"items_global": items, "hist": items, "hist_global": items, "hist_mask": torch.ones(1, dtype=torch.bool)}
        return int(self.base.item_repr(p, items, ctx).shape[-1])

    # ------------------------------------------------------------------ parameters
    def specs(self) -> list[ParamSpec]:
        d, m = self.d, len(self.keys)
        out = list(self.base.all_specs())

        def lin(prefix, n_in, n_out, shared=True, w_init="xavier"):
            return [ParamSpec(f"{prefix}.w", (n_in, n_out), shared=shared, init=w_init, std=0.0),
                    ParamSpec(f"{prefix}.b", (n_out,), shared=shared, init="zeros")]

        def ln(prefix):
            return [ParamSpec(f"{prefix}.ln_g", (d,), shared=True, init="ones"),
                    ParamSpec(f"{prefix}.ln_b", (d,), shared=True, init="zeros")]

        for key, n_in in zip(self.keys, self.in_dims):
            out += lin(key, n_in, d) + ln(key)
        if "mlp" in self.experts:
            out += lin("mlp.l1", m * d, 2 * d) + lin("mlp.l2", 2 * d, d) + ln("mlp")
        if "gate" in self.experts:
            for key in self.keys:
                out += lin(f"gate.{key}", d, d)
            out += lin("gate.out", m * d, d) + ln("gate")
        if self.mode == "fedvlr":
            n_in = len(self.view_keys) * d
            out += [ParamSpec("router.w1", (n_in, self.router_hidden), shared=False, init="xavier"),
                    ParamSpec("router.b1", (self.router_hidden,), shared=False, init="zeros"),
                    # zero output layer: every user starts with uniform expert weights
                    ParamSpec("router.w2", (self.router_hidden, len(self.experts)), shared=False, init="zeros"),
                    ParamSpec("router.b2", (len(self.experts),), shared=False, init="zeros")]
        return out

    # ------------------------------------------------------------------ forward
    def _view_rows(self, name: str, gid: torch.Tensor) -> torch.Tensor:
        return self.views[name][gid]

    def _history_means(self, ctx: dict) -> list[torch.Tensor]:
        hist, mask = ctx["hist_global"], ctx["hist_mask"]
        key = ("_fusion_hist_means", id(hist))
        cached = ctx.get(key)
        if cached is not None:
            return cached
        w = mask.to(torch.float32)
        w = w / w.sum(-1, keepdim=True).clamp(min=1.0)
        means = [(self.views[name][hist] * w.unsqueeze(-1)).sum(-2) for name in self.view_names]
        ctx[key] = means
        return means

    def weights(self, p: dict, ctx: dict) -> torch.Tensor:
        """Router weights ``[..., J]`` of the user(s) in ``ctx`` (uniform for single-expert modes)."""
        if self.mode != "fedvlr":
            return torch.ones(1)
        x = router_input(self._history_means(ctx), p, self.view_keys)
        return router_weights(x, p, self.temperature)

    def _id_repr(self, p, items, ctx):
        x = self.base.item_repr(p, items, ctx)
        scoring = items is None and ctx["items_global"].dim() == 1 and ctx["items_global"].numel() == self.n_items
        if scoring and self.cold_idx is not None:
            x = x.clone()
            x[..., self.cold_idx, :] = x[..., self.cold_nbrs, :].mean(-2)
        return x

    def item_repr(self, p, items, ctx):
        gid = ctx["items_global"] if items is None else ctx.get("items_global", items)
        zs = []
        if self.use_id:
            zs.append(self._id_repr(p, items, ctx))
        zs += [self._view_rows(name, gid) for name in self.view_names]
        zs = [layer_norm(linear(x, p[f"{k}.w"], p[f"{k}.b"]), p[f"{k}.ln_g"], p[f"{k}.ln_b"])
              for x, k in zip(zs, self.keys)]
        zs = torch.broadcast_tensors(*zs)
        outs = []
        for e in self.experts:
            if e == "sum":
                outs.append(torch.stack(zs, 0).sum(0))
            elif e == "mlp":
                h = torch.relu(linear(torch.cat(zs, -1), p["mlp.l1.w"], p["mlp.l1.b"]))
                outs.append(layer_norm(linear(h, p["mlp.l2.w"], p["mlp.l2.b"]), p["mlp.ln_g"], p["mlp.ln_b"]))
            else:
                gated = [torch.sigmoid(linear(z, p[f"gate.{k}.w"], p[f"gate.{k}.b"])) * z
                         for z, k in zip(zs, self.keys)]
                outs.append(layer_norm(linear(torch.cat(gated, -1), p["gate.out.w"], p["gate.out.b"]),
                                       p["gate.ln_g"], p["gate.ln_b"]))
        if len(outs) == 1:
            self._last_weights = None
            return outs[0]
        w = self.weights(p, ctx)                           # [J] | [C, J] | [B, J]
        self._last_weights = w
        stacked = torch.stack(outs, -2)                    # [..., L, J, d]
        return (w.unsqueeze(-2).unsqueeze(-2) @ stacked).squeeze(-2)

    def head(self, p, vecs, ctx):
        return self.base.head(p, vecs, ctx)

    def regulariser(self, p, items, mask, config):
        reg = self.base.regulariser(p, items, mask, config)
        if self.balance and self._last_weights is not None:
            # push each user's routing away from collapsing onto one expert: λ (log J − H(w_u))
            w = self._last_weights
            reg = reg + self.balance * (float(np.log(w.shape[-1])) - entropy(w))
        return reg

    def describe(self) -> dict:
        out = self.base.describe()
        out.update(backbone=self.name, fusion=self.mode, views=self.view_names, experts=self.experts,
                   use_id=self.use_id, temperature=self.temperature,
                   cold_items_with_neighbours=0 if self.cold_idx is None else int(len(self.cold_idx)))
        out["shared"] = {s.name: list(s.shape) for s in self.shared_specs()}
        out["private"] = {s.name: list(s.shape) for s in self.private_specs()}
        return out
