"""Entropic optimal transport by Sinkhorn iterations in the log domain, batched over leading dimensions.

Cuturi, "Sinkhorn Distances: Lightspeed Computation of Optimal Transport", NeurIPS 2013. For a cost C [M, N] and
marginals a [M], b [N] (each summing to the same mass), the plan minimising <T, C> - eps H(T) subject to T 1 = a,
T^T 1 = b is T = diag(u) K diag(v) with K = exp(-C / eps). The classic updates u <- a / (K v), v <- b / (K^T u)
underflow for small eps, so they are run on the dual potentials f = eps log u, g = eps log v:

    f_m = eps log a_m - eps LSE_n((g_n - C_mn) / eps),   g_n = eps log b_n - eps LSE_m((f_m - C_mn) / eps),
    log T_mn = (f_m + g_n - C_mn) / eps.

Unbalanced variant (``rho``): the column marginal is only encouraged, by a penalty ``rho KL(T^T 1 | b)``, instead
of enforced (Chizat, Peyre, Schmitzer, Vialard, "Scaling algorithms for unbalanced optimal transport problems",
Math. Comp. 2018; FedOTP, Li et al., arXiv 2403.10876, relaxes its marginals in the same way). The g update is
then damped by ``rho / (rho + eps)``; ``rho -> inf`` is the balanced plan, ``rho -> 0`` lets each row spread its
mass by ``softmax_n(-C_mn / eps)`` alone, so columns compete for the rows (a row claimed by one column is not
available to another).

Entries with a_m = 0 (padding tokens) get a very negative log-mass instead of -inf so no NaN appears; their rows of
the plan are numerically zero. Used by PLOT (Chen et al., arXiv 2210.01253) and FedMPT for token-to-prompt matching;
the plan is computed without gradient there and gradients flow through the similarity it weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_NEG = -1e4  # log-mass standing in for log(0); exp(-1e4 / eps) is exactly 0 in float32/64


@dataclass
class SinkhornResult:
    plan: torch.Tensor  #: [..., M, N]
    n_iter: int  #: iterations run
    marginal_error: float  #: max |T 1 - a| after the last iteration (the b side is exact after a g update)


def _safe_log(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, torch.log(x.clamp_min(1e-38)), torch.full_like(x, _NEG))


def sinkhorn_log(
    cost: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    eps: float = 0.1,
    max_iter: int = 100,
    tol: float = 1e-3,
    rho: float | None = None,
) -> SinkhornResult:
    """Entropic OT plan between ``a`` ([..., M]) and ``b`` ([..., N]) under ``cost`` ([..., M, N]).

    Stops when the row-marginal error (max over the batch) falls below ``tol`` or after ``max_iter`` iterations
    (each iteration costs two log-sum-exp passes; the error is read off the next row update).
    Both marginals must carry the same total mass per problem. ``rho``: KL penalty on the column marginal
    (unbalanced OT; None enforces it exactly); the row marginal ``a`` is always enforced.
    """
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if rho is not None and rho <= 0:
        raise ValueError(f"rho must be > 0 (or None for balanced OT), got {rho}")
    damp = 1.0 if rho is None else rho / (rho + eps)
    if cost.shape[:-1] != a.shape or cost.shape[:-2] + cost.shape[-1:] != b.shape:
        raise ValueError(f"cost {tuple(cost.shape)} does not match a {tuple(a.shape)} and b {tuple(b.shape)}")
    mass_gap = (a.sum(-1) - b.sum(-1)).abs().max().item() if a.numel() else 0.0
    if rho is None and mass_gap > 1e-4 * max(1.0, float(a.sum(-1).abs().max())):
        raise ValueError(f"marginals must have equal mass per problem (largest gap {mass_gap:.3g})")
    log_a, log_b = _safe_log(a), _safe_log(b)
    kern = -cost / eps  # log K, computed once
    g = torch.zeros_like(b)
    f = eps * (log_a - torch.logsumexp(g.unsqueeze(-2) / eps + kern, dim=-1))
    err, it = float("inf"), 0
    for it in range(1, max_iter + 1):
        g = damp * eps * (log_b - torch.logsumexp(f.unsqueeze(-1) / eps + kern, dim=-2))
        # after the g update the column marginals are exact (balanced OT); the row marginals measure convergence.
        # They come free with the next f update: sum_n T_mn = exp(LSE_n((f_m + g_n - C_mn) / eps)) =
        # a_m exp((f_m - f'_m) / eps), where f' is that update, so no extra pass over the plan is needed
        f_next = eps * (log_a - torch.logsumexp(g.unsqueeze(-2) / eps + kern, dim=-1))
        row = a * torch.exp((f - f_next) / eps)
        err = float((row - a).abs().max()) if a.numel() else 0.0
        if err < tol or it == max_iter:
            break
        f = f_next
    plan = torch.exp((f.unsqueeze(-1) + g.unsqueeze(-2)) / eps + kern)
    return SinkhornResult(plan=plan, n_iter=it, marginal_error=err)
