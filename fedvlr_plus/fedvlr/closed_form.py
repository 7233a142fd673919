"""The FedVLR layer around a dot-product head in closed form: a local step's gradients for a chunk of clients,
and full-sort scores as one matrix product.

FedVLR (Li et al., AAAI-26, arXiv 2410.08478), Algorithm 1, keeps the broadcast fused views ``F`` fixed during a
round, and the router reads the user's history through those fixed views, so its input ``r_u`` is a constant of
the round. For a backbone whose head is ``<h_u, v> + b_u`` (FedAvg, FCF, PFedRec without the offset) a step of
client ``u`` on its examples ``l`` is

    w = softmax(φ_u(r_u) / T),   s_lj = <h_u, F_lj>,   logit_l = Σ_j w_j s_lj + b_u,
    J_u = Σ_l a_l BCE(logit_l, y_l),   δ_l = ∂J_u/∂logit_l = a_l (σ(logit_l) - y_l)

(``a_l``: the example's weight in the client's mean loss), and every gradient is a short sum:

    ∂J/∂b = Σ_l δ_l,   ∂J/∂h = Σ_j w_j Σ_l δ_l F_lj,   ∂J/∂w_j = Σ_l δ_l s_lj,   ∂J/∂F_lj = δ_l w_j h,

with the router's MLP ``φ_u(r) = W2 relu(W1 r + b1) + b2`` by the chain rule through the softmax. This is the
graph autograd differentiates on the generic path (the sequential reference and the tests keep autograd); here
the whole chunk costs a few batched matrix products per step and no graph.

Scoring every item needs no ``[users, items, d]`` mixture either: ``Σ_j w_j <h, F_ij> = <w ⊗ h, F_i>``, so the
scores of B users are one ``[B, J d] x [J d, N]`` product. Both identities hold because the mixture is linear
in ``F`` and the head is a dot product; the LayerNorms and nonlinearities of the experts run on the server,
before ``F`` is broadcast, so they do not stand in the way.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..nn import linear
from .router import history_input

ROUTER = ("router.w1", "router.b1", "router.w2", "router.b2")


@dataclass(frozen=True)
class MixtureDotHead:
    """The closed form of one FusionLayer: ``table`` (the broadcast fused views, ``experts`` blocks of ``d``),
    the head's ``weight`` and ``bias`` (None: no bias) and the router's softmax ``temperature``."""

    table: str
    weight: str
    bias: str | None
    experts: int
    d: int
    temperature: float

    @property
    def names(self) -> set[str]:
        """Every trained parameter this closed form covers (a step with any other one needs autograd)."""
        return {self.table, self.weight, *ROUTER} | ({self.bias} if self.bias else set())

    def router_input(self, ctx: dict) -> torch.Tensor:
        """``r_u [C, J d]``: the round's constant router input of the users in ``ctx``."""
        return history_input(ctx)

    def _route(self, x: torch.Tensor, p: dict):
        """Router pre-activation, hidden layer and weights ``[C, J]`` (the same ops as ``router_weights``)."""
        pre = linear(x, p["router.w1"], p["router.b1"])
        hidden = torch.relu(pre)
        w = torch.softmax(linear(hidden, p["router.w2"], p["router.b2"]) / self.temperature, dim=-1)
        return pre, hidden, w

    @torch.no_grad()
    def step(self, rows: torch.Tensor, x: torch.Tensor, p: dict, y: torch.Tensor, a: torch.Tensor):
        """Gradients of every client's weighted loss for one step, and each client's loss.

        ``rows [C, L, J d]``: the fused views of the step's examples; ``x [C, J d]``: the router input; ``p``: the
        clients' stacked parameters; ``y``/``a [C, L]``: labels and example weights (zero on padding).
        Returns (name -> gradient, with the table's as ``[C, L, J d]`` rows; loss ``[C]``)."""
        c_n, l_n = rows.shape[:2]
        j_n, d = self.experts, self.d
        h = p[self.weight]
        pre, hidden, w = self._route(x, p)
        s = torch.bmm(rows.reshape(c_n, l_n * j_n, d), h.unsqueeze(-1)).view(c_n, l_n, j_n)
        logits = (s * w.unsqueeze(1)).sum(-1)
        if self.bias is not None:
            logits = logits + p[self.bias].unsqueeze(-1)
        delta = (torch.sigmoid(logits) - y) * a
        per_client = torch.bmm(delta.unsqueeze(1), rows).view(c_n, j_n, d)    # Σ_l δ_l F_lj
        g_w = torch.bmm(delta.unsqueeze(1), s).squeeze(1)                      # ∂J/∂w_j
        g_out = w * (g_w - (w * g_w).sum(-1, keepdim=True)) / self.temperature  # through softmax(o / T)
        g_pre = torch.bmm(g_out.unsqueeze(1), p["router.w2"].transpose(1, 2)).squeeze(1) * (pre > 0)
        grads = {self.table: delta.unsqueeze(-1) * self.row_direction(w, h).unsqueeze(1),
                 self.weight: (w.unsqueeze(-1) * per_client).sum(1),
                 "router.w1": x.unsqueeze(-1) * g_pre.unsqueeze(1), "router.b1": g_pre,
                 "router.w2": hidden.unsqueeze(-1) * g_out.unsqueeze(1), "router.b2": g_out}
        if self.bias is not None:
            grads[self.bias] = delta.sum(1)
        loss = F.binary_cross_entropy_with_logits(logits, y, weight=a, reduction="none").sum(1)
        return grads, loss

    def row_direction(self, w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """``w ⊗ h [..., J d]``: the vector a fused row is scored against (and its gradient's direction)."""
        return (w.unsqueeze(-1) * h.unsqueeze(-2)).reshape(*w.shape[:-1], self.experts * self.d)

    @torch.no_grad()
    def scores(self, fused: torch.Tensor, p: dict, ctx: dict) -> torch.Tensor:
        """Logits ``[B, N]`` of every item for the B users of ``ctx`` (``p``: their stacked private parameters,
        ``fused [N, J d]``: the broadcast views)."""
        _, _, w = self._route(self.router_input(ctx), p)
        out = self.row_direction(w, p[self.weight]) @ fused[:, :self.experts * self.d].T
        if self.bias is not None:
            out = out + p[self.bias].unsqueeze(-1)
        return out
