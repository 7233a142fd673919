"""PFedRec: dual personalisation (private score function + personalised item embedding).

Each client has a private score function (an affine map of the item embedding, ``logit = w_u · e_i + b_u``) and
fine-tunes the global item embedding locally every round. The server averages the uploaded item embeddings
(FedAvg). The client keeps its locally fine-tuned table (``item_emb_personal``) and scores with it, which is the
"dual" part: personalisation in both the score function and the item embedding.

Reference: Zhang, Long, Zhou, Zhang, Zhang, Yang, "Dual Personalization on Federated Recommendation", IJCAI 2023.

Unlike the FedVLR code release (docs/method.md, "Departures from the original release"), which loaded neither
the local nor the global state, so every round and every evaluation started from the initialisation, the score
function and the personal table are restored every round and at evaluation. Item rows use a larger learning rate
(``item_lr_scale``), the PFedRec convention; the value is a run option.
"""
from __future__ import annotations

from .base import Backbone, ParamSpec, rowdot, take_rows


class PFedRec(Backbone):
    name = "pfedrec"
    default_strategy = "fedavg"
    default_lr = 0.5
    default_item_lr_scale = 300.0
    dot_head = ("item_emb", "head_w", "head_b")
    personal_copies = {"item_emb": "item_emb_personal"}

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
