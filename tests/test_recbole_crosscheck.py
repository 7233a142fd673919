"""Our evaluator against RecBole 1.2.1's own evaluator on MovieLens-100K (one tie-free score matrix).

RecBole masks the user's history with -inf before ``torch.topk`` (train at valid; train + valid at test), builds
``rec.topk`` in its ``Collector`` and computes the metrics in its metric classes. With no tied scores RecBole's
top-k is unambiguous, so both evaluators must agree to float precision, per user and on average.

1. ``test_metric_classes_*``: our splits of ML-100K, RecBole's Collector + Evaluator fed with the masked scores.
2. ``test_recbole_pipeline_*``: RecBole's own data pipeline (``create_dataset`` + ``data_preparation``) makes the
   split and the history masks; our evaluator gets the same split and ``mask_history="all"``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from test_evaluation_real import load_ml100k, ml100k_path

from fedvlr_plus._compat import patch_recbole
from fedvlr_plus.datasets import InteractionData
from fedvlr_plus.datasets.splits import leave_one_out, ratio_split
from fedvlr_plus.evaluation import evaluate

# RecBole 1.2.1 on pandas 2.3 / NumPy 2 emits chained-assignment and __array_wrap__ warnings from its own code.
pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

METRICS = ("hr", "ndcg", "mrr", "recall")
RB_NAME = {"hr": "hit", "ndcg": "ndcg", "mrr": "mrr", "recall": "recall"}
KS = (5, 10)


@pytest.fixture
def recbole_env(monkeypatch, tmp_path):
    ml100k_path()  # skip early when recbole or its example data is missing
    patch_recbole()
    # RecBole's metric classes use np.float, removed in NumPy 1.24; RecBole's own Config sets the same alias.
    monkeypatch.setattr(np, "float", np.float64, raising=False)
    monkeypatch.chdir(tmp_path)  # RecBole writes ./log and ./log_tensorboard
    return tmp_path


def tie_free_scores(n_users, n_items, popularity, seed=0):
    """Popularity plus tiny seeded noise: same order as popularity where it differs, no exact ties."""
    rng = np.random.default_rng(seed)
    S = popularity[None, :].astype(np.float64) + 1e-3 * rng.random((n_users, n_items))
    srt = np.sort(S, axis=1)
    assert not (srt[:, 1:] == srt[:, :-1]).any(), "the score matrix must be tie-free"
    return S


def recbole_metrics(scores: torch.Tensor, positive_u: torch.Tensor, positive_i: torch.Tensor):
    """RecBole's Collector (rec.topk) + metric classes; returns (summary dict, per-user dict at each K)."""
    from recbole.evaluator import Collector, Evaluator
    from recbole.evaluator.register import metrics_dict

    config = {
        "metrics": [RB_NAME[m] for m in METRICS],
        "topk": list(KS),
        "eval_args": {"mode": "full"},
        "device": torch.device("cpu"),
        "metric_decimal_place": 12,
    }
    collector = Collector(config)
    collector.eval_batch_collect(scores, None, positive_u, positive_i)
    struct = collector.get_data_struct()
    summary = dict(Evaluator(config).evaluate(struct))
    per_user = {}
    for m in METRICS:
        cls = metrics_dict[RB_NAME[m]](config)
        pos_index, pos_len = cls.used_info(struct)
        values = cls.metric_info(pos_index, pos_len) if m in ("ndcg", "recall") else cls.metric_info(pos_index)
        for k in KS:
            per_user[f"{m}@{k}"] = values[:, k - 1]
    return summary, per_user


def compare(ours, rb_summary, rb_per_user, n_users):
    assert ours.n_users() == n_users
    s = ours.summary()
    for m in METRICS:
        for k in KS:
            col = f"{m}@{k}"
            assert s[col] == pytest.approx(rb_summary[f"{RB_NAME[m]}@{k}"], abs=1e-6), col
            assert np.allclose(ours.per_user[col].to_numpy(), rb_per_user[col], atol=1e-9), col


# ---------------------------------------------------------------------- 1. our splits, RecBole's metrics
@pytest.mark.parametrize("split_fn", [leave_one_out, ratio_split], ids=["loo", "ratio"])
@pytest.mark.parametrize("split", ["test", "valid"])
def test_metric_classes_agree(recbole_env, split_fn, split):
    data = split_fn(load_ml100k())
    S = tie_free_scores(data.n_users, data.n_items, data.item_popularity("train"))
    ours = evaluate(data, lambda u: S[u], split=split, ks=KS, metrics=METRICS, mask_history="all")

    users = ours.per_user["user"].to_numpy()
    row_of = np.full(data.n_users, -1)
    row_of[users] = np.arange(len(users))
    masked = data.matrix(["train", "valid"] if split == "test" else ["train"])[users].tocoo()
    scores = torch.as_tensor(S[users])
    scores[torch.as_tensor(masked.row, dtype=torch.long), torch.as_tensor(masked.col, dtype=torch.long)] = -np.inf
    target = data.part(split)[["user", "item"]].drop_duplicates()
    pos_u = torch.as_tensor(row_of[target["user"].to_numpy()])
    pos_i = torch.as_tensor(target["item"].to_numpy())
    rb_summary, rb_per_user = recbole_metrics(scores, pos_u, pos_i)
    compare(ours, rb_summary, rb_per_user, len(users))
    if split_fn is ratio_split:
        assert ours.per_user["n_targets"].max() > 1  # multi-target users are really exercised


# ---------------------------------------------------------------------- 2. RecBole's own pipeline and masks
def _recbole_split(split_args):
    from recbole.config import Config
    from recbole.data import create_dataset, data_preparation

    config = Config(
        model="Pop",
        dataset="ml-100k",
        config_dict={
            "eval_args": {"split": split_args, "order": "TO", "group_by": "user", "mode": "full"},
            "metrics": [RB_NAME[m] for m in METRICS],
            "topk": list(KS),
            "metric_decimal_place": 12,
            "use_gpu": False,
            "seed": 0,
            "reproducibility": True,
            "show_progress": False,
            "log_wandb": False,
            "eval_batch_size": 1 << 20,
            "train_neg_sample_args": None,
        },
    )
    dataset = create_dataset(config)
    return config, dataset, data_preparation(config, dataset)


@pytest.mark.parametrize("split_args", [{"LS": "valid_and_test"}, {"RS": [0.8, 0.1, 0.1]}], ids=["LS", "RS"])
def test_recbole_pipeline_agrees(recbole_env, split_args):
    config, dataset, (train_data, valid_data, test_data) = _recbole_split(split_args)
    uid, iid = config["USER_ID_FIELD"], config["ITEM_ID_FIELD"]
    n_users, n_items = dataset.user_num - 1, dataset.item_num - 1  # RecBole's id 0 is padding

    # Our InteractionData: RecBole's own train/valid/test parts, ids shifted down by one (no padding row).
    parts = []
    for code, loader in ((0, train_data), (1, valid_data), (2, test_data)):
        feat = loader._dataset.inter_feat if hasattr(loader, "_dataset") else loader.dataset.inter_feat
        parts.append(pd.DataFrame({"user": feat[uid].numpy() - 1, "item": feat[iid].numpy() - 1, "split": code}))
    inter = pd.concat(parts, ignore_index=True)
    inter = inter.assign(rating=np.float32(1), timestamp=0.0)[["user", "item", "rating", "timestamp", "split"]]
    inter["split"] = inter["split"].astype(np.int8)
    data = InteractionData("ml-100k-recbole", np.arange(n_users), np.arange(n_items), inter)
    S = tie_free_scores(n_users, n_items, data.item_popularity("train"))

    for split, loader in (("valid", valid_data), ("test", test_data)):
        ours = evaluate(data, lambda u: S[u], split=split, ks=KS, metrics=METRICS, mask_history="all")
        # RecBole side, exactly as Trainer._full_sort_batch_eval: pad column 0 and the history get -inf
        from recbole.evaluator import Collector, Evaluator

        collector = Collector(config)
        users_rb = []
        for interaction, history_index, positive_u, positive_i in loader:
            u = interaction[uid].numpy()
            users_rb.append(u - 1)
            scores = torch.full((len(u), n_items + 1), -np.inf, dtype=torch.float64)
            scores[:, 1:] = torch.as_tensor(S[u - 1])
            scores[:, 0] = -np.inf
            if history_index is not None:
                scores[history_index] = -np.inf
            collector.eval_batch_collect(scores, interaction, positive_u, positive_i)
        struct = collector.get_data_struct()
        rb_summary = dict(Evaluator(config).evaluate(struct))
        users_rb = np.concatenate(users_rb)
        assert np.array_equal(np.sort(users_rb), ours.per_user["user"].to_numpy())
        s = ours.summary()
        print(
            f"\nRecBole {split_args} {split}: ours hr@10 {s['hr@10']:.6f} ndcg@10 {s['ndcg@10']:.6f} "
            f"mrr@10 {s['mrr@10']:.6f} recall@10 {s['recall@10']:.6f}; RecBole {rb_summary}"
        )
        assert s["hr@10"] > 0.05  # a popularity order is far from random: the comparison is not 0 == 0
        for m in METRICS:
            for k in KS:
                assert s[f"{m}@{k}"] == pytest.approx(rb_summary[f"{RB_NAME[m]}@{k}"], abs=1e-6), (split, m, k)
