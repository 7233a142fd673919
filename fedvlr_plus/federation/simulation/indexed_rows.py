"""A step's item rows read by id where they sit in a table, never gathered into a per-example copy.

A batched local step scores every example of every client of a chunk against its client's head and sums the
examples' rows weighted by their loss gradients. Gathering the rows first writes a ``[C, L, width]`` copy that
the two operations then read back; reading the rows in place saves the copy and, for the scores, a batched
product with one column (slow on CPU). The scores come from a numba kernel (:mod:`.row_kernels`) where numba
imports and the table is large and on the CPU, else from the gathered rows and a batched product; the weighted
sums from ``embedding_bag``. Both agree with the gathered form to float rounding.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ...compiled import LazyKernels


class IndexedRows:
    """A step's rows as the rows ``ids [C, L]`` of a table ``[M, >= J d]`` (the broadcast fused views, or a chunk's
    stepped copy of its touched rows), each read as ``J`` blocks of ``d``: the scores by a compiled kernel, the
    weighted sums by ``embedding_bag``; no ``[C, L, J d]`` copy is made (it would be written once and read twice
    a step)."""

    def __init__(self, table: torch.Tensor, ids: torch.Tensor, experts: int, d: int):
        self.table, self.ids, self.experts, self.d = table, ids, experts, d

    def dot(self, h: torch.Tensor) -> torch.Tensor:
        """``<h_c, F_lj>`` -> ``[C, L, J]``."""
        c_n, l_n = self.ids.shape
        big = self.table.numel() >= KERNEL_FROM_FLOATS
        on_cpu = self.table.device.type == "cpu" and self.table.is_contiguous()
        kernels = _row_kernels() if big and on_cpu else None
        if kernels is not None:  # (contiguous inputs: one compiled version per dtype)
            out = torch.empty(c_n, l_n, self.experts, dtype=self.table.dtype)
            kernels.indexed_dot(
                self.table.detach().numpy(),
                self.ids.contiguous().numpy(),
                h.detach().to(self.table.dtype).contiguous().numpy(),
                out.numpy(),
            )
            return out
        # torch: gathered, then an elementwise product for one block (it beats a batched product with one column),
        # else one batched product (a reduction such as vecdot allocates a product as large as the rows, which
        # costs more than it saves inside a run)
        rows = self.table.index_select(0, self.ids.reshape(-1))[:, : self.experts * self.d]
        h = h.to(self.table.dtype)
        if self.experts == 1:
            return (rows.view(c_n, l_n, self.d) * h.unsqueeze(1)).sum(-1, keepdim=True)
        return torch.bmm(rows.reshape(c_n, l_n * self.experts, self.d), h.unsqueeze(-1)).view(c_n, l_n, -1)

    def weighted_sum(self, delta: torch.Tensor) -> torch.Tensor:
        """``Σ_l delta_cl F_l`` -> ``[C, J d]``."""
        out = F.embedding_bag(self.ids, self.table, per_sample_weights=delta.to(self.table.dtype), mode="sum")
        return out[:, : self.experts * self.d]


#: the scores come from the compiled kernel where the table has this many floats (8 MB): it no longer sits in the
#: cache, so reading rows in place saves a pass through memory, and a run with such tables repays numba's import
#: (0.4-0.6 s CPU, once per process), which a small run (KU, ml-100k: tables of 0.3-0.7 M floats) would not
KERNEL_FROM_FLOATS = 1 << 21
_KERNELS = LazyKernels("fedvlr_plus.federation.simulation.row_kernels")


def _row_kernels():
    """The ``row_kernels`` module, or None where numba does not import (the torch path then scores the rows)."""
    return _KERNELS.get()


def prepare_kernels() -> bool:
    """Compile the steps' kernel, or load it from numba's cache, with one tiny call (float32, as a run calls it);
    False where numba is missing (steps then take the torch path). ``bench suite`` calls this before its cases."""
    # the argument types :meth:`IndexedRows.dot` passes (contiguous float32 and int64), without a table large
    # enough to pass its size rule
    return _KERNELS.prepare(
        lambda kernels: kernels.indexed_dot(
            np.zeros((2, 4), np.float32),
            np.zeros((1, 1), np.int64),
            np.zeros((1, 2), np.float32),
            np.empty((1, 1, 2), np.float32),
        )
    )
