"""Compiled kernel (numba) for a step's per-example scores ``<h_c, V_{i, j}>`` read straight from a table.

A batched local step (:mod:`.indexed_rows`) scores every example of every client of a chunk against its client's
head, one score per block of the example's row (the FedVLR layer's experts; one block for a plain item table).
In torch that is a gather of the rows (``[C, L, width]``, written once and read back) and a batched reduction;
here each row is read once from the table, where it sits, and reduced in registers. The sums are reassociated (so
that the compiler vectorises them), which changes the last bits against torch's reduction, never the value beyond
float rounding; NaN and infinity propagate as in torch (no "finite math" assumption), so a diverged step is still
seen as one.

:mod:`.indexed_rows` imports this module only for a step that reads the rows of a large table by id on the CPU
(``KERNEL_FROM_FLOATS``), and keeps its torch path where numba does not import. The kernel compiles on first use
and is cached next to this file.
"""

from __future__ import annotations

import numba
import numpy as np

#: reassociation and fused multiply-add, but no assumption that values are finite
_FAST = {"reassoc", "contract", "nsz"}


@numba.njit(cache=True, fastmath=_FAST, boundscheck=False)
def indexed_dot(table, items, h, out):
    """``out[c, l, j] = <h[c], table[items[c, l], j d : (j + 1) d]>`` for the ``J = out.shape[2]`` blocks of
    ``d = h.shape[1]`` columns at the start of each row (wider tables keep their other columns unread)."""
    c_n, l_n = items.shape
    j_n, d = out.shape[2], h.shape[1]
    zero = np.zeros(1, out.dtype)[0]  # (a sum started from a product, or run from k = 1, is not vectorised)
    for c in range(c_n):
        hc = h[c]
        for l in range(l_n):
            row = table[items[c, l]]
            for j in range(j_n):
                acc = zero
                for k in range(d):
                    acc += row[j * d + k] * hc[k]
                out[c, l, j] = acc
