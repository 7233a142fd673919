"""Weighted sums of a round's uploads, added a chunk of clients at a time.

FedAvg, sparse row averaging and FedGrad (with SGD or Adam on the server) depend on the uploads only through
``Σ_u w_u x_u`` per shared array and, for item tables, ``Σ_{u ∋ r} w_u`` per row (``w_u = n_u / Σ_v n_v``). A
simulator that trains its clients in chunks can therefore hand each chunk's uploads to :class:`RunningSums` and
drop them: the round holds the sums (the size of the shared state), not every client's touched rows.

The sums do not depend on how the uploads are cut into chunks, only on their order: an item table's rows are
added with ``index_add_``, one upload after another, whatever the blocks they are buffered in; a dense array is
summed in float64 (one ``tensordot`` per chunk). Uploads a chunk hands over in a smaller space (a chunk's
``hidden`` sums, :class:`~.summed_chunk.SummedChunk`) are summed there over the round and mapped back once, when
the sums are read (:class:`HiddenSums`).
"""

from __future__ import annotations

import torch

#: values buffered per item table before one ``index_add_`` (few calls for small uploads, bounded memory)
BLOCK_FLOATS = 1 << 22


def rows_of(u, name: str, n_rows: int) -> torch.Tensor:
    """Row ids of an upload; an item table sent whole counts as touching every row."""
    r = u.rows.get(name)
    return r.long() if r is not None else torch.arange(n_rows)


class RowSums:
    """``Σ_u w_u x_u[r]`` (in ``dtype``) and ``Σ_{u ∋ r} w_u`` (float64) per row of one item table."""

    def __init__(self, shape, dtype, block_floats: int = BLOCK_FLOATS):
        self.n_rows = int(shape[0])
        self.width = 1
        for s in shape[1:]:
            self.width *= int(s)
        self.dtype = dtype
        self.block_floats = int(block_floats)
        self.num = torch.zeros(self.n_rows, self.width, dtype=dtype)
        self.den = torch.zeros(self.n_rows, dtype=torch.float64)
        self._block, self._size = [], 0
        self.hidden = []  # (HiddenSums, P [k, width]): H P is added to ``num`` when the sums are read

    def add(self, rows: torch.Tensor, vals: torch.Tensor, weight: float) -> None:
        """One upload: its row ids, its values ``[len(rows), ...]`` and its weight."""
        self._block.append((rows, vals.reshape(rows.shape[0], -1), weight))
        self._size += rows.shape[0] * self.width
        if self._size >= self.block_floats:
            self._flush()

    def _flush(self) -> None:
        if not self._block:
            return
        block, self._block, self._size = self._block, [], 0
        rows = torch.cat([r for r, _, _ in block])
        ws = torch.repeat_interleave(
            torch.tensor([w for _, _, w in block], dtype=torch.float64), torch.tensor([r.shape[0] for r, _, _ in block])
        )
        vals = torch.cat([v for _, v, _ in block]).to(self.dtype)  # cat always copies: scaling in place is safe
        self.num.index_add_(0, rows, vals.mul_(ws.to(self.dtype).unsqueeze(1)))
        self.den.index_add_(0, rows, ws)

    def add_block(self, rows: torch.Tensor, vals: torch.Tensor, weights: torch.Tensor, held=None) -> None:
        """Many uploads' rows at once (``vals [len(rows), width]``, scaled here in place; ``weights`` float64, one
        per row): the same additions in the same order as adding the uploads one by one. ``held``: ``(row ids,
        weights)`` of the uploads' rows, once per upload, where ``rows`` may repeat a row of one upload."""
        self._flush()
        self.num.index_add_(0, rows, vals.to(self.dtype).mul_(weights.to(self.dtype).unsqueeze(1)))
        self.den.index_add_(0, *((rows, weights) if held is None else held))

    def add_factors(
        self,
        coef: torch.Tensor,
        factor: torch.Tensor,
        rows: torch.Tensor,
        weights: torch.Tensor,
        base: torch.Tensor | None = None,
    ) -> None:
        """Uploads whose weighted sum is ``coef @ factor`` (weights applied) plus ``base`` times the weights of
        the uploads holding each row, and which touch ``rows`` (``weights``: float64, one per entry of ``rows``)."""
        self._flush()
        if base is not None:
            held = torch.zeros_like(self.den).index_add_(0, rows, weights)
            self.num.addcmul_(held.to(self.dtype).unsqueeze(1), base.reshape(self.num.shape).to(self.dtype))
        self.num.addmm_(coef.to(self.dtype), factor.to(self.dtype))
        self.den.index_add_(0, rows, weights)

    def add_partial(self, rows: torch.Tensor, num: torch.Tensor, den: torch.Tensor, scale: float) -> None:
        """Another party's sums of some uploads on ``rows`` (``num [len(rows), width]``, ``den`` float64), made
        with weights that sum to 1 over its own uploads; ``scale`` (its share of the examples) makes them this
        round's weights."""
        self._flush()
        self.num.index_add_(0, rows, num.reshape(rows.shape[0], -1).to(torch.float64).mul_(scale).to(self.dtype))
        self.den.index_add_(0, rows, den.to(torch.float64) * scale)

    def _settle(self) -> None:
        """Add the hidden sums' rows (each group once, and it takes no more chunks after)."""
        for group, proj in self.hidden:
            self.num.addmm_(group.read().to(self.dtype), proj.to(self.dtype))
        self.hidden = []

    def touched(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(rows, num[rows], den[rows])`` of the rows some upload touched (what a node sends of its sums)."""
        num, den = self.result()
        rows = torch.nonzero(den > 0).flatten()
        return rows, num.index_select(0, rows), den.index_select(0, rows)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(num [rows, width], den [rows])``."""
        self._flush()
        self._settle()
        return self.num, self.den


class DenseSum:
    """``Σ_u w_u x_u`` of one dense array, in float64."""

    def __init__(self, shape=None):
        self.total = None
        self.shape = shape
        self.hidden = []  # (HiddenSums, M [m, b]): H.reshape(m, -1).T M is added to the total when it is read

    def add(self, arrays: list[torch.Tensor], weights: torch.Tensor) -> None:
        self.add_stacked(torch.stack([a.to(torch.float64) for a in arrays]), weights)

    def add_stacked(self, stacked: torch.Tensor, weights: torch.Tensor) -> None:
        """The uploads of many clients stacked ``[C, ...]``."""
        part = torch.tensordot(weights, stacked.to(torch.float64), dims=1)
        self.total = part if self.total is None else self.total + part

    def result(self) -> torch.Tensor:
        for group, right in self.hidden:
            h = group.read()
            part = (h.reshape(right.shape[0], -1).T.to(torch.float64) @ right.to(torch.float64)).reshape(self.shape)
            self.total = part if self.total is None else self.total + part
        self.hidden = []
        return self.total


class HiddenSums:
    """``H = Σ_r w_r e_{key r} ⊗ v_r [n_keys, k]`` of the chunks whose ``readouts`` (the maps back to the uploads'
    space, :class:`~.summed_chunk.SummedChunk`'s ``hidden``) are equal; once read, it takes no more chunks."""

    def __init__(self, n_keys: int, k: int, dtype, readouts: dict):
        self.h = torch.zeros(n_keys, k, dtype=dtype)
        self.readouts = readouts
        self.done = False

    def takes(self, n_keys: int, k: int, readouts: dict) -> bool:
        """Whether a chunk's hidden sums with these readouts may be added here."""
        mine = self.readouts
        return (
            not self.done
            and tuple(self.h.shape) == (n_keys, k)
            and readouts.keys() == mine.keys()
            and all(
                kind == mine[n][0] and m.shape == mine[n][1].shape and torch.equal(m, mine[n][1])
                for n, (kind, m) in readouts.items()
            )
        )

    def add(self, keys: torch.Tensor, vals: torch.Tensor, weights: torch.Tensor) -> None:
        """A chunk's ``vals [R, k]`` (scaled here in place) at ``keys [R]`` with their weights (float64)."""
        self.h.index_add_(0, keys, vals.to(self.h.dtype).mul_(weights.to(self.h.dtype).unsqueeze(1)))

    def read(self) -> torch.Tensor:
        self.done = True
        return self.h


class RunningSums:
    """The weighted sums of every shared array over the uploads added so far (see the module docstring).
    ``tables``: the names of the item tables (uploaded row-wise)."""

    def __init__(self, shared: dict[str, torch.Tensor], tables, block_floats: int = BLOCK_FLOATS):
        tables = set(tables)
        self.shapes = {k: tuple(v.shape) for k, v in shared.items()}
        self.rows = {k: RowSums(v.shape, v.dtype, block_floats) for k, v in shared.items() if k in tables}
        self.dense = {k: DenseSum(tuple(v.shape)) for k, v in shared.items() if k not in tables}
        self.hidden = {}  # group -> its HiddenSums taking chunks now
        self.count = 0

    def add(self, updates: list, weights: torch.Tensor) -> None:
        """``updates`` with their weights (float64, aligned), in the round's order."""
        if not updates:
            return
        w = weights.tolist()
        for name, acc in self.rows.items():
            n_rows = self.shapes[name][0]
            for u, wu in zip(updates, w):
                acc.add(rows_of(u, name, n_rows), u.arrays[name], wu)
        for name, acc in self.dense.items():
            acc.add([u.arrays[name] for u in updates], weights)
        self.count += len(updates)

    def add_summed(self, chunk, weights: torch.Tensor) -> None:
        """A :class:`~.summed_chunk.SummedChunk` with its clients' weights (float64, aligned with its clients)."""
        for name, (rows, vals, client, real, held) in chunk.row_blocks.items():
            w = weights.index_select(0, client)
            held = None if held is None else (held[0], weights.index_select(0, held[1]))
            self.rows[name].add_block(rows, vals, w if real is None else w * real, held)
        for name, (coef, factor, columns, base, rows, client) in chunk.row_factors.items():
            w = weights.index_select(0, columns).to(factor.dtype).unsqueeze(1)
            self.rows[name].add_factors(coef, factor * w, rows, weights.index_select(0, client), base)
        for name, stacked in chunk.dense.items():
            self.dense[name].add_stacked(stacked, weights)
        for group, (keys, vals, client, n_keys, readouts) in chunk.hidden.items():
            self._hidden_group(group, n_keys, vals, readouts).add(keys, vals, weights.index_select(0, client))
        self.count += len(chunk)

    def _hidden_group(self, group: str, n_keys: int, vals: torch.Tensor, readouts: dict) -> HiddenSums:
        """The hidden sums a chunk's ``group`` adds to: the current ones, or new ones (with their readers) where
        the readouts differ or the current ones have been read."""
        current = self.hidden.get(group)
        if current is not None and current.takes(n_keys, vals.shape[1], readouts):
            return current
        new = self.hidden[group] = HiddenSums(n_keys, vals.shape[1], vals.dtype, readouts)
        for name, (kind, m) in readouts.items():
            (self.rows[name] if kind == "rows" else self.dense[name]).hidden.append((new, m))
        return new

    def add_partial(self, rows: dict, dense: dict, scale: float, count: int) -> None:
        """Another party's sums over ``count`` uploads (a Flower node's, :mod:`fedvlr_plus.flower.node_sums`):
        ``rows[name] = (row ids, num, den)`` per item table, ``dense[name]`` per dense array, weighted within that
        party; ``scale`` is its share of the round's examples."""
        if set(rows) != set(self.rows) or set(dense) != set(self.dense):
            raise ValueError(f"partial sums of {sorted({*rows, *dense})}, expected {sorted(self.shapes)}")
        for name, (r, num, den) in rows.items():
            self.rows[name].add_partial(r.long(), num, den, scale)
        for name, total in dense.items():
            acc = self.dense[name]
            part = total.to(torch.float64).reshape(self.shapes[name]) * scale
            acc.total = part if acc.total is None else acc.total + part
        self.count += int(count)

    def row_sums(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rows[name].result()

    def dense_sum(self, name: str) -> torch.Tensor:
        return self.dense[name].result()
