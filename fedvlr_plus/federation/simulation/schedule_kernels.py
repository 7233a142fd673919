"""Compiled kernels (numba) for a round's schedule: the negatives of every positive example
(:func:`with_negatives`) and the rows a chunk's clients touch (:func:`touched_keys`).

In numpy a negative costs a dozen passes over arrays of the round's size: the key chain's three mixes, the
uniform, the draw's rank among the free items and the repeats and concatenations that lay the examples out. Here
each negative is drawn, placed and written in one pass: the same splitmix64 chain (integers mod 2^64, so the same
bits), the same float product and the same free item (from the client's free items listed once, or by a binary
search over ``P[i] - i`` where it draws few; see :class:`.schedule._Positives`). About 3x faster on ml-100k.

For the touched rows, the schedule needs the sorted distinct (client, item) pairs of a chunk's examples and each
example's rank among them. ``numpy.unique`` sorts the keys by comparison (``O(n log n)``, and memory-bound at
35,598 clients: about 60 ns an example). Both parts of a key are small integers, so two stable counting sorts (by
item, then by client) order them in linear time, and one pass numbers the distinct pairs: the same arrays, about
twice as fast.

:mod:`.schedule` imports this module only once a process has laid out or ranked enough examples to repay numba's
import, and keeps its numpy path where numba does not import. The kernels compile on first use and are cached
next to this file.
"""

from __future__ import annotations

import numba
import numpy as np

from .rng import _GOLDEN, _M2
from .rng_kernels import _INV_2_53, _mix


@numba.njit(inline="always")
def _link(h, key):
    """One link of :func:`.rng.hash64`'s chain: ``mix(h + φ + key · M2)`` mod 2^64."""
    return _mix(h + _GOLDEN + np.uint64(key) * _M2)


@numba.njit(inline="always")
def _free_item(positives, first, count, r):
    """The ``r``-th item (0-based, in id order) outside a client's sorted positives ``positives[first:first +
    count]``: ``r`` plus the number of positives ``P[i]`` with ``P[i] - i <= r``."""
    lo, hi = 0, count
    while lo < hi:
        mid = (lo + hi) // 2
        if positives[first + mid] - mid <= r:
            lo = mid + 1
        else:
            hi = mid
    return r + lo


#: a client's free items are listed once (one pass over the catalogue) where it draws at least the catalogue's
#: size over this many negatives in a round: a listed draw is one load, a binary search some 40 ns
LIST_FREE_ITEMS_RATIO = 32


@numba.njit(cache=True, boundscheck=False)
def with_negatives(prefix, k, n_items, epochs, client, step, slot, item, place, cids, n, positives, offs):
    """The positive examples of ``epochs`` epochs (``client``, ``step``, ``slot``, ``item``, each one's ``place``
    q within its client's epoch; epoch after epoch, each epoch's positives client after client), followed by
    ``k`` negatives after each, as ``schedule._add_negatives`` lays them out: ``(client, step, slot, item,
    label)`` of all examples. The t-th negative of a positive is the draw keyed by (``prefix``: seed, round and
    the negatives' tag; epoch, client id, ``q k + t``) over the client's free items (all but
    ``positives[offs[c]:offs[c] + n[c]]``, sorted)."""
    p_n, c_n = client.shape[0], n.shape[0]
    total = p_n // epochs
    out_client, out_step = np.empty(p_n * (1 + k), np.int64), np.empty(p_n * (1 + k), np.int64)
    out_slot = np.empty(p_n * (1 + k), np.int64)
    out_item, out_label = np.empty(p_n * (1 + k), np.int64), np.zeros(p_n * (1 + k), np.float32)
    out_client[:p_n], out_step[:p_n], out_slot[:p_n], out_item[:p_n] = client, step, slot, item
    out_label[:p_n] = 1.0
    listed = np.empty(n_items, np.int64)
    for c in range(c_n):
        free = n_items - n[c]
        use_list = epochs * n[c] * k * LIST_FREE_ITEMS_RATIO >= n_items
        if use_list:
            _list_free(positives, offs[c], n[c], n_items, listed)
        for e in range(epochs):
            h = _link(_link(prefix, e), cids[c])
            for p in range(e * total + offs[c], e * total + offs[c] + n[c]):
                for t in range(k):
                    u = np.int64(_mix(_link(h, place[p] * k + t) + _GOLDEN) >> np.uint64(11)) * _INV_2_53
                    r = min(np.int64(u * free), free - 1)
                    o = p_n + p * k + t
                    out_client[o], out_step[o], out_slot[o] = c, step[p], slot[p] + 1 + t
                    out_item[o] = listed[r] if use_list else _free_item(positives, offs[c], n[c], r)
    return out_client, out_step, out_slot, out_item, out_label


@numba.njit(inline="always")
def _list_free(positives, first, count, n_items, out):
    """``out[:n_items - count]``: the items outside a client's sorted positives, in id order."""
    f, j = 0, 0
    for i in range(n_items):
        if j < count and positives[first + j] == i:
            j += 1
        else:
            out[f] = i
            f += 1


@numba.njit(cache=True, boundscheck=False)
def _stable_order(key, order, buckets):
    """``order`` reordered stably by ``key[order]`` (every key in ``[0, buckets)``), by counting."""
    start = np.zeros(buckets + 1, np.int64)
    for p in range(order.shape[0]):
        start[key[order[p]] + 1] += 1
    for b in range(buckets):
        start[b + 1] += start[b]
    out = np.empty_like(order)
    for p in range(order.shape[0]):
        k = key[order[p]]
        out[start[k]] = order[p]
        start[k] += 1
    return out


@numba.njit(cache=True, boundscheck=False)
def touched_keys(client, item, c_n, n_items):
    """The sorted distinct keys ``client * n_items + item`` and each example's rank among them (what
    ``numpy.unique(keys, return_inverse=True)`` returns)."""
    n = client.shape[0]
    order = _stable_order(item, np.arange(n), n_items)
    order = _stable_order(client, order, c_n)
    inv = np.empty(n, np.int64)
    ukey = np.empty(n, np.int64)
    u = -1
    prev = -1
    for p in range(n):
        i = order[p]
        key = client[i] * n_items + item[i]
        if key != prev:
            u += 1
            ukey[u] = key
            prev = key
        inv[i] = u
    return ukey[: u + 1], inv
