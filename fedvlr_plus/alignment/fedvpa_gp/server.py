"""FedVPA-GP's server side: the prior table of the clients' posterior summaries, the balanced k-means prototype
labels, and the federated training of one method on the shared round loop (FedAvg, then the server Adam)."""
from __future__ import annotations

import numpy as np
import torch

from ...federation.messages import ClientUpdate
from ...federation.rounds import RoundLoop, fit_each, over_the_wire
from ...federation.state.store import MemoryStore
from ...federation.strategies.server_adam import ServerAdam
from ..pairs import PreferencePairs, kmeans
from .batched import BatchedVPAClients
from .client import VPAClient
from .config import POSTERIOR_LOGVAR, POSTERIOR_MU, VPAConfig
from .model import VPAModel, named_arrays, orthonormal_rows, prototype_matrix
from .optim import fedadam_step, round_lr


class PriorTable:
    """The server's table of every client's posterior summary; a round's uploads overwrite their rows, the
    others keep theirs."""

    def __init__(self, n_clients: int, latent: int):
        self.mu = torch.zeros(n_clients, latent)
        self.logvar = torch.zeros(n_clients, latent)
        self.count = torch.zeros(n_clients)
        self.present = torch.zeros(n_clients, dtype=torch.bool)

    def update(self, updates: list[ClientUpdate]) -> None:
        for u in updates:
            self.mu[u.cid] = torch.as_tensor(u.arrays[POSTERIOR_MU]).float()
            self.logvar[u.cid] = torch.as_tensor(u.arrays[POSTERIOR_LOGVAR]).float()
            self.count[u.cid] = float(u.num_examples)
            self.present[u.cid] = True

    def arrays(self) -> dict[str, torch.Tensor]:
        return {"prior.mu": self.mu.clone(), "prior.logvar": self.logvar.clone(), "prior.count": self.count.clone(),
                "prior.present": self.present.clone()}


def prototype_labels(mu: np.ndarray, proto: np.ndarray, seed: int = 0) -> np.ndarray:
    """Balanced k-means (k = M, k-means++ seeding) over client mean-z; cluster j is then given the prototype that
    minimises the total centre-to-prototype distance over all matchings (so labels follow the data, and stay put
    from round to round once the clusters sit on their prototypes)."""
    from itertools import permutations

    labels, centres = kmeans(mu, len(proto), seed=seed, balanced=True)
    d = ((centres[:, None, :] - proto[None]) ** 2).sum(-1)
    best = min(permutations(range(len(proto))), key=lambda p: sum(d[j, p[j]] for j in range(len(p))))
    return np.asarray(best)[labels]

class _Spec:
    item_table = False


def train_federated(train: PreferencePairs, test: PreferencePairs, cfg: VPAConfig, *, log: list | None = None,
                    simulator: str = "batched", on_round=None):
    """Train one method over the clients of ``train`` (all clients every round); return the shared state, the
    clients, the prior table, the prototype labels and the per-round history. ``simulator``: ``batched`` (all
    clients at once, :class:`BatchedVPAClients`) or ``sequential`` (one :class:`VPAClient` at a time).
    ``on_round(r, shared, table, labels)``: called after every round (diagnostics)."""
    from ...federation.strategies.fedavg import FedAvgStrategy

    torch.manual_seed(cfg.seed)
    K = train.n_clients
    model = VPAModel.from_config(train.chosen.shape[1], cfg)
    shared = named_arrays(model)
    specs = {k: _Spec() for k in shared}
    store = MemoryStore()
    clients = [VPAClient(k, train.of_client(k), test.of_client(k), cfg, n_table=K, store=store)
               for k in range(K) if (train.client == k).sum() >= 2]
    table = PriorTable(K, cfg.latent)
    labels = np.full(K, -1, np.int64)
    fixed_proto = prototype_matrix(cfg.prototypes, cfg.latent, cfg.prototype_scale).numpy()
    strategy = FedAvgStrategy()
    server_adam = ServerAdam() if cfg.server_optimizer == "adam" else None

    def configure(r, shared):
        # the clients see the network, the peers' posterior summaries and their prototype labels
        return {**shared, **table.arrays(), "labels": torch.as_tensor(labels)}, {"round": r}

    def aggregate(r, shared, updates, config):
        if log is not None:
            log.extend(updates)
        params = [ClientUpdate(cid=u.cid, kind="params", num_examples=u.num_examples,
                               arrays={k: v for k, v in u.arrays.items() if k.startswith("net.")}) for u in updates]
        averaged = strategy.aggregate(shared, params, specs)
        shared = averaged if server_adam is None else fedadam_step(server_adam, shared, averaged, round_lr(cfg, r))
        if cfg.method != "monolithic":
            table.update(updates)
            warmup = cfg.rounds // 3 if cfg.ortho_warmup is None else cfg.ortho_warmup
            if cfg.method == "fedvpa_gp" and r >= warmup:
                # labels from the clients' mean z only once z carries the preference signal: assigned on the
                # first rounds' near-random z, the prototype pull would lock random labels in
                have = table.present.numpy()
                proto = fixed_proto if "net.proto" not in shared else orthonormal_rows(
                    torch.as_tensor(np.asarray(shared["net.proto"]), dtype=torch.float32), cfg.prototype_scale).numpy()
                labels[have] = prototype_labels(table.mu[have].numpy(), proto, seed=cfg.seed + r)
        return shared, {"round": r, "loss": float(np.mean([u.metrics["loss"] for u in updates])),
                        "kl_term": float(np.mean([u.metrics["kl"] for u in updates]))}

    if simulator == "batched":
        batched = BatchedVPAClients(train, cfg, n_table=K, store=store)
        fit = over_the_wire(lambda cohort, message, config: batched.fit(message, config))  # all clients at once
    else:
        fit = over_the_wire(fit_each)
    report = None if on_round is None else lambda r, shared, record: on_round(r, shared, table, labels)
    loop = RoundLoop(clients, aggregate, fit=fit, configure=configure, on_round=report)
    shared, history = loop.run(shared, range(1, cfg.rounds + 1))
    return shared, clients, table, labels, history
