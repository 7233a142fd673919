"""A chunk of clients' uploads handed over as blocks for the round's running sums, not as one object per client.

A streamed round (:mod:`.upload_stream`) only needs each chunk's weighted sums (:mod:`.running_sum`). Where no
upload is changed on its way (no decoy rows, clipping or noise) and nobody inspects single uploads, a batched
simulator can give a chunk's uploads as what the sums read: an item table's uploaded rows as one block, client
after client in the order the per-client uploads would be added (the sums are then bit for bit those of the
per-client uploads), or two factors whose product is the sum of the chunk's rows, where the simulator can form
them more cheaply than the rows (then equal up to float rounding); a dense array stacked over the chunk's
clients. What is left per
client is its id, example count and loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class SummedChunk:
    """One chunk's uploads as blocks (``C`` clients, ``R`` uploaded rows of a table over all of them)."""

    kind: str  # "params" or "grads", as every ClientUpdate of the chunk would say
    cids: np.ndarray  # [C]
    num_examples: np.ndarray  # [C]
    losses: np.ndarray  # [C]
    # table -> (row ids [R], values [R, width] (the sums may scale them in place), client index [R], real [R]
    # bool: the rows that count, or None for all; the others are added with weight 0, held): ``held`` None
    # where each client's entries are its uploaded rows, once each; else the values may repeat a row (sums of
    # several gradients) and ``held = (row ids [H], client index [H])`` are the rows each client uploads
    row_blocks: dict = field(default_factory=dict)
    # table -> (coef [rows, K] (dense, or sparse CSR), factor [K, width], factor client [K], base [rows, width]
    # or None, row ids [R], client index [R]): client c uploads the rows ``row ids[client index == c]``, and the
    # weighted sum of the uploads is ``coef @ factor`` (factor row k weighed by its client's weight) plus ``base``
    # times the summed weight of the clients uploading each row
    row_factors: dict = field(default_factory=dict)
    dense: dict = field(default_factory=dict)  # dense shared array -> [C, ...]
    # group -> (keys [R], values [R, k] (scaled in place), client index [R], n_keys, readouts): where uploads are
    # linear in per-key vectors of a space smaller than theirs, and the maps back are the same for every client
    # of the round, their weighted sum is read out of ``H = Σ_r w_{client r} e_{keys r} ⊗ values_r [n_keys, k]``
    # once a round: ``readouts[name] = ("rows", P [k, width])`` adds ``H P`` to an item table's sum (its
    # holders are in ``row_factors`` or ``row_blocks``), ``("outer", M [m, b])`` is a dense array's sum,
    # ``H.reshape(m, -1).T M``
    hidden: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.cids)


def may_sum(config: dict, on_upload) -> bool:
    """Whether a round's uploads may reach the sums as blocks: nothing changes or reads single uploads."""
    return (
        on_upload is None
        and not float(config.get("upload_noise", 0.0) or 0.0)
        and not float(config.get("upload_clip", 0.0) or 0.0)
        and not config.get("pad_uploads", 0)
    )


def check_summed(shared: dict[str, torch.Tensor], chunk: SummedChunk, kind: str) -> None:
    """The block form of :func:`~.strategy.check_updates`: the right kind, every shared array once, shapes."""
    if chunk.kind != kind:
        raise ValueError(
            f"clients {chunk.cids[:3].tolist()}... uploaded {chunk.kind!r} but this strategy aggregates {kind!r}"
        )
    held = [*chunk.row_blocks, *chunk.row_factors]
    outer = [name for part in chunk.hidden.values() for name, (kind, _) in part[4].items() if kind == "outer"]
    names = [*held, *chunk.dense, *outer]
    if sorted(names) != sorted(shared):
        raise ValueError(f"a chunk's uploads carry {sorted(names)}, expected the shared arrays {sorted(shared)}")
    for name, (rows, vals, client, real, held) in chunk.row_blocks.items():
        if (
            vals.shape[0] != rows.shape[0]
            or client.shape[0] != rows.shape[0]
            or tuple(vals.shape[1:]) != (int(np.prod(shared[name].shape[1:])),)
            or (real is not None and real.shape[0] != rows.shape[0])
            or (held is not None and held[0].shape != held[1].shape)
        ):
            raise ValueError(f"{name!r}: a chunk's row block of shape {tuple(vals.shape)} for {rows.shape[0]} rows")
    for name, (coef, factor, columns, base, rows, client) in chunk.row_factors.items():
        if (
            coef.shape[0] != shared[name].shape[0]
            or coef.shape[1] != factor.shape[0]
            or factor.shape[1] != int(np.prod(shared[name].shape[1:]))
            or columns.shape[0] != factor.shape[0]
            or rows.shape != client.shape
            or (base is not None and base.shape != shared[name].shape)
        ):
            raise ValueError(f"{name!r}: a chunk's factors of shapes {tuple(coef.shape)} and {tuple(factor.shape)}")
    for group, (keys, vals, client, n_keys, readouts) in chunk.hidden.items():
        if keys.shape[0] != vals.shape[0] or client.shape != keys.shape:
            raise ValueError(f"{group!r}: hidden sums of shape {tuple(vals.shape)} for {keys.shape[0]} keys")
        for name, (kind, m) in readouts.items():
            if kind == "rows":
                bad = name not in held or m.shape != (vals.shape[1], int(np.prod(shared[name].shape[1:])))
                bad = bad or n_keys != shared[name].shape[0]
            else:
                bad = kind != "outer" or (n_keys * vals.shape[1] // m.shape[0]) * m.shape[1] != shared[name].numel()
            if bad:
                raise ValueError(f"{name!r}: a {kind!r} readout of shape {tuple(m.shape)} from {group!r}")
    for name, v in chunk.dense.items():
        if tuple(v.shape) != (len(chunk.cids),) + tuple(shared[name].shape):
            raise ValueError(f"{name!r}: a chunk's stacked uploads of shape {tuple(v.shape)}")
