"""One chunk of module clients (a RecBole model) under the FedVLR layer, trained together: the layer's per-client
item table made from the chunk's rows of the broadcast fused views, in front of the model's own batched training
(:class:`~fedvlr_plus.federation.simulation.modules.chunk.ChunkTraining`).

The one-at-a-time client (:class:`~fedvlr_plus.federation.simulation.modules.client.ModuleClient`) replaces the
model's item
tables by ``Σ_j w_uj F_ij`` over every item, ``w_u`` its router's weights of the round's history input. A step's
loss reads only the rows it looks up, so here each client holds just the rows of ``F`` it touches this round
(``[C, 1 + T, blocks * d]``, the local ids of :mod:`.module_lanes`) and its router (``[C, ...]``). Every local step

1. mixes each client's rows by its own router weights (the routers differ per client and change every step),
   split by columns into the model's item tables (row 0: the model's padding row, as the reference keeps it);
2. runs the model's batched gradient on those tables (:meth:`ChunkTraining.gradients`, the model's own
   ``calculate_loss`` under ``vmap``), which gives the gradient of each client's loss with respect to its mixed
   rows, its user row and the model's dense parameters;
3. pulls the mixed rows' gradient back through the mixture in closed form (``w_j g`` for the rows of expert
   ``j``; ``Σ <g, F_j>`` for the weight ``w_j``) and from the weights by autograd through the router (with the
   layer's router balance term), and steps everything as :class:`~fedvlr_plus.federation.client.LocalTraining`
   does (``F`` summed for a ``grads`` upload, and stepped only with ``local_shared`` or a ``params`` upload).

The router's input (the mean broadcast view of the client's positives) is fixed in a round, as in the reference.
"""

from __future__ import annotations

import numpy as np
import torch

from ..federation.messages import ClientUpdate
from ..federation.simulation.modules.chunk import (
    ChunkTraining,
    _expand,
    _gathered_rows,
    _where,
    accumulate,
    summed_blocks,
)
from .layer import FUSED
from .router import entropy, router_weights


def layer_refusal(layer) -> str | None:
    """Why the clients of the FedVLR layer ``layer`` cannot be batched by its structure (None when they can)."""
    if layer.content_preference:
        return "the FedVLR layer's content preference is not batched"
    if layer.offset or layer.additive:
        return "the FedVLR layer adds personal item parts to the fused vector"
    return None


class FusedChunk:
    """The chunk's layer parameters around the model's :class:`ChunkTraining` (``inner``), with the same
    interface (``gradients``, ``step``, ``finish``, ``states``, ``summed``) for the simulator's loop."""

    def __init__(self, layer, inner: ChunkTraining, rows: torch.Tensor, router: dict, history: torch.Tensor):
        self.layer, self.inner = layer, inner
        self.rows = rows  # [C, 1 + T, blocks * d] the client's rows of F (row 0: never looked up)
        self.router = router  # name -> [C, ...]
        self.history = history  # [C, J * d] the router's input
        self.pairwise, self.fields, self.t_max, self.c0 = inner.pairwise, inner.fields, inner.t_max, inner.c0
        self.upload, self.local_shared = inner.upload, inner.local_shared
        self.lr, self.item_lr, self.wd = inner.lr, inner.item_lr, inner.wd
        self.acc = {FUSED: None} if self.upload == "grads" else {}
        self.specs = {s.name: s for s in layer.all_specs()}
        self.tables = [n for n, k in layer.base.kinds.items() if k == "item"]
        self.widths = [int(layer.base.template.get_parameter(n).shape[1]) for n in self.tables]
        self.pads = {n: layer.base.template.get_parameter(n).detach()[0].to(rows.dtype) for n in self.tables}

    @classmethod
    def start(
        cls, layer, sched, c0: int, c1: int, shared: dict, states: dict, config: dict, dtype, positives
    ) -> FusedChunk:
        """``positives``: each client's training items (sorted, unique), aligned with ``sched.clients[c0:c1]``."""
        base = layer.base
        base_states = {n: v for n, v in states.items() if n in base.kinds}
        inner = ChunkTraining.start(base, sched, c0, c1, shared, base_states, config, dtype, fills_items=True)
        f = shared[FUSED]
        rows, _ = _gathered_rows(f, torch.zeros(f.shape[1:], dtype=f.dtype), sched, c0, c1, inner.t_max)
        # the layer's own private parameters (the router): the model's are in ``inner``
        router = {s.name: states[s.name].to(dtype) for s in layer.private_specs() if s.name not in base.kinds}
        return cls(layer, inner, rows, router, _history_input(layer, f, positives))

    # ------------------------------------------------------------------ the mixture
    def _experts(self) -> torch.Tensor:
        """``[C, 1 + T, J, d]``: the experts' blocks of the client's rows (a view)."""
        layer = self.layer
        f = self.rows.view(*self.rows.shape[:-1], layer.blocks, layer.d)
        return f[..., : len(layer.experts), :]

    def _weights(self, router: dict) -> torch.Tensor | None:
        """``[C, J]`` each client's router weights (None where the layer has no router)."""
        layer = self.layer
        if len(layer.experts) == 1 or layer.mode == "uniform":
            return None
        return router_weights(self.history, router, layer.temperature)

    def _mix(self, w: torch.Tensor | None) -> torch.Tensor:
        """``[C, 1 + T, d]`` each client's rows mixed as :meth:`FusionLayer._fused_part` mixes them: ``Σ_j w_j f_j``
        (an expert at a time, not the broadcast product: a third of the memory traffic)."""
        f = self._experts()
        if f.shape[-2] == 1:
            return f[..., 0, :]
        if w is None:  # uniform
            return f.mean(-2)
        out = f[..., 0, :] * w[:, 0, None, None]
        for j in range(1, f.shape[-2]):
            out.addcmul_(f[..., j, :], w[:, j, None, None])
        return out

    def _mix_backward(self, g: torch.Tensor, w: torch.Tensor | None):
        """The mixture's vector-Jacobian product: the gradient ``[C, 1 + T, blocks * d]`` of the rows for the mixed
        rows' gradient ``g [C, 1 + T, d]``, and that of the router weights ``[C, J]`` (None without a router)."""
        f = self._experts()
        n_c, n_l, n_j, d = f.shape
        if n_j == 1:
            g_f = g.unsqueeze(-2)
        elif w is None:
            g_f = (g / n_j).unsqueeze(-2).expand(n_c, n_l, n_j, d)
        else:
            g_f = g.unsqueeze(-2) * w[:, None, :, None]
        if self.layer.blocks == n_j:  # (always, as long as the content preference block is refused)
            g_rows = g_f.reshape(self.rows.shape)
        else:
            g_rows = torch.zeros_like(self.rows)
            g_rows.view(n_c, n_l, self.layer.blocks, d)[..., :n_j, :] = g_f
        if w is None:
            return g_rows, None
        # Σ_{l, k} g[c, l, k] f[c, l, j, k]: one small matrix-vector product per row
        g_w = torch.bmm(f.reshape(n_c * n_l, n_j, d), g.reshape(n_c * n_l, d, 1)).view(n_c, n_l, n_j).sum(1)
        return g_rows, g_w

    def _write_tables(self, mixed: torch.Tensor) -> None:
        """The model's item tables of the chunk from the mixed rows (split by columns; the padding row first)."""
        c = 0
        for name, width in zip(self.tables, self.widths):
            table = mixed[..., c : c + width].clone()
            table[:, 0] = self.pads[name]
            self.inner.batched[name] = table
            c += width

    # ------------------------------------------------------------------ gradients and the local step
    def gradients(self, lanes, dropout) -> tuple[dict, torch.Tensor]:
        """Per-client gradients of the model's parameters, of the rows of ``F`` and of the routers, and the losses
        ``[C]`` (the model's loss plus the layer's router balance term) of one local step."""
        router = {n: v.detach().requires_grad_(True) for n, v in self.router.items()}
        with torch.enable_grad():
            w = self._weights(router)
            balance = None
            if self.layer.balance and w is not None:
                balance = self.layer.balance * (float(np.log(w.shape[-1])) - entropy(w))
        self._write_tables(self._mix(None if w is None else w.detach()))
        grads, loss = self.inner.gradients(lanes, dropout)
        g_mixed = torch.cat([grads.pop(n) for n in self.tables], -1)
        g_mixed[:, 0] = 0.0  # the padding row is the model's own, not a row of F
        grads[FUSED], g_w = self._mix_backward(g_mixed, None if w is None else w.detach())
        if w is not None:  # on through the router, by autograd (small: [C, J * d] inputs)
            outs, g_outs = [w], [g_w]
            if balance is not None:
                outs.append(balance.sum())
                g_outs.append(torch.ones((), dtype=balance.dtype))
                loss = loss + balance.detach()
            g_router = torch.autograd.grad(outs, list(router.values()), g_outs, allow_unused=True)
            grads.update({n: torch.zeros_like(v) if g is None else g for (n, v), g in zip(router.items(), g_router)})
        return grads, loss

    @torch.no_grad()
    def step(self, grads: dict, used: torch.Tensor, active: torch.Tensor) -> None:
        """The model's step (:meth:`ChunkTraining.step`), then :meth:`LocalTraining.step` of the rows of ``F``
        and of the routers; clients not ``active`` keep their values."""
        own = {n: grads.pop(n) for n in [FUSED, *self.router]}
        self.inner.step(grads, used, active)
        every = bool(active.all())
        for name, g in own.items():
            if name in self.acc:
                accumulate(self.acc, name, g, active, every)
                if not self.local_shared:
                    continue
            p = self.rows if name == FUSED else self.router[name]
            if self.wd:
                g = g + self.wd * (p * _expand(used, p) if name == FUSED else p)
            lr = self.item_lr if self.specs[name].scaled else self.lr
            p -= lr * g if every else _where(active, lr * g, 0.0)

    # ------------------------------------------------------------------ uploads and private states
    def _uploaded(self) -> dict[str, torch.Tensor]:
        """``{shared name: [C, ...]}`` what each client uploads (``F``: its ``[C, 1 + T, ...]`` rows)."""
        inner, grads = self.inner, self.upload == "grads"
        acc = self.acc.get(FUSED)
        out = {FUSED: (torch.zeros_like(self.rows) if acc is None else acc) if grads else self.rows}
        for name in self.layer.shared_names:
            if name != FUSED:
                out[name] = (inner.acc if grads else inner.batched)[name]
        return out

    def states(self) -> dict:
        """The chunk's new private states ``{name: [C, ...]}`` (the model's and the routers)."""
        out = {n: v.clone() for n, v in self.router.items()}
        for s in self.layer.private_specs():
            if s.name not in out:
                table = self.inner.batched[s.name]
                out[s.name] = (table[:, 1] if self.layer.base.kinds[s.name] == "user" else table).clone()
        return out

    def finish(self, sched, cids, losses: list, config: dict, privatise) -> tuple[dict, dict]:
        """The chunk's uploads ``{cid: ClientUpdate}`` and its new private states ``{name: [C, ...]}``."""
        uploaded, updates = self._uploaded(), {}
        for j, cid in enumerate(int(c) for c in cids):
            idx = self.c0 + j
            touched = torch.from_numpy(sched.touched_of(idx))
            arrays = {n: (v[j][1 : 1 + len(touched)] if n == FUSED else v[j]) for n, v in uploaded.items()}
            steps = losses[j]
            up = ClientUpdate(
                cid=cid,
                kind=self.upload,
                arrays=arrays,
                rows={FUSED: touched},
                num_examples=int(sched.n_pos[idx]),
                metrics={"loss": float(np.mean(steps)) if steps else 0.0, "steps": len(steps)},
            )
            updates[cid] = privatise(up, self.inner.shared, config)
        return updates, self.states()

    def summed(self, sched, cids, losses: list):
        """The chunk's uploads as blocks for the round's sums (:mod:`.summed_chunk`)."""
        uploaded = self._uploaded()
        rows = {FUSED: uploaded.pop(FUSED)}
        return summed_blocks(self.upload, sched, cids, self.c0, self.t_max, losses, rows, uploaded)


def _history_input(layer, views: torch.Tensor, positives: list) -> torch.Tensor:
    """``[C, J * d]``: the mean broadcast view (the experts' blocks) of each client's positives, as
    :func:`~fedvlr_plus.fedvlr.router.history_input` computes it for one client (here one sparse product)."""
    import scipy.sparse as sp

    views = views[:, : len(layer.experts) * layer.d]
    counts = np.array([len(p) for p in positives], dtype=np.int64)
    crow = np.concatenate([[0], np.cumsum(counts)])
    vals = np.repeat(1.0 / np.maximum(counts, 1), counts).astype(np.float32)
    mean = sp.csr_matrix((vals, np.concatenate(positives), crow), shape=(len(positives), views.shape[0]))
    return torch.from_numpy(np.ascontiguousarray(mean @ views.numpy())).to(views.dtype)
