"""A round whose uploads are aggregated as they arrive, a chunk of clients at a time.

Where the simulator hands its uploads over chunk by chunk (``fit_chunks``) and the strategy is linear (it needs
only the weighted sums of the uploads, :mod:`.running_sum`), the engine adds each chunk to the sums and drops it:
a round holds the sums and one chunk's uploads, not every client's. The weights are the ones the strategy would
compute from the whole list (``n_u / Σ_v n_v``), known before training because a client's example count is its
number of training positives; a client that reports another count is an error, not a silent reweighting.
The new state equals the all-at-once aggregate up to the order of float additions (chunks come sorted by size,
not in client order). A simulator with ``sums_chunks`` may hand a chunk over as blocks (:mod:`.summed_chunk`)
where nothing changes or inspects single uploads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..strategies.base import check_updates
from .running_sum import RunningSums
from .summed_chunk import SummedChunk, check_summed, may_sum


@dataclass
class StreamedUploads:
    """A round's uploads once added to the sums: what the engine keeps of them (in cohort order)."""

    sums: RunningSums
    num_examples: np.ndarray
    losses: np.ndarray

    def __len__(self) -> int:
        return len(self.num_examples)


def can_stream(sim, strategy) -> bool:
    """Whether the round can be streamed: the simulator offers chunks and the strategy is linear and aggregates
    as :class:`~.strategy.Strategy` does (a subclass with its own ``aggregate`` gets the whole list)."""
    from ..strategies.base import Strategy

    return (
        callable(getattr(sim, "fit_chunks", None))
        and bool(getattr(strategy, "linear", False))
        and type(strategy).aggregate is Strategy.aggregate
    )


def fit_streamed(
    sim, strategy, cids, shared: dict, specs: dict, config: dict, examples: np.ndarray, on_upload=None
) -> StreamedUploads:
    """Train ``cids`` with ``sim.fit_chunks`` and add every chunk to the round's sums as it ends. ``examples``:
    each client's training positives (its ``num_examples``), aligned with ``cids``."""
    cids, examples = np.asarray(cids, dtype=np.int64), np.asarray(examples)
    n = torch.tensor([float(x) for x in examples], dtype=torch.float64)
    weights = n / n.sum()  # exactly ``example_weights`` of the whole round's uploads
    where = {int(c): i for i, c in enumerate(cids.tolist())}
    sums = RunningSums(shared, [k for k in shared if specs[k].item_table])
    losses = np.full(len(cids), np.nan)
    blocks = {"summed": True} if getattr(sim, "sums_chunks", False) and may_sum(config, on_upload) else {}
    for chunk in sim.fit_chunks(cids, shared, config, **blocks):
        if not len(chunk):
            continue
        if isinstance(chunk, SummedChunk):
            check_summed(shared, chunk, strategy.upload)
            idx = [where[int(c)] for c in chunk.cids.tolist()]
            _check_examples(chunk.cids, chunk.num_examples, examples[idx])
            losses[idx] = chunk.losses
            sums.add_summed(chunk, weights[torch.tensor(idx)])
            del chunk  # (else it stays alive while the simulator trains the next chunk)
            continue
        check_updates(shared, chunk, strategy.upload)
        idx = [where[int(u.cid)] for u in chunk]
        _check_examples([u.cid for u in chunk], [u.num_examples for u in chunk], examples[idx])
        for u, i in zip(chunk, idx):
            losses[i] = float(u.metrics.get("loss", 0.0))
            if on_upload is not None:
                on_upload(config["round"], u)
        sums.add(chunk, weights[torch.tensor(idx)])
        del chunk
    if sums.count != len(cids) or np.isnan(losses).any():
        raise RuntimeError(f"the simulator returned {sums.count} uploads for {len(cids)} clients")
    return StreamedUploads(sums=sums, num_examples=np.asarray(examples, dtype=np.float64), losses=losses)


def _check_examples(cids, reported, expected) -> None:
    for cid, got, want in zip(cids, reported, expected):
        if int(got) != int(want):
            raise RuntimeError(f"client {cid} reported {got} examples, expected {want} (its training positives)")
