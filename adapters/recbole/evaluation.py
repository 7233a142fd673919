"""RecBole's side of the evaluation: the same masked scores ranked by RecBole's own evaluator, and a wrapped model
trained centrally by RecBole's ``Trainer`` (the non-federated reference) with its scorer."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from .models import recbole_workdir

if TYPE_CHECKING:
    from .backbone import RecBoleBackbone

RB_METRIC = {"hr": "hit", "ndcg": "ndcg", "recall": "recall", "mrr": "mrr"}
CACHE_ATTRIBUTES = ("restore_user_e", "restore_item_e")


def recbole_evaluate(
    data,
    scorer,
    *,
    split: str = "test",
    ks=(10,),
    metrics=("hr", "ndcg"),
    mask_history: str = "train",
    batch_size: int = 512,
) -> dict:
    """RecBole's own evaluator (``Collector`` + metric classes) on full-sort scores from ``scorer``.

    The history is masked with -inf before RecBole's top-k exactly as our evaluator masks it
    (``mask_history``: ``train``, or ``all`` = train + valid at test, RecBole's native behaviour).
    Returns ``{"hr@10": ..., "ndcg@10": ...}`` with our metric names.
    """
    from fedvlr_plus._compat import patch_recbole

    patch_recbole()
    from recbole.evaluator import Collector, Evaluator

    unknown = set(metrics) - set(RB_METRIC)
    if unknown:
        raise ValueError(f"RecBole evaluator: unsupported metrics {sorted(unknown)}")
    conf = {
        "metrics": [RB_METRIC[m] for m in metrics],
        "topk": [int(k) for k in ks],
        "eval_args": {"mode": "full"},
        "device": torch.device("cpu"),
        "metric_decimal_place": 12,
    }
    mask_splits = {"train": ["train"], "none": [], "all": ["train", "valid"] if split == "test" else ["train"]}[
        mask_history
    ]
    tgt = data.part(split)[["user", "item"]].drop_duplicates()
    target = data.matrix([split]).tocsr()
    users = np.unique(tgt["user"].to_numpy(np.int64))
    mask = data.matrix(mask_splits).tocsr() if mask_splits else None
    collector = Collector(conf)
    for b0 in range(0, len(users), batch_size):
        bu = users[b0 : b0 + batch_size]
        out = scorer(bu)
        S = (out.detach() if torch.is_tensor(out) else torch.as_tensor(np.asarray(out))).to(torch.float64).clone()
        if mask is not None:
            sub = mask[bu]
            r = np.repeat(np.arange(len(bu)), np.diff(sub.indptr))
            S[torch.as_tensor(r), torch.as_tensor(sub.indices.astype(np.int64))] = -torch.inf
        t = target[bu]
        pu = torch.as_tensor(np.repeat(np.arange(len(bu)), np.diff(t.indptr)))
        pi = torch.as_tensor(t.indices.astype(np.int64))
        collector.eval_batch_collect(S, None, pu, pi)
    res = Evaluator(conf).evaluate(collector.get_data_struct())
    back = {v: k for k, v in RB_METRIC.items()}
    out = {}
    for key, value in res.items():
        name, k = key.split("@")
        out[f"{back[name]}@{k}"] = float(value)
    return out


def central_scorer(backbone: RecBoleBackbone, model):
    """Scorer (our user ids -> [B, n_items], our item order) of a centrally trained RecBole ``model``."""
    from recbole.data.interaction import Interaction

    def score(users):
        users = torch.as_tensor(np.asarray(users, dtype=np.int64))
        rb = backbone.user_map[users]
        with torch.no_grad():
            model.eval()
            for attr in CACHE_ATTRIBUTES:
                if hasattr(model, attr):
                    setattr(model, attr, None)
            try:
                s = model.full_sort_predict(Interaction({model.USER_ID: rb})).view(len(rb), -1)
                return s[:, backbone.item_map]
            except NotImplementedError:
                inter = Interaction(
                    {
                        model.USER_ID: rb.repeat_interleave(backbone.n_items),
                        model.ITEM_ID: backbone.item_map.repeat(len(rb)),
                    }
                )
                return model.predict(inter).view(len(rb), -1)

    return score


def train_central(backbone: RecBoleBackbone, *, epochs: int = 10, seed: int | None = None, workdir=None):
    """Train the same model centrally with RecBole's own ``Trainer`` on the training split the backbone was
    built from (RecBole's negative sampling, optimizer and learning rate from its config), no early stopping.
    Returns the trained module; score it with :func:`central_scorer`."""
    from recbole.data import data_preparation
    from recbole.trainer import Trainer

    seed = backbone.seed if seed is None else int(seed)
    config = backbone.config
    config["epochs"] = int(epochs)
    with recbole_workdir(workdir):
        from recbole.data import create_dataset

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            np_state = np.random.get_state()
            np.random.seed(seed)
            dataset = create_dataset(config)
            train_data, _, _ = data_preparation(config, dataset)
            model = backbone.model_class(config, train_data.dataset).to("cpu")
            trainer = Trainer(config, model)
            trainer.fit(train_data, valid_data=None, saved=False, show_progress=False, verbose=False)
            np.random.set_state(np_state)
    return model.eval()
