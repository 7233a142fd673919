"""Compiled kernel (numba) for the sparse factor of a chunk's deferred fused-row gradients
(:meth:`.closed_form.MixtureSteps.table_factors`).

The factor is a CSR matrix over the catalogue's rows with one entry per nonzero per-row sum of a client's step. In
torch it is built from a gather of the sums, their nonzero positions, a stable sort by item, a count and three
more gathers: eight passes, most of them over arrays as large as the chunk's touched rows. Here one pass counts
each item's entries and a second writes them, in the order the stable sort gives (step, then entry), so the
matrix is the same entry for entry.

:mod:`.closed_form` imports this module only once a process has built enough factors to repay numba's import,
and keeps its torch path where numba does not import or the sums are not on the CPU. The kernel compiles on first
use and is cached next to this file.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, boundscheck=False)
def factor_csr(delta_rows, real, items, c_n, t_max, n_items):
    """``(crow, col, values)`` of the CSR factor: for every step ``s`` and real touched row ``e`` (flat id
    ``real[e]``, global item ``items[e]``) with ``delta_rows[s, real[e]] != 0``, an entry in row ``items[e]`` at
    column ``s c_n + real[e] // t_max``; within a row, entries in (step, entry) order."""
    s_n, r_n = delta_rows.shape[0], real.shape[0]
    crow = np.zeros(n_items + 1, np.int64)
    for s in range(s_n):
        for e in range(r_n):
            if delta_rows[s, real[e]] != 0:
                crow[items[e] + 1] += 1
    for i in range(n_items):
        crow[i + 1] += crow[i]
    fill = crow[:-1].copy()
    col = np.empty(crow[n_items], np.int64)
    values = np.empty(crow[n_items], delta_rows.dtype)
    for s in range(s_n):
        for e in range(r_n):
            v = delta_rows[s, real[e]]
            if v != 0:
                pos = fill[items[e]]
                col[pos] = s * c_n + real[e] // t_max
                values[pos] = v
                fill[items[e]] = pos + 1
    return crow, col, values
