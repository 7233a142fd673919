"""MoR (Mixture-of-Rewards): federated alignment by exchanging preference *scores* instead of parameters.

Lu, Wang, Zhang, Yang, Zheng, Tong, Xu, Zheng, "Replacing Parameters with Preferences: Federated Alignment of
Heterogeneous Vision-Language Models", arXiv 2602.00485 / 2605.03426 (2026). No code is public; the algorithm below
is this package's reconstruction, mapped onto recommendation (what is published and what is not:
docs/alignment.md, "MoR"):

1. Each client trains its own Bradley-Terry reward model r_k(x, y) on its own pairs, minimising
   -log sigma(r_k(x, y_w) - r_k(x, y_l)). Architectures differ between clients (bilinear and MLP by default). The reward
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

Where the parts live: :mod:`.mor_rewards` (reward models, clients, queries), :mod:`.mor_router` (standardiser,
router, fusion), :mod:`.mor_policy` (residual policy, GRPO rounds, rankings), :mod:`.mor_backbone` (reference
backbone, taste vectors, candidates), :mod:`.mor_config` (settings), :mod:`.mor_items` (clients whose rewards read
item ids); this module holds the reward report and the two runners and re-exports every public name.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch

from ...federation.messages import ClientUpdate
from ...federation.state.store import MemoryStore
from ..pairs import PreferencePairs, pairwise_accuracy
from .backbone import ReferenceRanking, reference_candidates, train_backbone, user_taste
from .config import MoRConfig
from .implicit import require_genres
from .policy import ResidualPolicy, expected_reward, policy_rankings, ranking_metrics, run_grpo
from .rewards import (
    REWARD_KINDS,
    SCORE_ARRAY,
    BilinearReward,
    LinearReward,
    MLPReward,
    RewardClient,
    make_reward,
    query_clients,
    score_queries,
    stack_scores,
    train_bradley_terry,
)
from .router import Router, Standardiser, fuse, fuse_scores, fused_reward, router_weights_by_objective, train_router

__all__ = ["REWARD_KINDS", "SCORE_ARRAY", "BilinearReward", "LinearReward", "MLPReward", "MoRConfig",
           "ReferenceRanking", "ResidualPolicy", "RewardClient", "Router", "Standardiser", "expected_reward",
           "fuse", "fuse_scores", "fused_reward", "make_clients", "make_reward", "policy_rankings", "query_clients",
           "ranking_metrics", "reference_candidates", "reward_report", "router_weights_by_objective", "run_grpo",
           "run_mor_hh", "run_mor_ratings", "score_queries", "split_public", "stack_scores", "train_backbone",
           "train_bradley_terry", "train_router", "user_taste"]


def reward_report(clients: list[RewardClient], public: PreferencePairs, test: PreferencePairs, cfg: MoRConfig,
                  log: list | None = None, extra_for=None) -> tuple[dict, Router, Standardiser]:
    """Per-client own / others' accuracy, router training on ``public``, and uniform / best-single / fused
    accuracy on the pooled held-out pairs ``test`` (objective = each pair's group). ``extra_for(pairs)``: the
    extra query arrays of a pair set (item ids and histories for item clients, :func:`.mor_items.pair_queries`)."""
    extra_for = extra_for or (lambda pairs: None)
    K = len(clients)
    n_obj = len(test.group_names)
    # public pairs: scores obtained by queries (chosen and rejected in one query of G = 2)
    items = np.stack([public.chosen, public.rejected], 1)
    s_pub = query_clients(clients, public.context, items, 0, log, extra_for(public))          # [K, N, 2]
    std = Standardiser.fit(s_pub)
    z_pub = std(s_pub)
    router = Router(public.context.shape[1], n_obj, K)
    train_router(router, z_pub[..., 0], z_pub[..., 1], public.context, public.group, epochs=cfg.router_epochs,
                 balance=cfg.router_balance, seed=cfg.seed, holdout=cfg.router_holdout)
    s_test = std(query_clients(clients, test.context, np.stack([test.chosen, test.rejected], 1), 0, log,
                               extra_for(test)))
    with torch.no_grad():
        w = router(test.context, test.group)
    fused = fuse(w, s_test)
    uniform = s_test.mean(0)
    single_pub = [pairwise_accuracy(z_pub[k, :, 0], z_pub[k, :, 1]) for k in range(K)]
    best = int(np.argmax(single_pub))
    single_test = [pairwise_accuracy(s_test[k, :, 0], s_test[k, :, 1]) for k in range(K)]
    per_client = []
    for c in clients:
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


def split_public(train: PreferencePairs, fraction: float, seed: int = 0) -> tuple[PreferencePairs, PreferencePairs]:
    """Move ``fraction`` of each client's training pairs (whole users where pairs carry users) to a public set."""
    from ..pairs import holdout_split

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


def run_mor_ratings(data, *, group_by: str = "taste", n_groups: int = 4, text: str = "none", min_gap: float = 2.0,
                    test_fraction: float = 0.2, backbone_rounds: int = 20, backbone: str = "fedavg",
                    cfg: MoRConfig | None = None, encoder=None, cache_dir=None, progress: bool = False,
                    pooled_baseline: bool = False) -> dict:
    """The whole MoR experiment on a rating dataset (e.g. MovieLens-100K), as the JSON-ready report.
    ``pooled_baseline``: also run GRPO with one reward model trained on the pooled pairs (honesty check 4)."""
    from fedvlr_plus.datasets.splits import dedup, leave_one_out

    from ..pairs import holdout_split, item_features, rating_pairs, user_groups

    cfg = cfg or MoRConfig()
    t0 = time.perf_counter()
    split = leave_one_out(dedup(data))                      # ratings kept; split by time, one valid / test per user
    require_genres(split, "the rating-gap comparison reads genres; the interactions comparison takes --content NAME")
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
    ref = reference_candidates(split, ref_scores, cfg.candidates)
    x = user_taste(split, feats)
    eligible = np.flatnonzero(groups >= 0)
    policy, history = run_grpo(clients, router, std, ref_logits=ref.logits[eligible], cand=ref.cand[eligible],
                               x=x[eligible], o=groups[eligible], feats=feats, cfg=cfg, log=uploads)
    exp_r = expected_reward(clients, router, std, policy, ref_logits=ref.logits, cand=ref.cand, x=x,
                            o=np.maximum(groups, 0), feats=feats, cfg=cfg, users=eligible)
    pooled = None
    if pooled_baseline:
        pooled = _pooled_baseline(clients, router, std, train, public, test, ref, x, groups, feats, cfg,
                                  n_objectives=len(names))
    out = _held_out_rankings(split, groups, policy, pooled, ref, x, feats, cfg)
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
        "uplink": _uplink(uploads),
        "config": {"candidates": ref.cand.shape[1], "group_size": cfg.grpo.group_size, "beta": cfg.grpo.beta,
                   "kl": cfg.grpo.kl, "rounds": cfg.grpo_rounds, "users_per_round": cfg.users_per_round,
                   "architectures": list(cfg.architectures), "seed": cfg.seed},
        "seconds": {"rewards": t_reward, "total": time.perf_counter() - t0},
    })
    return report


def _uplink(uploads: list[ClientUpdate]) -> dict:
    return {"arrays": sorted({k for u in uploads for k in u.arrays}), "messages": len(uploads),
            "floats": int(sum(v.numel() for u in uploads for v in u.arrays.values()))}


def _pooled_baseline(clients, router, std, train, public, test, ref, x, groups, feats, cfg: MoRConfig, *,
                     n_objectives: int) -> dict:
    """Honesty check 4's baseline: one reward model on the pooled training pairs (a centralised reference, not
    federated), the same GRPO run, the same evaluation (under the federated fused reward)."""
    eligible = np.flatnonzero(groups >= 0)
    pool = RewardClient(0, cfg.architectures[0], replace(train, client=np.zeros(len(train), np.int64)), None,
                        seed=cfg.seed, epochs=cfg.reward_epochs, lr=cfg.reward_lr)
    pub = query_clients([pool], public.context, np.stack([public.chosen, public.rejected], 1))
    pstd = Standardiser.fit(pub)
    prouter = Router(x.shape[1], n_objectives, 1)       # softmax over one client: weight 1
    pz = pstd(query_clients([pool], test.context, np.stack([test.chosen, test.rejected], 1)))[0]
    ppolicy, phist = run_grpo([pool], prouter, pstd, ref_logits=ref.logits[eligible], cand=ref.cand[eligible],
                              x=x[eligible], o=groups[eligible], feats=feats, cfg=cfg)
    return {"reward_accuracy": pairwise_accuracy(pz[:, 0], pz[:, 1]), "policy": ppolicy,
            "grpo": phist, "expected_fused_reward": expected_reward(
                clients, router, std, ppolicy, ref_logits=ref.logits, cand=ref.cand, x=x, o=np.maximum(groups, 0),
                feats=feats, cfg=cfg, users=eligible)}


def _held_out_rankings(split, groups, policy, pooled, ref, x, feats, cfg: MoRConfig) -> dict:
    """Reference vs policy (and the pooled baseline's policy) on the valid and test targets of grouped users."""
    out = {}
    for part in ("valid", "test"):
        targets = np.full(split.n_users, -1, np.int64)
        df = split.part(part)
        targets[df["user"].to_numpy()] = df["item"].to_numpy()
        targets[groups < 0] = -1
        out[part] = policy_rankings(policy, ref_scores=ref.scores, train_mask=ref.train_mask, cand=ref.cand, x=x,
                                    feats=feats, targets=targets, cfg=cfg)
        if pooled is not None:
            out[part]["pooled"] = policy_rankings(pooled["policy"], ref_scores=ref.scores,
                                                  train_mask=ref.train_mask, cand=ref.cand, x=x, feats=feats,
                                                  targets=targets, cfg=cfg)["grpo"]
    return out


def run_mor_hh(root, *, cfg: MoRConfig | None = None, limit: int | None = None, clients_per_type: int = 2,
               test_fraction: float = 0.2, encoder=None, cache_dir=None, progress: bool = False) -> dict:
    """MoR's reward side on HH-RLHF (helpful-base vs harmless-base clients, objective = the split): per-client
    accuracy, router, fused vs uniform vs best single. No GRPO here (no item catalogue): ``grpo`` is empty and
    ``policy`` None."""
    from ..pairs import hh_pairs, holdout_split

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
        "uplink": _uplink(uploads),
        "config": {"architectures": list(cfg.architectures), "seed": cfg.seed},
        "seconds": {"total": time.perf_counter() - t0},
    })
    return report
