"""MoR's policy side: the residual recommendation policy over the reference's candidates, the GRPO rounds on the
shared round loop (clients score the sampled items, the server fuses and steps the policy), and its evaluation."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ...federation.rounds import RoundLoop, fit_each, over_the_wire
from ...nn import gather_entries
from ..grpo import grpo_loss, kl_categorical, sample_groups
from .backbone import RANK_BLOCK
from .config import MoRConfig
from .rewards import score_queries, stack_scores
from .router import fuse_scores, fused_reward


class ResidualPolicy(torch.nn.Module):
    """logits(u, c) = ref_logits(u, c) / T + x_u^T W f_c + b . f_c, with W = b = 0 at the start (pi = pi_ref)."""

    def __init__(self, dc: int, d: int, temperature: float = 1.0):
        super().__init__()
        self.W = torch.nn.Parameter(torch.zeros(dc, d))
        self.b = torch.nn.Parameter(torch.zeros(d))
        self.temperature = float(temperature)

    def forward(self, ref_logits, x, cand_feats, ids=None):
        """ref_logits [B, C], x [B, dc], cand_feats [B, C, d] -> [B, C] (``ids`` is read by the item policy)."""
        delta = torch.einsum("bi,ij,bcj->bc", x, self.W, cand_feats) + cand_feats @ self.b
        return ref_logits / self.temperature + delta


class ItemResidualPolicy(ResidualPolicy):
    """The residual policy plus an item-to-item term: logits(u, c) += sum_l w_ul A[h_ul, c] over the user's recent
    items h_u (weights w_u), A = 0 at the start. It lets the policy represent what item rewards know (which
    items follow which); entries A[j, c] move only where GRPO sampled c for a user who took j."""

    def __init__(self, dc: int, d: int, n_items: int, temperature: float = 1.0):
        super().__init__(dc, d, temperature)
        self.A = torch.nn.Parameter(torch.zeros(n_items, n_items))

    def forward(self, ref_logits, x, cand_feats, ids=None):
        """``ids`` = (history [B, L] int, history weights [B, L], candidate ids [B, C])."""
        hist, weight, cand = (torch.as_tensor(a) for a in ids)
        a = gather_entries(self.A, hist.clamp_min(0).long()[:, :, None], cand.long()[:, None, :])  # [B, L, C]
        item_term = (weight.float()[:, :, None] * a).sum(1)
        return super().forward(ref_logits, x, cand_feats) + item_term


class ItemContext(NamedTuple):
    """What the item policy and item clients read per user row: recent items, their weights, candidate ids."""

    hist: np.ndarray
    weight: np.ndarray
    cand: np.ndarray

    def rows(self, users) -> tuple:
        return self.hist[users], self.weight[users], self.cand[users]


def _call(policy, ref, x, f, ctx: ItemContext | None, users):
    """The policy's logits, with the item ids of ``users`` when there is an item context."""
    if ctx is None:
        return policy(ref, x, f)
    return policy(ref, x, f, ids=ctx.rows(users))


def ranking_metrics(
    scores: np.ndarray, target_rank_base: np.ndarray, in_cand: np.ndarray, target_pos: np.ndarray, k: int = 10
) -> dict:
    """HR@k / NDCG@k where each user's target is either candidate ``target_pos`` (ranked by ``scores`` among the
    candidates) or outside the candidate set (then its rank is ``target_rank_base`` >= number of candidates)."""
    ranks = np.where(
        in_cand, (scores > scores[np.arange(len(scores)), np.maximum(target_pos, 0)][:, None]).sum(1), target_rank_base
    )
    hit = ranks < k
    return {
        f"hr@{k}": float(hit.mean()),
        f"ndcg@{k}": float(np.where(hit, 1.0 / np.log2(ranks + 2), 0.0).mean()),
        "n_users": int(len(ranks)),
    }


class _GRPOServer:
    """The server side of MoR's GRPO rounds: each round draws users and item groups from the policy, sends them to
    every client to score, fuses the scores and steps the policy. The policy is the server's own state."""

    def __init__(self, router, std, ref_logits, cand, x, o, feats, cfg: MoRConfig, log, item_context=None):
        torch.manual_seed(cfg.seed)
        self.router, self.std, self.cand, self.o, self.feats, self.cfg, self.log = router, std, cand, o, feats, cfg, log
        self.ctx = item_context
        self.policy = (
            ResidualPolicy(x.shape[1], feats.shape[1], cfg.temperature)
            if item_context is None
            else ItemResidualPolicy(x.shape[1], feats.shape[1], feats.shape[0], cfg.temperature)
        )
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
        fb = torch.as_tensor(self.feats[self.cand[users]], dtype=torch.float32)  # [B, C, d]
        with torch.no_grad():
            logits_old = _call(policy, self.ref_all[users], xb, fb, self.ctx, users)
        actions = sample_groups(logits_old, cfg.grpo.group_size, generator=self.g)  # [B, G]
        items = torch.gather(fb, 1, actions.unsqueeze(-1).expand(-1, -1, fb.shape[-1]))
        self.batch = (users, xb, fb, actions, torch.log_softmax(logits_old, -1).gather(-1, actions), items)
        extra = None
        if self.ctx is not None:
            hist, weight, cand = self.ctx.rows(users)
            extra = {
                "query.history": hist,
                "query.history_weight": weight,
                "query.item_ids": np.take_along_axis(cand, actions.numpy(), 1),
            }
        return score_queries(xb.numpy(), items.numpy(), extra), {"round": r}

    def aggregate(self, r, policy, updates, config):
        """Fuse the clients' scores into rewards and take the GRPO steps on the policy."""
        cfg = self.cfg
        users, xb, fb, actions, logp_old, items = self.batch
        scores = stack_scores(updates, items.shape[:-1], self.log)
        rewards = fuse_scores(self.router, self.std, xb.numpy(), self.o[users], scores)
        ref_b = self.ref_all[users] / cfg.temperature
        for _ in range(cfg.inner_steps):
            logits = _call(policy, self.ref_all[users], xb, fb, self.ctx, users)
            loss, diag = grpo_loss(logits, actions, logp_old, ref_b, rewards, cfg.grpo)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        with torch.no_grad():
            kl = float(kl_categorical(_call(policy, self.ref_all[users], xb, fb, self.ctx, users), ref_b).mean())
        return policy, {"round": r, "reward": float(rewards.mean()), "kl": kl, "clip_fraction": diag["clip_fraction"]}


def run_grpo(
    clients,
    router,
    std,
    *,
    ref_logits: np.ndarray,
    cand: np.ndarray,
    x: np.ndarray,
    o: np.ndarray,
    feats: np.ndarray,
    cfg: MoRConfig,
    log: list | None = None,
    item_context: ItemContext | None = None,
) -> tuple[ResidualPolicy, list[dict]]:
    """GRPO on the residual policy over each user's candidates; returns the policy and per-round diagnostics
    (mean sampled fused reward, exact KL to the reference over the candidates, clip fraction). With
    ``item_context`` (rows aligned with ``ref_logits``) the policy is :class:`ItemResidualPolicy` and every query
    also carries the item ids and histories."""
    server = _GRPOServer(router, std, ref_logits, cand, x, o, feats, cfg, log, item_context)
    loop = RoundLoop(clients, server.aggregate, fit=over_the_wire(fit_each), configure=server.configure)
    return loop.run(server.policy, range(1, cfg.grpo_rounds + 1))


def expected_reward(
    clients, router, std, policy, *, ref_logits, cand, x, o, feats, cfg: MoRConfig, users: np.ndarray
) -> dict:
    """Exact expected fused reward under pi_theta and pi_ref over each user's candidates (all scored)."""
    ref = torch.as_tensor(ref_logits[users], dtype=torch.float32)
    xb = torch.as_tensor(x[users], dtype=torch.float32)
    fb = torch.as_tensor(feats[cand[users]], dtype=torch.float32)
    R = fused_reward(clients, router, std, xb.numpy(), o[users], fb.numpy())
    with torch.no_grad():
        p = torch.softmax(policy(ref, xb, fb), -1)
        q = torch.softmax(ref / cfg.temperature, -1)
        kl = kl_categorical(policy(ref, xb, fb), ref / cfg.temperature)
    return {"policy": float((p * R).sum(-1).mean()), "reference": float((q * R).sum(-1).mean()), "kl": float(kl.mean())}


def reference_ranks(ref_scores: np.ndarray, train_mask: np.ndarray, users: np.ndarray, targets: np.ndarray):
    """Each user's 0-based rank of its target among every item by the reference's scores, training items
    masked; a block of users at a time (a whole masked copy of the table is gigabytes at 20k users)."""
    ranks = np.zeros(len(users), np.int64)
    for a in range(0, len(users), RANK_BLOCK):
        u, t = users[a : a + RANK_BLOCK], targets[a : a + RANK_BLOCK]
        s = np.where(train_mask[u], -np.inf, ref_scores[u])
        ranks[a : a + RANK_BLOCK] = (s > s[np.arange(len(u)), t][:, None]).sum(1)
    return ranks


def _policy_logits(policy, ref_scores, x, feats, item_context, users, cand) -> np.ndarray:
    """The policy's logits over ``cand`` for a block of ``users`` (the candidates' features of every user at once
    are [users, C, d]: 8 GB at 20k users, 100 candidates and 1,028 features)."""
    with torch.no_grad():
        return _call(
            policy,
            torch.as_tensor(ref_scores[users[:, None], cand], dtype=torch.float32),
            torch.as_tensor(x[users], dtype=torch.float32),
            torch.as_tensor(feats[cand], dtype=torch.float32),
            item_context,
            users,
        ).numpy()


def policy_rankings(
    policy,
    *,
    ref_scores: np.ndarray,
    train_mask,
    cand,
    x,
    feats,
    targets: np.ndarray,
    cfg: MoRConfig,
    k: int = 10,
    item_context: ItemContext | None = None,
) -> dict:
    """HR@k / NDCG@k of the reference (full ranking, training items masked) and of the policy (which re-orders
    the reference's top-C candidates; every other item stays below them) on held-out targets."""
    users = np.flatnonzero(targets >= 0)
    t = targets[users]
    ref_rank = reference_ranks(ref_scores, train_mask, users, t)
    c = cand[users]
    in_cand = (c == t[:, None]).any(1)
    pos = np.where(in_cand, (c == t[:, None]).argmax(1), -1)
    logits = (
        np.concatenate(
            [
                _policy_logits(
                    policy, ref_scores, x, feats, item_context, users[a : a + RANK_BLOCK], c[a : a + RANK_BLOCK]
                )
                for a in range(0, len(users), RANK_BLOCK)
            ]
        )
        if len(users)
        else np.zeros((0, c.shape[1]), np.float32)
    )
    # outside the candidates the policy keeps the reference order below all C candidates
    out_rank = np.maximum(ref_rank, c.shape[1])
    pol = ranking_metrics(logits, out_rank, in_cand, pos, k)
    ref_hit = ref_rank < k
    ref = {
        f"hr@{k}": float(ref_hit.mean()),
        f"ndcg@{k}": float(np.where(ref_hit, 1.0 / np.log2(ref_rank + 2), 0.0).mean()),
        "n_users": int(len(t)),
    }
    return {"reference": ref, "grpo": pol, "target_in_candidates": float(in_cand.mean())}
