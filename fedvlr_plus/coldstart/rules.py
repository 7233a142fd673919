"""Server-side rules that give cold items (no training interaction) an ID row from their content.

An ID-only recommender can only rank a cold item by its untrained (random, or negative-sampled) ID row. The
server holds the trained ID table ``D`` and every item's content views, so without any user data it can fill the
cold rows from content:

- ``neighbours``: the mean ID row of the item's ``k`` nearest warm items by content cosine (the FedVLR layer's
  :func:`~fedvlr_plus.fedvlr.cold.content_neighbours`); a kNN "attribute-to-item" estimate.
- ``mapping``: a linear map from content to ID space fitted on the warm items by ridge regression,
  ``W = argmin ||X_w W - D_w||² + λ ||W||²`` (with an unpenalised intercept), applied to the cold items' views.
  This is the linear content-to-embedding mapping of Gantner, Drumond, Freudenthaler, Rendle & Schmidt-Thieme,
  "Learning Attribute-to-Feature Mappings for Cold-Start Recommendations", ICDM 2010; λ is chosen on a held-out
  fifth of the warm items (server-side, still no user data).
- ``both``: the mean of the two estimates.
- ``none``: leave the rows as training left them (the backbone alone).

The rules act on a ``[N, d]`` tensor and only touch the cold rows, so they serve both the backbone's shared item
tables and the FedVLR layer's ID input (``FusionLayer.fused_views(..., cold_rule=rule)``, in place of the
layer's own :class:`~fedvlr_plus.fedvlr.cold.ColdItemRule`).

Under the layer each rule also comes in a ``fused-`` form (:data:`FUSED_RULES`) that acts on the layer's output
instead: the experts' fused views of a cold item become the mean of its warm neighbours' fused views, or the ridge
map from content to fused views. The input form asks the fusion to turn an estimated ID row into an item vector;
the output form estimates the item vector itself, in the space the clients' heads were trained on, exactly as the
rule does for a backbone's own item rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..nn import gather_rows
from .ridge import LAMBDAS, RidgeMap

RULES = ("none", "neighbours", "mapping", "both")
#: prefix of a rule applied to the FedVLR layer's fused views (its output) instead of its ID input
FUSED_PREFIX = "fused-"
#: the rules in their output form, for the FedVLR layer only
FUSED_RULES = tuple(FUSED_PREFIX + r for r in RULES[1:])


def plain_rule(name: str) -> str:
    """The rule ``name`` names without its ``fused-`` prefix (the same estimate, made in the space it is given)."""
    return name[len(FUSED_PREFIX) :] if name.startswith(FUSED_PREFIX) else name


def content_matrix(views: dict[str, np.ndarray]) -> np.ndarray:
    """Views concatenated, each row-normalised and weighted by 1/sqrt(#views) (so rows have unit norm)."""
    if not views:
        raise ValueError("cold-item rules need at least one content view")
    parts = []
    for v in views.values():
        v = np.asarray(v, dtype=np.float64)
        parts.append(v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12) / np.sqrt(len(views)))
    return np.concatenate(parts, axis=1)


@dataclass
class ColdRule:
    """A fitted rule: ``apply(table)`` returns ``table`` with the cold rows replaced (differentiable in the warm
    rows for ``neighbours``; the ridge map is refitted on the detached warm rows at every call)."""

    rule: str  # one of RULES
    cold: np.ndarray  # bool [N]
    content: np.ndarray  # [N, f] (content_matrix)
    neighbours: np.ndarray | None  # [n_cold, k] warm item ids
    lambdas: tuple = LAMBDAS
    seed: int = 0
    last_lambda: float | None = None
    #: applied to the FedVLR layer's fused views (its output), not to its ID input (:data:`FUSED_RULES`)
    on_fused: bool = False
    _ridge: RidgeMap | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def name(self) -> str:
        """The rule as the command line and the reports name it."""
        return FUSED_PREFIX + self.rule if self.on_fused else self.rule

    def mapped(self, table: torch.Tensor) -> torch.Tensor:
        warm = ~self.cold
        y = table.detach().to(torch.float64).reshape(len(table), -1).cpu().numpy()
        if self._ridge is None:  # the content rows never change: their centring and Gram are formed once
            self._ridge = RidgeMap(self.content[warm], self.lambdas, self.seed)
        lam, w, b = self._ridge.fit(y[warm])
        self.last_lambda = lam
        pred = self.content[self.cold] @ w + b
        return torch.as_tensor(pred, dtype=table.dtype).reshape(-1, *table.shape[1:])

    def by_neighbours(self, table: torch.Tensor) -> torch.Tensor:
        return gather_rows(table, torch.as_tensor(self.neighbours, dtype=torch.long)).mean(1)

    def apply(self, table: torch.Tensor) -> torch.Tensor:
        if self.rule == "none" or not self.cold.any():
            return table
        if self.rule == "neighbours":
            rows = self.by_neighbours(table)
        elif self.rule == "mapping":
            rows = self.mapped(table)
        else:
            rows = 0.5 * (self.by_neighbours(table) + self.mapped(table))
        out = table.clone()
        out[torch.as_tensor(np.flatnonzero(self.cold), dtype=torch.long)] = rows
        return out

    __call__ = apply


def make_rule(rule: str, views: dict[str, np.ndarray], cold: np.ndarray, *, k: int = 10, seed: int = 0) -> ColdRule:
    """A :class:`ColdRule` for the boolean ``cold`` mask over items, from the content ``views`` (``rule``: one of
    :data:`RULES` or :data:`FUSED_RULES`)."""
    from ..fedvlr.cold import content_neighbours

    if rule not in RULES + FUSED_RULES:
        raise ValueError(f"cold-item rule must be one of {', '.join(RULES + FUSED_RULES)}, got {rule!r}")
    on_fused, rule = rule in FUSED_RULES, plain_rule(rule)
    cold = np.asarray(cold, dtype=bool)
    if cold.all():
        raise ValueError("every item is cold: nothing to borrow an ID row from")
    nbrs = content_neighbours(views, cold, k) if rule in ("neighbours", "both") else None
    return ColdRule(rule, cold, content_matrix(views), nbrs, seed=seed, on_fused=on_fused)


def apply_to_tables(bb, shared: dict[str, torch.Tensor], rule: ColdRule) -> dict[str, torch.Tensor]:
    """The backbone's shared item tables with their cold rows filled by ``rule`` (other entries unchanged)."""
    out = dict(shared)
    for spec in bb.shared_specs():
        if spec.item_table and spec.name in shared:
            out[spec.name] = rule.apply(shared[spec.name])
    return out
