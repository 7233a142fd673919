"""FCF: federated collaborative filtering (matrix factorisation with private user factors).

The item factor matrix ``Y`` is shared; each user's factor ``x_u`` stays on the device; ``logit = x_u · y_i``.
The server updates ``Y`` from aggregated client gradients (``Y <- Y - γ Σ_u ∇_Y J_u``), so the default strategy is
gradient aggregation with a server SGD step (``fedgrad``). During local epochs only ``x_u`` is stepped; the
gradient of ``Y`` is accumulated over all local steps and uploaded.

Reference: Ammad-ud-din, Ivannikova, Khan, Oyomno, Fu, Tan, Flanagan, "Federated Collaborative Filtering for
Privacy-Preserving Personalized Recommendation System", arXiv:1901.09888, 2019.

Deviation, stated: the paper fits ``x_u`` in closed form (ALS) on a confidence-weighted squared loss over all
items; here, as in the FedVLR comparison, ``x_u`` takes SGD steps on BCE with sampled negatives so that every
backbone shares one training protocol. Unlike the FedVLR code release (docs/method.md, "Departures from the
original release"): ``x_u`` is restored every round, so each user keeps its own factor; gradients are accumulated
over all local steps (not the last mini-batch's only) and the server step is plain SGD by default, as in FCF.
"""

from __future__ import annotations

from .base import Backbone, ParamSpec, rowdot, take_rows


class FCF(Backbone):
    name = "fcf"
    default_strategy = "fedgrad"
    default_lr = 0.5
    default_item_lr_scale = 1.0
    # FCF's update is Y <- Y - γ Σ_u ∇_Y J_u, a sum over clients: on the averaged gradient that is the client lr
    # times the clients per round (the engine's rule for None). Y is FCF's only shared part and each row is touched
    # by few clients, so the sum rule stays stable here
    default_server_lr = None
    dot_head = ("item_emb", "user_emb", None)

    def specs(self):
        n, d = self.n_items, self.dim
        return [
            ParamSpec("item_emb", (n, d), shared=True, item_table=True, init="normal", std=0.1),
            ParamSpec("user_emb", (d,), shared=False, init="normal", std=0.1),
        ]

    def item_repr(self, p, items, ctx):
        return take_rows(p["item_emb"], items)

    def head(self, p, vecs, ctx):
        return rowdot(vecs, p["user_emb"])

    def scoring_floats_per_item(self, table_width: int) -> int:
        return 2  # every item's logit is one product of the shared table with the users' factors
