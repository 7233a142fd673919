"""FedDTL's two towers (low-rank adapters on frozen content embeddings), its settings, the GRPO stage's noisy
candidate sampling and the warm / cold ranking evaluation."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ...adapters.base import ParamSpec
from .task import RecTask
from .towers import ItemContent, ItemTower, item_vectors, lora, user_vectors  # noqa: F401 (re-exported)

METHODS = ("fedavg_both", "decoupled_sft", "feddtl")
USER_PARAMS = ("user_down", "user_up")
ITEM_PARAMS = ("item_down", "item_up")


@dataclass
class DTLConfig:
    rank: int = 4
    tau: float = 0.05  #: softmax temperature on cosines
    lr: float = 1e-2
    server_lr: float = 1e-2
    server_steps: int = 10
    server_batch: int = 1024
    batch_size: int = 256
    per_user: int = 8  #: training examples drawn per user and round
    sigma: float = 0.1  #: GRPO noise std in the user embedding
    group: int = 4  #: G
    clip_eps: float = 0.2
    beta: float = 0.5  #: KL weight to the hybrid reference
    ref_mix: float = 0.5  #: weight of the SFT model in the hybrid reference
    rl_candidates: int = 100  #: GRPO acts over the target plus rl_candidates - 1 random warm items
    epochs: int = 1  #: local passes over the round's examples (the same in every stage and method)
    proto_weighting: str = "count"  #: server CE: "count" (prototypes drawn by example count) or "uniform"
    #: what a decoupled client uploads for the server's alignment: "item", per trained item the normalised mean of
    #: its examples' user embeddings; or "example", every example's user embedding with its item (the paper's
    #: per-sample uploads; one vector per (user, item) example leaves the client)
    prototypes: str = "item"
    rank_among: str = "own"  #: evaluation: warm among warm, cold among cold ("own") or both among all items
    #: decoupled methods: "fedavg" (each round starts from the FedAvg of the user adapters, as in the paper) or
    #: "private" (each client keeps its own user adapter in its store and restores it every round; the uploads
    #: and the averaged global user adapter, used by the hybrid reference and the global-model evaluation, stay)
    user_tower: str = "fedavg"
    #: server alignment: weight of a penalty keeping every item's adapted vector near its frozen content vector,
    #: mean_i (1 - cos(v_i, e_i)) over the whole catalogue, novel (cold) items included (the server knows their
    #: content). 0 = none (the earlier behaviour). Why: cross-entropy on base-class uploads pulls the shared item
    #: adapter towards the base classes; the anchor is what novel classes generalise from (KgCoOp's argument,
    #: Yao et al., CVPR 2023)
    anchor_weight: float = 0.0

    def __post_init__(self):
        if self.user_tower not in ("fedavg", "private"):
            raise ValueError(f"user_tower must be 'fedavg' or 'private', got {self.user_tower!r}")
        if self.anchor_weight < 0:
            raise ValueError(f"anchor_weight must be >= 0, got {self.anchor_weight}")
        if self.prototypes not in ("item", "example"):
            raise ValueError(f"prototypes must be 'item' or 'example', got {self.prototypes!r}")


def param_specs(d: int, r: int) -> dict[str, ParamSpec]:
    return {
        s.name: s
        for s in (
            ParamSpec("user_down", (r, d), True, std=1.0 / math.sqrt(d)),
            ParamSpec("user_up", (d, r), True, init="zeros"),
            ParamSpec("item_down", (r, d), True, std=1.0 / math.sqrt(d)),
            ParamSpec("item_up", (d, r), True, init="zeros"),
        )
    }


def init_params(d: int, r: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(int(seed))
    return {
        n: (torch.zeros(s.shape) if s.init == "zeros" else torch.randn(s.shape, generator=g) * s.std)
        for n, s in param_specs(d, r).items()
    }


def noisy_candidates(
    u: torch.Tensor,
    items: torch.Tensor | ItemTower,
    group: int,
    sigma: float,
    generator: torch.Generator | None = None,
    columns: torch.Tensor | None = None,
) -> torch.Tensor:
    """G candidate items per row: the nearest item to ``normalise(u + sigma eps)``; [B, G] column indices.

    ``items`` is [A, d] item vectors or an :class:`ItemTower` over A items; with ``columns`` ([B, k] indices into
    them) each row chooses within its own action set and the result indexes ``columns``' second axis."""
    eps = torch.randn(u.shape[0], group, u.shape[1], generator=generator) * sigma
    noisy = F.normalize(u.detach().unsqueeze(1) + eps, dim=-1)
    with torch.no_grad():
        sims = items.scores(noisy) if isinstance(items, ItemTower) else noisy @ items.T  # [B, G, A]
    if columns is not None:
        sims = sims.gather(2, columns.unsqueeze(1).expand(-1, group, -1))
    return sims.argmax(-1)


#: users scored at once by :func:`evaluate_users`: its memory grows with this block (a [block, items] float64
#: score table), not with the population (19,412 users × 11,924 items would be 1.9 GB, twice over when masked)
EVAL_USERS_PER_BLOCK = 2048


def evaluate_users(
    p: dict,
    task: RecTask,
    users: np.ndarray,
    cfg: DTLConfig,
    ks=(10,),
    among: str | None = None,
    block: int = EVAL_USERS_PER_BLOCK,
) -> dict:
    """Warm and cold targets apart, the user's train items masked.

    ``among`` (default ``cfg.rank_among``): ``"own"`` ranks a warm target among the warm items and a cold target
    among the cold items (the base-to-novel protocol of prompt learning: base classes are scored among base
    classes, novel among novel); ``"all"`` ranks both among every item. Users are scored ``block`` at a time.
    """
    among = among or cfg.rank_among
    if among not in ("own", "all"):
        raise ValueError(f"among must be 'own' or 'all', got {among!r}")
    users = np.asarray([u for u in users if len(task.histories[u])], dtype=np.int64)
    kinds = {"warm": task.warm_target, "cold": task.cold_target}
    if not len(users):
        return {kind: {"n": 0, **{f"{m}@{k}": 0.0 for k in ks for m in ("hr", "ndcg")}} for kind in kinds}
    with torch.no_grad():
        items = ItemContent(torch.from_numpy(task.content)).tower(p)
    hidden = {"warm": task.cold_items, "cold": np.setdiff1d(np.arange(task.n_items), task.cold_items)}
    ranks = {kind: [] for kind in kinds}
    for a in range(0, len(users), block):
        part = users[a : a + block]
        scores = _masked_scores(p, task, part, items)
        for kind, targets in kinds.items():
            ok = targets[part] >= 0
            s = scores[torch.from_numpy(ok)]
            if among == "own":
                s[:, torch.from_numpy(hidden[kind])] = -torch.inf  # (boolean indexing made s a copy)
            tt = torch.from_numpy(targets[part][ok])
            ranks[kind].append((s > s.gather(1, tt[:, None])).sum(1).numpy())
    return {kind: _rank_metrics(np.concatenate(r), ks) for kind, r in ranks.items()}


def _masked_scores(p: dict, task: RecTask, users: np.ndarray, items: ItemTower) -> torch.Tensor:
    """``[len(users), n_items]`` float64 scores, each user's training items at -inf."""
    ctx = torch.from_numpy(np.stack([task.content[task.histories[u]].mean(0) for u in users]))
    with torch.no_grad():
        scores = items.scores(user_vectors(p, ctx)).double()
    for row, u in enumerate(users):
        scores[row, torch.from_numpy(task.histories[u])] = -torch.inf
    return scores


def _rank_metrics(ranks: np.ndarray, ks) -> dict:
    """HR@k and NDCG@k of 0-based target ranks, with the number of targets."""
    res = {"n": int(len(ranks))}
    for k in ks:
        res[f"hr@{k}"] = float(np.mean(ranks < k)) if len(ranks) else 0.0
        res[f"ndcg@{k}"] = float(np.mean(np.where(ranks < k, 1 / np.log2(ranks + 2), 0))) if len(ranks) else 0.0
    return res
