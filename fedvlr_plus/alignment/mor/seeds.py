"""MoR on implicit feedback against its federated baselines, over seeds.

One seed: every participating client (a user group) trains its own reward model on its users' training
interactions (:mod:`.mor_implicit`); the server fits the router on public pairs (:func:`.mor.reward_report`); a
FedAvg reward of one architecture and uniform averaging of the client rewards are the baselines
(:mod:`.mor_baselines`). Each of the three fused rewards drives the same GRPO run (same reference policy, same
candidates, same seed). Some clients are held out of reward training altogether: their users measure
cross-client adaptability (reward accuracy on their pairs, policy HR@10 on their test items).

Two reward views: ``features`` (item features; the earlier table) and ``items`` (the clients' own co-occurrence
counts over item ids, the policy with an item-to-item term, :mod:`.mor_items`).

The reference backbone is trained once (seed 0) and cached, or with every seed (``reference_per_seed``);
everything else is redone per seed. Aggregation over seeds and the paired tests live in :mod:`.mor_table`.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import torch

from ...errors import ConfigError
from ..pairs import PreferencePairs, holdout_split, pairwise_accuracy
from .backbone import ReferenceRanking, reference_candidates, train_backbone
from .baselines import ScoringClient, UniformRouter, fedavg_reward
from .config import MoRConfig
from .implicit import interaction_pairs, setting_features, train_only_groups, user_profiles, with_popularity
from .items import (
    fedavg_item_reward,
    make_item_clients,
    next_item_pairs,
    pair_queries,
    recent_items,
    training_sequences,
)
from .method import make_clients, reward_report, split_public
from .policy import ItemContext, policy_rankings, run_grpo
from .rewards import query_clients
from .router import Router, Standardiser, fuse

METHODS = ("mor", "uniform", "fedavg")
#: what the clients' rewards and the policy read: item features (genres, year, popularity) or item ids (the
#: clients' own co-occurrence counts, :mod:`.mor_items`)
REWARD_VIEWS = ("features", "items")
#: the FedAvg reward baseline's settings unless a run gives others
FEDAVG_REWARD = {"fedavg_kind": "bilinear", "fedavg_rounds": 10, "fedavg_epochs": 3}
RECENT_LENGTH, RECENT_HALF_LIFE = 20, 5.0   # the item view's history: 20 latest items, weight halving every 5


class ImplicitSetting(NamedTuple):
    """What every seed shares: the split, item features, clients (groups), contexts and the reference."""
    split: object
    feats: np.ndarray
    groups: np.ndarray
    names: tuple
    x: np.ndarray
    ref: ReferenceRanking
    backbone: dict
    held_out: tuple          # group ids kept out of reward training
    recent: object = None    # RecentItems: each user's latest training items (the item view's context)
    sequences: dict | None = None


def prepare_setting(data, *, group_by: str = "taste", n_groups: int = 4, held_out_clients: int = 1,
                    backbone: str = "fedavg", backbone_rounds: int = 30, candidates: int = 100, text: str = "none",
                    content: str | None = None, cache_dir=None, progress: bool = False) -> ImplicitSetting:
    """``content``: a feature array the dataset ships, for the item features and the taste groups (data whose
    items have no genres need one)."""
    from fedvlr_plus.datasets.splits import dedup, leave_one_out

    from ..pairs import default_cache_dir

    split = leave_one_out(dedup(data))
    base, vectors = setting_features(split, content=content, text=text, cache_dir=cache_dir, progress=progress)
    feats = with_popularity(split, base)
    groups, names = train_only_groups(split, group_by, k=n_groups, seed=0, item_vectors=vectors)
    if not 0 <= held_out_clients < len(names):
        raise ValueError(f"held_out_clients must be in [0, {len(names) - 1}], got {held_out_clients}")
    _check_groups(groups, names, getattr(split, "name", "the data"))
    scores, bb = train_backbone(split, backbone=backbone, rounds=backbone_rounds, seed=0, progress=progress,
                                cache_dir=cache_dir if cache_dir is not None else default_cache_dir())
    ref = reference_candidates(split, scores, candidates)
    held = tuple(range(len(names) - held_out_clients, len(names)))
    return ImplicitSetting(split, feats, groups, tuple(names), user_profiles(split, feats), ref,
                           {"name": backbone, "rounds": backbone_rounds, **bb}, held,
                           recent_items(split, length=RECENT_LENGTH, half_life=RECENT_HALF_LIFE),
                           training_sequences(split))


def _check_groups(groups: np.ndarray, names: tuple, source: str) -> None:
    """Every group is a client: one without users would leave the comparison with fewer clients than asked for."""
    sizes = np.bincount(groups[groups >= 0], minlength=len(names))
    empty = [n for n, c in zip(names, sizes) if c == 0]
    if empty:
        raise ConfigError("--groups", f"{source}: group(s) {', '.join(empty)} have no users (sizes "
                          f"{', '.join(f'{n} {c}' for n, c in zip(names, sizes))})",
                          "ask for fewer groups or group by something else")


def fused_accuracy(clients, router, std, pairs: PreferencePairs, extra_for=None) -> float:
    """Pairwise accuracy of a fused reward on ``pairs`` (objective = each pair's group)."""
    if not len(pairs):
        return float("nan")
    extra = extra_for(pairs) if extra_for is not None else None
    z = std(query_clients(clients, pairs.context, np.stack([pairs.chosen, pairs.rejected], 1), extra=extra))
    with torch.no_grad():
        f = fuse(router(pairs.context, pairs.group), z)
    return pairwise_accuracy(f[:, 0].numpy(), f[:, 1].numpy())


def reward_baselines(clients, train, public, cfg: MoRConfig, *, fedavg_kind: str, fedavg_rounds: int,
                     fedavg_epochs: int, item_setting: ImplicitSetting | None = None) -> dict:
    """The FedAvg reward (one client-like scorer, weight 1, its own public standardisation) and the uniform
    router over MoR's clients: ``{name: (clients, router, standardiser)}``. With ``item_setting`` (the item view)
    the FedAvg reward is :func:`.mor_items.fedavg_item_reward` (the clients' counts pooled, one round)."""
    extra = None
    if item_setting is None:
        model, hist = fedavg_reward(train, kind=fedavg_kind, rounds=fedavg_rounds, local_epochs=fedavg_epochs,
                                    lr=cfg.reward_lr, seed=cfg.seed)
        scorer = [ScoringClient(0, model)]
    else:
        s = item_setting
        scorer = [fedavg_item_reward(train, sequences=s.sequences, n_items=s.split.n_items, recent=s.recent,
                                     seed=cfg.seed)]
        hist, extra = [], pair_queries(s.recent)(public)
    items = np.stack([public.chosen, public.rejected], 1)
    fstd = Standardiser.fit(query_clients(scorer, public.context, items, extra=extra))
    n_obj = len(public.group_names)
    ustd = Standardiser.fit(query_clients(clients, public.context, items, extra=extra))
    return {"fedavg": (scorer, Router(public.context.shape[1], n_obj, 1), fstd),
            "uniform": (clients, UniformRouter(len(clients)), ustd), "fedavg_history": hist}


def _targets(split, part: str, users_mask: np.ndarray) -> np.ndarray:
    t = np.full(split.n_users, -1, np.int64)
    df = split.part(part)
    t[df["user"].to_numpy()] = df["item"].to_numpy()
    t[~users_mask] = -1
    return t


def policy_figures(s: ImplicitSetting, policy, cfg: MoRConfig, populations: dict, view: str = "features") -> dict:
    """{population: {part: {reference, grpo}}} HR@10 / NDCG@10 of a policy and of the reference."""
    ctx = ItemContext(s.recent.hist, s.recent.weight, s.ref.cand) if view == "items" else None
    out = {}
    for pop, mask in populations.items():
        out[pop] = {}
        for part in ("valid", "test"):
            r = policy_rankings(policy, ref_scores=s.ref.scores, train_mask=s.ref.train_mask, cand=s.ref.cand,
                                x=s.x, feats=s.feats, targets=_targets(s.split, part, mask), cfg=cfg,
                                item_context=ctx)
            out[pop][part] = {"reference": r["reference"], "grpo": r["grpo"]}
    return out


def seed_pairs(s: ImplicitSetting, cfg: MoRConfig, test_fraction: float, negatives: str = "uniform",
               view: str = "features"):
    """This seed's pairs: training / public / held-out users of the participating clients, and the pairs of the
    held-out clients (never trained on). The item view's pairs are the users' latest training items."""
    make = next_item_pairs if view == "items" else interaction_pairs
    pairs = make(s.split, s.feats, s.groups, s.names, negatives=negatives, seed=cfg.seed)
    out = np.isin(pairs.group, s.held_out)
    fed, outside = pairs.take(np.flatnonzero(~out)), pairs.take(np.flatnonzero(out))
    del pairs   # each split copies its rows' feature vectors: free every stage's input once it is split
    train, test = holdout_split(fed, test_fraction, seed=cfg.seed, by="user")
    del fed
    train, public = split_public(train, cfg.public_fraction, seed=cfg.seed)
    return train, public, test, outside


def seed_clients(s: ImplicitSetting, cfg: MoRConfig, test_fraction: float, negatives: str, view: str):
    """This seed's pairs (:func:`seed_pairs`), the participating clients' rewards of ``view`` and the query
    arrays a pair set needs (None for the features view): (train, public, test, outside, clients, extra_for)."""
    train, public, test, outside = seed_pairs(s, cfg, test_fraction, negatives, view)
    if view == "items":
        clients = make_item_clients(train, test, cfg.architectures, sequences=s.sequences, n_items=s.split.n_items,
                                    recent=s.recent, seed=cfg.seed)
        return train, public, test, outside, clients, pair_queries(s.recent)
    return train, public, test, outside, make_clients(train, test, cfg), None


def run_seed(s: ImplicitSetting, cfg: MoRConfig, *, test_fraction: float = 0.2,
             fedavg_kind: str = FEDAVG_REWARD["fedavg_kind"], fedavg_rounds: int = FEDAVG_REWARD["fedavg_rounds"],
             fedavg_epochs: int = FEDAVG_REWARD["fedavg_epochs"], negatives: str = "uniform",
             view: str = "features") -> dict:
    """One seed of the comparison (see the module docstring), as a JSON-ready dict."""
    if view not in REWARD_VIEWS:
        raise ValueError(f"view must be one of {REWARD_VIEWS}, got {view!r}")
    t0 = time.perf_counter()
    items = view == "items"
    if items:   # the router's initial weights come from torch's global generator: make a seed its own run
        torch.manual_seed(cfg.seed)
    train, public, test, outside, clients, extra_for = seed_clients(s, cfg, test_fraction, negatives, view)
    report, router, std = reward_report(clients, public, test, cfg, extra_for=extra_for)
    fused = {"mor": (clients, router, std)}
    base = reward_baselines(clients, train, public, cfg, fedavg_kind=fedavg_kind, fedavg_rounds=fedavg_rounds,
                            fedavg_epochs=fedavg_epochs, item_setting=s if items else None)
    fused.update({k: base[k] for k in ("fedavg", "uniform")})
    inside = (s.groups >= 0) & ~np.isin(s.groups, s.held_out)
    populations = {"clients": inside, "held_out_clients": np.isin(s.groups, s.held_out) & (s.groups >= 0)}
    eligible = np.flatnonzero(inside)
    ctx = ItemContext(*s.recent.of(eligible), s.ref.cand[eligible]) if items else None
    out = {"seed": cfg.seed, "reward_accuracy": {}, "reward_accuracy_held_out_clients": {}, "policy": {},
           "grpo_last": {}}
    for name, (cl, rt, st) in fused.items():
        out["reward_accuracy"][name] = fused_accuracy(cl, rt, st, test, extra_for)
        out["reward_accuracy_held_out_clients"][name] = fused_accuracy(cl, rt, st, outside, extra_for)
        policy, hist = run_grpo(cl, rt, st, ref_logits=s.ref.logits[eligible], cand=s.ref.cand[eligible],
                                x=s.x[eligible], o=s.groups[eligible], feats=s.feats, cfg=cfg, item_context=ctx)
        out["policy"][name] = policy_figures(s, policy, cfg, populations, view)
        out["grpo_last"][name] = hist[-1]
    out["reference"] = {pop: {part: v[part]["reference"] for part in v}
                        for pop, v in out["policy"]["mor"].items()}
    out.update({"clients": report["clients"], "router_weights": report["router_weights"],
                "best_single": {k: report["reward_accuracy"][k] for k in ("best_single", "best_single_client")},
                "fedavg_reward_rounds": base["fedavg_history"],
                "pairs": {"train": len(train), "public": len(public), "test": len(test),
                          "held_out_clients": len(outside)},
                "seconds": time.perf_counter() - t0})
    return out


def with_reference_seed(s: ImplicitSetting, seed: int, *, candidates: int, cache_dir=None,
                        progress: bool = False) -> ImplicitSetting:
    """``s`` with its reference backbone trained with ``seed`` (cached per seed) and that reference's candidates."""
    from ..pairs import default_cache_dir

    scores, bb = train_backbone(s.split, backbone=s.backbone["name"], rounds=s.backbone["rounds"], seed=seed,
                                progress=progress,
                                cache_dir=cache_dir if cache_dir is not None else default_cache_dir())
    return s._replace(ref=reference_candidates(s.split, scores, candidates),
                      backbone={"name": s.backbone["name"], "rounds": s.backbone["rounds"], "seed": seed, **bb})


def run_mor_seeds(data, *, seeds: int = 5, first_seed: int = 0, cfg: MoRConfig | None = None,
                  setting_kw: dict | None = None, seed_kw: dict | None = None, on_seed=None,
                  reference_per_seed: bool = False) -> dict:
    """Every seed of :func:`run_seed` on one shared setting, with the summary and paired tests of
    :func:`.mor_table.summarise`. ``reference_per_seed``: each seed also retrains the reference backbone with
    that seed (so the reference row has a spread); otherwise it is trained once, with seed 0."""
    from .table import summarise

    cfg = cfg or MoRConfig()
    t0, c0 = time.perf_counter(), time.process_time()
    s = prepare_setting(data, candidates=cfg.candidates, **(setting_kw or {}))
    runs = []
    for seed in range(first_seed, first_seed + seeds):
        s_seed = s
        if reference_per_seed:
            kw = setting_kw or {}
            s_seed = with_reference_seed(s, seed, candidates=cfg.candidates, cache_dir=kw.get("cache_dir"),
                                         progress=kw.get("progress", False))
        runs.append(run_seed(s_seed, replace(cfg, seed=seed), **(seed_kw or {})))
        if reference_per_seed:
            runs[-1]["backbone"] = s_seed.backbone
        if on_seed is not None:
            on_seed(runs[-1])
    return {"source": getattr(data, "name", "data"), "reward_signal": "interactions",
            "groups": list(s.names), "held_out_clients": [s.names[g] for g in s.held_out],
            "backbone": s.backbone, "seeds": [r["seed"] for r in runs], "per_seed": runs,
            "summary": summarise(runs),
            "config": {"candidates": int(s.ref.cand.shape[1]), "group_size": cfg.grpo.group_size,
                       "beta": cfg.grpo.beta, "kl": cfg.grpo.kl, "grpo_rounds": cfg.grpo_rounds,
                       "users_per_round": cfg.users_per_round, "policy_lr": cfg.policy_lr,
                       "architectures": list(cfg.architectures), "reward_epochs": cfg.reward_epochs,
                       "reference_per_seed": reference_per_seed, **(seed_kw or {})},
            "seconds": {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}}
