"""Fixed-size uploads: every item-table upload padded with decoy rows to the same number of rows.

A row-sparse upload names the rows a client touched (its positives and its sampled negatives), and its size
tells how many that was. With ``pad_uploads = K`` every client sends exactly ``K`` rows of every item table (``-1``:
the whole catalogue, a dense upload): its touched rows plus decoys drawn uniformly from the items it did not touch,
as its negatives are drawn from the items it has not interacted with. The rows are sent sorted by id, so a decoy's
position says nothing. A decoy carries "no change": a zero gradient, or the broadcast value of its row. FedAvg and
FedGrad aggregate the same model with or without decoys (a zero change moves nothing); averages over a row's
contributors (sparse-avg, median, trimmed mean) count decoys as contributors of a zero change.

What decoys hide: which rows are real from the row ids and the upload's size. What they do not hide on their own:
values. A decoy's change is exactly zero, a real row's is not, so the server can drop decoys unless the upload is
also noised (``upload_noise``, added after padding, to decoys and real rows alike; see docs/privacy.md).

Decoys are drawn from counter-based streams keyed by (seed, round, client, item), so the batched simulator and the
sequential reference pad a client's upload with the same decoys.
"""

from __future__ import annotations

import numpy as np
import torch

from ...errors import ConfigError
from ..messages import ClientUpdate
from ..simulation import rng

TAG_DECOY = 6


def pad_size(pad: int, n_items: int) -> int:
    """Rows per padded upload: ``pad`` (``-1``: every item), at most the catalogue."""
    return n_items if pad < 0 else min(int(pad), n_items)


def decoy_ids(touched: np.ndarray, n_items: int, size: int, seed: int, round_index: int, cid: int) -> np.ndarray:
    """``size - len(touched)`` item ids outside ``touched``, uniformly without replacement (the items with the
    smallest keyed uniform draws), sorted."""
    need = size - len(touched)
    if need < 0:
        raise ConfigError(
            f"--pad-uploads {size}",
            f"client {cid} touched {len(touched)} item rows in round {round_index}, more than the padded size",
            f"pad to at least {len(touched)} rows, or pad with 'all' (a dense upload)",
        )
    free = np.setdiff1d(np.arange(n_items, dtype=np.int64), touched, assume_unique=False)
    if need == 0 or not len(free):
        return np.zeros(0, dtype=np.int64)
    keys = rng.uniform(int(seed), int(round_index), TAG_DECOY, int(cid), free)
    return np.sort(free[np.argsort(keys, kind="stable")[:need]])


def pad_with_decoys(update: ClientUpdate, shared: dict[str, torch.Tensor], config: dict) -> ClientUpdate:
    """``update`` with every item table padded to ``config['pad_uploads']`` rows (0: unchanged)."""
    pad = int(config.get("pad_uploads", 0) or 0)
    if pad == 0 or not update.rows:
        return update
    arrays, rows = dict(update.arrays), dict(update.rows)
    for name, real in update.rows.items():
        n_items = int(shared[name].shape[0])
        real_np = real.numpy().astype(np.int64)
        extra = decoy_ids(
            real_np,
            n_items,
            pad_size(pad, n_items),
            int(config.get("seed", 0)),
            int(config.get("round", 0)),
            int(update.cid),
        )
        a = update.arrays[name]
        if update.kind == "grads":
            fill = torch.zeros((len(extra),) + tuple(a.shape[1:]), dtype=a.dtype)
        else:
            fill = shared[name].to(a.dtype).index_select(0, torch.from_numpy(extra))
        ids = np.concatenate([real_np, extra])
        order = torch.from_numpy(np.argsort(ids, kind="stable"))
        rows[name] = torch.from_numpy(ids)[order]
        arrays[name] = torch.cat([a, fill]).index_select(0, order)
    return ClientUpdate(
        cid=update.cid,
        kind=update.kind,
        arrays=arrays,
        rows=rows,
        num_examples=update.num_examples,
        metrics=dict(update.metrics),
    )
