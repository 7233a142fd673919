"""The router's part of a chunk's closed-form local steps, shared by every head behind the layer.

The router reads the user's history through the round's fixed views, so its input ``x`` is a constant of the
round and every gradient of its first layer ``W1`` is the outer product ``x ⊗ g``. After any number of SGD steps
(with weight decay) ``W1 = α W1_0 − lr x ⊗ G`` for a per-client scale ``α`` and a running sum ``G [C, H]``: the
steps update ``α`` and ``G`` and read ``x W1`` as ``α (x W1_0) − lr |x|² G``, and :meth:`FirstLayer.write`
writes ``W1`` once at the end, instead of ``[C, J d, H]`` twice a step.
"""

from __future__ import annotations

import torch

from ..nn import linear


class FirstLayer:
    """The router's first layer over a chunk's steps: ``x [C, J d]`` the router's input, ``w1`` its first layer's
    stacked weights at the start, ``lr``/``wd`` the steps' learning rate and weight decay."""

    def __init__(self, x: torch.Tensor, w1: torch.Tensor, lr: float, wd: float):
        self.x, self.lr, self.wd = x, float(lr), float(wd)
        with torch.no_grad():
            self.x_w1 = linear(x, w1)
            self.x_sq = (x * x).sum(-1, keepdim=True)
        self.alpha = torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)
        self.g_sum = torch.zeros_like(self.x_w1)

    def pre(self, b1: torch.Tensor) -> torch.Tensor:
        """The router's pre-activation ``x W1 + b1`` at the current step ``[C, H]``."""
        return self.alpha * self.x_w1 - self.lr * self.x_sq * self.g_sum + b1

    def forward(self, p: dict, temperature: float):
        """The router's pre-activation, hidden layer and weights ``[C, J]`` at the current step (the ops of
        ``router_weights``)."""
        pre = self.pre(p["router.b1"])
        hidden = torch.relu(pre)
        return pre, hidden, torch.softmax(linear(hidden, p["router.w2"], p["router.b2"]) / temperature, dim=-1)

    def decay(self, active: torch.Tensor) -> None:
        """Weight decay of the clients that have this step, before its gradient step (as ``_LocalSGD.step``'s)."""
        if self.wd:
            decay = (1.0 - self.lr * self.wd * active).unsqueeze(-1)
            self.alpha *= decay
            self.g_sum *= decay

    def add(self, g_pre: torch.Tensor) -> None:
        """A step's gradient of the pre-activation (``W1``'s is ``x ⊗ g_pre``)."""
        self.g_sum += g_pre

    @torch.no_grad()
    def write(self, w1: torch.Tensor) -> None:
        """Write the steps into ``w1`` (the stacked weights the chunk trains) in place."""
        if self.wd:  # (without weight decay the scale stays 1)
            w1.mul_(self.alpha.unsqueeze(-1))
        w1.baddbmm_(self.x.unsqueeze(-1), self.g_sum.unsqueeze(1), alpha=-self.lr)


def router_grads(pre, hidden, w, g_w, w2: torch.Tensor, temperature: float) -> tuple[torch.Tensor, dict]:
    """The router's gradients from ``∂J/∂w [C, J]``, through the softmax of its logits over ``temperature``:
    ``(∂J/∂pre [C, H], {router.b1, router.w2, router.b2})`` (``router.w1``'s is the first layer's to sum)."""
    g_out = w * (g_w - (w * g_w).sum(-1, keepdim=True)) / temperature
    g_pre = torch.bmm(g_out.unsqueeze(1), w2.transpose(1, 2)).squeeze(1) * (pre > 0)
    return g_pre, {"router.b1": g_pre, "router.w2": hidden.unsqueeze(-1) * g_out.unsqueeze(1), "router.b2": g_out}
