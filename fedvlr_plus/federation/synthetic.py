"""Synthetic interaction data with learnable structure, for tests and for scale benchmarks.

Users and items fall into ``groups``; a user draws ``share`` of its items from its own group and the rest from the
whole catalogue with Zipf-like popularity. History lengths are geometric-ish around ``mean_items`` (at least
``min_items``). Timestamps increase along each user's draws, and the result is split leave-one-out by time, so
it looks like a real implicit-feedback log to every part of the engine.
"""

from __future__ import annotations

import numpy as np

SYNTHETIC_PREFIX = "synthetic:"


def synthetic_data(
    n_users: int = 200,
    n_items: int = 300,
    mean_items: float = 20.0,
    *,
    groups: int = 10,
    share: float = 0.8,
    min_items: int = 5,
    seed: int = 0,
    name: str | None = None,
):
    from ..datasets import InteractionData
    from ..datasets.splits import leave_one_out

    if n_items < 2 * min_items:
        raise ValueError("n_items must be at least twice min_items")
    g = np.random.default_rng(seed)
    lengths = np.minimum(min_items + g.geometric(1.0 / max(mean_items - min_items + 1, 1.0), n_users) - 1, n_items // 2)
    total = int(lengths.sum())
    user = np.repeat(np.arange(n_users), lengths)
    user_group = g.integers(0, groups, n_users)
    item_group = g.integers(0, groups, n_items)
    pop = 1.0 / np.arange(1, n_items + 1) ** 0.8
    pop = pop[g.permutation(n_items)]
    pop /= pop.sum()
    by_group = [np.flatnonzero(item_group == k) for k in range(groups)]
    own = g.random(total) < share
    items = g.choice(n_items, size=total, p=pop)
    ug = user_group[user]
    for k in range(groups):
        sel = np.flatnonzero(own & (ug == k))
        if len(by_group[k]) and len(sel):
            w = pop[by_group[k]] / pop[by_group[k]].sum()
            items[sel] = g.choice(by_group[k], size=len(sel), p=w)
    ts = np.arange(total, dtype=np.float64)
    # keep the first occurrence of each (user, item): implicit feedback without repeats
    key = user.astype(np.int64) * n_items + items
    _, first = np.unique(key, return_index=True)
    first.sort()
    user, items, ts = user[first], items[first], ts[first]
    data = InteractionData.from_raw(
        name or f"synthetic-{n_users}x{n_items}", user, items, timestamp=ts, item_order=np.arange(n_items)
    )
    # users whose draws collapsed below 3 distinct items stay in train only (leave_one_out convention)
    return leave_one_out(data)


def synthetic_source(source: str, seed: int = 0):
    """The data a ``synthetic:USERSxITEMS`` source names (e.g. ``synthetic:35000x18000``): 30 interactions per
    user on average in 50 groups, split leave-one-out; the same data for ``run`` and ``bench round``."""
    from ..errors import ConfigError

    users, items = source_sizes(
        source[len(SYNTHETIC_PREFIX) :],
        source,
        "a synthetic source is synthetic:USERSxITEMS",
        "e.g. synthetic:35000x18000",
    )
    if users < 1 or items < 10:
        raise ConfigError(f"SOURCE {source!r}", "a synthetic source needs at least 1 user and 10 items")
    return synthetic_data(users, items, 30.0, groups=50, seed=seed, name=f"synthetic-{users}x{items}")


def source_sizes(sizes: str, source: str, form: str, example: str) -> tuple[int, int]:
    """``(users, items)`` of the ``USERSxITEMS`` part of a generated source; a malformed one is one line naming
    ``source``, its ``form`` and an ``example``."""
    from ..errors import ConfigError

    try:
        users, items = (int(x) for x in sizes.lower().split("x"))
    except ValueError:
        raise ConfigError(f"SOURCE {source!r}", form, example) from None
    return users, items
