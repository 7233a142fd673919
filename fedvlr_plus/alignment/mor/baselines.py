"""The federated alignment baselines MoR is compared with on the same GRPO run: one reward model of one
architecture trained by FedAvg over the clients' pairs (parameters are exchanged, the thing MoR avoids), and the
clients' own rewards averaged uniformly (no router)."""

from __future__ import annotations

import numpy as np
import torch

from ...federation.messages import ClientUpdate
from ...federation.rounds import RoundLoop, fit_each, over_the_wire
from ...federation.strategies.fedavg import FedAvgStrategy
from ..pairs import PreferencePairs
from .rewards import SCORE_ARRAY, make_reward, train_bradley_terry


class _DenseSpec:
    item_table = False


class FedAvgRewardClient:
    """A client of the FedAvg reward: loads the broadcast parameters, takes ``epochs`` local Bradley-Terry epochs
    on its own pairs and uploads its new parameters."""

    def __init__(self, cid: int, kind: str, pairs: PreferencePairs, *, epochs: int, lr: float, seed: int):
        self.cid, self.kind, self.pairs = int(cid), kind, pairs
        self.epochs, self.lr, self.seed = int(epochs), float(lr), int(seed)

    def fit(self, shared: dict, config: dict) -> ClientUpdate:
        model = make_reward(self.kind, self.pairs.context.shape[1], self.pairs.chosen.shape[1])
        model.load_state_dict({k: torch.as_tensor(v) for k, v in shared.items()})
        loss = train_bradley_terry(
            model,
            self.pairs,
            epochs=self.epochs,
            lr=self.lr,
            seed=self.seed * 1000 + 7 * int(config["round"]) + self.cid,
        )
        return ClientUpdate(
            cid=self.cid,
            kind="params",
            num_examples=len(self.pairs),
            arrays={k: v.detach().clone() for k, v in model.state_dict().items()},
            metrics={"loss": loss[-1]},
        )


def fedavg_reward(
    train: PreferencePairs,
    *,
    kind: str = "bilinear",
    rounds: int = 10,
    local_epochs: int = 3,
    lr: float = 1e-2,
    seed: int = 0,
    on_round=None,
) -> tuple[torch.nn.Module, list[dict]]:
    """One ``kind`` reward model trained by FedAvg (example-weighted mean of the clients' parameters every round)
    over every client of ``train``; returns the model and the per-round mean local loss."""
    model = make_reward(kind, train.context.shape[1], train.chosen.shape[1], seed=seed)
    shared = {k: v.detach().clone() for k, v in model.state_dict().items()}
    specs = {k: _DenseSpec() for k in shared}
    clients = [
        FedAvgRewardClient(k, kind, train.of_client(k), epochs=local_epochs, lr=lr, seed=seed)
        for k in np.unique(train.client)
    ]
    strategy = FedAvgStrategy()

    def aggregate(r, state, updates, config):
        if on_round is not None:
            on_round(r, state, updates)
        return strategy.aggregate(state, updates, specs), {
            "round": r,
            "loss": float(np.mean([u.metrics["loss"] for u in updates])),
        }

    loop = RoundLoop(clients, aggregate, fit=over_the_wire(fit_each))
    shared, history = loop.run(shared, range(1, rounds + 1))
    model.load_state_dict(shared)
    return model.eval(), history


class ScoringClient:
    """Serves the scores of a fixed reward model through the same query protocol as a MoR client."""

    def __init__(self, cid: int, model: torch.nn.Module):
        self.cid, self.model = int(cid), model

    def fit(self, shared: dict, config: dict) -> ClientUpdate:
        x = torch.as_tensor(np.asarray(shared["query.context"]), dtype=torch.float32)
        y = torch.as_tensor(np.asarray(shared["query.items"]), dtype=torch.float32)
        with torch.no_grad():
            s = self.model(x.unsqueeze(1) if y.dim() == 3 else x, y)
        return ClientUpdate(cid=self.cid, kind="params", arrays={SCORE_ARRAY: s.float()}, num_examples=0)


class UniformRouter(torch.nn.Module):
    """The router of uniform reward averaging: weight 1/K on every client, for every input and objective."""

    def __init__(self, n_clients: int):
        super().__init__()
        self.n_clients = int(n_clients)

    def forward(self, x, o):
        return torch.full((len(x), self.n_clients), 1.0 / self.n_clients)
