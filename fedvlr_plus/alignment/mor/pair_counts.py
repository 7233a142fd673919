"""The item-pair counts of MoR's item view, kept sparse.

A client's reward reads how often its users took two items together. Held as a dense ``[n_items, n_items]``
table that is 570 MB of float32 per table at 12k items (Amazon 2014 Toys), and a run holds several (each client,
its two cross-fitting halves, the FedAvg baseline's parts), while a client's users touch a few thousand pairs.
:class:`PairTable` keeps only the non-zero cells, as sorted keys ``row * n + col`` and their values, and looks
cells up in one vectorised ``searchsorted``; every value and every lookup is the dense table's, bit for bit.
"""

from __future__ import annotations

import numpy as np

#: what a client counts: ``cooc`` (both items in a user's training items) or ``next`` (the second within a window
#: of interactions after the first)
ITEM_REWARD_KINDS = ("cooc", "next")


#: up to this many items a table is dense (4,096² float32 cells: 64 MB), which is the faster form to fill and read;
#: above it only the non-zero cells are kept (12k items dense would be 570 MB per table)
DENSE_MAX_ITEMS = 4096


class PairTable:
    """A ``[n, n]`` float32 table, either ``dense`` or as the sorted keys ``row * n + col`` of its non-zero cells and
    their ``values``; the two forms hold and return the same numbers."""

    def __init__(self, n: int, keys=None, values=None, dense: np.ndarray | None = None):
        self.n, self.dense = int(n), dense
        self.keys = None if keys is None else np.asarray(keys, np.int64)
        self.values = None if values is None else np.asarray(values, np.float32)

    @classmethod
    def from_pairs(cls, n: int, rows: np.ndarray, cols: np.ndarray) -> PairTable:
        """Sparse: each (row, col) pair counted once per occurrence; the diagonal is dropped."""
        rows, cols = np.asarray(rows, np.int64), np.asarray(cols, np.int64)
        off = rows != cols
        keys, counts = np.unique(rows[off] * n + cols[off], return_counts=True)
        return cls(n, keys, counts.astype(np.float32))

    def lookup(self, rows, cols) -> np.ndarray:
        """The cells ``(rows, cols)`` (broadcast together), zero where the table has none."""
        rows, cols = np.broadcast_arrays(np.asarray(rows, np.int64), np.asarray(cols, np.int64))
        if self.dense is not None:
            return self.dense[rows, cols]
        query = rows * self.n + cols
        if not len(self.keys):
            return np.zeros(query.shape, np.float32)
        at = np.minimum(np.searchsorted(self.keys, query), len(self.keys) - 1)
        return np.where(self.keys[at] == query, self.values[at], np.float32(0.0))

    def cosine(self, n_items: np.ndarray) -> PairTable:
        """``count_ij / sqrt(max(n_i n_j, 1))`` with ``n_items`` the item counts (float32 arithmetic in both forms)."""
        n_items = np.asarray(n_items, np.float32)
        if self.dense is not None:
            return PairTable(self.n, dense=self.dense / np.sqrt(np.maximum(n_items[:, None] * n_items[None, :], 1.0)))
        rows, cols = np.divmod(self.keys, self.n)
        return PairTable(self.n, self.keys, self.values / np.sqrt(np.maximum(n_items[rows] * n_items[cols], 1.0)))

    def toarray(self) -> np.ndarray:
        """The dense table (for small tables and tests)."""
        if self.dense is not None:
            return self.dense
        out = np.zeros(self.n * self.n, np.float32)
        out[self.keys] = self.values
        return out.reshape(self.n, self.n)


def item_counts(
    sequences: dict, users, n_items: int, kind: str, window: int = 5, *, dense_max_items: int = DENSE_MAX_ITEMS
) -> tuple[PairTable, np.ndarray]:
    """Pair counts and item counts ``[n_items]`` (float32) over ``users``' sequences. ``cooc``: both items in the
    user's training items; ``next``: i within the ``window`` interactions after j. Dense up to
    ``dense_max_items`` items, sparse above."""
    if kind not in ITEM_REWARD_KINDS:
        raise ValueError(f"unknown item reward {kind!r} ({', '.join(ITEM_REWARD_KINDS)})")
    n = np.zeros(n_items, np.float32)
    dense = np.zeros((n_items, n_items), np.float32) if n_items <= dense_max_items else None
    rows, cols = [], []
    for u in users:
        seq = sequences.get(int(u))
        if seq is None:
            continue
        items = np.unique(seq)
        n[items] += 1
        if dense is not None and kind == "cooc":
            dense[np.ix_(items, items)] += 1  # distinct items: each pair once, as a block
            continue
        pairs = _user_pairs(seq, items, kind, window)
        if dense is not None:
            np.add.at(dense, pairs, 1)
        else:
            rows.append(pairs[0])
            cols.append(pairs[1])
    if dense is not None:
        np.fill_diagonal(dense, 0)
        return PairTable(n_items, dense=dense), n
    empty = np.zeros(0, np.int64)
    return PairTable.from_pairs(
        n_items, np.concatenate(rows) if rows else empty, np.concatenate(cols) if cols else empty
    ), n


def _user_pairs(seq: np.ndarray, items: np.ndarray, kind: str, window: int) -> tuple[np.ndarray, np.ndarray]:
    """One user's counted (row, col) pairs: every ordered pair of its distinct items (``cooc``), or each item with
    the ones up to ``window`` interactions after it (``next``)."""
    if kind == "cooc":
        return np.repeat(items, len(items)), np.tile(items, len(items))
    lags = range(1, window + 1)
    return (np.concatenate([seq[:-lag] for lag in lags]), np.concatenate([seq[lag:] for lag in lags]))
