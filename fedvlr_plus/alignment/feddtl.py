"""FedDTL: decoupled training with local reinforcement fine-tuning, mapped onto next-item recommendation.

Ma, Cheng, Xu, "Decoupled Training with Local Reinforcement Fine-Tuning in Federated Learning", ICML 2026,
arXiv 2605.27900 (see docs/alignment.md, "FedDTL"). In the paper a CLIP text encoder (server) is the
semantic anchor and the image encoder (clients) is LoRA-tuned; classes split into base and novel. Here:

- **item tower (server, the anchor)**: ``v_i = normalise(e_i + B_s A_s e_i)``, ``e_i`` the frozen offline text
  embedding of item i's content (MiniLM over "title. genres. year"), ``A_s, B_s`` a low-rank adapter;
- **user tower (clients)**: ``u = normalise(h + B_c A_c h)``, ``h`` the mean content embedding of the user's
  private history (other than the target), ``A_c, B_c`` a low-rank adapter;
- policy ``pi(i | u) = softmax_i(cos(u, v_i) / tau)`` over the warm items; base / novel classes = warm / cold items
  (cold items have content but no training interactions);
- **SFT stage**: cross-entropy of the held-out-of-history target, on the user adapter only;
- **GRPO stage**: G candidates per example from Gaussian noise in the user embedding (``argmax_i cos(normalise(u +
  sigma eps_j), v_i)``), reward ``1[candidate = target]``, group-normalised advantages, clipped ratio and a k3 KL to
  a hybrid reference ``0.5 pi_SFT + 0.5 pi_global`` (the mixture of the client's final SFT model and the latest
  global model), all through :func:`fedvlr_plus.alignment.grpo.grpo_loss`;
- **uplink**: the user adapter and, per item the client trained on, the normalised mean of its users' context
  embeddings for that item (a class prototype: no user id, no history, no rating); **server**: FedAvg of the user
  adapters (:func:`~fedvlr_plus.federation.strategy.make_strategy`), then cross-entropy training of its item
  adapter so the uploaded prototypes pick their item (modality alignment);
- **baseline "FedAvg of both towers"**: clients train both adapters with the SFT loss and FedAvg averages both.

Prototypes travel with their example counts and the server draws them in that proportion (the paper uploads
per-sample embeddings). Evaluation follows the base-to-novel protocol (warm targets among warm items, cold among
cold) and is reported twice: with the global model and with each client's own tower(s) after its last local
training; the headline is the client towers for the decoupled methods and the global model for FedAvg of both.

Clients are groups of users: a Dirichlet(alpha) split over each user's dominant genre (label skew), the genre
with the largest share of the history (``dominant="count"``) or the one most over-represented against the global
genre shares (``"lift"``). ``DTLConfig.user_tower="private"`` keeps each client's user adapter in its store and
restores it every round (the paper's scheme, the default, starts every round from the FedAvg of the adapters).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ..adapters.base import ParamSpec
from ..federation.messages import ClientUpdate
from ..federation.rounds import RoundLoop
from ..federation.store import MemoryStore
from ..federation.strategy import make_strategy
from .grpo import GRPOConfig, grpo_loss

METHODS = ("fedavg_both", "decoupled_sft", "feddtl")
USER_PARAMS = ("user_down", "user_up")
ITEM_PARAMS = ("item_down", "item_up")


# ----------------------------------------------------------------------------------------------- data
@dataclass
class RecTask:
    """Item content embeddings, per-user train histories and held-out targets, cold items."""

    content: np.ndarray                 #: [n_items, d] frozen, unit-norm
    histories: list[np.ndarray]         #: per user: train item ids (warm items only)
    warm_target: np.ndarray             #: [n_users] item id or -1
    cold_target: np.ndarray             #: [n_users] item id or -1
    warm_items: np.ndarray              #: ids of the items with training interactions
    cold_items: np.ndarray
    user_genre: np.ndarray              #: [n_users] dominant genre index (for the label-skewed split)

    @property
    def n_items(self) -> int:
        return int(self.content.shape[0])

    @property
    def dim(self) -> int:
        return int(self.content.shape[1])


def item_texts(data) -> list[str]:
    """"title. genre, genre. year" per item (what the server tower reads)."""
    items = data.items.reindex(range(data.n_items))
    out = []
    for _, row in items.iterrows():
        parts = [str(row.get("title") or "").strip()]
        cats = row.get("categories")
        if isinstance(cats, (list, tuple, np.ndarray)) and len(cats):
            parts.append(", ".join(map(str, cats)))
        year = row.get("release_year")
        if year is not None and str(year).strip().isdigit():
            parts.append(str(year).strip())
        out.append(". ".join(p for p in parts if p) or "untitled")
    return out


def dominant_labels(data, histories: list[np.ndarray], rule: str = "count", min_share: float = 0.1) -> np.ndarray:
    """Each user's dominant genre/category over its train items (an item's labels share weight 1).

    ``rule="count"``: the genre with the largest weight in the history (on ml-100k 623 of 943 users get Drama, so a
    Dirichlet split over it is only a mild skew). ``rule="lift"``: the genre most over-represented in the history,
    ``argmax_c share_u(c) / share_all(c)`` (the global share over all users' train histories), among the genres
    that make up at least ``min_share`` of the history (so one odd item cannot decide); a user with no such genre
    falls back to the count rule.
    """
    if rule not in ("count", "lift"):
        raise ValueError(f"dominant-genre rule must be 'count' or 'lift', got {rule!r}")
    cats = data.items["categories"].reindex(range(data.n_items)) if "categories" in data.items.columns else None
    names: dict[str, int] = {}
    item_labels = []
    for i in range(data.n_items):
        cs = cats.iloc[i] if cats is not None else None
        cs = list(cs) if isinstance(cs, (list, tuple, np.ndarray)) and len(cs) else ["(none)"]
        item_labels.append([names.setdefault(c, len(names)) for c in cs])
    w = np.zeros((len(histories), len(names)))
    for u, h in enumerate(histories):
        for i in h:
            for c in item_labels[i]:
                w[u, c] += 1.0 / len(item_labels[i])
    out = np.argmax(w, 1).astype(np.int64)
    if rule == "lift":
        share = w / np.maximum(w.sum(1, keepdims=True), 1e-12)
        glob = w.sum(0) / max(w.sum(), 1e-12)
        lift = np.where((share >= min_share) & (glob > 0)[None], share / np.maximum(glob, 1e-12)[None], -np.inf)
        ok = np.isfinite(lift).any(1)
        out[ok] = np.argmax(lift[ok], 1)
    out[w.sum(1) == 0] = 0
    return out


def build_task(data, content: np.ndarray, *, cold_share: float = 0.2, seed: int = 0,
               dominant: str = "count") -> RecTask:
    """Cold items (a random ``cold_share`` of the rated items) lose every training interaction. Per user, the
    latest warm interaction and the latest cold interaction are held out; the other warm ones are the history.
    ``dominant``: how a user's genre for the label-skewed split is chosen (:func:`dominant_labels`)."""
    rng = np.random.default_rng(seed)
    inter = data.inter.sort_values(["user", "timestamp", "item"], kind="stable")
    rated = np.unique(inter["item"].to_numpy())
    cold = np.sort(rng.choice(rated, size=int(round(cold_share * len(rated))), replace=False))
    is_cold = np.zeros(data.n_items, bool)
    is_cold[cold] = True
    histories, wt, ct = [], np.full(data.n_users, -1), np.full(data.n_users, -1)
    for u, grp in inter.groupby("user", sort=True):
        items = grp["item"].to_numpy()
        warm = items[~is_cold[items]]
        cold_u = items[is_cold[items]]
        if len(warm) >= 2:
            wt[u] = warm[-1]
            warm = warm[:-1]
        if len(cold_u):
            ct[u] = cold_u[-1]
        histories.append(np.unique(warm))
    while len(histories) < data.n_users:
        histories.append(np.zeros(0, np.int64))
    warm_items = np.flatnonzero(~is_cold & np.isin(np.arange(data.n_items), rated))
    content = np.asarray(content, np.float32)
    content = content / np.linalg.norm(content, axis=1, keepdims=True).clip(1e-12)
    return RecTask(content=content, histories=histories, warm_target=wt, cold_target=ct,
                   warm_items=warm_items, cold_items=cold, user_genre=dominant_labels(data, histories, dominant))


def dirichlet_split(labels: np.ndarray, n_clients: int, alpha: float, seed: int = 0) -> np.ndarray:
    """Client id per user: for every label, its users are dealt to clients in Dirichlet(alpha) proportions
    (Hsu, Qi & Brown, arXiv 1909.06335). Redraws until every client has a user."""
    rng = np.random.default_rng(seed)
    for _ in range(100):
        out = np.zeros(len(labels), np.int64)
        for g in np.unique(labels):
            users = rng.permutation(np.flatnonzero(labels == g))
            props = rng.dirichlet(np.full(n_clients, alpha))
            out[users] = rng.choice(n_clients, size=len(users), p=props)
        if len(np.unique(out)) == n_clients:
            return out
    raise ValueError(f"could not give each of {n_clients} clients a user with alpha={alpha}")


# ----------------------------------------------------------------------------------------------- model
@dataclass
class DTLConfig:
    rank: int = 4
    tau: float = 0.05            #: softmax temperature on cosines
    lr: float = 1e-2
    server_lr: float = 1e-2
    server_steps: int = 10
    server_batch: int = 1024
    batch_size: int = 256
    per_user: int = 8            #: training examples drawn per user and round
    sigma: float = 0.1           #: GRPO noise std in the user embedding
    group: int = 4               #: G
    clip_eps: float = 0.2
    beta: float = 0.5            #: KL weight to the hybrid reference
    ref_mix: float = 0.5         #: weight of the SFT model in the hybrid reference
    rl_candidates: int = 100     #: GRPO acts over the target plus rl_candidates - 1 random warm items
    epochs: int = 1              #: local passes over the round's examples (the same in every stage and method)
    proto_weighting: str = "count"   #: server CE: "count" (prototypes drawn by example count) or "uniform"
    rank_among: str = "own"      #: evaluation: warm among warm, cold among cold ("own") or both among all items
    #: decoupled methods: "fedavg" (each round starts from the FedAvg of the user adapters, as in the paper) or
    #: "private" (each client keeps its own user adapter in its store and restores it every round; the uploads
    #: and the averaged global user adapter, used by the hybrid reference and the global-model evaluation, stay)
    user_tower: str = "fedavg"

    def __post_init__(self):
        if self.user_tower not in ("fedavg", "private"):
            raise ValueError(f"user_tower must be 'fedavg' or 'private', got {self.user_tower!r}")


def param_specs(d: int, r: int) -> dict[str, ParamSpec]:
    return {s.name: s for s in (ParamSpec("user_down", (r, d), True, std=1.0 / math.sqrt(d)),
                                 ParamSpec("user_up", (d, r), True, init="zeros"),
                                 ParamSpec("item_down", (r, d), True, std=1.0 / math.sqrt(d)),
                                 ParamSpec("item_up", (d, r), True, init="zeros"))}


def init_params(d: int, r: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(int(seed))
    return {n: (torch.zeros(s.shape) if s.init == "zeros" else torch.randn(s.shape, generator=g) * s.std)
            for n, s in param_specs(d, r).items()}


def lora(x: torch.Tensor, down: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Residual low-rank adapter ``normalise(x + B A x)`` (Hu et al., LoRA, arXiv 2106.09685, on a frozen map)."""
    return F.normalize(x + (x @ down.T) @ up.T, dim=-1)


def item_vectors(p: dict, content: torch.Tensor) -> torch.Tensor:
    return lora(content, p["item_down"], p["item_up"])


def user_vectors(p: dict, ctx: torch.Tensor) -> torch.Tensor:
    return lora(ctx, p["user_down"], p["user_up"])


def noisy_candidates(u: torch.Tensor, items: torch.Tensor, group: int, sigma: float,
                     generator: torch.Generator | None = None, columns: torch.Tensor | None = None) -> torch.Tensor:
    """G candidate items per row: the nearest item to ``normalise(u + sigma eps)``; [B, G] column indices.

    ``items`` is [A, d]; with ``columns`` ([B, k] indices into it) each row chooses within its own action set and
    the result indexes ``columns``' second axis."""
    eps = torch.randn(u.shape[0], group, u.shape[1], generator=generator) * sigma
    noisy = F.normalize(u.detach().unsqueeze(1) + eps, dim=-1)
    sims = noisy @ items.detach().T                                   # [B, G, A]
    if columns is not None:
        sims = sims.gather(2, columns.unsqueeze(1).expand(-1, group, -1))
    return sims.argmax(-1)


# ----------------------------------------------------------------------------------------------- client
class DTLClient:
    """A group of users (their histories are private and never leave :meth:`fit`)."""

    def __init__(self, cid: int, task: RecTask, users, cfg: DTLConfig, *, seed: int = 0, store=None):
        self.cid = int(cid)
        self.task = task
        self.users = np.asarray(users, dtype=np.int64)
        self.cfg = cfg
        self.seed = int(seed)
        self.store = store if store is not None else MemoryStore()
        self._content = torch.from_numpy(task.content)
        self._warm = torch.from_numpy(task.warm_items)
        col = np.full(task.n_items, -1)
        col[task.warm_items] = np.arange(len(task.warm_items))
        self._col = col
        self._hist_sum = {int(u): task.content[task.histories[u]].sum(0) for u in self.users}

    def examples(self, rnd: int) -> tuple[np.ndarray, np.ndarray]:
        """(context [n, d], target column [n]): up to ``per_user`` train items per user, each predicted from the
        mean of the user's other train items."""
        rng = np.random.default_rng([self.seed, self.cid, rnd])
        ctx, tgt = [], []
        for u in self.users:
            h = self.task.histories[u]
            if len(h) < 2:
                continue
            pick = rng.choice(h, size=min(self.cfg.per_user, len(h)), replace=False)
            s = self._hist_sum[int(u)]
            ctx.append((s[None] - self.task.content[pick]) / (len(h) - 1))
            tgt.append(self._col[pick])
        if not ctx:
            return np.zeros((0, self.task.dim), np.float32), np.zeros(0, np.int64)
        return np.concatenate(ctx).astype(np.float32), np.concatenate(tgt).astype(np.int64)

    def fit(self, shared: dict, config: dict) -> ClientUpdate:
        cfg = self.cfg
        stage = config.get("stage", "sft")
        train_items = bool(config.get("train_item_tower", False))
        names = list(USER_PARAMS) + (list(ITEM_PARAMS) if train_items else [])
        glob = {k: torch.as_tensor(v, dtype=torch.float32) for k, v in shared.items()}
        state = self.store.load(self.cid) or {}
        personal = cfg.user_tower == "private" and not train_items
        # a private user tower continues from where this client left it, not from the average
        start = {**glob, **{k: state[f"own.{k}"] for k in USER_PARAMS}} if personal and "own.user_down" in state \
            else glob
        p = {k: v.clone().requires_grad_(k in names) for k, v in start.items()}
        opt = torch.optim.Adam([p[k] for k in names], lr=cfg.lr)
        ctx_np, tgt_np = self.examples(int(config.get("round", 0)))
        ctx, tgt = torch.from_numpy(ctx_np), torch.from_numpy(tgt_np)
        gen = torch.Generator().manual_seed(int(self.seed * 1000003 + self.cid * 7919 + config.get("round", 0)))
        warm_content = self._content[self._warm]
        if stage == "rl":
            # the action set of an example: its target (column 0) and rl_candidates - 1 other warm items; a hit
            # among ~100 is frequent enough for groups to disagree, a hit among all warm items is not
            n_warm = len(self.task.warm_items)
            k = min(cfg.rl_candidates, n_warm)
            neg = torch.randint(0, n_warm - 1, (len(tgt), k - 1), generator=gen)
            neg = neg + (neg >= tgt.unsqueeze(1)).long()          # skip the target itself
            cand = torch.cat([tgt.unsqueeze(1), neg], 1)           # [n, k]
            sft = {**glob, **{k_: state[k_] for k_ in USER_PARAMS}} if "user_down" in state else glob
            with torch.no_grad():
                v_ref = item_vectors(glob, warm_content)
                # scores against every warm item, then the action-set columns (no [n, k, d] gather)
                ref_sft = (user_vectors(sft, ctx) @ v_ref.T).gather(1, cand) / cfg.tau
                ref_glob = (user_vectors(glob, ctx) @ v_ref.T).gather(1, cand) / cfg.tau
                # hybrid reference: the mixture ref_mix * pi_SFT + (1 - ref_mix) * pi_global, as log-probabilities
                ref_logits = torch.logsumexp(torch.stack([
                    math.log(cfg.ref_mix) + torch.log_softmax(ref_sft, -1),
                    math.log(1 - cfg.ref_mix) + torch.log_softmax(ref_glob, -1)]), 0)
        gcfg = GRPOConfig(group_size=cfg.group, clip_eps=cfg.clip_eps, beta=cfg.beta, kl="k3")
        losses, rewards, nonzero = [], [], []
        batches = [perm[s:s + cfg.batch_size] for _ in range(cfg.epochs)
                   for perm in [torch.randperm(len(tgt), generator=gen)] for s in range(0, len(tgt), cfg.batch_size)]
        for b in batches:
            v = item_vectors(p, warm_content)
            u = user_vectors(p, ctx[b])
            logits = u @ v.T / cfg.tau
            if stage == "sft":
                loss = F.cross_entropy(logits, tgt[b])
            else:
                logits = logits.gather(1, cand[b])                  # [B, k] over the action set
                actions = noisy_candidates(u, v, cfg.group, cfg.sigma, gen, columns=cand[b])
                r = (actions == 0).float()                          # column 0 is the held-out target
                with torch.no_grad():
                    logp_old = torch.log_softmax(logits, -1).gather(-1, actions)
                loss, diag = grpo_loss(logits, actions, logp_old, ref_logits[b], r, gcfg)
                rewards.append(diag["reward"])
                nonzero.append(float((r.std(-1) > 0).float().mean()))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        new_state = dict(state)
        if stage == "sft":          # the client's latest SFT model: half of its hybrid reference later
            new_state.update({k: p[k].detach().clone() for k in USER_PARAMS})
        if personal:
            new_state.update({f"own.{k}": p[k].detach().clone() for k in USER_PARAMS})
        if new_state:
            self.store.save(self.cid, new_state, copy=False)
        arrays = {k: p[k].detach().clone() for k in (names if train_items else USER_PARAMS)}
        rows = {}
        if not train_items and len(tgt):
            # class prototypes: per trained item, the normalised mean of this client's context embeddings
            with torch.no_grad():
                emb = user_vectors(p, ctx)
            cols, inv = torch.unique(tgt, return_inverse=True)
            proto = torch.zeros(len(cols), emb.shape[1]).index_add_(0, inv, emb)
            arrays["proto"] = F.normalize(proto, dim=-1)
            rows["proto"] = self._warm[cols]
            # how many of this round's examples each prototype averages: the server samples prototypes in that
            # proportion, so its CE sees the items as often as the clients' examples do (the paper uploads
            # per-sample embeddings; a count keeps that sample weighting without any per-user vector)
            arrays["proto_n"] = torch.bincount(inv, minlength=len(cols)).float()
            rows["proto_n"] = rows["proto"]
        metrics = {"loss": float(np.mean(losses)) if losses else 0.0, "steps": len(losses)}
        if rewards:
            metrics.update(reward=float(np.mean(rewards)), groups_with_signal=float(np.mean(nonzero)))
        return ClientUpdate(cid=self.cid, kind="params", arrays=arrays, rows=rows,
                            num_examples=max(int(len(tgt)), 1), metrics=metrics)

    def evaluate(self, shared: dict, config: dict) -> dict:
        p = {k: torch.as_tensor(v, dtype=torch.float32) for k, v in shared.items()}
        return evaluate_users(p, self.task, self.users, self.cfg, ks=config.get("ks", (10,)))


# ----------------------------------------------------------------------------------------------- evaluation
def evaluate_users(p: dict, task: RecTask, users: np.ndarray, cfg: DTLConfig, ks=(10,), among: str | None = None) -> dict:
    """Warm and cold targets apart, the user's train items masked.

    ``among`` (default ``cfg.rank_among``): ``"own"`` ranks a warm target among the warm items and a cold target
    among the cold items (the base-to-novel protocol of prompt learning: base classes are scored among base
    classes, novel among novel); ``"all"`` ranks both among every item.
    """
    among = among or cfg.rank_among
    if among not in ("own", "all"):
        raise ValueError(f"among must be 'own' or 'all', got {among!r}")
    users = np.asarray([u for u in users if len(task.histories[u])], dtype=np.int64)
    if not len(users):
        return {kind: {"n": 0, **{f"{m}@{k}": 0.0 for k in ks for m in ("hr", "ndcg")}} for kind in ("warm", "cold")}
    ctx = torch.from_numpy(np.stack([task.content[task.histories[u]].mean(0) for u in users]))
    with torch.no_grad():
        scores = (user_vectors(p, ctx) @ item_vectors(p, torch.from_numpy(task.content)).T).double()
    for row, u in enumerate(users):
        scores[row, torch.from_numpy(task.histories[u])] = -torch.inf
    out = {}
    for kind, targets in (("warm", task.warm_target), ("cold", task.cold_target)):
        t = targets[users]
        ok = t >= 0
        tt = torch.from_numpy(t[ok])
        s = scores[torch.from_numpy(ok)]
        if among == "own":
            other = task.cold_items if kind == "warm" else np.setdiff1d(np.arange(task.n_items), task.cold_items)
            s = s.clone()
            s[:, torch.from_numpy(other)] = -torch.inf
        ranks = (s > s.gather(1, tt[:, None])).sum(1).numpy()
        res = {"n": int(ok.sum())}
        for k in ks:
            res[f"hr@{k}"] = float(np.mean(ranks < k)) if len(ranks) else 0.0
            res[f"ndcg@{k}"] = float(np.mean(np.where(ranks < k, 1 / np.log2(ranks + 2), 0))) if len(ranks) else 0.0
        out[kind] = res
    return out


# ----------------------------------------------------------------------------------------------- server
def server_align(p: dict, protos: list[tuple], task: RecTask, cfg: DTLConfig,
                 seed: int = 0) -> tuple[dict, list[float]]:
    """Train the item adapter so each uploaded prototype classifies to its item (CE over warm items).

    ``protos``: ``(embeddings [n, d], item ids [n])`` or ``(embeddings, item ids, example counts [n])`` per client.
    With counts and ``cfg.proto_weighting == "count"`` a batch draws prototypes in proportion to their counts
    (the sample-weighted CE of the paper's per-sample uploads); otherwise uniformly.
    """
    col = torch.full((task.n_items,), -1, dtype=torch.long)
    col[torch.from_numpy(task.warm_items)] = torch.arange(len(task.warm_items))
    x = torch.cat([t[0] for t in protos])
    y = col[torch.cat([t[1] for t in protos]).long()]
    counted = cfg.proto_weighting == "count" and all(len(t) > 2 for t in protos)
    n = torch.cat([t[2].float() for t in protos]) if counted else torch.ones(len(y))
    keep = y >= 0
    x, y, n = x[keep], y[keep], n[keep]
    q = {k: v.clone().requires_grad_(k in ITEM_PARAMS) for k, v in p.items()}
    opt = torch.optim.Adam([q[k] for k in ITEM_PARAMS], lr=cfg.server_lr)
    warm_content = torch.from_numpy(task.content[task.warm_items])
    losses = []
    gen = torch.Generator().manual_seed(int(seed))
    for _ in range(cfg.server_steps):
        b = torch.multinomial(n, cfg.server_batch, replacement=True, generator=gen) if counted \
            else torch.randperm(len(y), generator=gen)[:cfg.server_batch]
        loss = F.cross_entropy(x[b] @ item_vectors(q, warm_content).T / cfg.tau, y[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return {k: v.detach() for k, v in q.items()}, losses


@dataclass
class DTLResult:
    method: str
    test: dict                   #: headline figures, plus "global_model" and "client_models" evaluations
    history: list[dict] = field(default_factory=list)
    params: dict = field(default_factory=dict)               #: the final global model
    client_params: list[dict] = field(default_factory=list)  #: each client's own tower(s) after its last round
    client_examples: list[int] = field(default_factory=list)
    assign: np.ndarray | None = None                         #: client id per user


def label_skew(genres: np.ndarray, task: RecTask, assign: np.ndarray) -> list[float]:
    """Per client, the total-variation distance between the label mix of its users' train items and the global
    mix (``genres``: [n_items, n_labels] item label weights, rows summing to 1 or 0): how skewed the split is over
    the items, which are the classes here."""
    def mix(users):
        cnt = np.bincount(np.concatenate([task.histories[u] for u in users] + [np.zeros(0, np.int64)]),
                          minlength=task.n_items).astype(np.float64)
        x = cnt @ genres
        return x / max(x.sum(), 1e-12)
    g = mix(range(len(task.histories)))
    return [float(0.5 * np.abs(mix(np.flatnonzero(assign == c)) - g).sum()) for c in range(int(assign.max()) + 1)]


def item_label_weights(data) -> np.ndarray:
    """[n_items, n_labels] genre weights (an item's labels share weight 1; items without labels are zero rows)."""
    cats = data.items["categories"].reindex(range(data.n_items)) if "categories" in data.items.columns else None
    lists = [list(c) if isinstance(c, (list, tuple, np.ndarray)) else [] for c in
             (cats if cats is not None else [None] * data.n_items)]
    names = {c: j for j, c in enumerate(sorted({c for cs in lists for c in cs}))}
    out = np.zeros((data.n_items, max(len(names), 1)))
    for i, cs in enumerate(lists):
        for c in cs:
            out[i, names[c]] += 1.0 / len(cs)
    return out


def train(task: RecTask, method: str, cfg: DTLConfig, *, n_clients: int = 5, alpha: float = 0.1, rounds: int = 20,
          sft_rounds: int = 10, seed: int = 0, log=None) -> DTLResult:
    """One method end to end; returns the global model's warm / cold figures over all users."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    torch.manual_seed(seed)
    assign = dirichlet_split(task.user_genre, n_clients, alpha, seed)
    clients = [DTLClient(c, task, np.flatnonzero(assign == c), cfg, seed=seed) for c in range(n_clients)]
    shared = init_params(task.dim, cfg.rank, seed)
    specs = param_specs(task.dim, cfg.rank)
    strategy = make_strategy("fedavg")
    both = method == "fedavg_both"
    agg_names = list(USER_PARAMS) + (list(ITEM_PARAMS) if both else [])
    last_uploads: list[ClientUpdate] = []   # the final round's: each client's own tower(s)

    def configure(r, shared):
        stage = "rl" if method == "feddtl" and r >= sft_rounds else "sft"
        return shared, {"round": r, "stage": stage, "train_item_tower": both}

    def aggregate(r, shared, ups, config):
        plain = [ClientUpdate(u.cid, "params", {k: u.arrays[k] for k in agg_names}, num_examples=u.num_examples)
                 for u in ups]
        new = strategy.aggregate({k: shared[k] for k in agg_names}, plain, {k: specs[k] for k in agg_names})
        shared = {**shared, **{k: v.float() for k, v in new.items()}}
        row = {"round": r, "stage": config["stage"], "loss": float(np.mean([u.metrics["loss"] for u in ups]))}
        if not both:
            shared, sl = server_align(shared, [(u.arrays["proto"], u.rows["proto"], u.arrays["proto_n"])
                                               for u in ups if "proto" in u.arrays],
                                      task, cfg, seed)
            row["server_loss_first"], row["server_loss_last"] = sl[0], sl[-1]
        if config["stage"] == "rl":
            row["reward"] = float(np.mean([u.metrics["reward"] for u in ups]))
            row["groups_with_signal"] = float(np.mean([u.metrics["groups_with_signal"] for u in ups]))
        last_uploads[:] = ups
        return shared, row

    def report(r, shared, row):
        if log:
            log(f"[{method}] round {r + 1}/{rounds} {row['stage']} loss {row['loss']:.4f}")

    shared, history = RoundLoop(clients, aggregate, configure=configure, on_round=report).run(shared, range(rounds))
    ups = last_uploads
    users = np.arange(len(task.histories))
    glob = evaluate_users(shared, task, users, cfg)
    # each client's own tower(s) as left by its last local training (the user adapter, plus the item adapter for
    # FedAvg of both towers), with the server's latest global parts for the rest
    own = [USER_PARAMS + (ITEM_PARAMS if both else ()) for _ in clients]
    personal = _pooled([evaluate_users({**shared, **{k: u.arrays[k] for k in names}}, task, c.users, cfg)
                        for c, u, names in zip(clients, ups, own)])
    # headline: FedAvg of both towers is one global model (both towers averaged); the decoupled methods keep the
    # client-side tower local, so each client's users are ranked with that client's own adapted user tower
    test = glob if both else personal
    return DTLResult(method, {**test, "global_model": glob, "client_models": personal}, history,
                     params={k: v.detach().clone() for k, v in shared.items()},
                     client_params=[{k: u.arrays[k] for k in names} for u, names in zip(ups, own)],
                     client_examples=[u.num_examples for u in ups], assign=assign)


def _pooled(parts: list[dict]) -> dict:
    """Per-kind figures of several disjoint user groups pooled into one (weighted by each group's ``n``)."""
    out = {}
    for kind in ("warm", "cold"):
        n = np.array([p[kind]["n"] for p in parts], dtype=np.float64)
        out[kind] = {"n": int(n.sum())}
        for k in parts[0][kind]:
            if k != "n":
                out[kind][k] = float((n * [p[kind][k] for p in parts]).sum() / max(n.sum(), 1.0))
    return out


def minilm_content(data, device: str = "cpu", cache_dir=None) -> np.ndarray:
    """MiniLM embeddings of :func:`item_texts`; kept in ``cache_dir`` (keyed by the texts) when one is given."""
    from ..views.sentence_encoder import SentenceEncoder

    embed = SentenceEncoder(device=device, progress=False).embed
    if cache_dir:
        from .fedmpt import cached_encoders

        embed = cached_encoders(None, embed, cache_dir)[1]
    return embed(item_texts(data))


def run_feddtl(source: str, cfg: DTLConfig, *, seeds, clients: int, alpha: float, rounds: int, sft_rounds: int,
               cold_share: float, dominant: str, device: str = "cpu", cache_dir: str | None = None,
               log=print) -> dict:
    """``align feddtl``: every method for every seed on ``source``; mean and per-seed figures."""
    import time

    from .. import datasets

    t0 = time.time()
    data = datasets.load(source)
    content = minilm_content(data, device, cache_dir or None)
    genres = item_label_weights(data)
    per_seed = []
    for seed in seeds:
        task = build_task(data, content, cold_share=cold_share, seed=seed, dominant=dominant)
        assign = dirichlet_split(task.user_genre, clients, alpha, seed)
        row = {"client_users": np.bincount(assign, minlength=clients).tolist(),
               "client_genre_tv": [round(x, 4) for x in label_skew(genres, task, assign)]}
        log(f"seed {seed}: users per client {row['client_users']}, genre-mix TV to the global mix "
            f"{row['client_genre_tv']}")
        for m in METHODS:
            t = time.time()
            res = train(task, m, cfg, n_clients=clients, alpha=alpha, rounds=rounds,
                        sft_rounds=sft_rounds, seed=seed)
            row[m] = res.test
            rl = [h for h in res.history if h["stage"] == "rl"]
            if rl:
                row[m]["rl_reward_last"] = rl[-1]["reward"]
                row[m]["rl_groups_with_signal"] = rl[-1]["groups_with_signal"]
            g, c = res.test["global_model"], res.test["client_models"]
            log(f"seed {seed} {m:>13}: warm HR@10 {res.test['warm']['hr@10']:.4f} NDCG@10 "
                f"{res.test['warm']['ndcg@10']:.4f} | cold HR@10 {res.test['cold']['hr@10']:.4f} NDCG@10 "
                f"{res.test['cold']['ndcg@10']:.4f} | global model warm/cold {g['warm']['hr@10']:.4f}/"
                f"{g['cold']['hr@10']:.4f}, client models {c['warm']['hr@10']:.4f}/{c['cold']['hr@10']:.4f} "
                f"({time.time() - t:.1f}s)")
        per_seed.append(row)
    report = {"source": source, "seeds": list(seeds), "clients": clients, "alpha": alpha,
              "dominant": dominant, "user_tower": cfg.user_tower,
              "rounds": rounds, "sft_rounds": sft_rounds, "cold_share": cold_share,
              "rank_among": cfg.rank_among, "epochs": cfg.epochs, "per_user": cfg.per_user,
              "server_steps": cfg.server_steps,
              "n_warm_items": int(len(task.warm_items)), "n_cold_items": int(len(task.cold_items))}
    mean = lambda rows: {kind: {k: float(np.mean([r[kind][k] for r in rows])) for k in ("hr@10", "ndcg@10")}  # noqa: E731
                         for kind in ("warm", "cold")}
    for m in METHODS:
        report[m] = mean([s[m] for s in per_seed])
        report[m]["global_model"] = mean([s[m]["global_model"] for s in per_seed])
        report[m]["client_models"] = mean([s[m]["client_models"] for s in per_seed])
    report["per_seed"] = per_seed
    report["seconds"] = round(time.time() - t0, 1)
    return report
