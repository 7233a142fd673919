"""Initial values: the server's shared state and each client's private state.

Shared parameters come from one torch generator seeded with the run's seed. A client's private parameters come
from counter-based draws keyed by (seed, parameter, client, element), so a client gets the same initial head
whether it is created alone, in a batch of thousands, or after a restart.
"""

from __future__ import annotations

import numpy as np
import torch

from ...adapters.base import Backbone, init_shared
from ..simulation import rng


def init_shared_state(bb: Backbone, seed: int, dtype=torch.float32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(int(seed))
    return {s.name: init_shared(s, g, dtype) for s in bb.shared_specs()}


def round_start(bb: Backbone, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A client's private state as its local training starts a round: ``per_round`` parameters back at their
    initial value (zeros or ones), everything else as stored (also for a block of clients, ``[C, ...]``)."""
    fresh = [s for s in bb.private_specs() if s.per_round]
    if not fresh:
        return state
    out = dict(state)
    for s in fresh:  # ParamSpec guarantees a zeros or ones init
        out[s.name] = torch.full_like(state[s.name], 0.0 if s.init == "zeros" else 1.0)
    return out


def init_private_block(
    bb: Backbone, cids, seed: int, dtype=torch.float32, *, skip=frozenset()
) -> dict[str, torch.Tensor]:
    """Initial private state of the clients ``cids`` as one tensor per parameter, ``[len(cids), *shape]``, drawn in
    one vectorised call per parameter. Row ``c`` is what client ``cids[c]`` draws alone: the draws are keyed by
    (seed, parameter, client, element), never by position in the batch. Parameters named in ``skip`` are not
    drawn (another source initialises them); the others' draws do not change."""
    cids = np.asarray(cids, dtype=np.int64)
    out = {}
    for index, spec in enumerate(bb.all_specs()):
        if spec.shared or spec.name in skip:
            continue
        shape = tuple(spec.shape)
        if spec.init in ("zeros", "ones"):
            out[spec.name] = torch.full((len(cids),) + shape, 0.0 if spec.init == "zeros" else 1.0, dtype=dtype)
            continue
        if spec.init not in ("normal", "xavier"):
            raise ValueError(f"parameter {spec.name}: unknown init {spec.init!r}")
        numel = int(np.prod(shape)) if shape else 1
        keys = (seed, rng.TAG_INIT, index, cids[:, None], np.arange(numel)[None, :])
        if dtype == torch.float32:  # the same bits as the float64 draw below, rounded, at about 2/3 of its cost
            vals = rng.normal_float32(*keys, scale=spec.init_std())
        else:
            vals = rng.normal(*keys)
            vals *= spec.init_std()
        out[spec.name] = torch.from_numpy(vals).to(dtype).view((len(cids),) + shape)
    return out


def init_private_states(bb: Backbone, cids, seed: int, dtype=torch.float32) -> list[dict[str, torch.Tensor]]:
    """Initial private state of each client in ``cids`` (one dict per client, drawn in one vectorised call)."""
    block = init_private_block(bb, cids, seed, dtype)
    return [{name: v[c].clone() for name, v in block.items()} for c in range(len(np.asarray(cids)))]


def stored_or_initial(bb: Backbone, store, cids, names: list[str], seed: int, dtype=torch.float32) -> dict:
    """The private parameters ``names`` of the clients ``cids`` as one ``[C, ...]`` tensor each, in ``dtype``: the
    stored values, read as one block, and the initial ones (only these parameters drawn, in one call) for clients
    without a stored state. What a batched chunk trains from, and what the router report reads."""
    from .store import load_block

    cids = np.asarray(cids, dtype=np.int64)
    stored = load_block(store, cids, names)
    missing = np.flatnonzero(~np.logical_and.reduce([stored[n][1] for n in names])) if names else []
    others = frozenset(s.name for s in bb.private_specs()) - set(names)
    fresh = init_private_block(bb, cids[missing], seed, dtype, skip=others) if len(missing) else {}
    if len(missing) and len(missing) == len(cids):  # nothing stored (a chunk of round 1): the draw is the block
        return {name: fresh[name] for name in names}
    out = {}
    for name in names:
        vals = stored[name][0]
        if vals is None:
            vals = torch.zeros((len(cids),) + tuple(fresh[name].shape[1:]), dtype=dtype)
        vals = vals.to(dtype)
        if len(missing):
            vals[torch.from_numpy(missing)] = fresh[name]
        out[name] = vals
    return out
