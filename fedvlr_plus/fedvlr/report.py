"""The router report: how the users' private routers weigh the fusion experts at a run's current state.

It shows whether FedVLR's personalisation (Li et al., AAAI-26, arXiv 2410.08478, Eq. 3) is used at all: a router
that is uniform for everyone, or collapsed onto one expert for everyone, personalises nothing. Mean weights,
across-user spread and entropy; see docs/method.md.
"""

from __future__ import annotations

import numpy as np
import torch

from .router import entropy

# A user's router input is the mean of its padded history's fused views, [users, longest history, J d] floats
# before the mean: over every user at once that is 8 GB on amazon2014-toys (19,412 users, 548 items the longest
# history), so the weights are computed for bounded chunks of users, and their private states loaded per chunk.
_USERS_PER_CHUNK = 256


def router_report(run, users: np.ndarray | None = None) -> dict:
    """Expert weights of every user at the run's current state: mean entropy and across-user spread."""
    bb = run.bb
    if getattr(bb, "mode", None) != "fedvlr":
        return {}
    w = user_weights(run, users if users is not None else run.eligible)
    ent = entropy(w)
    return {
        "experts": list(bb.experts),
        "mean_weights": w.mean(0).tolist(),
        "std_across_users": w.std(0).tolist(),
        "mean_entropy": float(ent.mean()),
        "max_entropy": float(np.log(w.shape[1])),
        "min_entropy": float(ent.min()),
        "n_users": int(len(w)),
    }


def user_weights(run, users) -> torch.Tensor:
    """``[len(users), J]`` expert weights (float64) of these users' routers at the run's current state."""
    users = np.asarray(users, dtype=np.int64)
    round_ctx = run.bb.round_context(run.shared)
    return torch.cat(
        [
            _chunk_weights(run, users[a : a + _USERS_PER_CHUNK], round_ctx)
            for a in range(0, len(users), _USERS_PER_CHUNK)
        ]
    )


def _chunk_weights(run, users: np.ndarray, round_ctx: dict) -> torch.Tensor:
    """``[len(users), J]`` expert weights (float64) of these users' routers (fresh ones drawn as in training)."""
    from ..federation.simulation.batched import history_ctx
    from ..federation.state.initial import stored_or_initial

    # only the routers' parameters, as one block: a read of each user's whole state cost more than a training round
    names = [s.name for s in run.bb.private_specs() if s.name.startswith("router.")]
    p = stored_or_initial(run.bb, run.store, users, names, run.cfg.seed, getattr(run.sim, "dtype", torch.float32))
    ctx = {**history_ctx(run.indptr, run.indices, users), **round_ctx}
    with torch.no_grad():
        return run.bb.weights(p, ctx).double()
