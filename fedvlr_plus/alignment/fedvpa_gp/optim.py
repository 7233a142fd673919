"""FedVPA-GP's step sizes and optimisers: the round's Adam step size, the clients' local optimisers and the
server's Adam step on FedAvg's averaged update (FedAdam)."""

from __future__ import annotations

import math

import numpy as np
import torch

from ...federation.strategies.server_adam import ServerAdam
from .config import VPAConfig


def round_lr(cfg: VPAConfig, r: int) -> float:
    """The Adam step size of round r (1-based): the server's (``server_optimizer="adam"``) or the clients'. Adam's
    steps are about lr whatever the gradient's size, so with a constant lr the federated model keeps moving by
    about lr per round; the cosine schedule lets it settle."""
    if cfg.lr_schedule == "constant":
        return cfg.lr
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * (r - 1) / max(cfg.rounds, 1)))


class _Optimizers:
    def __init__(self, opts):
        self.opts = opts

    def zero_grad(self):
        for o in self.opts:
            o.zero_grad()

    def step(self):
        for o in self.opts:
            o.step()


def local_optimizer(cfg: VPAConfig, net: list, pi: torch.Tensor | None, r: int) -> _Optimizers:
    """The client's optimiser of round r: Adam on the network (``server_optimizer="none"``) or plain SGD
    (``"adam"``: the server adapts the step instead); the private mixture logits pi always with Adam.

    Why the server variant exists: a fresh Adam's first steps are close to lr * sign(gradient). Two client types
    whose gradients on a weight share a sign but differ in size (the encoder's ReLU features are >= 0, and the type
    information sits in their sizes) then move it by +lr and -lr, and FedAvg cancels exactly what would separate
    the types. SGD keeps the sizes; the server's Adam scales the averaged update."""
    lr = round_lr(cfg, r)
    if cfg.server_optimizer == "adam":
        opts = [torch.optim.SGD(net, lr=cfg.local_lr, weight_decay=cfg.weight_decay)]
    else:
        opts = [torch.optim.Adam(net, lr=lr, weight_decay=cfg.weight_decay)]
    if pi is not None:
        opts.append(torch.optim.Adam([pi], lr=lr))
    return _Optimizers(opts)


def fedadam_step(adam: ServerAdam, old: dict, averaged: dict, lr: float) -> dict:
    """One server Adam step on the network over FedAvg's result taken as a pseudo-gradient
    g = theta - mean_k theta_k (FedAdam, Reddi et al., "Adaptive Federated Optimization", ICLR 2021); the other
    arrays pass through as averaged."""
    adam.tick()
    out = dict(averaged)
    for k, a in averaged.items():
        if not k.startswith("net."):
            continue
        o = torch.as_tensor(np.asarray(old[k]), dtype=torch.float32)
        g = o - torch.as_tensor(np.asarray(a), dtype=torch.float32)
        out[k] = adam.update(k, o, g, lr)
    return out
