"""Row-wise order statistics shared by the robust strategies (coordinate median, trimmed mean).

For an item table the statistic of row ``r`` is taken over the clients whose upload contains ``r`` (rows nobody
touched keep their value); for a dense array, over all clients. Work is cut into row chunks of bounded size.
"""

from __future__ import annotations

import torch

from .base import check_updates, gather_rows


def _sorted_groups(rows: torch.Tensor, vals: torch.Tensor):
    """Group uploads by row: unique rows, counts, and values padded with NaN to ``[R, K, D]`` sorted along K."""
    order = torch.argsort(rows, stable=True)
    rows, vals = rows[order], vals[order]
    uniq, counts = torch.unique_consecutive(rows, return_counts=True)
    return uniq, counts, vals


def _reduce_sorted(padded: torch.Tensor, counts: torch.Tensor, trim: float | None) -> torch.Tensor:
    """Median (``trim=None``) or trimmed mean of each group; ``padded`` is sorted with NaN at the end."""
    k = counts.long()
    if trim is None:
        lo, hi = (k - 1) // 2, k // 2
        a = padded.gather(1, lo.view(-1, 1, 1).expand(-1, 1, padded.shape[2])).squeeze(1)
        b = padded.gather(1, hi.view(-1, 1, 1).expand(-1, 1, padded.shape[2])).squeeze(1)
        return (a + b) / 2
    cut = torch.floor(k.to(torch.float64) * trim).long()
    cut = torch.where(k - 2 * cut <= 0, (k - 1) // 2, cut)  # never trim everything away
    lo, hi = cut, k - cut  # keep sorted positions [lo, hi)
    cs = torch.nan_to_num(padded, nan=0.0).cumsum(1)
    cs = torch.cat([torch.zeros_like(cs[:, :1]), cs], dim=1)
    top = cs.gather(1, hi.view(-1, 1, 1).expand(-1, 1, cs.shape[2])).squeeze(1)
    bot = cs.gather(1, lo.view(-1, 1, 1).expand(-1, 1, cs.shape[2])).squeeze(1)
    return (top - bot) / (hi - lo).unsqueeze(1).to(cs.dtype)


def robust_aggregate(shared, updates, specs, *, trim: float | None, chunk_floats: int):
    check_updates(shared, updates, "params")
    out = {}
    for name, g in shared.items():
        flat_g = g.reshape(g.shape[0], -1) if specs[name].item_table else g.reshape(1, -1)
        if specs[name].item_table:
            rows, vals, _ = gather_rows(updates, name, g.shape[0])
        else:
            rows = torch.zeros(len(updates), dtype=torch.long)
            vals = torch.stack([u.arrays[name].reshape(-1) for u in updates])
        uniq, counts, vals = _sorted_groups(rows, vals.to(torch.float64))
        starts = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)[:-1]])
        new = flat_g.to(torch.float64).clone()
        d = vals.shape[1]
        kmax = int(counts.max())
        step = max(1, int(chunk_floats) // max(kmax * d, 1))
        for a in range(0, len(uniq), step):
            cnt = counts[a : a + step]
            st = starts[a : a + step]
            group = torch.repeat_interleave(torch.arange(len(cnt)), cnt)
            pos = torch.arange(int(cnt.sum())) - torch.repeat_interleave(st - st[0], cnt)
            padded = torch.full((len(cnt), int(cnt.max()), d), float("nan"), dtype=torch.float64)
            padded[group, pos] = vals[int(st[0]) : int(st[0]) + int(cnt.sum())]
            padded = padded.sort(dim=1).values  # NaN sorts last
            new[uniq[a : a + step]] = _reduce_sorted(padded, cnt, trim)
        out[name] = new.reshape(g.shape).to(g.dtype)
    return out
