"""FedRAP's local steps in closed form: a chunk's gradients written out, with no autograd graph.

For client ``u`` and the examples ``l`` of one step, with ``A_l``/``C_l`` the rows of the personal and the common
table, ``w``/``b`` the head, ``a_l`` the example's weight in the client's mean loss, ``m_l`` its mask and ``n`` the
step's real examples (:mod:`.fedrap`):

    logit_l = <w, A_l + C_l> + b,   δ_l = ∂J/∂logit_l = a_l (σ(logit_l) − y_l),
    R = (−λ Σ_l m_l ||A_l − C_l||² + μ Σ_l m_l |C_l|_1) / (d n),

so every gradient is a short expression of the rows the step already gathered:

    ∂J/∂A_l = δ_l w − 2λ m_l (A_l − C_l) / (d n),
    ∂J/∂C_l = δ_l w + 2λ m_l (A_l − C_l) / (d n) + μ m_l sign(C_l) / (d n),
    ∂J/∂w = Σ_l δ_l (A_l + C_l),   ∂J/∂b = Σ_l δ_l.

This is the graph autograd differentiates on the generic path (the sequential reference and the tests keep it);
the simulator applies these gradients exactly as it applies autograd's (:class:`_LocalSGD.step`), so weight decay
and gradient uploads behave the same. ``sign(0) = 0``, as autograd's gradient of ``|x|`` at 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .chunk_steps import ChunkSteps, steps_shared

COMMON, PERSONAL, WEIGHT, BIAS = "item_common", "item_personal", "head_w", "head_b"


@dataclass(frozen=True)
class FedRAPKernel:
    """The closed form of a FedRAP chunk's local steps (the simulator's step-kernel interface). ``penalties``
    maps a round to its curriculum weights ``(λ_t, μ_t)`` (:meth:`FedRAP.curriculum`)."""

    penalties: object

    table = COMMON
    names = frozenset({COMMON, PERSONAL, WEIGHT, BIAS})

    #: the rounds these steps cover: each client steps its own copy of the shared parts (else autograd trains them)
    covers = staticmethod(steps_shared)

    def local_steps(self, ctx: dict, p: dict, lr: float, wd: float, defer) -> FedRAPSteps:
        lam, mu = self.penalties(int(ctx.get("round", 1)))
        return FedRAPSteps(p, float(lam), float(mu), ctx.get("scratch"))


class FedRAPSteps(ChunkSteps):
    """One chunk's steps: ``p`` holds the clients' stacked parameters, the tables as their ``[C, T, d]`` touched
    rows (stepped in place by the simulator between steps)."""

    prefix = "fedrap"

    def __init__(self, p: dict, lam: float, mu: float, scratch=None):
        super().__init__(scratch)
        self.common = p[COMMON].view(-1, p[COMMON].shape[-1])
        self.personal = p[PERSONAL].view(-1, p[PERSONAL].shape[-1])
        self.lam, self.mu = lam, mu

    @torch.no_grad()
    def step(self, fidx, p: dict, y: torch.Tensor, a: torch.Tensor, active: torch.Tensor, _fidx=None):
        """Every client's gradients (the tables' as ``[C, L, d]`` rows) and its weighted loss ``[C]``."""
        shape = (*y.shape, self.common.shape[-1])
        common, personal = self.gather("common", self.common, fidx, y), self.gather("personal", self.personal, fidx, y)
        w, b = p[WEIGHT], p[BIAS]
        # A + C written once and read twice: <w, A + C> as a broadcast dot product (a batched product with one
        # column is several times slower on the CPU), Σ_l δ_l (A + C) as a batched product with one row
        vecs = torch.add(personal, common, out=self.buffer("vecs", y, shape))
        logits = torch.linalg.vecdot(vecs, w.unsqueeze(1)) + b.unsqueeze(-1)
        delta = (torch.sigmoid(logits) - y) * a
        g_w = torch.bmm(delta.unsqueeze(1), vecs)
        grads = {WEIGHT: g_w.squeeze(1), BIAS: delta.sum(1)}
        loss = F.binary_cross_entropy_with_logits(logits, y, weight=a, reduction="none").sum(1)
        g_personal = torch.mul(delta.unsqueeze(-1), w.unsqueeze(1), out=self.buffer("g_personal", y, shape))
        # (a second buffer: the simulator scales each table's gradient in place)
        g_common = self.buffer("g_common", y, shape).copy_(g_personal)
        grads[PERSONAL], grads[COMMON] = g_personal, g_common
        if self.lam == 0.0 and self.mu == 0.0:  # (FedRAP adds no penalty then, not a zero one)
            return grads, loss
        sign = self.buffer("sign", y, shape)
        penalty = add_penalty(g_personal, g_common, personal, common, a, active, (self.lam, self.mu), sign)
        return grads, loss + penalty


def add_penalty(g_personal, g_shared, personal, shared, a, active, penalties: tuple, sign) -> torch.Tensor:
    """Add FedRAP's penalty ``R`` to a step's gradients of the personal rows ``A_l`` and of the shared vectors
    ``S_l`` (``[C, L, d]``, in place) and return each active client's penalty ``[C]``: with ``s_l = m_l / (d n)``,
    ``∂R/∂A_l = −2λ s_l (A_l − S_l)`` and ``∂R/∂S_l = 2λ s_l (A_l − S_l) + μ s_l sign(S_l)``. ``personal`` is
    overwritten with ``A − S`` and ``sign`` (a buffer of the same shape) with ``sign(S)``; ``a`` are the examples'
    weights (zero on padding), ``active`` the clients that have this step."""
    lam, mu = penalties
    mask = (a > 0).to(a.dtype)
    d, n = shared.shape[-1], mask.sum(-1).clamp(min=1.0)
    scale = (mask * (active / (d * n)).unsqueeze(-1)).unsqueeze(-1)  # m_l / (d n) of active clients
    torch.sign(shared, out=sign)
    g_shared.addcmul_(sign, scale, value=mu)
    gap = torch.sub(personal, shared, out=personal)
    g_personal.addcmul_(gap, scale, value=-2.0 * lam)
    g_shared.addcmul_(gap, scale, value=2.0 * lam)
    # |S_l|_1 = <S_l, sign(S_l)> exactly; the penalty's means over d as sums / d
    spread = (torch.linalg.vecdot(gap, gap) * mask).sum(-1)
    sparsity = (torch.linalg.vecdot(shared, sign) * mask).sum(-1)
    return (mu * sparsity - lam * spread) / (d * n) * active
