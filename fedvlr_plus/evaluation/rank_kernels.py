"""Compiled kernel (numba) for full-sort evaluation: each target compared with every score of its user's row.

A target's rank among a user's candidates needs two counts, the candidates scored above it and those tied with
it. Sorting the row answers them for any number of targets, but a row sort costs as much as some eighty passes
over the row; a user with one held-out item (leave-one-out) needs one pass. Here each target reads its row once
and counts in registers (the comparisons are exact: no fast-math), then takes back the counts of the row's masked
items (the user's own history, a CSR row), so no masked copy of the scores is ever made.

:mod:`.row_ranks` imports this module only for a batch of scores large enough to repay numba's import, and keeps
the sorting path where numba does not import. The kernel compiles on first use and is cached next to this file.
"""

from __future__ import annotations

import numba


@numba.njit(cache=True, boundscheck=False)
def target_counts(scores, rows, items, mask_ptr, mask_idx, greater, ties, masked):
    """For target ``p`` (row ``rows[p]``, item ``items[p]``, score ``t = scores[rows[p], items[p]]``): ``greater``
    and ``ties``, the unmasked items of its row scored above ``t`` and equal to ``t``; ``masked``: whether the
    target is itself one of its row's masked items (``mask_idx[mask_ptr[r]:mask_ptr[r + 1]]``, free of
    duplicates)."""
    for p in range(rows.shape[0]):
        r, item = rows[p], items[p]
        row = scores[r]
        t = row[item]
        above, equal = 0, 0
        for i in range(row.shape[0]):
            above += row[i] > t
            equal += row[i] == t
        hit = False
        for q in range(mask_ptr[r], mask_ptr[r + 1]):
            v = row[mask_idx[q]]
            above -= v > t
            equal -= v == t
            hit = hit or mask_idx[q] == item
        greater[p], ties[p], masked[p] = above, equal, hit
