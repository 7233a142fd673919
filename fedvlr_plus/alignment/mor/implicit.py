"""MoR's implicit-feedback signal: each client's preference pairs are its users' own TRAINING interactions, an item a
user interacted with preferred over an item the user did not interact with (Bradley-Terry on implicit feedback, as
BPR, Rendle et al., UAI 2009). That is the signal the policy is judged on (which item a user picks next), where
rating gaps (which of two rated items a user liked more) are not.

Everything here reads the training part of a split only: item popularity, user profiles (the contexts), taste
groups and the pairs. The validation and test interactions are never read, so nothing trained from these can see
them; a sampled negative is any item outside the user's training interactions, exactly what a client that does
not know its future would draw.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ...errors import ConfigError
from ..pairs import PreferencePairs, content_flag_hint, genre_matrix, item_features, shipped_features, user_groups


def training_view(split) -> SimpleNamespace:
    """The training interactions of ``split`` with its item / user frames, in the shape ``user_groups`` reads."""
    inter = split.inter[split.inter["split"] == 0]
    return SimpleNamespace(
        inter=inter,
        items=split.items,
        users=split.users,
        n_users=split.n_users,
        n_items=split.n_items,
        name=getattr(split, "name", "data"),
    )


def train_only_groups(
    split, by: str = "taste", *, k: int = 4, seed: int = 0, item_vectors: np.ndarray | None = None
) -> tuple[np.ndarray, tuple]:
    """User groups (the clients) computed from the training interactions only; with ``item_vectors`` taste groups
    are read from the users' mean item vectors instead of their rating-centred genre profiles."""
    return user_groups(training_view(split), by, k=k, seed=seed, item_vectors=item_vectors)


def setting_features(
    split, *, content: str | None, text: str = "none", cache_dir=None, progress: bool = False
) -> tuple[np.ndarray, np.ndarray | None]:
    """(item features without popularity, the item vectors taste groups read, or None for the genre profiles).

    ``content``: a feature array the dataset ships (e.g. lfm2k's tag-text embeddings), rows scaled to unit
    norm, replaces the genre and year features. Without it the items must have genres: a data set whose items
    have none would give every user the same (zero) taste and every item the same features, so it is refused."""
    if content is not None:
        x = np.asarray(shipped_features(split, content), np.float64)
        x = (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)).astype(np.float32)
        return x, x  # the same vectors: the features copy them (popularity appended), the groups read them
    require_genres(split, content_flag_hint(split))
    return item_features(split, text=text, cache_dir=cache_dir, progress=progress), None


def require_genres(split, hint: str) -> None:
    """Refuse data whose items have no genres: every user would have the same (zero) taste and every item the
    same features."""
    if split.items is None or "categories" not in split.items or not genre_matrix(split.items)[0].shape[1]:
        raise ConfigError(
            getattr(split, "name", "the data"),
            "its items have no genres (empty 'categories'), so "
            "every user would have the same taste and every item the same features",
            hint,
        )


def with_popularity(split, feats: np.ndarray) -> np.ndarray:
    """Item features + the standardised log(1 + number of training interactions): a global count a server gets as
    the sum of the clients' per-item counts, the strongest single cue of which items users pick."""
    tr = split.inter[split.inter["split"] == 0]
    cnt = np.bincount(tr["item"].to_numpy(np.int64), minlength=split.n_items).astype(np.float64)
    pop = np.log1p(cnt)
    pop = (pop - pop.mean()) / max(pop.std(), 1e-9)
    return np.concatenate([feats, pop[:, None].astype(np.float32)], 1).astype(np.float32)


def user_profiles(split, feats: np.ndarray) -> np.ndarray:
    """Each user's context: the mean features of the user's training items [n_users, d] (zeros without any)."""
    tr = split.inter[split.inter["split"] == 0]
    u = tr["user"].to_numpy(np.int64)
    n = int(split.n_users)
    x = np.zeros((n, feats.shape[1]))
    np.add.at(x, u, feats[tr["item"].to_numpy(np.int64)])
    return (x / np.maximum(np.bincount(u, minlength=n), 1)[:, None]).astype(np.float32)


def sample_negatives(
    rng: np.random.Generator, seen: np.ndarray, n_items: int, size: int, weights: np.ndarray | None = None
) -> np.ndarray:
    """``size`` items not in ``seen``, drawn with replacement uniformly or in proportion to ``weights``."""
    pool = np.setdiff1d(np.arange(n_items), seen, assume_unique=False)
    if not len(pool):
        raise ValueError("a user interacted with every item: no negative to sample")
    p = None
    if weights is not None and weights[pool].sum() > 0:
        p = weights[pool] / weights[pool].sum()
    return rng.choice(pool, size=size, replace=True, p=p)


NEGATIVES = ("uniform", "popular")


def negative_weights(split, negatives: str) -> np.ndarray | None:
    """None (uniform) or each item's number of training interactions: popularity-matched negatives, so that a
    reward cannot win on popularity alone (the reference already ranks by it) and has to learn taste."""
    if negatives == "uniform":
        return None
    if negatives == "popular":
        tr = split.inter[split.inter["split"] == 0]
        return np.bincount(tr["item"].to_numpy(np.int64), minlength=split.n_items).astype(np.float64)
    raise ValueError(f"negatives must be one of {NEGATIVES}, got {negatives!r}")


def interaction_pairs(
    split,
    feats: np.ndarray,
    user_group: np.ndarray,
    group_names,
    *,
    max_pairs_per_user: int | None = 40,
    negatives: str = "uniform",
    seed: int = 0,
) -> PreferencePairs:
    """(user, training item, sampled non-interacted item) pairs; the context is the user's profile without the
    pair's own chosen item (no label in the context). One client per group; users with group -1 are dropped."""
    tr = split.inter[split.inter["split"] == 0]
    rng = np.random.default_rng(seed)

    def positives():
        for u, df in tr.groupby("user", sort=True):
            if user_group[u] < 0:
                continue
            items = np.unique(df["item"].to_numpy(np.int64))
            pos = items
            if max_pairs_per_user and len(items) > max_pairs_per_user:
                pos = rng.choice(items, max_pairs_per_user, replace=False)
            yield u, items, pos

    return pairs_from_positives(
        split, feats, user_group, group_names, positives(), rng=rng, negatives=negatives, source="interactions"
    )


def pairs_from_positives(
    split, feats: np.ndarray, user_group: np.ndarray, group_names, positives, *, rng, negatives: str, source: str
) -> PreferencePairs:
    """Pairs from ``positives``, ``(user, its training items, its chosen items)`` per grouped user: each chosen
    item over one item outside the user's training items, drawn from ``rng`` right after that user's positives
    (so a generator that draws the positives from the same ``rng`` keeps one fixed order of draws); the context
    is the mean features of the user's other training items."""
    weights = negative_weights(split, negatives)
    ctx, ch, rj, us = [], [], [], []
    for u, items, pos in positives:
        total = feats[items].sum(0)
        ctx.append((total[None, :] - feats[pos]) / max(len(items) - 1, 1))
        ch.append(pos)
        rj.append(sample_negatives(rng, items, split.n_items, len(pos), weights))
        us.append(np.full(len(pos), u, np.int64))
    if not ctx:
        raise ValueError(f"{getattr(split, 'name', 'data')}: no grouped user has a training interaction")
    user = np.concatenate(us)
    chosen_item, rejected_item = np.concatenate(ch), np.concatenate(rj)
    group = user_group[user].astype(np.int64)
    return PreferencePairs(
        context=np.concatenate(ctx).astype(np.float32),
        chosen=feats[chosen_item],
        rejected=feats[rejected_item],
        client=group.copy(),
        group=group,
        group_names=tuple(group_names),
        user=user,
        chosen_item=chosen_item,
        rejected_item=rejected_item,
        meta={"source": source, "negatives": negatives},
    )
