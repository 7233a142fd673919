"""FedRAP: federated recommendation with additive personalisation.

A user's item table is the sum of a private table ``A_u`` and a shared table ``C``:
``logit(u, i) = w_u · (A_u[i] + C[i]) + b_u``. ``C`` is averaged by the server; ``A_u``, ``w_u`` and ``b_u`` never
leave the device. The local loss adds two curriculum-weighted terms to BCE:

``J_u = BCE − λ_t · mean_i ||A_u[i] − C[i]||² / d + μ_t · mean_i |C[i]|_1 / d``, with
``λ_t = tanh(t / 10) · λ_0`` and ``μ_t = tanh(t / 10) · μ_0``.

The first term pushes the personal part away from the global one (they should carry different information), the
second keeps ``C`` sparse. ``t`` is the 1-based round index (round 1 uses ``tanh(0.1)``); the weights are computed
from the stored base values every round, never compounded.

Reference: Li, Long, Zhou, Wang, Zhang, Yang, "Federated Recommendation with Additive Personalization",
ICLR 2024 (arXiv:2301.09109).

Unlike the FedVLR code release (docs/method.md, "Departures from the original release"): ``A_u`` and the
head are restored every round and at evaluation, so personalisation survives between rounds; the curriculum is
recomputed from the base values, so it does not compound and is never zero. Stated choices: the two
penalties are averaged over the items of each mini-batch (the rows the step touches) instead of whole tables, so
that rows a client never sees stay untouched; ``A_u`` starts at zero, so an untrained client scores with ``C``;
``A_u`` learns at the plain client learning rate while ``C`` uses the item-row multiplier (``item_lr_scale``):
``A_u`` is never averaged, and at the row rate it memorised every sampled negative and the local loss diverged
(ML-100K validation; ``personal_row_lr=True`` restores the row rate). Defaults λ_0 = 1e-4, μ_0 = 1e-2 follow
the FedVLR configuration.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .base import Backbone, ParamSpec, rowdot, take_rows
from .chunk_steps import runs_forward_of


@dataclass(frozen=True)
class FedRAPOptions:
    """FedRAP's own penalties, the base weights λ_0 (the gap between ``A_u`` and ``C``) and μ_0 (the sparsity of
    ``C``). The field names are the constructor's keywords, the command line's ``--fedrap-lambda`` /
    ``--fedrap-mu`` and the keys a run folder records them under."""

    fedrap_lambda: float = 1e-4
    fedrap_mu: float = 1e-2

    def __post_init__(self):
        if not (self.fedrap_lambda >= 0 and self.fedrap_mu >= 0):
            raise ValueError("FedRAPOptions: fedrap_lambda and fedrap_mu must be >= 0")


class FedRAP(Backbone):
    name = "fedrap"
    default_strategy = "fedavg"
    default_lr = 0.5
    default_item_lr_scale = 300.0
    additive_item_tables = ("item_personal",)
    options_type = FedRAPOptions

    def __init__(
        self,
        n_items,
        dim=64,
        *,
        fedrap_lambda: float = FedRAPOptions.fedrap_lambda,
        fedrap_mu: float = FedRAPOptions.fedrap_mu,
        personal_row_lr: bool = False,
        **options,
    ):
        super().__init__(n_items, dim, **options)
        self.penalties = FedRAPOptions(float(fedrap_lambda), float(fedrap_mu))
        self.lam0 = self.penalties.fedrap_lambda
        self.mu0 = self.penalties.fedrap_mu
        self.personal_row_lr = bool(personal_row_lr)

    def option_values(self) -> dict:
        return asdict(self.penalties)

    def specs(self):
        n, d = self.n_items, self.dim
        return [
            ParamSpec("item_common", (n, d), shared=True, item_table=True, init="normal", std=0.1),
            ParamSpec(
                "item_personal", (n, d), shared=False, item_table=True, init="zeros", row_lr=self.personal_row_lr
            ),
            ParamSpec("head_w", (d,), shared=False, init="normal", std=0.1),
            ParamSpec("head_b", (), shared=False, init="zeros"),
        ]

    def item_repr(self, p, items, ctx):
        return take_rows(p["item_personal"], items) + take_rows(p["item_common"], items)

    def shared_item_repr(self, p, items, ctx):
        return take_rows(p["item_common"], items)

    def head(self, p, vecs, ctx):
        return rowdot(vecs, p["head_w"]) + p["head_b"][..., None]

    def curriculum(self, round_index: int) -> tuple[float, float]:
        w = math.tanh(max(int(round_index), 1) / 10.0)
        return w * self.lam0, w * self.mu0

    def step_kernel(self):
        """The closed form of a batched chunk's local steps (:mod:`.fedrap_steps`), where this class's own forward
        and penalty are the ones trained; None for a subclass that changes them (autograd trains it)."""
        forward = ("head", "item_repr", "regulariser", "split_regulariser", "specs", "curriculum")
        if self.uses_history or not runs_forward_of(self, FedRAP, forward):
            return None
        from .fedrap_steps import FedRAPKernel

        return FedRAPKernel(self.curriculum)

    def regulariser(self, p, items, mask, config, ctx=None):
        return self.split_regulariser(
            take_rows(p["item_common"], items), {"item_personal": take_rows(p["item_personal"], items)}, mask, config
        )

    def split_regulariser(self, shared_vecs, personal, mask, config):
        lam, mu = self.curriculum(int(config.get("round", 1)))
        if lam == 0.0 and mu == 0.0:
            return 0.0
        a, c = personal["item_personal"], shared_vecs
        m = mask.to(a.dtype)
        n = m.sum(-1).clamp(min=1.0)
        diff = ((a - c) ** 2).mean(-1)  # [..., L]
        l1 = c.abs().mean(-1)
        return (-lam * (diff * m).sum(-1) + mu * (l1 * m).sum(-1)) / n
