"""Initial values: the server's shared state and each client's private state.

Shared parameters come from one torch generator seeded with the run's seed. A client's private parameters come
from counter-based draws keyed by (seed, parameter, client, element), so a client gets the same initial head
whether it is created alone, in a batch of thousands, or after a restart.
"""
from __future__ import annotations

import numpy as np
import torch

from ..adapters.base import Backbone, init_shared
from . import rng


def init_shared_state(bb: Backbone, seed: int, dtype=torch.float32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(int(seed))
    return {s.name: init_shared(s, g, dtype) for s in bb.shared_specs()}


def round_start(bb: Backbone, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A client's private state as its local training starts a round: ``per_round`` parameters back at their
    initial value (zeros or ones), everything else as stored."""
    fresh = [s for s in bb.private_specs() if s.per_round]
    if not fresh:
        return state
    out = dict(state)
    for s in fresh:   # ParamSpec guarantees a zeros or ones init
        out[s.name] = torch.full_like(state[s.name], 0.0 if s.init == "zeros" else 1.0)
    return out


def init_private_states(bb: Backbone, cids, seed: int, dtype=torch.float32) -> list[dict[str, torch.Tensor]]:
    """Initial private state of each client in ``cids`` (vectorised over clients)."""
    cids = np.asarray(cids, dtype=np.int64)
    out = [dict() for _ in range(len(cids))]
    for index, spec in enumerate(bb.all_specs()):
        if spec.shared:
            continue
        shape = tuple(spec.shape)
        numel = int(np.prod(shape)) if shape else 1
        if spec.init in ("zeros", "ones"):
            fill = 0.0 if spec.init == "zeros" else 1.0
            for st in out:
                st[spec.name] = torch.full(shape, fill, dtype=dtype)
            continue
        if spec.init not in ("normal", "xavier"):
            raise ValueError(f"parameter {spec.name}: unknown init {spec.init!r}")
        vals = rng.normal(seed, rng.TAG_INIT, index, cids[:, None], np.arange(numel)[None, :]) * spec.init_std()
        block = torch.from_numpy(vals).to(dtype)
        for c, st in enumerate(out):
            st[spec.name] = block[c].reshape(shape).clone()
    return out
