"""A joining user's start conditioned on the items it joins with (``--new-user-start items``).

The ``population`` start gives every newcomer the same state: the trained clients' mean. What the population
learnt is richer than one mean: the users who interacted with an item hold user vectors (and routers) that score
that item's neighbourhood well. So each item gets the mean private state of the trained users who interacted with
it, pulled towards the population mean by ``ITEM_PRIOR_USERS`` pseudo-users (an item few users touched says
little), and a newcomer starts from the mean of those item means over its support items: with one interaction it
starts as "the users who liked this item", with none it would start at the population mean.

In a deployment each item's sum is one aggregate of the clients' private states over the items in their histories
(secure aggregation shows the server the per-item sums and counts, never a client's state or history), computed
once and sent to newcomers with the item table; a newcomer combines the rows of its own items locally. The FedVLR
router is handled in function space, as in :mod:`.population`: each item keeps the mean expert weights of its
users, and the newcomer's router outputs the mean of those over its support items.
"""

from __future__ import annotations

import numpy as np
import torch

from ..federation.state.store import load_block

#: the population mean's weight in an item's mean, in users: an item two users touched is mostly the population's
ITEM_PRIOR_USERS = 5.0
#: trained clients whose states are read at once (their rows are added into the per-item sums, then dropped)
_CLIENTS_PER_BLOCK = 2048


def item_mean_states(run, population: dict[str, torch.Tensor], prior_users: float = ITEM_PRIOR_USERS) -> dict:
    """``{name: [n_items, *shape]}``: each item's mean private state over the trained clients who interacted with
    it in training, with ``prior_users`` pseudo-clients at ``population`` (the trained clients' mean state);
    ``"router.weights"`` ``[n_items, J]`` too for a FedVLR model (its users' mean expert weights)."""
    from ..fedvlr.report import user_weights

    names = [n for n in population if not n.startswith("router.")]
    n_items, routed = run.data.n_items, getattr(run.bb, "mode", None) == "fedvlr"
    sums = {n: torch.zeros((n_items,) + tuple(population[n].shape), dtype=torch.float64) for n in names}
    weights, weight_sum, trained = None, None, 0
    counts = torch.zeros(n_items, dtype=torch.float64)
    for a in range(0, len(run.eligible), _CLIENTS_PER_BLOCK):
        cids = run.eligible[a : a + _CLIENTS_PER_BLOCK]
        block = load_block(run.store, cids, names)
        has = np.logical_and.reduce([block[n][1] for n in names]) if names else np.ones(len(cids), bool)
        cids, pos = cids[has], np.flatnonzero(has)
        user_of, items = _histories(run.indptr, run.indices, cids)
        items_t = torch.from_numpy(items)
        for n in names:
            sums[n].index_add_(0, items_t, block[n][0][torch.from_numpy(pos[user_of])].double())
        counts.index_add_(0, items_t, torch.ones(len(items), dtype=torch.float64))
        if routed:
            w = user_weights(run, cids)
            if weights is None:
                weights, weight_sum = torch.zeros(n_items, w.shape[1], dtype=torch.float64), w.sum(0)
            else:
                weight_sum += w.sum(0)
            weights.index_add_(0, items_t, w[torch.from_numpy(user_of)])
        trained += len(cids)
    out = {}
    for n in names:
        shape = (-1,) + (1,) * population[n].dim()
        mean = (sums[n] + prior_users * population[n].double()) / (counts + prior_users).view(shape)
        out[n] = mean.to(population[n].dtype)
    if routed:
        mean_w = weight_sum / max(trained, 1)
        out["router.weights"] = (weights + prior_users * mean_w) / (counts + prior_users).unsqueeze(1)
    return out


def _histories(indptr: np.ndarray, indices: np.ndarray, cids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(position in cids, item)`` of every training interaction of the clients ``cids``."""
    starts, ends = indptr[cids], indptr[cids + 1]
    lengths = ends - starts
    user_of = np.repeat(np.arange(len(cids)), lengths)
    offsets = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return user_of, indices[np.repeat(starts, lengths) + offsets].astype(np.int64)


def item_start_states(
    run,
    population: dict[str, torch.Tensor],
    item_means: dict,
    indptr: np.ndarray,
    indices: np.ndarray,
    users: np.ndarray,
) -> dict[int, dict[str, torch.Tensor]]:
    """Each of ``users``' start: the mean over its support items (``indptr``/``indices``) of the items' mean
    states; the router (FedVLR) outputs the mean of the items' mean expert weights for every input."""
    out = {}
    for u in np.asarray(users, np.int64):
        items = torch.from_numpy(indices[indptr[u] : indptr[u + 1]].astype(np.int64))
        state = dict(population)
        for n, table in item_means.items():
            if n != "router.weights":
                state[n] = table.index_select(0, items).mean(0)
        if "router.weights" in item_means:
            w = item_means["router.weights"].index_select(0, items).mean(0)
            state["router.w2"] = torch.zeros_like(population["router.w2"])
            state["router.b2"] = (run.bb.temperature * torch.log(w.clamp_min(1e-6))).to(population["router.b2"].dtype)
        out[int(u)] = state
    return out
