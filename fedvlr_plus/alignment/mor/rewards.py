"""MoR's clients: private Bradley-Terry reward models of different architectures, and the scoring service
through which a client uploads only the scores of the server's queries, never its parameters."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ...federation.messages import ClientUpdate
from ...federation.rounds import fit_each, over_the_wire
from ...federation.state.store import MemoryStore
from ..pairs import PreferencePairs, pairwise_accuracy

REWARD_KINDS = ("bilinear", "mlp", "linear")
SCORE_ARRAY = "scores"


# ------------------------------------------------------------------------------------------------ reward models
class BilinearReward(torch.nn.Module):
    """r(x, y) = x^T W y + w . y: context-dependent taste plus a context-free item quality."""

    kind = "bilinear"

    def __init__(self, dc: int, d: int, rank: int = 16):
        super().__init__()
        self.U = torch.nn.Linear(dc, rank, bias=False)
        self.V = torch.nn.Linear(d, rank, bias=False)
        self.w = torch.nn.Linear(d, 1)

    def forward(self, x, y):
        return (self.U(x) * self.V(y)).sum(-1) + self.w(y).squeeze(-1)


class MLPReward(torch.nn.Module):
    """r(x, y) = MLP([x ; y ; x * y]) (the elementwise product only when the dimensions agree)."""

    kind = "mlp"

    def __init__(self, dc: int, d: int, hidden: int = 64):
        super().__init__()
        self.prod = dc == d
        self.net = torch.nn.Sequential(
            torch.nn.Linear(dc + d + (d if self.prod else 0), hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
        )

    def forward(self, x, y):
        x = x.expand(*y.shape[:-1], x.shape[-1])
        parts = [x, y, x * y] if self.prod else [x, y]
        return self.net(torch.cat(parts, -1)).squeeze(-1)


class LinearReward(torch.nn.Module):
    """r(x, y) = w . y: one item-quality direction, blind to the context."""

    kind = "linear"

    def __init__(self, dc: int, d: int):
        super().__init__()
        self.w = torch.nn.Linear(d, 1)

    def forward(self, x, y):
        return self.w(y).squeeze(-1)


def make_reward(kind: str, dc: int, d: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    if kind == "bilinear":
        return BilinearReward(dc, d)
    if kind == "mlp":
        return MLPReward(dc, d)
    if kind == "linear":
        return LinearReward(dc, d)
    raise ValueError(f"unknown reward architecture {kind!r} ({', '.join(REWARD_KINDS)})")


def train_bradley_terry(
    model: torch.nn.Module,
    pairs: PreferencePairs,
    *,
    epochs: int = 30,
    lr: float = 1e-2,
    weight_decay: float = 1e-4,
    batch_size: int = 256,
    seed: int = 0,
) -> list[float]:
    """Minimise -log sigma(r(x, chosen) - r(x, rejected)) with Adam; returns the mean loss per epoch."""
    x, c, r = (torch.as_tensor(a, dtype=torch.float32) for a in (pairs.context, pairs.chosen, pairs.rejected))
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=g)
        tot = 0.0
        for s in range(0, len(x), batch_size):
            b = perm[s : s + batch_size]
            loss = -F.logsigmoid(model(x[b], c[b]) - model(x[b], r[b])).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot += float(loss.detach()) * len(b)
        losses.append(tot / max(len(x), 1))
    return losses


# ------------------------------------------------------------------------------------------------ the client
class RewardClient:
    """A MoR client: private pairs, a private reward model (in ``store``), and a scoring service.

    ``fit(shared, config)``: ``shared`` holds the server's queries ``"query.context"`` [Q, dc] and
    ``"query.items"`` [Q, G, d]; the client trains its reward model on its pairs the first time (the model then
    lives in the store), scores the queries and uploads only ``{"scores": [Q, G]}``.
    ``evaluate(shared, config)``: held-out pairwise accuracy on its own held-out pairs and, when ``shared`` carries
    ``"pairs.context" / "pairs.chosen" / "pairs.rejected"``, on those pairs (e.g. other clients' held-out pairs).
    """

    def __init__(
        self,
        cid: int,
        kind: str,
        train: PreferencePairs,
        test: PreferencePairs | None = None,
        *,
        store=None,
        seed: int = 0,
        epochs: int = 30,
        lr: float = 1e-2,
        weight_decay: float = 1e-4,
    ):
        if not len(train):
            raise ValueError(f"MoR client {cid}: no training pairs")
        self.cid, self.kind = int(cid), kind
        self.train, self.test = train, test
        self.store = store if store is not None else MemoryStore()
        self.seed, self.epochs, self.lr, self.wd = int(seed), int(epochs), float(lr), float(weight_decay)
        self.dc, self.d = train.context.shape[1], train.chosen.shape[1]
        self.train_loss: list[float] = []

    def _model(self) -> torch.nn.Module:
        model = make_reward(self.kind, self.dc, self.d, seed=self.seed * 1000 + self.cid)
        state = self.store.load(self.cid)
        if state is None:  # first contact: train locally, keep the model private
            self.train_loss = train_bradley_terry(
                model, self.train, epochs=self.epochs, lr=self.lr, weight_decay=self.wd, seed=self.seed + self.cid
            )
            self.store.save(self.cid, {k: v.detach().clone() for k, v in model.state_dict().items()})
        else:
            model.load_state_dict(state)
        return model.eval()

    def score(self, context, items) -> torch.Tensor:
        """Scores of items [Q, G, d] (or [Q, d]) in contexts [Q, dc]."""
        model = self._model()
        x = torch.as_tensor(np.asarray(context), dtype=torch.float32)
        y = torch.as_tensor(np.asarray(items), dtype=torch.float32)
        with torch.no_grad():
            return model(x.unsqueeze(1) if y.dim() == 3 else x, y)

    def fit(self, shared: dict, config: dict) -> ClientUpdate:
        for key in ("query.context", "query.items"):
            if key not in shared:
                raise ValueError(f"MoR client {self.cid}: the server did not send {key!r}")
        s = self.score(shared["query.context"], shared["query.items"])
        return ClientUpdate(
            cid=self.cid,
            kind="params",
            arrays={SCORE_ARRAY: s.to(torch.float32)},
            num_examples=len(self.train),
            metrics={"queries": float(s.numel())},
        )

    def accuracy(self, pairs: PreferencePairs) -> float:
        if not len(pairs):
            return float("nan")
        return pairwise_accuracy(
            self.score(pairs.context, pairs.chosen).numpy(), self.score(pairs.context, pairs.rejected).numpy()
        )

    def evaluate(self, shared: dict, config: dict) -> dict:
        out = {
            "cid": self.cid,
            "architecture": self.kind,
            "own_accuracy": self.accuracy(self.test) if self.test is not None else float("nan"),
        }
        if "pairs.context" in shared:
            s_c = self.score(shared["pairs.context"], shared["pairs.chosen"]).numpy()
            s_r = self.score(shared["pairs.context"], shared["pairs.rejected"]).numpy()
            out["given_accuracy"] = pairwise_accuracy(s_c, s_r)
        return out


def score_queries(context, items, extra: dict | None = None) -> dict:
    """The server's message to the clients: contexts [Q, dc] and items [Q, G, d] (or [Q, d]) to score, plus
    ``extra`` named arrays (item ids and histories for clients that score item ids, :mod:`.mor_items`)."""
    return {
        "query.context": np.asarray(context, np.float32),
        "query.items": np.asarray(items, np.float32),
        **(extra or {}),
    }


def stack_scores(updates: list[ClientUpdate], shape, log: list | None = None) -> torch.Tensor:
    """The uploaded scores, one client after another: [K, *shape]. Anything but scores is refused."""
    out = []
    for u in updates:
        if set(u.arrays) != {SCORE_ARRAY}:
            raise ValueError(f"client {u.cid} uploaded {sorted(u.arrays)}; MoR clients upload scores only")
        if log is not None:
            log.append(u)
        out.append(u.arrays[SCORE_ARRAY].reshape(shape))
    return torch.stack(out).float()


def query_clients(
    clients, context, items, round_index: int = 0, log: list | None = None, extra: dict | None = None
) -> torch.Tensor:
    """Send one batch of queries to every client (their ``fit``) and stack the uploaded scores: [K, Q, G]."""
    updates = over_the_wire(fit_each)(clients, score_queries(context, items, extra), {"round": round_index})
    return stack_scores(updates, np.asarray(items).shape[:-1], log)
