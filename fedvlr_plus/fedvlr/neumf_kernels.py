"""Compiled kernels (numba) for the item side of FedNCF's first layer behind the FedVLR layer
(:class:`.neumf_steps.NeuMFSteps`).

A step mixes each example's per-expert rows ``W_i F^M_ij`` with its client's router weights, and on the way back
reads the same rows again for ``∂J/∂w`` and adds ``w_j ∂J/∂h_1`` to the example's touched row, expert by expert. In
torch that is a gather of the rows into a ``[J, C, L h1]`` copy, a mix, ``J`` dot products, a ``[C L, J h1]``
product and an ``index_add_``: five passes over arrays ``J`` times the size of ``h_1``. Here the forward reads each
row once where it sits in the table, and the backward does the dot products and the row sums in one pass.

The forward sums in torch's order (the first expert's product, then the others added, then the user side), so
``h_1`` is torch's bit for bit. The backward's dot products are reassociated so that the compiler vectorises them,
which changes their last bits against torch's reduction, never the value beyond float rounding; NaN and infinity
propagate as in torch (no "finite math" assumption).

:mod:`.neumf_steps` imports this module for steps on the CPU and keeps its torch path where numba does not
import. The kernels compile on first use and are cached next to this file.
"""

from __future__ import annotations

import numba
import numpy as np

#: reassociation and fused multiply-add, but no assumption that values are finite
_FAST = {"reassoc", "contract", "nsz"}


@numba.njit(cache=True, boundscheck=False)
def mix_item_side(table, items, w, user_side, out):
    """``out[c L + l] = relu(Σ_j w[c, j] table[items[c, l] J + j] + user_side[c])``: the first layer's output of
    every example (``table [N J, h1]``: each item's ``J`` expert rows, one after the other)."""
    c_n, l_n = items.shape
    j_n, h = w.shape[1], table.shape[1]
    for c in range(c_n):
        side = user_side[c]
        for l in range(l_n):
            o = out[c * l_n + l]
            first = items[c, l] * j_n
            row, wj = table[first], w[c, 0]
            for k in range(h):
                o[k] = row[k] * wj
            for j in range(1, j_n):
                row, wj = table[first + j], w[c, j]
                for k in range(h):
                    o[k] += row[k] * wj
            for k in range(h):
                v = o[k] + side[k]
                o[k] = v if not v < 0 else 0  # (NaN passes, as in torch's relu)


@numba.njit(cache=True, fastmath=_FAST, boundscheck=False)
def back_item_side(table, items, w, d1, fidx, g_mix, acc):
    """``g_mix[c, j] = Σ_l <table[items[c, l] J + j], d1[c L + l]>`` (the first layer's part of ``∂J/∂w_j``), and
    ``acc[fidx[c L + l], j h1 : (j + 1) h1] += w[c, j] d1[c L + l]`` (each touched row's sums, expert by expert;
    examples of one row add up in order)."""
    c_n, l_n = items.shape
    j_n, h = w.shape[1], table.shape[1]
    zero = np.zeros(1, g_mix.dtype)[0]  # (a sum started from a product, or run from k = 1, is not vectorised)
    for c in range(c_n):
        for j in range(j_n):
            g_mix[c, j] = zero
        for l in range(l_n):
            e = c * l_n + l
            grad, dst, first = d1[e], acc[fidx[e]], items[c, l] * j_n
            for j in range(j_n):
                row, wj, s = table[first + j], w[c, j], zero
                for k in range(h):
                    s += row[k] * grad[k]
                    dst[j * h + k] += wj * grad[k]
                g_mix[c, j] += s
