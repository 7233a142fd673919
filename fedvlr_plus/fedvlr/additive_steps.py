"""FedRAP behind the FedVLR layer: a chunk's local steps with hand-written gradients and no autograd graph.

Under the layer's default rule (fedgrad: clients upload gradients and do not step the shared parts locally) the
broadcast fused views ``F`` are fixed during the round; the private personal table ``A``, FedRAP's head ``h``,
``b`` and the router move. For the examples ``l`` of one step (``a_l`` their weights, ``m_l`` their mask, ``n``
the real ones):

    w = softmax(φ_u(r_u) / T),   g_l = Σ_j w_j F_lj,   logit_l = <h, g_l + A_l> + b,
    δ_l = a_l (σ(logit_l) − y_l),   R = (−λ Σ_l m_l ||A_l − g_l||² + μ Σ_l m_l |g_l|_1) / (d n)

(FedRAP's penalty reads the fused vector ``g_l`` as its shared part), and with ``s_l = m_l / (d n)``:

    ∂J/∂A_l = δ_l h − 2λ s_l (A_l − g_l),   e_l = ∂J/∂g_l = δ_l h + 2λ s_l (A_l − g_l) + μ s_l sign(g_l),
    ∂J/∂h = Σ_l δ_l (g_l + A_l),   ∂J/∂b = Σ_l δ_l,   ∂J/∂w_j = Σ_l <e_l, F_lj>,   ∂J/∂F_lj = w_j e_l.

The router's gradients follow through the softmax, its first layer kept as a scale and a running sum
(:mod:`.router_steps`). ``e_l`` is not rank one (the penalty is not linear in
``g_l``), so the fused rows' uploaded gradient is summed per touched row as the steps go (``[C T, J d]``) and
handed over at the end. The gradients are autograd's in another order of float summation; the tests compare the
round with the generic path and the sequential reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..adapters.chunk_steps import ChunkSteps, keeps_shared_fixed
from ..adapters.fedrap_steps import add_penalty
from .closed_form import ROUTER
from .router import history_mean
from .router_steps import FirstLayer, router_grads

PERSONAL, WEIGHT, BIAS = "item_personal", "head_w", "head_b"


@dataclass(frozen=True)
class MixtureAdditive:
    """The layer's local steps in front of FedRAP: ``table`` (the broadcast fused views, ``experts`` blocks of
    ``d``), the router's softmax ``temperature`` and ``penalties``, FedRAP's curriculum (round -> ``(λ_t, μ_t)``)."""

    table: str
    experts: int
    d: int
    temperature: float
    penalties: object

    @property
    def names(self) -> set[str]:
        """Every trained parameter these steps cover."""
        return {self.table, PERSONAL, WEIGHT, BIAS, *ROUTER}

    #: the fused rows' gradient is always formed at the end (never stepped per example)
    defers_rows = True

    #: the rounds these steps cover: the shared parts stay fixed on the client (else autograd trains the chunk)
    covers = staticmethod(keeps_shared_fixed)

    def local_steps(self, ctx: dict, p: dict, lr: float, wd: float, defer: tuple[int, int, int] | None):
        """The state of one chunk's local training (:class:`AdditiveSteps`)."""
        if defer is None:
            raise ValueError("the additive steps keep the fused rows fixed: the chunk must defer their gradient")
        lam, mu = self.penalties(int(ctx.get("round", 1)))
        return AdditiveSteps(self, history_mean(ctx), p, lr, wd, defer, (float(lam), float(mu)), ctx.get("scratch"))


class AdditiveSteps(ChunkSteps):
    """One chunk's steps (see the module docstring). ``x``: the router's input ``[C, J d]``; ``p``: the chunk's
    stacked parameters, the personal table as its ``[C, T, d]`` touched rows (stepped in place by the simulator
    between steps); ``defer``: clients, touched rows and steps of the chunk."""

    prefix = "additive"

    def __init__(self, head: MixtureAdditive, x, p: dict, lr: float, wd: float, defer: tuple, penalties, scratch=None):
        super().__init__(scratch)
        self.head, self.first = head, FirstLayer(x, p["router.w1"], lr, wd)
        self.lam, self.mu = penalties
        c_n, t_max, _ = defer
        self.personal = p[PERSONAL].view(-1, head.d)
        self.rows_grad = torch.zeros(c_n * t_max, head.experts * head.d, dtype=x.dtype, device=x.device)
        self.c_n, self.t_max = c_n, t_max

    def rows(self, fused: torch.Tensor, chunk_rows, fidx: torch.Tensor, items: torch.Tensor):
        """The step's fused rows expert after expert, ``[J, C, L, d]`` (from the broadcast table by the examples'
        item ids: each expert's block contiguous, so the mixture and ``∂J/∂w`` read it in place), and the flat ids
        ``fidx`` of the examples' touched rows."""
        j_n, d = self.head.experts, self.head.d
        out = self.buffer("fused", fused, (j_n, *items.shape, d))
        for j in range(j_n):
            torch.index_select(fused[:, j * d : (j + 1) * d], 0, items.reshape(-1), out=out[j].view(-1, d))
        return out, fidx

    def _mixture(self, fused: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``g_l = Σ_j w_j F_lj`` -> ``[C, L, d]``, one expert at a time into a buffer."""
        g = torch.mul(fused[0], w[:, 0, None, None], out=self.buffer("mixed", fused, fused[0].shape))
        for j in range(1, w.shape[1]):
            g.addcmul_(fused[j], w[:, j, None, None])
        return g

    def _penalised(self, g_head, personal, mixed, a, active):
        """``(∂J/∂A, e, penalty [C] or None)``: the head's gradient of the item vector ``g_head`` with FedRAP's
        penalty added to each side (``e``: the fused vector's), and each client's penalty."""
        g_mixed = self.buffer("g_mixed", g_head, g_head.shape).copy_(g_head)
        if self.lam == 0.0 and self.mu == 0.0:  # (FedRAP adds no penalty then, not a zero one)
            return g_head, g_mixed, None
        sign = self.buffer("sign", mixed, mixed.shape)
        penalty = add_penalty(g_head, g_mixed, personal, mixed, a, active, (self.lam, self.mu), sign)
        return g_head, g_mixed, penalty

    @torch.no_grad()
    def step(self, rows, p: dict, y: torch.Tensor, a: torch.Tensor, active: torch.Tensor, _fidx=None):
        """One step of every client: the gradients (None for what this object applies or sums itself:
        ``router.w1`` and the fused rows) and each client's weighted loss ``[C]``."""
        fused, fidx = rows
        pre, hidden, w = self.first.forward(p, self.head.temperature)
        mixed = self._mixture(fused, w)
        personal = self.buffer("personal", mixed, mixed.shape)
        torch.index_select(self.personal, 0, fidx, out=personal.view(-1, self.head.d))
        h, b = p[WEIGHT], p[BIAS]
        # the item vector written once and read twice: <h, v> as a broadcast dot product (a batched product with
        # one column is several times slower on the CPU), Σ_l δ_l v_l as a batched product with one row
        vecs = torch.add(mixed, personal, out=self.buffer("vecs", mixed, mixed.shape))
        logits = torch.linalg.vecdot(vecs, h.unsqueeze(1)) + b.unsqueeze(-1)
        delta = (torch.sigmoid(logits) - y) * a
        grads = {WEIGHT: torch.bmm(delta.unsqueeze(1), vecs).squeeze(1), BIAS: delta.sum(1)}
        loss = F.binary_cross_entropy_with_logits(logits, y, weight=a, reduction="none").sum(1)
        g_head = torch.mul(delta.unsqueeze(-1), h.unsqueeze(1), out=self.buffer("g_personal", mixed, mixed.shape))
        g_personal, g_mixed, penalty = self._penalised(g_head, personal, mixed, a, active)
        g_w = self._weight_grads(fused, g_mixed)
        self.first.decay(active)
        g_pre, router = router_grads(pre, hidden, w, g_w, p["router.w2"], self.head.temperature)
        self.first.add(g_pre)
        grads.update(router, **{"router.w1": None})
        self._record_rows(fidx, g_mixed, w)
        grads[PERSONAL], grads[self.head.table] = g_personal, None
        return grads, loss if penalty is None else loss + penalty

    @staticmethod
    def _weight_grads(fused: torch.Tensor, g_mixed: torch.Tensor) -> torch.Tensor:
        """``∂J/∂w_j = Σ_l <e_l, F_lj>`` -> ``[C, J]``: one batched product with one row a client, ``e`` against
        every expert's ``[L d]`` block read in place."""
        j_n, c_n = fused.shape[:2]
        return torch.bmm(g_mixed.reshape(c_n, 1, -1), fused.view(j_n, c_n, -1).permute(1, 2, 0)).squeeze(1)

    def _record_rows(self, fidx: torch.Tensor, g_mixed: torch.Tensor, w: torch.Tensor) -> None:
        """Add each example's ``∂J/∂F_lj = w_j e_l`` to the sum of its touched row."""
        c_n, l_n, d = g_mixed.shape
        j_n = w.shape[1]
        per_row = self.buffer("row_grads", g_mixed, (c_n, l_n, j_n, d))
        torch.mul(g_mixed.unsqueeze(2), w.view(c_n, 1, j_n, 1), out=per_row)
        self.rows_grad.index_add_(0, fidx, per_row.view(-1, j_n * d))

    @torch.no_grad()
    def finish(self, p: dict, acc: dict | None = None) -> None:
        """Write ``router.w1`` in place (the fused rows' gradient is handed over by :meth:`table_grads`)."""
        self.first.write(p["router.w1"])

    @torch.no_grad()
    def table_grads(self, touched: torch.Tensor) -> torch.Tensor:
        """The clients' summed gradient of their touched fused rows: ``[C, T, J d]``."""
        return self.rows_grad.view(self.c_n, self.t_max, -1)


def additive_kernel(layer) -> MixtureAdditive | None:
    """The additive steps of ``layer`` (a :class:`~.layer.FusionLayer` that routes over several experts and adds
    nothing else to the item vector or the loss, which the layer checks), where it sits in front of FedRAP's own
    forward with FedRAP's personal table; else None."""
    from ..adapters.fedrap import FedRAP
    from .layer import FUSED

    base = layer.base
    # (FedRAP's own closed form exists only where a subclass changes none of its forward and penalty)
    fedrap = isinstance(base, FedRAP) and base.step_kernel() is not None
    if not (fedrap and layer.additive == (PERSONAL,) and layer.d == base.dim):
        return None
    return MixtureAdditive(FUSED, len(layer.experts), layer.d, layer.temperature, base.curriculum)
