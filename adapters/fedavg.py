"""FedAvg backbone: the FedAvg baseline of the FedVLR paper.

Item embedding table shared and averaged by the server; a private affine prediction head per user,
``logit(u, i) = w_u · e_i + b_u``. The head's weight vector plays the role of a user embedding.

References: McMahan, Moore, Ramage, Hampson, Agüera y Arcas, "Communication-Efficient Learning of Deep Networks
from Decentralized Data", AISTATS 2017 (the aggregation rule); Li, Long, Jiang, Zhang, Yang, "Federated
Vision-Language-Recommendation with Personalized Fusion", AAAI-26 (this backbone as their FedAvg baseline).

Unlike the FedVLR code release (docs/method.md, "Departures from the original release"): the head is really
private and restored every round and at evaluation, so users are scored by their own heads; averaging weights sum
to 1, so the item table keeps its scale; the model returns logits and the loss applies the sigmoid once.
"""

from __future__ import annotations

from .base import Backbone, ParamSpec, rowdot, take_rows


class FedAvgMF(Backbone):
    name = "fedavg"
    default_strategy = "fedavg"
    default_lr = 0.5
    default_item_lr_scale = 300.0
    dot_head = ("item_emb", "head_w", "head_b")

    def specs(self):
        n, d = self.n_items, self.dim
        return [
            ParamSpec("item_emb", (n, d), shared=True, item_table=True, init="normal", std=0.1),
            ParamSpec("head_w", (d,), shared=False, init="normal", std=0.1),
            ParamSpec("head_b", (), shared=False, init="zeros"),
        ]

    def item_repr(self, p, items, ctx):
        return take_rows(p["item_emb"], items)

    def head(self, p, vecs, ctx):
        return rowdot(vecs, p["head_w"]) + p["head_b"][..., None]

    def scoring_floats_per_item(self, table_width: int) -> int:
        # every item's logit is one product of the shared table with the users' heads, and no [users, items, d]
        # tensor is formed; a personal copy of the table (PFedRec) is scored per user as the default assumes
        return 2 if not self.personal_copies else super().scoring_floats_per_item(table_width)
