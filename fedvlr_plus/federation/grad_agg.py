"""Gradient aggregation with a server optimizer (FedVLR Algorithm 1).

Clients keep the shared parameters fixed during local training, accumulate their gradients over **all** local
steps and upload the sums. The server forms ``g = Σ_u w_u g_u`` with ``w_u = n_u / Σ_v n_v`` (item-table rows a
client did not touch contribute zero) and steps its own optimizer on the shared parameters: plain SGD
``θ ← θ − η g`` by default, as in Algorithm 1, or Adam as a named option (FedAdam). Item-table rows use
``η · item_lr_scale``, the same row multiplier the clients use. The optimizer that is stepped
is the one that owns the shared parameters (B3 of fedvlr-method.md); its state is part of the checkpoint.

References: Li, Long, Jiang, Zhang, Yang, "Federated Vision-Language-Recommendation with Personalized Fusion",
AAAI-26, Algorithm 1; Ammad-ud-din et al., "Federated Collaborative Filtering ...", arXiv:1901.09888, 2019 (item
factors updated from aggregated user gradients); Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan,
"Adaptive Federated Optimization", ICLR 2021 (the Adam option).
"""
from __future__ import annotations

import torch

from .strategy import Strategy, check_updates, example_weights, weighted_dense, weighted_row_sums


class GradientAggregation(Strategy):
    name = "fedgrad"
    upload = "grads"

    def __init__(self, server_lr: float, optimizer: str = "sgd", betas=(0.9, 0.999), eps: float = 1e-8,
                 item_lr_scale: float = 1.0):
        if optimizer not in ("sgd", "adam"):
            raise ValueError(f"server optimizer must be 'sgd' or 'adam', got {optimizer!r}")
        if not server_lr > 0:
            raise ValueError(f"server learning rate must be positive, got {server_lr}")
        self.server_lr = float(server_lr)
        self.item_lr_scale = float(item_lr_scale)
        self.optimizer_name = optimizer
        self.betas, self.eps = betas, eps
        self.params: dict[str, torch.Tensor] | None = None
        self.opt: torch.optim.Optimizer | None = None
        self._pending_state: dict | None = None

    def _bind(self, shared: dict[str, torch.Tensor], specs: dict) -> None:
        if self.params is None:
            self.params = {k: v.detach().clone().requires_grad_(True) for k, v in sorted(shared.items())}
            # item-table rows learn at server_lr * item_lr_scale, as they do on the clients
            groups = [{"params": [p for k, p in self.params.items() if specs[k].item_table],
                       "lr": self.server_lr * self.item_lr_scale},
                      {"params": [p for k, p in self.params.items() if not specs[k].item_table],
                       "lr": self.server_lr}]
            groups = [g for g in groups if g["params"]]
            if self.optimizer_name == "sgd":
                self.opt = torch.optim.SGD(groups, lr=self.server_lr)
            else:
                self.opt = torch.optim.Adam(groups, lr=self.server_lr, betas=self.betas, eps=self.eps)
            if self._pending_state is not None:
                self.opt.load_state_dict(self._pending_state)
                self._pending_state = None
        else:
            with torch.no_grad():  # the server state may have been replaced (resume): copy it in
                for k, v in shared.items():
                    if v is not self.params[k]:
                        self.params[k].copy_(v)

    def aggregate(self, shared, updates, specs):
        check_updates(shared, updates, self.upload)
        self._bind(shared, specs)
        w = example_weights(updates)
        for name, p in self.params.items():
            if specs[name].item_table:
                num, _ = weighted_row_sums(updates, name, p.shape, w, p.dtype)
                p.grad = num.reshape(p.shape)
            else:
                p.grad = weighted_dense(updates, name, w).to(p.dtype)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return {k: v.detach().clone() for k, v in self.params.items()}

    def state_dict(self) -> dict:
        if self.opt is not None:
            return {"optimizer": self.opt.state_dict()}
        return {"optimizer": self._pending_state} if self._pending_state is not None else {}

    def load_state_dict(self, state: dict) -> None:
        opt_state = state.get("optimizer") if state else None
        if opt_state is None:
            return
        if self.opt is not None:
            self.opt.load_state_dict(opt_state)
        else:
            self._pending_state = opt_state
