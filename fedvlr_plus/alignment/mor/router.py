"""MoR's server-side fusion: per-client score standardisation, the router over clients per input and objective,
and the fused reward R(x, y; o) = sum_k w_k(x, o) z_k(x, y)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .rewards import query_clients


class Router(torch.nn.Module):
    """w(x, o) = softmax(W2 tanh(W1 [x ; onehot(o)])) over K clients.

    Once trained (:func:`train_router` records which objectives it saw), an objective it never saw, such as a held-out
    client's group, gets the mean of its weights over the seen objectives at the same x: that objective's input
    weights were never trained, so reading them would route on their random start.
    """

    def __init__(self, dc: int, n_objectives: int, n_clients: int, hidden: int = 32):
        super().__init__()
        self.n_objectives = n_objectives
        self.net = torch.nn.Sequential(
            torch.nn.Linear(dc + n_objectives, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, n_clients)
        )
        self.register_buffer("seen", torch.zeros(n_objectives, dtype=torch.bool))

    def forward(self, x, o):
        x = torch.as_tensor(x, dtype=torch.float32)
        o = torch.as_tensor(o, dtype=torch.long)
        w = self._weights(x, o)
        unseen = ~self.seen[o]
        if self.seen.any() and unseen.any():  # an untrained router (nothing seen) reads its weights as they are
            w = w.clone()
            w[unseen] = self._over_seen_objectives(x[unseen])
        return w

    def _weights(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        oh = F.one_hot(o, self.n_objectives).float()
        return torch.softmax(self.net(torch.cat([x, oh], -1)), -1)

    def _over_seen_objectives(self, x: torch.Tensor) -> torch.Tensor:
        seen = torch.nonzero(self.seen).flatten().tolist()
        return torch.stack([self._weights(x, torch.full((len(x),), int(j))) for j in seen]).mean(0)


@dataclass
class Standardiser:
    """Per-client z-scoring of scores, with statistics from the public set."""

    mean: torch.Tensor  # [K]
    std: torch.Tensor  # [K]

    @classmethod
    def fit(cls, scores: torch.Tensor) -> Standardiser:
        """``scores`` [K, ...]: every score each client gave on the public set."""
        flat = scores.reshape(scores.shape[0], -1)
        return cls(flat.mean(1), flat.std(1).clamp_min(1e-6))

    def __call__(self, scores: torch.Tensor) -> torch.Tensor:
        shape = (-1,) + (1,) * (scores.dim() - 1)
        return (scores - self.mean.reshape(shape)) / self.std.reshape(shape)


def fuse(weights: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """R = sum_k w_k z_k; weights [Q, K], z [K, Q] or [K, Q, G] -> [Q] or [Q, G]."""
    w = weights.T
    if z.dim() == 3:
        w = w.unsqueeze(-1)
    return (w * z).sum(0)


def train_router(
    router: Router,
    z_chosen: torch.Tensor,
    z_rejected: torch.Tensor,
    x,
    o,
    *,
    epochs: int = 200,
    lr: float = 1e-2,
    balance: float = 0.1,
    seed: int = 0,
    holdout: float = 0.0,
) -> list[float]:
    """Bradley-Terry loss of the fused reward on public pairs + ``balance`` * sum_k wbar_k log wbar_k.

    z_chosen / z_rejected: [K, N] standardised client scores of the public pairs; x [N, dc]; o [N] objectives.
    ``holdout`` > 0: that share of the pairs is kept out of training and the router ends with the weights of the
    epoch whose Bradley-Terry loss on them was lowest (early stopping; a router fitted to a small public set
    otherwise switches between clients on noise and loses the ensemble that averaging gives).
    """
    torch.manual_seed(seed)
    x = torch.as_tensor(x, dtype=torch.float32)
    o = torch.as_tensor(o, dtype=torch.long)
    router.seen[torch.unique(o)] = True
    opt = torch.optim.Adam(router.parameters(), lr=lr)
    margin = (z_chosen - z_rejected).float()
    fit, held = _holdout_rows(len(x), holdout, seed)
    best, best_state = float("inf"), None
    losses = []
    for _ in range(epochs):
        w = router(x[fit], o[fit])  # [N, K]
        fused = (w.T * margin[:, fit]).sum(0)
        wbar = w.mean(0)
        loss = -F.logsigmoid(fused).mean() + balance * (wbar * torch.log(wbar + 1e-12)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if held is not None:
            with torch.no_grad():
                held_loss = float(-F.logsigmoid((router(x[held], o[held]).T * margin[:, held]).sum(0)).mean())
            if held_loss < best:
                best, best_state = held_loss, {k: v.clone() for k, v in router.state_dict().items()}
    if best_state is not None:
        router.load_state_dict(best_state)
    return losses


def _holdout_rows(n: int, holdout: float, seed: int):
    """(rows to fit, held-out rows or None): every row is fitted without a holdout."""
    if holdout <= 0:
        return slice(None), None
    held = np.random.default_rng(seed).random(n) < holdout
    if held.all() or not held.any():
        return slice(None), None
    return torch.as_tensor(np.flatnonzero(~held)), torch.as_tensor(np.flatnonzero(held))


def router_weights_by_objective(router: Router, x, o, n_objectives: int) -> list[list[float]]:
    """Mean router weight of each client (columns) over the inputs of each objective (rows)."""
    with torch.no_grad():
        w = router(x, o).numpy()
    o = np.asarray(o)
    return [w[o == j].mean(0).tolist() if (o == j).any() else [float("nan")] * w.shape[1] for j in range(n_objectives)]


def fused_reward(clients, router, std, x, o, items, round_index=0, log=None) -> torch.Tensor:
    """Fused reward of items [Q, G, d] for contexts x [Q, dc] and objectives o [Q]: [Q, G]."""
    return fuse_scores(router, std, x, o, query_clients(clients, x, items, round_index, log))


def fuse_scores(router, std, x, o, scores: torch.Tensor) -> torch.Tensor:
    """The router's mixture of the standardised client scores [K, Q, G] for contexts x and objectives o: [Q, G]."""
    z = std(scores)
    with torch.no_grad():
        w = router(x, o)
    return fuse(w, z)
