"""Compiled kernel (numba) for the rows a chunk's clients touch in a round (:func:`.schedule._touched_keys`).

The schedule needs the sorted distinct (client, item) pairs of a chunk's examples and each example's rank among
them. ``numpy.unique`` sorts the keys by comparison (``O(n log n)``, and memory-bound at 35,598 clients: about
60 ns an example). Both parts of a key are small integers, so two stable counting sorts (by item, then by client)
order them in linear time, and one pass numbers the distinct pairs: the same arrays, about twice as fast.

:mod:`.schedule` imports this module only once a process has ranked enough examples to repay numba's import, and
keeps ``numpy.unique`` where numba does not import. The kernel compiles on first use and is cached next to this
file.
"""

from __future__ import annotations

import numba
import numpy as np


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
