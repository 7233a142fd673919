"""How much any router could gain over uniform averaging of MoR's client rewards (the routing headroom), measured
without GRPO, per seed.

A router only beats uniform averaging where the clients differ in *where* they are right. Two measurements:

1. **Own-group accuracy** (:func:`group_accuracy`): client k's pairwise accuracy on the held-out users' pairs of
   every group j, [K, J]. Routing a user to the clients of the user's own taste group can only help if client k
   is the most accurate on group k's users; the Bradley-Terry loss of the public pairs can only learn such a
   routing if that difference exists.
2. **Re-ranking bound** (:func:`rerank_bound`): every participating user's reference top-C re-ordered by a fused
   reward alone: uniform weights, each single client, the best global simplex weights and the best weights per
   group. The last two are chosen on the users' VALIDATION items themselves, an oracle that no router with
   global or per-group weights (on the grid) can beat on validation; their TEST HR@10 says whether even that
   choice carries over. Beside them a
   per-user router that is not an oracle (:func:`own_fit_row`): each user's weights from how well each client
   ranked that user's own training pairs, its temperature chosen on validation.
3. **The rewards a GRPO run follows** (:func:`reward_rows`): the same re-ranking by MoR's trained router and by
   the FedAvg reward, and by each reward's KL-regularised optimum at the run's beta, ``ref / T + R / beta``: the
   exact maximiser over the candidates of the objective GRPO climbs, E[R] - beta KL(pi || pi_ref), whose
   solution is pi* proportional to pi_ref exp(R / beta). GRPO's sampled steps and its policy class stop short of
   it (or wander past it: HR@10 is not the objective), so it is where each reward points the policy, not a bound.

Nothing here feeds back into a run: it reads the validation and test items only to report the bound.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..pairs import PreferencePairs, pairwise_accuracy
from .config import MoRConfig
from .rewards import query_clients
from .router import Standardiser

#: simplex step per number of clients, coarser as the grid grows (330 rows at 8 clients)
GRID_STEP = {2: 0.05, 3: 0.1, **{k: 0.25 for k in range(4, 9)}}
OWN_FIT_TEMPERATURES = (0.03, 0.1, 0.3, 1.0)  # per-user router's softmax temperatures (accuracy units)


def simplex_grid(k: int, step: float | None = None) -> np.ndarray:
    """Every weight vector of ``k`` non-negative multiples of ``step`` summing to 1, and the uniform one (so an
    oracle over the grid is never below uniform averaging on the set it is chosen on): [M, k]."""
    step = step if step is not None else GRID_STEP.get(k, 0.5)
    n = int(round(1 / step))
    rows = [c for c in itertools.product(range(n + 1), repeat=k) if sum(c) == n]
    return np.vstack([np.full((1, k), 1.0 / k), np.asarray(rows, np.float64) / n])


def rerank_hits(scores: np.ndarray, cand: np.ndarray, targets: np.ndarray, k: int = 10) -> np.ndarray:
    """Per user: is the target among the top-k candidates by ``scores`` [U, C] (False when not a candidate)."""
    inside = (cand == targets[:, None]).any(1)
    pos = (cand == targets[:, None]).argmax(1)
    rank = (scores > scores[np.arange(len(scores)), pos][:, None]).sum(1)
    return inside & (rank < k)


def best_weights(z: np.ndarray, cand, targets, grid: np.ndarray) -> np.ndarray:
    """The grid row whose fused scores sum_k w_k z_k [U, C] give the most hits (first one on ties)."""
    hits = [rerank_hits(np.tensordot(w, z, 1), cand, targets).sum() for w in grid]
    return grid[int(np.argmax(hits))]


def candidate_scores(clients, std: Standardiser, x, feats, cand, extra: dict | None) -> np.ndarray:
    """Every client's standardised scores of every user's candidates, through the query protocol: [K, U, C]."""
    return std(query_clients(clients, x, feats[cand], extra=extra)).numpy()


def rerank_bound(z: np.ndarray, cand, targets: dict, groups: np.ndarray) -> dict:
    """HR@10 (valid, test) of uniform, each client, the valid-chosen global and per-group weights; ``targets``
    {"valid": [U], "test": [U]}."""
    grid = simplex_grid(len(z))
    glob = best_weights(z, cand, targets["valid"], grid)
    per_group = np.zeros_like(z[0])
    chosen = {}
    for g in np.unique(groups):
        m = groups == g
        w = best_weights(z[:, m], cand[m], targets["valid"][m], grid)
        per_group[m], chosen[int(g)] = np.tensordot(w, z[:, m], 1), w.tolist()
    fused = {
        "uniform": z.mean(0),
        "oracle_global": np.tensordot(glob, z, 1),
        "oracle_per_group": per_group,
        **{f"client_{k}": z[k] for k in range(len(z))},
    }
    out = {
        name: {part: float(rerank_hits(f, cand, t).mean()) for part, t in targets.items()} for name, f in fused.items()
    }
    out["weights"] = {"oracle_global": glob.tolist(), "oracle_per_group": chosen}
    return out


def own_fit(clients, std: Standardiser, pair_sets, users: np.ndarray, extra_for=None) -> np.ndarray:
    """[K, U]: each client's pairwise accuracy on each user's own training pairs (any of ``pair_sets``; 0.5 for a
    user without any), the input of a per-user router that sends a user to the clients that explained that
    user's past best."""
    row = np.full(max(int(users.max()), *(int(p.user.max()) for p in pair_sets)) + 1, -1)
    row[users] = np.arange(len(users))
    hits, n = np.zeros((len(clients), len(users))), np.zeros(len(users))
    for pairs in pair_sets:
        extra = extra_for(pairs) if extra_for is not None else None
        z = std(query_clients(clients, pairs.context, np.stack([pairs.chosen, pairs.rejected], 1), extra=extra))
        right = (z[..., 0] > z[..., 1]).numpy().astype(np.float64)  # [K, N]
        keep = row[pairs.user] >= 0
        for k in range(len(clients)):
            np.add.at(hits[k], row[pairs.user[keep]], right[k, keep])
        np.add.at(n, row[pairs.user[keep]], 1)
    return np.where(n > 0, hits / np.maximum(n, 1), 0.5)


def own_fit_row(z: np.ndarray, fit: np.ndarray, cand, targets: dict, temperatures=OWN_FIT_TEMPERATURES) -> dict:
    """HR@10 of per-user weights softmax(fit / T) over the clients, T chosen on valid HR@10."""

    def fused(t):
        w = np.exp((fit - fit.max(0)) / t)
        return ((w / w.sum(0))[:, :, None] * z).sum(0)

    best = max(temperatures, key=lambda t: rerank_hits(fused(t), cand, targets["valid"]).sum())
    return {
        **{part: float(rerank_hits(fused(best), cand, tg).mean()) for part, tg in targets.items()},
        "temperature": best,
    }


def group_accuracy(clients, std: Standardiser, pairs: PreferencePairs, extra_for=None) -> list[list[float]]:
    """[K, J]: each client's pairwise accuracy on the pairs of each group present in ``pairs``."""
    extra = extra_for(pairs) if extra_for is not None else None
    z = std(query_clients(clients, pairs.context, np.stack([pairs.chosen, pairs.rejected], 1), extra=extra))
    z = z.numpy()
    return [
        [pairwise_accuracy(z[k, pairs.group == g, 0], z[k, pairs.group == g, 1]) for g in np.unique(pairs.group)]
        for k in range(len(clients))
    ]


def reward_rows(ref: np.ndarray, beta: float, rewards: dict, cand, targets: dict) -> dict:
    """Re-ranking by each reward of ``rewards`` ({name: scores [U, C]}) and by its KL-regularised optimum
    ``ref + R / beta`` (row ``kl_<name>``; ``ref`` the reference's logits over the temperature)."""
    out = {}
    for name, r in rewards.items():
        for row, scores in ((name, r), (f"kl_{name}", ref + r / max(beta, 1e-12))):
            out[row] = {part: float(rerank_hits(scores, cand, t).mean()) for part, t in targets.items()}
    return out


def _trained_rewards(s, cfg: MoRConfig, clients, train, public, test, extra_for, view: str, fedavg: dict):
    """MoR's trained router with its standardiser, and the FedAvg reward (scorer, router, standardiser), as the
    seed's GRPO runs build them."""
    from .method import reward_report
    from .seeds import FEDAVG_REWARD, reward_baselines

    _, router, std = reward_report(clients, public, test, cfg, extra_for=extra_for)
    base = reward_baselines(
        clients, train, public, cfg, item_setting=s if view == "items" else None, **{**FEDAVG_REWARD, **fedavg}
    )
    return router, std, base["fedavg"]


def _fused(router, z: np.ndarray, x, o) -> np.ndarray:
    """A router's mixture of standardised candidate scores z [K, U, C]: [U, C]."""
    import torch

    from .router import fuse

    with torch.no_grad():
        return fuse(router(x, o), torch.as_tensor(z)).numpy()


def headroom_seed(
    s,
    cfg: MoRConfig,
    *,
    test_fraction: float = 0.2,
    negatives: str = "popular",
    view: str = "items",
    fedavg: dict | None = None,
) -> dict:
    """One seed's own-group accuracy matrix and re-ranking bound on the participating clients' users.
    ``fedavg``: the FedAvg reward's ``fedavg_kind`` / ``fedavg_rounds`` / ``fedavg_epochs``."""
    from .seeds import _targets, seed_clients

    if view == "items":  # the router's initial weights, as in a GRPO run's seed
        import torch

        torch.manual_seed(cfg.seed)
    train, public, test, _, clients, extra_for = seed_clients(s, cfg, test_fraction, negatives, view)
    # the public set's standardisation comes with the trained router: one query of the public pairs serves both
    router, std, (scorer, f_router, f_std) = _trained_rewards(
        s, cfg, clients, train, public, test, extra_for, view, fedavg or {}
    )
    inside = (s.groups >= 0) & ~np.isin(s.groups, s.held_out)
    users = np.flatnonzero(inside)
    cand = s.ref.cand[users]
    extra = None
    if view == "items":
        h, w = s.recent.of(users)
        extra = {"query.history": h, "query.history_weight": w, "query.item_ids": cand}
    z = candidate_scores(clients, std, s.x[users], s.feats, cand, extra)
    targets = {p: _targets(s.split, p, inside)[users] for p in ("valid", "test")}
    bound = rerank_bound(z, cand, targets, s.groups[users])
    bound["own_fit"] = own_fit_row(z, own_fit(clients, std, (train, public, test), users, extra_for), cand, targets)
    x, o = s.x[users], s.groups[users]
    rewards = {
        "mor_router": _fused(router, z, x, o),
        "fedavg_reward": _fused(f_router, candidate_scores(scorer, f_std, x, s.feats, cand, extra), x, o),
        "uniform": z.mean(0),
    }
    rows = reward_rows(s.ref.logits[users] / cfg.temperature, cfg.grpo.beta, rewards, cand, targets)
    rows.pop("uniform")  # the bound's own uniform row; only its KL optimum is new
    bound.update(rows)
    ref = s.ref.logits[users]
    bound["reference"] = {p: float(rerank_hits(ref, cand, t).mean()) for p, t in targets.items()}
    return {
        "seed": cfg.seed,
        "clients": [
            {"cid": c.cid, "kind": c.kind, "group": s.names[int(c.train.group[0])], "n_train_pairs": len(c.train)}
            for c in clients
        ],
        "group_accuracy": group_accuracy(clients, std, test, extra_for),
        "groups": [s.names[int(g)] for g in np.unique(test.group)],
        "rerank": bound,
    }
