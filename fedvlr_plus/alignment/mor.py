"""MoR (Mixture-of-Rewards): federated alignment by exchanging preference *scores* instead of parameters.

Lu, Wang, Zhang, Yang, Zheng, Tong, Xu, Zheng, "Replacing Parameters with Preferences: Federated Alignment of
Heterogeneous Vision-Language Models", arXiv 2602.00485 / 2605.03426 (2026). No code is public; the algorithm below
is this package's reconstruction, mapped onto recommendation (what is published and what is not:
docs/alignment.md, "MoR"):

1. Each client trains its own Bradley-Terry reward model r_k(x, y) on its own pairs, minimising
   -log sigma(r_k(x, y_w) - r_k(x, y_l)). Architectures differ between clients (bilinear, MLP, linear). The reward
   model is private: a client only ever uploads *scores* of the (context, item) queries the server sends.
2. Server router w(x, o) = softmax(W2 tanh(W1 [x ; onehot(o)])) over the K clients, x the input context and o the
   alignment objective. Fused reward R(x, y; o) = sum_k w_k(x, o) * z_k(x, y) where z_k is client k's score
   standardised with its mean / std on the public set (client scales differ).
3. The router is trained on a small public preference set (tagged with its objective) by the Bradley-Terry loss of
   R, plus a load-balancing term lambda * sum_k wbar_k log wbar_k against collapsing onto one client.
4. Policy: a recommendation policy over a candidate set per user (the frozen reference's top-C unseen items):
   logits = ref_logits / T + delta_theta(x, item), delta = x^T W f(item) + b . f(item), W = b = 0 at the start, so
   pi_theta starts at the frozen reference pi_ref (a trained federated backbone). GRPO rounds (:mod:`.grpo`):
   sample G items per user, query every client for their scores, fuse, step theta on the clipped surrogate with a
   beta-weighted KL to pi_ref.

Everything runs through the federation's client protocol: ``RewardClient.fit(shared, config)`` receives the queries
as named arrays and returns a :class:`~fedvlr_plus.federation.messages.ClientUpdate` whose only array is
``"scores"``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F

from ..federation.messages import ClientUpdate
from ..federation.rounds import RoundLoop, fit_each, over_the_wire
from ..federation.store import MemoryStore
from .grpo import GRPOConfig, grpo_loss, kl_categorical, sample_groups
from .pairs import PreferencePairs, pairwise_accuracy

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
        self.net = torch.nn.Sequential(torch.nn.Linear(dc + d + (d if self.prod else 0), hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(hidden, 1))

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


def train_bradley_terry(model: torch.nn.Module, pairs: PreferencePairs, *, epochs: int = 30, lr: float = 1e-2,
                        weight_decay: float = 1e-4, batch_size: int = 256, seed: int = 0) -> list[float]:
    """Minimise -log sigma(r(x, chosen) - r(x, rejected)) with Adam; returns the mean loss per epoch."""
    x, c, r = (torch.as_tensor(a, dtype=torch.float32) for a in (pairs.context, pairs.chosen, pairs.rejected))
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=g)
        tot = 0.0
        for s in range(0, len(x), batch_size):
            b = perm[s:s + batch_size]
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

    def __init__(self, cid: int, kind: str, train: PreferencePairs, test: PreferencePairs | None = None, *,
                 store=None, seed: int = 0, epochs: int = 30, lr: float = 1e-2, weight_decay: float = 1e-4):
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
            self.train_loss = train_bradley_terry(model, self.train, epochs=self.epochs, lr=self.lr,
                                                  weight_decay=self.wd, seed=self.seed + self.cid)
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
        return ClientUpdate(cid=self.cid, kind="params", arrays={SCORE_ARRAY: s.to(torch.float32)},
                            num_examples=len(self.train), metrics={"queries": float(s.numel())})

    def accuracy(self, pairs: PreferencePairs) -> float:
        if not len(pairs):
            return float("nan")
        return pairwise_accuracy(self.score(pairs.context, pairs.chosen).numpy(),
                                 self.score(pairs.context, pairs.rejected).numpy())

    def evaluate(self, shared: dict, config: dict) -> dict:
        out = {"cid": self.cid, "architecture": self.kind,
               "own_accuracy": self.accuracy(self.test) if self.test is not None else float("nan")}
        if "pairs.context" in shared:
            s_c = self.score(shared["pairs.context"], shared["pairs.chosen"]).numpy()
            s_r = self.score(shared["pairs.context"], shared["pairs.rejected"]).numpy()
            out["given_accuracy"] = pairwise_accuracy(s_c, s_r)
        return out


def score_queries(context, items) -> dict:
    """The server's message to the clients: contexts [Q, dc] and items [Q, G, d] (or [Q, d]) to score."""
    return {"query.context": np.asarray(context, np.float32), "query.items": np.asarray(items, np.float32)}


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


def query_clients(clients, context, items, round_index: int = 0, log: list | None = None) -> torch.Tensor:
    """Send one batch of queries to every client (their ``fit``) and stack the uploaded scores: [K, Q, G]."""
    updates = over_the_wire(fit_each)(clients, score_queries(context, items), {"round": round_index})
    return stack_scores(updates, np.asarray(items).shape[:-1], log)


# ------------------------------------------------------------------------------------------------ the router
class Router(torch.nn.Module):
    """w(x, o) = softmax(W2 tanh(W1 [x ; onehot(o)])) over K clients."""

    def __init__(self, dc: int, n_objectives: int, n_clients: int, hidden: int = 32):
        super().__init__()
        self.n_objectives = n_objectives
        self.net = torch.nn.Sequential(torch.nn.Linear(dc + n_objectives, hidden), torch.nn.Tanh(),
                                       torch.nn.Linear(hidden, n_clients))

    def forward(self, x, o):
        oh = F.one_hot(torch.as_tensor(o, dtype=torch.long), self.n_objectives).float()
        return torch.softmax(self.net(torch.cat([torch.as_tensor(x, dtype=torch.float32), oh], -1)), -1)


@dataclass
class Standardiser:
    """Per-client z-scoring of scores, with statistics from the public set."""

    mean: torch.Tensor   # [K]
    std: torch.Tensor    # [K]

    @classmethod
    def fit(cls, scores: torch.Tensor) -> "Standardiser":
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


def train_router(router: Router, z_chosen: torch.Tensor, z_rejected: torch.Tensor, x, o, *, epochs: int = 200,
                 lr: float = 1e-2, balance: float = 0.1, seed: int = 0) -> list[float]:
    """Bradley-Terry loss of the fused reward on public pairs + ``balance`` * sum_k wbar_k log wbar_k.

    z_chosen / z_rejected: [K, N] standardised client scores of the public pairs; x [N, dc]; o [N] objectives.
    """
    torch.manual_seed(seed)
    x = torch.as_tensor(x, dtype=torch.float32)
    o = torch.as_tensor(o, dtype=torch.long)
    opt = torch.optim.Adam(router.parameters(), lr=lr)
    margin = (z_chosen - z_rejected).float()
    losses = []
    for _ in range(epochs):
        w = router(x, o)                                   # [N, K]
        fused = (w.T * margin).sum(0)
        wbar = w.mean(0)
        loss = -F.logsigmoid(fused).mean() + balance * (wbar * torch.log(wbar + 1e-12)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


# ------------------------------------------------------------------------------------------------ the policy
class ResidualPolicy(torch.nn.Module):
    """logits(u, c) = ref_logits(u, c) / T + x_u^T W f_c + b . f_c, with W = b = 0 at the start (pi = pi_ref)."""

    def __init__(self, dc: int, d: int, temperature: float = 1.0):
        super().__init__()
        self.W = torch.nn.Parameter(torch.zeros(dc, d))
        self.b = torch.nn.Parameter(torch.zeros(d))
        self.temperature = float(temperature)

    def forward(self, ref_logits, x, cand_feats):
        """ref_logits [B, C], x [B, dc], cand_feats [B, C, d] -> [B, C]."""
        delta = torch.einsum("bi,ij,bcj->bc", x, self.W, cand_feats) + cand_feats @ self.b
        return ref_logits / self.temperature + delta


def ranking_metrics(scores: np.ndarray, target_rank_base: np.ndarray, in_cand: np.ndarray, target_pos: np.ndarray,
                    k: int = 10) -> dict:
    """HR@k / NDCG@k where each user's target is either candidate ``target_pos`` (ranked by ``scores`` among the
    candidates) or outside the candidate set (then its rank is ``target_rank_base`` >= number of candidates)."""
    ranks = np.where(in_cand, (scores > scores[np.arange(len(scores)), np.maximum(target_pos, 0)][:, None]).sum(1),
                     target_rank_base)
    hit = ranks < k
    return {f"hr@{k}": float(hit.mean()), f"ndcg@{k}": float(np.where(hit, 1.0 / np.log2(ranks + 2), 0.0).mean()),
            "n_users": int(len(ranks))}


@dataclass
class MoRConfig:
    reward_epochs: int = 30
    reward_lr: float = 1e-2
    architectures: tuple = ("bilinear", "mlp")   # dealt round-robin over the clients
    public_fraction: float = 0.1                 # share of each client's training pairs donated as public pairs
    router_epochs: int = 300
    router_balance: float = 0.05
    candidates: int = 100                        # C: the reference's top-C unseen items per user
    grpo_rounds: int = 30
    users_per_round: int = 256
    inner_steps: int = 2
    policy_lr: float = 0.05
    temperature: float = 1.0
    grpo: GRPOConfig = field(default_factory=lambda: GRPOConfig(group_size=8, beta=0.05, kl="k3"))
    seed: int = 0


def router_weights_by_objective(router: Router, x, o, n_objectives: int) -> list[list[float]]:
    """Mean router weight of each client (columns) over the inputs of each objective (rows)."""
    with torch.no_grad():
        w = router(x, o).numpy()
    o = np.asarray(o)
    return [w[o == j].mean(0).tolist() if (o == j).any() else [float("nan")] * w.shape[1]
            for j in range(n_objectives)]


def reward_report(clients: list[RewardClient], public: PreferencePairs, test: PreferencePairs, cfg: MoRConfig,
                  log: list | None = None) -> tuple[dict, Router, Standardiser]:
    """Per-client own / others' accuracy, router training on ``public``, and uniform / best-single / fused
    accuracy on the pooled held-out pairs ``test`` (objective = each pair's group)."""
    K = len(clients)
    n_obj = len(test.group_names)
    # public pairs: scores obtained by queries (chosen and rejected in one query of G = 2)
    items = np.stack([public.chosen, public.rejected], 1)
    s_pub = query_clients(clients, public.context, items, 0, log)          # [K, N, 2]
    std = Standardiser.fit(s_pub)
    z_pub = std(s_pub)
    router = Router(public.context.shape[1], n_obj, K)
    train_router(router, z_pub[..., 0], z_pub[..., 1], public.context, public.group, epochs=cfg.router_epochs,
                 balance=cfg.router_balance, seed=cfg.seed)
    s_test = std(query_clients(clients, test.context, np.stack([test.chosen, test.rejected], 1), 0, log))
    with torch.no_grad():
        w = router(test.context, test.group)
    fused = fuse(w, s_test)
    uniform = s_test.mean(0)
    single_pub = [pairwise_accuracy(z_pub[k, :, 0], z_pub[k, :, 1]) for k in range(K)]
    best = int(np.argmax(single_pub))
    single_test = [pairwise_accuracy(s_test[k, :, 0], s_test[k, :, 1]) for k in range(K)]
    per_client = []
    for k, c in enumerate(clients):
        own = c.accuracy(c.test) if c.test is not None else float("nan")
        others = test.take(np.flatnonzero(test.client != c.cid))
        per_client.append({"cid": c.cid, "group": test.group_names[int(c.train.group[0])],
                           "architecture": c.kind, "n_train_pairs": len(c.train),
                           "own": own, "others": c.accuracy(others)})
    report = {
        "reward_accuracy": {"uniform": pairwise_accuracy(uniform[:, 0], uniform[:, 1]),
                            "best_single": single_test[best],
                            "fused": pairwise_accuracy(fused[:, 0], fused[:, 1]),
                            "best_single_client": clients[best].cid,
                            "best_single_oracle": float(np.max(single_test)),
                            "n_test_pairs": len(test), "n_public_pairs": len(public)},
        "clients": per_client,
        "router_weights": {"objectives": list(test.group_names), "clients": [c.cid for c in clients],
                           "mean_weight": router_weights_by_objective(router, test.context, test.group, n_obj)},
    }
    by_group = {}
    for j, name in enumerate(test.group_names):
        m = test.group == j
        if m.any():
            by_group[name] = {"uniform": pairwise_accuracy(uniform[m, 0], uniform[m, 1]),
                              "best_single": pairwise_accuracy(s_test[best][m, 0], s_test[best][m, 1]),
                              "fused": pairwise_accuracy(fused[m, 0], fused[m, 1])}
    report["reward_accuracy_by_objective"] = by_group
    return report, router, std


def fused_reward(clients, router, std, x, o, items, round_index=0, log=None) -> torch.Tensor:
    """Fused reward of items [Q, G, d] for contexts x [Q, dc] and objectives o [Q]: [Q, G]."""
    return fuse_scores(router, std, x, o, query_clients(clients, x, items, round_index, log))


def fuse_scores(router, std, x, o, scores: torch.Tensor) -> torch.Tensor:
    """The router's mixture of the standardised client scores [K, Q, G] for contexts x and objectives o: [Q, G]."""
    z = std(scores)
    with torch.no_grad():
        w = router(x, o)
    return fuse(w, z)


class _GRPOServer:
    """The server side of MoR's GRPO rounds: each round draws users and item groups from the policy, sends them to
    every client to score, fuses the scores and steps the policy. The policy is the server's own state."""

    def __init__(self, router, std, ref_logits, cand, x, o, feats, cfg: MoRConfig, log):
        torch.manual_seed(cfg.seed)
        self.router, self.std, self.cand, self.o, self.feats, self.cfg, self.log = router, std, cand, o, feats, cfg, log
        self.policy = ResidualPolicy(x.shape[1], feats.shape[1], cfg.temperature)
        self.opt = torch.optim.Adam(self.policy.parameters(), lr=cfg.policy_lr)
        self.g = torch.Generator().manual_seed(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        self.ref_all = torch.as_tensor(ref_logits, dtype=torch.float32)
        self.x_all = torch.as_tensor(x, dtype=torch.float32)

    def configure(self, r, policy):
        """Draw the round's users and, from the current policy, a group of candidate items for each."""
        cfg = self.cfg
        users = self.rng.choice(len(self.x_all), size=min(cfg.users_per_round, len(self.x_all)), replace=False)
        xb = self.x_all[users]
        fb = torch.as_tensor(self.feats[self.cand[users]], dtype=torch.float32)          # [B, C, d]
        with torch.no_grad():
            logits_old = policy(self.ref_all[users], xb, fb)
        actions = sample_groups(logits_old, cfg.grpo.group_size, generator=self.g)     # [B, G]
        items = torch.gather(fb, 1, actions.unsqueeze(-1).expand(-1, -1, fb.shape[-1]))
        self.batch = (users, xb, fb, actions, torch.log_softmax(logits_old, -1).gather(-1, actions), items)
        return score_queries(xb.numpy(), items.numpy()), {"round": r}

    def aggregate(self, r, policy, updates, config):
        """Fuse the clients' scores into rewards and take the GRPO steps on the policy."""
        cfg = self.cfg
        users, xb, fb, actions, logp_old, items = self.batch
        scores = stack_scores(updates, items.shape[:-1], self.log)
        rewards = fuse_scores(self.router, self.std, xb.numpy(), self.o[users], scores)
        ref_b = self.ref_all[users] / cfg.temperature
        for _ in range(cfg.inner_steps):
            logits = policy(self.ref_all[users], xb, fb)
            loss, diag = grpo_loss(logits, actions, logp_old, ref_b, rewards, cfg.grpo)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        with torch.no_grad():
            kl = float(kl_categorical(policy(self.ref_all[users], xb, fb), ref_b).mean())
        return policy, {"round": r, "reward": float(rewards.mean()), "kl": kl,
                        "clip_fraction": diag["clip_fraction"]}


def run_grpo(clients, router, std, *, ref_logits: np.ndarray, cand: np.ndarray, x: np.ndarray, o: np.ndarray,
             feats: np.ndarray, cfg: MoRConfig, log: list | None = None) -> tuple[ResidualPolicy, list[dict]]:
    """GRPO on the residual policy over each user's candidates; returns the policy and per-round diagnostics
    (mean sampled fused reward, exact KL to the reference over the candidates, clip fraction)."""
    server = _GRPOServer(router, std, ref_logits, cand, x, o, feats, cfg, log)
    loop = RoundLoop(clients, server.aggregate, fit=over_the_wire(fit_each), configure=server.configure)
    return loop.run(server.policy, range(1, cfg.grpo_rounds + 1))


def expected_reward(clients, router, std, policy, *, ref_logits, cand, x, o, feats, cfg: MoRConfig,
                    users: np.ndarray) -> dict:
    """Exact expected fused reward under pi_theta and pi_ref over each user's candidates (all scored)."""
    ref = torch.as_tensor(ref_logits[users], dtype=torch.float32)
    xb = torch.as_tensor(x[users], dtype=torch.float32)
    fb = torch.as_tensor(feats[cand[users]], dtype=torch.float32)
    R = fused_reward(clients, router, std, xb.numpy(), o[users], fb.numpy())
    with torch.no_grad():
        p = torch.softmax(policy(ref, xb, fb), -1)
        q = torch.softmax(ref / cfg.temperature, -1)
        kl = kl_categorical(policy(ref, xb, fb), ref / cfg.temperature)
    return {"policy": float((p * R).sum(-1).mean()), "reference": float((q * R).sum(-1).mean()),
            "kl": float(kl.mean())}


def policy_rankings(policy, *, ref_scores: np.ndarray, train_mask, cand, x, feats, targets: np.ndarray,
                    cfg: MoRConfig, k: int = 10) -> dict:
    """HR@k / NDCG@k of the reference (full ranking, training items masked) and of the policy (which re-orders
    the reference's top-C candidates; every other item stays below them) on held-out targets."""
    users = np.flatnonzero(targets >= 0)
    s = ref_scores[users].astype(np.float64).copy()
    s[train_mask[users]] = -np.inf
    t = targets[users]
    ref_rank = (s > s[np.arange(len(users)), t][:, None]).sum(1)
    c = cand[users]
    in_cand = (c == t[:, None]).any(1)
    pos = np.where(in_cand, (c == t[:, None]).argmax(1), -1)
    with torch.no_grad():
        logits = policy(torch.as_tensor(ref_scores[users[:, None], c], dtype=torch.float32),
                        torch.as_tensor(x[users], dtype=torch.float32),
                        torch.as_tensor(feats[c], dtype=torch.float32)).numpy()
    # outside the candidates the policy keeps the reference order below all C candidates
    out_rank = np.maximum(ref_rank, c.shape[1])
    pol = ranking_metrics(logits, out_rank, in_cand, pos, k)
    ref_hit = ref_rank < k
    ref = {f"hr@{k}": float(ref_hit.mean()),
           f"ndcg@{k}": float(np.where(ref_hit, 1.0 / np.log2(ref_rank + 2), 0.0).mean()), "n_users": int(len(t))}
    return {"reference": ref, "grpo": pol, "target_in_candidates": float(in_cand.mean())}


# ------------------------------------------------------------------------------------------------ end to end
def split_public(train: PreferencePairs, fraction: float, seed: int = 0) -> tuple[PreferencePairs, PreferencePairs]:
    """Move ``fraction`` of each client's training pairs (whole users where pairs carry users) to a public set."""
    from .pairs import holdout_split

    return holdout_split(train, fraction, seed=seed + 1, by="user")


def make_clients(train: PreferencePairs, test: PreferencePairs, cfg: MoRConfig) -> list[RewardClient]:
    store = MemoryStore()
    clients = []
    for k in range(train.n_clients):
        own = train.of_client(k)
        if not len(own):
            continue
        arch = cfg.architectures[k % len(cfg.architectures)]
        clients.append(RewardClient(k, arch, own, test.of_client(k), store=store, seed=cfg.seed,
                                    epochs=cfg.reward_epochs, lr=cfg.reward_lr))
    return clients


def user_taste(data, feats: np.ndarray, splits=(0,)) -> np.ndarray:
    """Each user's taste vector: mean of (r - mean_u) x item features over the user's ratings in ``splits``."""
    inter = data.inter[data.inter["split"].isin(list(splits))].dropna(subset=["rating"])
    u = inter["user"].to_numpy(np.int64)
    r = inter["rating"].to_numpy(np.float64)
    n = int(data.n_users)
    cnt = np.maximum(np.bincount(u, minlength=n), 1)
    mean_u = np.bincount(u, r, minlength=n) / cnt
    x = np.zeros((n, feats.shape[1]))
    np.add.at(x, u, (r - mean_u[u])[:, None] * feats[inter["item"].to_numpy(np.int64)])
    return (x / np.maximum(cnt - 2, 1)[:, None]).astype(np.float32)


def train_backbone(split, *, backbone: str = "fedavg", rounds: int = 20, dim: int = 32, seed: int = 0,
                   progress: bool = False, cache_dir=None) -> tuple[np.ndarray, dict]:
    """Train a federated backbone on the split data (:class:`~fedvlr_plus.federation.engine.FederatedRun`);
    return its item scores [n_users, n_items] and its test figures. With ``cache_dir`` the scores are kept on disk
    under a key of the dataset identity and the run settings (a rerun with the same settings skips training)."""
    import hashlib
    import json
    import os
    from pathlib import Path

    from ..federation import FedConfig
    from ..federation.engine import FederatedRun, dataset_identity

    cfg = FedConfig(rounds=rounds, dim=dim, seed=seed, eval_every=rounds, ks=(10,), patience=rounds)
    key = hashlib.sha256(json.dumps([dataset_identity(split), backbone, cfg.to_dict()], sort_keys=True,
                                    default=str).encode()).hexdigest()[:24]
    path = Path(cache_dir) / "mor-backbones" / f"{backbone}-{key}.npz" if cache_dir is not None else None
    if path is not None and path.exists():
        z = np.load(path, allow_pickle=False)
        return z["scores"], json.loads(str(z["result"]))
    run = FederatedRun(split, backbone, cfg, progress=progress)
    full = run.run()
    with torch.no_grad():
        scores = run.sim.scores(np.arange(split.n_users), run.shared).float().numpy()
    result = {"selected_round": full.get("selected_round"),
              "test": {k: v for k, v in _flat(full).items() if k.startswith("test") and "sampled" not in k
                       and ("hr@" in k or "ndcg@" in k)}}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}.npz")
        np.savez(tmp, scores=scores, result=json.dumps(result))
        os.replace(tmp, path)
    return scores, result


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, name + "."))
        elif isinstance(v, (int, float)):
            out[name] = v
    return out


def run_mor_ratings(data, *, group_by: str = "taste", n_groups: int = 4, text: str = "none", min_gap: float = 2.0,
                    test_fraction: float = 0.2, backbone_rounds: int = 20, backbone: str = "fedavg",
                    cfg: MoRConfig | None = None, encoder=None, cache_dir=None, progress: bool = False,
                    pooled_baseline: bool = False) -> dict:
    """The whole MoR experiment on a rating dataset (e.g. MovieLens-100K), as the JSON-ready report.
    ``pooled_baseline``: also run GRPO with one reward model trained on the pooled pairs (honesty check 4)."""
    import time

    from fedvlr_plus.datasets.splits import dedup, leave_one_out

    from .pairs import holdout_split, item_features, rating_pairs, user_groups

    cfg = cfg or MoRConfig()
    t0 = time.perf_counter()
    split = leave_one_out(dedup(data))                      # ratings kept; split by time, one valid / test per user
    feats = item_features(split, text=text, encoder=encoder, cache_dir=cache_dir, progress=progress)
    groups, names = user_groups(split, group_by, k=n_groups, seed=cfg.seed)
    pairs = rating_pairs(split, feats, min_gap=min_gap, splits=(0,), user_group=groups, group_names=names,
                         seed=cfg.seed)
    train, test = holdout_split(pairs, test_fraction, seed=cfg.seed, by="user")
    train, public = split_public(train, cfg.public_fraction, seed=cfg.seed)
    clients = make_clients(train, test, cfg)
    uploads: list[ClientUpdate] = []
    report, router, std = reward_report(clients, public, test, cfg, uploads)
    t_reward = time.perf_counter() - t0

    ref_scores, bb_result = train_backbone(split, backbone=backbone, rounds=backbone_rounds, seed=cfg.seed,
                                           progress=progress, cache_dir=cache_dir)
    n_users, n_items = split.n_users, split.n_items
    train_mask = np.zeros((n_users, n_items), bool)
    tr = split.train()
    train_mask[tr["user"].to_numpy(), tr["item"].to_numpy()] = True
    masked = np.where(train_mask, -np.inf, ref_scores)
    C = min(cfg.candidates, n_items)
    cand = np.argsort(-masked, axis=1, kind="stable")[:, :C]
    ref_c = np.take_along_axis(ref_scores, cand, 1)
    x = user_taste(split, feats)
    eligible = np.flatnonzero(groups >= 0)
    policy, history = run_grpo(clients, router, std, ref_logits=ref_c[eligible], cand=cand[eligible],
                               x=x[eligible], o=groups[eligible], feats=feats, cfg=cfg, log=uploads)
    exp_r = expected_reward(clients, router, std, policy, ref_logits=ref_c, cand=cand, x=x, o=np.maximum(groups, 0),
                            feats=feats, cfg=cfg, users=eligible)
    pooled = None
    if pooled_baseline:
        # honesty check 4's baseline: one reward model on the pooled training pairs (a centralised reference, not
        # federated), the same GRPO run, the same evaluation
        pool = RewardClient(0, cfg.architectures[0], replace(train, client=np.zeros(len(train), np.int64)), None,
                            seed=cfg.seed, epochs=cfg.reward_epochs, lr=cfg.reward_lr)
        pub = query_clients([pool], public.context, np.stack([public.chosen, public.rejected], 1))
        pstd = Standardiser.fit(pub)
        prouter = Router(x.shape[1], len(names), 1)       # softmax over one client: weight 1
        pz = pstd(query_clients([pool], test.context, np.stack([test.chosen, test.rejected], 1)))[0]
        ppolicy, phist = run_grpo([pool], prouter, pstd, ref_logits=ref_c[eligible], cand=cand[eligible],
                                  x=x[eligible], o=groups[eligible], feats=feats, cfg=cfg)
        pooled = {"reward_accuracy": pairwise_accuracy(pz[:, 0], pz[:, 1]), "policy": ppolicy,
                  "grpo": phist, "expected_fused_reward": expected_reward(
                      clients, router, std, ppolicy, ref_logits=ref_c, cand=cand, x=x, o=np.maximum(groups, 0),
                      feats=feats, cfg=cfg, users=eligible)}
    out = {}
    for part in ("valid", "test"):
        targets = np.full(n_users, -1, np.int64)
        df = split.part(part)
        targets[df["user"].to_numpy()] = df["item"].to_numpy()
        targets[groups < 0] = -1
        out[part] = policy_rankings(policy, ref_scores=ref_scores, train_mask=train_mask, cand=cand, x=x,
                                    feats=feats, targets=targets, cfg=cfg)
        if pooled is not None:
            out[part]["pooled"] = policy_rankings(pooled["policy"], ref_scores=ref_scores, train_mask=train_mask,
                                                  cand=cand, x=x, feats=feats, targets=targets, cfg=cfg)["grpo"]
    uploaded = sorted({k for u in uploads for k in u.arrays})
    report.update({
        "source": getattr(data, "name", "data"), "group_by": group_by, "groups": list(names),
        "pairs": {"train": len(train), "public": len(public), "test": len(test), "min_gap": min_gap,
                  "features": int(feats.shape[1]), "text": text},
        "grpo": history,
        "expected_reward": exp_r,
        "pooled_baseline": None if pooled is None else {
            "reward_accuracy": pooled["reward_accuracy"], "grpo": pooled["grpo"],
            "expected_fused_reward": pooled["expected_fused_reward"],
            "policy": {"test": out["test"]["pooled"], "valid": out["valid"]["pooled"]}},
        "policy": {"reference": out["test"]["reference"], "grpo": out["test"]["grpo"],
                   "target_in_candidates": out["test"]["target_in_candidates"], "valid": out["valid"]},
        "backbone": {"name": backbone, "rounds": backbone_rounds,
                     "test": bb_result["test"], "selected_round": bb_result["selected_round"]},
        "uplink": {"arrays": uploaded, "messages": len(uploads),
                   "floats": int(sum(v.numel() for u in uploads for v in u.arrays.values()))},
        "config": {"candidates": C, "group_size": cfg.grpo.group_size, "beta": cfg.grpo.beta, "kl": cfg.grpo.kl,
                   "rounds": cfg.grpo_rounds, "users_per_round": cfg.users_per_round,
                   "architectures": list(cfg.architectures), "seed": cfg.seed},
        "seconds": {"rewards": t_reward, "total": time.perf_counter() - t0},
    })
    return report


def run_mor_hh(root, *, cfg: MoRConfig | None = None, limit: int | None = None, clients_per_type: int = 2,
               test_fraction: float = 0.2, encoder=None, cache_dir=None, progress: bool = False) -> dict:
    """MoR's reward side on HH-RLHF (helpful-base vs harmless-base clients, objective = the split): per-client
    accuracy, router, fused vs uniform vs best single. No GRPO here (no item catalogue): ``grpo`` is empty and
    ``policy`` None."""
    import time

    from .pairs import hh_pairs, holdout_split

    cfg = cfg or MoRConfig()
    t0 = time.perf_counter()
    pairs = hh_pairs(root, limit_per_split=limit, encoder=encoder, cache_dir=cache_dir,
                     clients_per_split=clients_per_type, seed=cfg.seed, progress=progress)
    train, test = holdout_split(pairs, test_fraction, seed=cfg.seed)
    train, public = holdout_split(train, cfg.public_fraction, seed=cfg.seed + 1)
    clients = make_clients(train, test, cfg)
    uploads: list[ClientUpdate] = []
    report, _, _ = reward_report(clients, public, test, cfg, uploads)
    report.update({
        "source": str(root), "groups": list(pairs.group_names),
        "pairs": {"train": len(train), "public": len(public), "test": len(test)},
        "grpo": [], "policy": None,
        "uplink": {"arrays": sorted({k for u in uploads for k in u.arrays}), "messages": len(uploads),
                   "floats": int(sum(v.numel() for u in uploads for v in u.arrays.values()))},
        "config": {"architectures": list(cfg.architectures), "seed": cfg.seed},
        "seconds": {"total": time.perf_counter() - t0},
    })
    return report
