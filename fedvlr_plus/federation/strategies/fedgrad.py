"""Gradient aggregation with a server optimizer (FedVLR Algorithm 1).

Clients keep the shared parameters fixed during local training, accumulate their gradients over **all** local
steps and upload the sums. The server forms ``g = Σ_u w_u g_u`` with ``w_u = n_u / Σ_v n_v`` (item-table rows a
client did not touch contribute zero) and steps its own optimizer on the shared parameters: plain SGD
``θ ← θ − η g`` by default, as in Algorithm 1, or Adam as a named option (FedAdam). Item-table rows use
``η · item_lr_scale``, the same row multiplier the clients use. The optimizer that is stepped
updates exactly the shared parameters it is given (an optimizer holding other copies would leave the server
state unchanged; docs/method.md, "Departures from the original release"); Adam's moments are part of the
checkpoint. The Adam update is the standard one, :class:`~.server_adam.ServerAdam`.

References: Li, Long, Jiang, Zhang, Yang, "Federated Vision-Language-Recommendation with Personalized Fusion",
AAAI-26, Algorithm 1; Ammad-ud-din et al., "Federated Collaborative Filtering ...", arXiv:1901.09888, 2019 (item
factors updated from aggregated user gradients); Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan,
"Adaptive Federated Optimization", ICLR 2021 (the Adam option).
"""

from __future__ import annotations

from .base import Strategy
from .server_adam import ServerAdam


class FedGradStrategy(Strategy):
    name = "fedgrad"
    upload = "grads"
    linear = True

    def __init__(
        self,
        server_lr: float,
        optimizer: str = "sgd",
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        item_lr_scale: float = 1.0,
    ):
        if optimizer not in ("sgd", "adam"):
            raise ValueError(f"server optimizer must be 'sgd' or 'adam', got {optimizer!r}")
        if not server_lr > 0:
            raise ValueError(f"server learning rate must be positive, got {server_lr}")
        self.server_lr = float(server_lr)
        self.item_lr_scale = float(item_lr_scale)
        self.optimizer_name = optimizer
        self.adam = ServerAdam(betas, eps) if optimizer == "adam" else None

    def from_sums(self, shared, sums, specs):
        out = {}
        if self.adam is not None:
            self.adam.tick()
        for name, p in shared.items():
            if specs[name].item_table:
                g = sums.row_sums(name)[0].reshape(p.shape)
            else:
                g = sums.dense_sum(name).to(p.dtype)
            lr = self.server_lr * (self.item_lr_scale if specs[name].scaled else 1.0)
            out[name] = p - lr * g if self.adam is None else self.adam.update(name, p, g, lr)
        return out

    def state_dict(self) -> dict:
        return {} if self.adam is None else self.adam.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        if self.adam is None:
            raise ValueError("an Adam state cannot be loaded into the SGD server optimizer")
        self.adam.load_state_dict(state)
