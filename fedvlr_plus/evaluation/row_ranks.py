"""Full-sort rank counts by comparing each target with its own row of scores, where that beats sorting the rows.

:func:`~.metrics.masked_rank_counts` sorts every row of scores once and locates each target by binary search: its
cost is a sort per user whatever the number of targets. With a few targets per user (leave-one-out holds out
one) reading the row once per target is far cheaper: on one CPU thread a 512 x 18,357 batch takes about 2 ms
this way against 200 ms for the sort. Both give the same integer counts, so every metric is the same bit for bit.

The comparison runs in a compiled kernel (:mod:`.rank_kernels`) for large float32/float64 batches on the CPU with
few targets per row; anything else (a small batch, which would not repay numba's import, other dtypes, scores on
an accelerator, many targets per user, or no numba) keeps the sorting path.
"""

from __future__ import annotations

import numpy as np
import torch

from ..compiled import LazyKernels
from .metrics import rank_counts

#: compare instead of sorting while a batch has at most this many targets per user on average: a row sort costs
#: about as much as 80 comparison passes over the row (one thread, 18k items), so this keeps a wide margin
COMPARE_UP_TO_TARGETS = 32
#: the kernel serves evaluations of at least this many scores (8 MB of float32): below it sorting them takes a few
#: milliseconds, and a small run's evaluation would not repay numba's import (0.4-0.6 s CPU once per process)
KERNEL_FROM_SCORES = 1 << 21
_KERNELS = LazyKernels("fedvlr_plus.evaluation.rank_kernels")


def compared_rank_counts(
    scores: torch.Tensor, mask_rows, pair_rows: np.ndarray, pair_items: np.ndarray, *, total_scores: int | None = None
):
    """``(greater, ties, n_candidates)`` as :func:`~.metrics.masked_rank_counts` gives them, counted by comparison,
    or None where this path does not apply (the caller then sorts).

    ``scores``: ``[B, n]`` without NaN; ``mask_rows``: the B users' masked items as a scipy CSR matrix ``[B, n]``
    (None: nothing masked); ``pair_rows`` / ``pair_items``: each target's row and item; ``total_scores``: the
    whole evaluation's users x items (default: this batch's), which decides whether the kernel is worth loading."""
    b_n, n = scores.shape
    usable = (
        scores.device.type == "cpu"
        and scores.dtype in (torch.float32, torch.float64)
        and scores.is_contiguous()
        and not scores.requires_grad
    )
    few = len(pair_rows) <= COMPARE_UP_TO_TARGETS * max(b_n, 1)
    large = (scores.numel() if total_scores is None else total_scores) >= KERNEL_FROM_SCORES
    if not (usable and few and large):
        return None
    kernels = _KERNELS.get()
    if kernels is None:
        return None
    mask_ptr, mask_idx = _csr_rows(mask_rows, b_n)
    p_n = len(pair_rows)
    greater, ties = np.empty(p_n, np.int64), np.empty(p_n, np.int64)
    masked = np.empty(p_n, np.bool_)
    kernels.target_counts(
        scores.numpy(),
        np.ascontiguousarray(pair_rows, dtype=np.int64),
        np.ascontiguousarray(pair_items, dtype=np.int64),
        mask_ptr,
        mask_idx,
        greater,
        ties,
        masked,
    )
    ties[masked] = 0  # a masked target is a miss (as the sorting path scores it)
    return greater, ties, n - np.diff(mask_ptr)


#: without the kernel, compare in torch while a batch has at most this many targets per user on average: each
#: target reads its user's row once (ml-100k leave-one-out: 2 ms a validation instead of 20 ms of row sorts)
TENSOR_COMPARE_UP_TO = 4


def tensor_rank_counts(scores: torch.Tensor, masked: torch.Tensor, pair_rows, pair_items):
    """``(greater, ties, n_candidates)`` as :func:`~.metrics.masked_rank_counts` gives them, by comparing each target
    with its own row (``masked``: ``[B, n]`` bool, True = not a candidate) through :func:`~.metrics.rank_counts`:
    masked items are NaN there, so they fail every comparison; a masked target is a miss (``ties = 0``)."""
    dev = scores.device
    rows = torch.as_tensor(np.asarray(pair_rows, dtype=np.int64), device=dev)
    items = torch.as_tensor(np.asarray(pair_items, dtype=np.int64), device=dev)
    greater, ties = rank_counts(scores[rows, items], scores.masked_fill(masked, float("nan")).index_select(0, rows))
    ties[masked[rows, items].cpu().numpy()] = 0
    n_candidates = (scores.shape[1] - masked.sum(dim=1)).cpu().numpy().astype(np.int64)
    return greater, ties, n_candidates


def _csr_rows(mask_rows, b_n: int) -> tuple[np.ndarray, np.ndarray]:
    """The mask's row pointers and column indices as int64, each row free of duplicates (an empty mask: no rows)."""
    if mask_rows is None:
        return np.zeros(b_n + 1, np.int64), np.zeros(0, np.int64)
    if not mask_rows.has_canonical_format:
        mask_rows = mask_rows.copy()
        mask_rows.sum_duplicates()
    return mask_rows.indptr.astype(np.int64), mask_rows.indices.astype(np.int64)


def prepare_kernels() -> bool:
    """Compile the evaluation's kernel, or load it from numba's cache, with one tiny call (float32 scores, as a run
    passes them); False where numba is missing (evaluation then sorts). ``bench suite`` calls this before its cases."""
    one = np.zeros(1, np.int64)
    return _KERNELS.prepare(
        lambda kernels: kernels.target_counts(
            np.zeros((1, 2), np.float32),
            one,
            one,
            np.zeros(2, np.int64),
            np.zeros(0, np.int64),
            np.empty(1, np.int64),
            np.empty(1, np.int64),
            np.empty(1, np.bool_),
        )
    )
