"""An item-promotion attack by malicious clients: fake users whose uploads push one target item up.

What the attacker knows: the shared state every client receives each round, the aggregation's upload kind
(``config["upload"]``, as every client does), and the ``pool`` most popular items (public popularity, e.g. a
top-sellers chart; here the training counts). It knows nothing about any real user's private state or data.

What each malicious client uploads: it trains honestly, with the ordinary client code, on a fabricated profile
(the target plus items drawn from the popular pool), so its row set, its number of examples and the shape of
every array are those of a benign user. Then, in every item table, it replaces the target row's contribution
by a step of length ``boost × m`` along the direction of the popular items' mean row, where ``m`` is the largest
row step of its own honest upload (the step is ``θ_u[r] − θ[r]`` for a parameter upload, the gradient row for a
gradient upload, whose sign the server's descent flips). Users' heads score popular items high, so moving the
target's row toward that direction raises its score for most users. With ``boost=1`` no uploaded row is longer
than an honest one of the same client.

Reference for the threat model (fake users uploading crafted item rows, popularity as the attacker's side
knowledge): Zhang, Li, Wang, Chen, Sadiq, Yin, "PipAttack: Poisoning Federated Recommender Systems for
Manipulating Item Promotion", WSDM 2022.
"""

from __future__ import annotations

import numpy as np
import torch

from ...adapters.base import Backbone
from ..client import RecClient
from ..messages import ClientUpdate
from ..state.store import MemoryStore

#: seed-stream tags of the attack (kept apart from the engine's own streams)
TAG_TARGET, TAG_PROFILE = 7301, 7302


def choose_target(train_counts: np.ndarray, seed: int, quantile: float = 0.1) -> int:
    """The item to promote: a seeded random choice among the least popular ``quantile`` of the warm items (those
    with at least one training interaction). Reads training counts only, never valid or test."""
    counts = np.asarray(train_counts)
    warm = np.flatnonzero(counts > 0)
    if not len(warm):
        raise ValueError("no item has a training interaction; nothing to promote")
    order = warm[np.argsort(counts[warm], kind="stable")]
    cold_ish = order[: max(1, int(np.ceil(quantile * len(order))))]
    return int(np.random.default_rng([int(seed), TAG_TARGET]).choice(cold_ish))


def popular_pool(train_counts: np.ndarray, size: int, exclude: int) -> np.ndarray:
    """The ``size`` most-interacted items (ties by id), ``exclude`` (the target) left out."""
    counts = np.asarray(train_counts)
    order = np.lexsort((np.arange(len(counts)), -counts))
    return order[order != exclude][:size].astype(np.int64)


def promotion_step(table: torch.Tensor, pool: np.ndarray) -> torch.Tensor:
    """Unit vector of the popular items' mean row: the direction the attacker moves the target's row."""
    mean = table[torch.as_tensor(pool)].reshape(len(pool), -1).to(torch.float64).mean(0)
    norm = float(mean.norm())
    return mean / norm if norm > 0 else mean


class PromotionAttacker:
    """A malicious client on the ordinary client contract (``fit`` / ``evaluate``): an honest
    :class:`~fedvlr_plus.federation.client.RecClient` on a fake profile, its target rows replaced."""

    def __init__(
        self,
        cid: int,
        backbone: Backbone,
        target: int,
        pool: np.ndarray,
        profile_size: int,
        *,
        seed: int = 0,
        boost: float = 1.0,
    ):
        if not boost > 0:
            raise ValueError(f"boost must be positive, got {boost}")
        self.cid, self.bb, self.target = int(cid), backbone, int(target)
        self.pool = np.asarray(pool, dtype=np.int64)
        self.boost = float(boost)
        g = np.random.default_rng([int(seed), TAG_PROFILE, self.cid])
        size = int(min(max(profile_size - 1, 1), len(self.pool)))
        fake = np.union1d(g.choice(self.pool, size=size, replace=False), [self.target])
        self.positives = fake
        # a real client object on the fake profile: its private state stays with the attacker
        self.honest = RecClient(self.cid, backbone, fake, MemoryStore(), seed=seed)

    def fit(self, shared: dict, config: dict) -> ClientUpdate:
        up = self.honest.fit(shared, config)
        specs = {s.name: s for s in self.bb.all_specs()}
        arrays = dict(up.arrays)
        for name, rows in up.rows.items():
            if not specs[name].item_table:
                continue
            arrays[name] = self._craft(name, arrays[name], rows, torch.as_tensor(shared[name]), up.kind)
        return ClientUpdate(
            cid=up.cid,
            kind=up.kind,
            arrays=arrays,
            rows=up.rows,
            num_examples=up.num_examples,
            metrics=dict(up.metrics),
        )

    def _craft(
        self, name: str, values: torch.Tensor, rows: torch.Tensor, table: torch.Tensor, kind: str
    ) -> torch.Tensor:
        """``values`` with the target's row replaced by a benign-sized step along the popular direction."""
        at = torch.nonzero(rows == self.target).flatten()
        if not len(at):
            return values
        flat = values.reshape(len(rows), -1)
        base = table.to(values.dtype).index_select(0, rows).reshape(len(rows), -1)
        steps = flat if kind == "grads" else flat - base
        others = torch.ones(len(rows), dtype=torch.bool)
        others[at] = False
        m = float(steps[others].norm(dim=1).max()) if others.any() else float(steps.norm(dim=1).max())
        step = (self.boost * m * promotion_step(table, self.pool)).to(values.dtype)
        out = flat.clone()
        # descent on a gradient upload moves the row by -g, so the attacker uploads the negated step
        out[at] = -step if kind == "grads" else base[at] + step
        return out.reshape(values.shape)

    def evaluate(self, shared: dict, config: dict) -> dict:
        return {"cid": self.cid, "split": config.get("split", "valid"), "n_targets": 0, "malicious": True}
