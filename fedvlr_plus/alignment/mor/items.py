"""MoR over item ids (``--reward-view items``): client rewards that know which items the client's own users take
together, and the queries that carry what they need.

Why: with genre / year / popularity features a reward says little that the reference backbone's top-C does not
already encode, so GRPO cannot gain. What the backbone ranks badly is *sequence*: which item follows the few items
a user took last. Each client counts that among its own users (co-occurrence, or "j then i" within a window) and
keeps the counts private; the server only ever receives scores.

- Context of a query: the user's most recent training items, newest first, weighted 0.5 ** (position / half-life)
  (:class:`RecentItems`), sent with the item ids to score (``query.history``, ``query.history_weight``,
  ``query.item_ids``) beside the feature arrays the feature clients read.
- Client reward (:class:`ItemRewardClient`): r(h, i) = theta . [log(1 + sum_l w_l S_k[h_l, i]), log(1 + n_k(i))]
  with S_k the client's cosine-normalised counts and n_k its item counts; theta by Bradley-Terry on the client's
  pairs, cross-fitted (counts from one half of its users, theta on the other's pairs, both ways, averaged) so the
  positives' own counts do not inflate theta.
- Pairs (:func:`next_item_pairs`): a user's latest training items over sampled items outside the user's
  training items; the pair's history is the user's recent items without the chosen one.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from scipy.optimize import minimize
from scipy.special import log_expit

from ...federation.messages import ClientUpdate
from ..pairs import PreferencePairs, pairwise_accuracy
from .implicit import pairs_from_positives
from .pair_counts import PairTable, item_counts
from .rewards import SCORE_ARRAY

QUERY_KEYS = ("query.history", "query.history_weight", "query.item_ids")


class RecentItems(NamedTuple):
    """Each user's ``length`` most recent training items, newest first (-1 pads) and their recency weights."""

    hist: np.ndarray  # [n_users, L] int64
    weight: np.ndarray  # [n_users, L] float32 (0 on pads)

    def of(self, users, exclude=None) -> tuple[np.ndarray, np.ndarray]:
        """The histories of ``users``; with ``exclude`` [Q] an item per row whose weight is zeroed."""
        h, w = self.hist[users], self.weight[users].copy()
        if exclude is not None:
            w[h == np.asarray(exclude)[:, None]] = 0.0
        return h, w


def training_sequences(split) -> dict:
    """{user: training items in time order (oldest first)}; ties keep the file order."""
    tr = split.inter[split.inter["split"] == 0]
    if "timestamp" in tr.columns:
        tr = tr.sort_values(["user", "timestamp"], kind="stable")
    else:
        tr = tr.sort_values("user", kind="stable")
    return {int(u): df["item"].to_numpy(np.int64) for u, df in tr.groupby("user", sort=True)}


def recent_items(split, *, length: int = 20, half_life: float = 5.0) -> RecentItems:
    hist = np.full((split.n_users, length), -1, np.int64)
    for u, seq in training_sequences(split).items():
        last = seq[::-1][:length]
        hist[u, : len(last)] = last
    weight = np.where(hist >= 0, 0.5 ** (np.arange(length) / half_life)[None, :], 0.0).astype(np.float32)
    return RecentItems(hist, weight)


def reward_features(sim: PairTable, logpop: np.ndarray, hist, weight, item_ids) -> np.ndarray:
    """[log(1 + sum_l w_l sim[h_l, i]), log(1 + n(i))] for histories [Q, L] and items [Q] or [Q, G]."""
    ids = np.asarray(item_ids)
    flat = ids.reshape(len(ids), -1)  # [Q, G]
    h = np.maximum(hist, 0)
    knn = (sim.lookup(h[:, :, None], flat[:, None, :]) * weight[:, :, None]).sum(1)
    return np.stack([np.log1p(knn), logpop[flat]], -1).reshape(*ids.shape, 2)


def fit_theta(phi_chosen: np.ndarray, phi_rejected: np.ndarray, l2: float = 1e-3) -> np.ndarray:
    """Bradley-Terry weights on feature differences (logistic regression without intercept, L-BFGS)."""
    d = (phi_chosen - phi_rejected).astype(np.float64)

    def loss(t):
        m = d @ t
        p = np.exp(log_expit(-m))  # sigma(-m): the gradient's weight
        return -log_expit(m).mean() + l2 * t @ t, -(d * p[:, None]).mean(0) + 2 * l2 * t

    return minimize(loss, np.zeros(d.shape[1]), jac=True, method="L-BFGS-B").x


class ItemRewardClient:
    """A MoR client whose private reward reads item ids: its users' counts (``kind``) and its theta.

    ``fit(shared, config)`` scores the queries' ``query.item_ids`` [Q, G] for the histories ``query.history`` /
    ``query.history_weight`` [Q, L] and uploads only ``{"scores": [Q, G]}``; ``recent`` is how the server attaches
    a history to a pair (a pair's own chosen item left out) when a pair set is scored through :meth:`accuracy`.
    """

    def __init__(
        self,
        cid: int,
        kind: str,
        train: PreferencePairs,
        test: PreferencePairs | None,
        *,
        sequences: dict,
        n_items: int,
        recent: RecentItems,
        seed: int = 0,
    ):
        if not len(train):
            raise ValueError(f"MoR client {cid}: no training pairs")
        self.cid, self.kind, self.train, self.test, self.recent = int(cid), kind, train, test, recent
        users = np.unique(train.user)
        counts, n = item_counts(sequences, users, n_items, kind)
        self.sim, self.logpop = counts.cosine(n), np.log1p(n)
        self.theta = self._cross_fit(sequences, users, n_items, seed)

    def _cross_fit(self, sequences, users, n_items, seed) -> np.ndarray:
        """theta fitted on one half's pairs with the other half's counts, both ways, averaged."""
        rng = np.random.default_rng(seed * 1000 + self.cid)
        half = np.isin(users, rng.choice(users, len(users) // 2, replace=False))
        thetas = []
        for a, b in ((users[half], users[~half]), (users[~half], users[half])):
            counts, n = item_counts(sequences, a, n_items, self.kind)
            pairs = self.train.take(np.flatnonzero(np.isin(self.train.user, b)))
            if not len(pairs):
                continue
            sim, logpop = counts.cosine(n), np.log1p(n)
            h, w = self.recent.of(pairs.user, exclude=pairs.chosen_item)
            thetas.append(
                fit_theta(
                    reward_features(sim, logpop, h, w, pairs.chosen_item),
                    reward_features(sim, logpop, h, w, pairs.rejected_item),
                )
            )
        return np.mean(thetas, 0) if thetas else np.array([1.0, 0.0])

    def score_ids(self, hist, weight, item_ids) -> np.ndarray:
        return reward_features(self.sim, self.logpop, np.asarray(hist), np.asarray(weight), item_ids) @ self.theta

    def fit(self, shared: dict, config: dict) -> ClientUpdate:
        for key in QUERY_KEYS:
            if key not in shared:
                raise ValueError(f"MoR item client {self.cid}: the server did not send {key!r}")
        s = self.score_ids(shared["query.history"], shared["query.history_weight"], shared["query.item_ids"])
        return ClientUpdate(
            cid=self.cid,
            kind="params",
            arrays={SCORE_ARRAY: torch.as_tensor(s, dtype=torch.float32)},
            num_examples=len(self.train),
            metrics={"queries": float(s.size)},
        )

    def accuracy(self, pairs: PreferencePairs) -> float:
        if not len(pairs):
            return float("nan")
        h, w = self.recent.of(pairs.user, exclude=pairs.chosen_item)
        return pairwise_accuracy(self.score_ids(h, w, pairs.chosen_item), self.score_ids(h, w, pairs.rejected_item))


def pair_queries(recent: RecentItems):
    """The ``extra`` arrays of a query of pairs (chosen, rejected) as [N, 2] items: ids and histories."""

    def extra(pairs: PreferencePairs) -> dict:
        h, w = recent.of(pairs.user, exclude=pairs.chosen_item)
        return {
            "query.history": h,
            "query.history_weight": w,
            "query.item_ids": np.stack([pairs.chosen_item, pairs.rejected_item], 1),
        }

    return extra


def next_item_pairs(
    split,
    feats: np.ndarray,
    user_group: np.ndarray,
    group_names,
    *,
    latest: int = 10,
    negatives: str = "popular",
    seed: int = 0,
) -> PreferencePairs:
    """Each grouped user's ``latest`` training items, each over one sampled item outside the user's training items;
    context = mean features of the user's other training items (as :func:`.mor_implicit.interaction_pairs`)."""
    positives = (
        (u, np.unique(seq), seq[::-1][:latest]) for u, seq in training_sequences(split).items() if user_group[u] >= 0
    )
    return pairs_from_positives(
        split,
        feats,
        user_group,
        group_names,
        positives,
        rng=np.random.default_rng(seed),
        negatives=negatives,
        source="next-items",
    )


def make_item_clients(
    train: PreferencePairs,
    test: PreferencePairs,
    kinds,
    *,
    sequences: dict,
    n_items: int,
    recent: RecentItems,
    seed: int,
) -> list[ItemRewardClient]:
    """One item client per client of ``train``, kinds dealt round-robin."""
    return [
        ItemRewardClient(
            k,
            kinds[i % len(kinds)],
            train.of_client(k),
            test.of_client(k),
            sequences=sequences,
            n_items=n_items,
            recent=recent,
            seed=seed,
        )
        for i, k in enumerate(np.unique(train.client))
    ]


def fedavg_item_reward(
    train: PreferencePairs, *, sequences: dict, n_items: int, recent: RecentItems, seed: int
) -> ItemRewardClient:
    """The FedAvg baseline of the item view: one ``cooc`` model whose parameters every client uploads (its raw
    pair counts, item counts and theta); the server sums the counts (the sufficient statistics of the pooled
    model) and averages theta weighted by the clients' numbers of pairs."""
    parts = make_item_clients(train, train, ("cooc",), sequences=sequences, n_items=n_items, recent=recent, seed=seed)
    counts, n = item_counts(sequences, np.unique(train.user), n_items, "cooc")
    pooled = parts[0]
    pooled.cid, pooled.train = 0, train
    pooled.theta = np.average([p.theta for p in parts], axis=0, weights=[len(p.train) for p in parts])
    pooled.sim, pooled.logpop = counts.cosine(n), np.log1p(n)
    return pooled
