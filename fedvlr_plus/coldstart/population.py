"""Where a joining user's private state starts: its own fresh draw, or what the population has learnt.

A user who joins with one interaction has too little data to train a private user vector (and, with the FedVLR
layer, a private router) from a random start. ``population`` starts it from the element-wise mean of the private
states of the clients already trained. In a deployment that mean is one aggregate of the existing clients'
private parameters, computed once (under secure aggregation no single client's state is seen) and sent to
newcomers; nothing about the backbone's shared state changes.
"""
from __future__ import annotations

import numpy as np
import torch

from ..federation.store import load_block

STARTS = ("fresh", "population")


def population_state(bb, store, cids) -> dict[str, torch.Tensor]:
    """The mean private state of the clients ``cids`` held in ``store`` (one tensor per private parameter)."""
    names = [s.name for s in bb.private_specs()]
    block = load_block(store, np.asarray(cids, np.int64), names)
    out = {}
    for name in names:
        vals, has = block[name]
        if vals is None or not has.any():
            raise ValueError(f"no trained client holds the private parameter {name!r}")
        out[name] = vals[torch.from_numpy(has)].mean(0)
    return out


def start_from(store, users, state: dict[str, torch.Tensor]) -> None:
    """Give every one of ``users`` the private ``state`` (committed, so the next round reads it back)."""
    for u in np.asarray(users, np.int64):
        store.save(int(u), state)
    store.commit()
