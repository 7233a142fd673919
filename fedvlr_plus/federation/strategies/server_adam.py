"""The server's Adam: one implementation for every server-side Adam step (fedgrad's ``--server-optimizer adam``,
the FedVLR layer's server parameters, FedVPA-GP's FedAdam step).

The standard update with bias-corrected moments, per named array:
``m ← β1 m + (1 − β1) g``, ``v ← β2 v + (1 − β2) g²``, ``θ ← θ − η m̂ / (√v̂ + ε)`` with ``m̂ = m / (1 − β1^t)`` and
``v̂ = v / (1 − β2^t)``; ``t`` counts server steps (:meth:`ServerAdam.tick`), not arrays.

Why not ``torch.optim.Adam``: it rounds differently (it folds the bias corrections into the step size and the
denominator and updates ``m`` with ``lerp``), which moves float32 parameters by a few units in the last place per
step, so results would not be those of earlier releases; and constructing the first ``torch.optim`` optimizer in a
process imports ``torch._dynamo``, seconds that the command line pays on every run. The moments are plain tensors,
so a checkpoint stores them as they are (:mod:`.plain_state`).

Reference: Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan, "Adaptive Federated Optimization",
ICLR 2021 (FedAdam); Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015.
"""

from __future__ import annotations

import torch


class ServerAdam:
    def __init__(self, betas=(0.9, 0.999), eps: float = 1e-8):
        self.betas, self.eps = (float(betas[0]), float(betas[1])), float(eps)
        self.t = 0
        self.m: dict[str, torch.Tensor] = {}
        self.v: dict[str, torch.Tensor] = {}

    def tick(self) -> None:
        """Start a server step: every :meth:`update` until the next tick shares its bias corrections."""
        self.t += 1

    def update(self, name: str, param: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        """The new value of ``param`` after this step with gradient ``grad`` (``param`` itself is not changed)."""
        b1, b2 = self.betas
        m = self.m.get(name, torch.zeros_like(param)) * b1 + (1 - b1) * grad
        v = self.v.get(name, torch.zeros_like(param)) * b2 + (1 - b2) * grad * grad
        self.m[name], self.v[name] = m, v
        m_hat = m / (1 - b1**self.t)
        v_hat = v / (1 - b2**self.t)
        return param - lr * m_hat / (v_hat.sqrt() + self.eps)

    def state_dict(self) -> dict:
        return {"t": self.t, "m": dict(self.m), "v": dict(self.v)}

    def load_state_dict(self, state: dict) -> None:
        self.t = int(state["t"])
        self.m, self.v = dict(state["m"]), dict(state["v"])
