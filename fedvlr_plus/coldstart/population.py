"""Where a joining user's private state starts: its own fresh draw, or what the population has learnt.

A user who joins with one interaction has too little data to train a private user vector (and, with the FedVLR
layer, a private router) from a random start. ``population`` starts it from the element-wise mean of the private
states of the clients already trained. In a deployment that mean is one aggregate of the existing clients'
private parameters, computed once (under secure aggregation no single client's state is seen) and sent to
newcomers; nothing about the backbone's shared state changes.

The FedVLR router is the exception to the parameter mean. Every router is a small MLP grown from its own random
first layer, so the mean of their parameters is no router anyone trained: its hidden units average out and its
output is close to uniform. What the population learnt is the mixture its users chose, so the newcomer's router
gets it in function space instead: a zero output layer whose bias is ``T · log`` of the trained users' mean expert
weights, which routes every input to exactly that mean mixture until the newcomer's own data moves it (on lfm2k's
validation joining users this start scored at least as well as the parameter mean at every support size).
"""

from __future__ import annotations

import numpy as np
import torch

from ..federation.state.store import load_block

#: ``population``: the trained clients' mean private state, the router as their mean mixture; ``mean-params``:
#: every parameter averaged, the router's too (the ablation of the router's start); ``items``: conditioned on the
#: user's support items (:mod:`.item_start`); ``auto``: whichever of ``population`` and ``items`` the validation
#: joining users rank better (``experiment.joining_epochs``); ``fresh``: the user's own draw
STARTS = ("population", "mean-params", "items", "auto", "fresh")


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


def population_router(run, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with the FedVLR router replaced by one that outputs the trained users' mean expert weights for
    every input (unchanged for a model without a router)."""
    from ..fedvlr.report import router_report

    if getattr(run.bb, "mode", None) != "fedvlr" or "router.b2" not in state:
        return state
    mean_w = torch.tensor(router_report(run)["mean_weights"], dtype=state["router.b2"].dtype)
    return {
        **state,
        "router.w2": torch.zeros_like(state["router.w2"]),
        "router.b2": run.bb.temperature * torch.log(mean_w.clamp_min(1e-6)),
    }


class PopulationStarts:
    """The starts a trained run offers its joining users, each computed once, when first asked for.

    A new-user study trains joining users from the same trained run many times (every support size, epoch
    count, start and prior weight), and the population's mean state, its mean mixture (a pass of every trained
    user's router) and the per-item means do not change between those trainings. Build one per trained run, after
    its training ended; it does not notice later training."""

    def __init__(self, run):
        self.run = run
        self._state = self._router = self._item_means = None

    @property
    def state(self) -> dict[str, torch.Tensor]:
        """The trained clients' mean private state (``mean-params``)."""
        if self._state is None:
            self._state = population_state(self.run.bb, self.run.store, self.run.eligible)
        return self._state

    @property
    def router(self) -> dict[str, torch.Tensor]:
        """:attr:`state` with the router as the trained users' mean mixture (``population``)."""
        if self._router is None:
            self._router = population_router(self.run, self.state)
        return self._router

    @property
    def item_means(self) -> dict:
        """Each item's users' mean state, for the ``items`` start (:mod:`.item_start`)."""
        if self._item_means is None:
            from .item_start import item_mean_states

            self._item_means = item_mean_states(self.run, self.state)
        return self._item_means
