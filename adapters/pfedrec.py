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

from .fedavg import FedAvgMF


class PFedRec(FedAvgMF):
    """FedAvg's shared item table and private affine head, plus the client's own fine-tuned copy of the table."""

    name = "pfedrec"
    personal_copies = {"item_emb": "item_emb_personal"}
