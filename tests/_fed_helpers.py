"""Helpers for the federation tests: small real/synthetic data and a stand-in evaluator.

The stand-in evaluator implements the interface of ``fedvlr_plus.evaluation.evaluate`` (full-sort with training
items masked, and 99 sampled negatives) and is installed only when the real one is absent from this checkout.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fedvlr_plus.datasets import InteractionData
from fedvlr_plus.datasets.splits import dedup, leave_one_out

from _shared import shared_data


class ShimResult:
    def __init__(self, per_user: dict, warm: np.ndarray):
        self.per_user, self.warm = per_user, warm

    def summary(self) -> dict:
        return {k: float(v.mean()) if len(v) else 0.0 for k, v in self.per_user.items()}

    def to_json(self, prefix: str = "test") -> dict:
        def part(sel):
            return {k: float(v[sel].mean()) if sel.any() else 0.0 for k, v in self.per_user.items()}
        ci = {k: [float(v.mean() - 1.96 * v.std() / np.sqrt(max(len(v), 1))),
                  float(v.mean() + 1.96 * v.std() / np.sqrt(max(len(v), 1)))] for k, v in self.per_user.items()}
        return {prefix: self.summary(), f"{prefix}_ci": ci, f"{prefix}_warm": part(self.warm),
                f"{prefix}_cold": part(~self.warm)}


def shim_evaluate(data, scorer, split="valid", protocol="full", ks=(10, 50), mask_history="train", seed=0):
    part = data.part(split)
    users = part["user"].to_numpy().astype(np.int64)
    targets = part["item"].to_numpy().astype(np.int64)
    train = data.matrix(["train"]).tocsr()
    scores = scorer(users)
    scores = scores.detach().cpu().numpy() if isinstance(scores, torch.Tensor) else np.asarray(scores)
    scores = scores.astype(np.float64)
    ranks = np.zeros(len(users), dtype=np.int64)
    g = np.random.default_rng(seed)
    everything = data.matrix(["train", "valid", "test"]).tocsr()
    for r, (u, t) in enumerate(zip(users, targets)):
        s = scores[r].copy()
        if protocol == "full":
            hist = train.indices[train.indptr[u]:train.indptr[u + 1]]
            hist = hist[hist != t]
            s[hist] = -np.inf
            ranks[r] = int((s > s[t]).sum())
        else:
            seen = set(everything.indices[everything.indptr[u]:everything.indptr[u + 1]].tolist())
            cand = [i for i in g.permutation(data.n_items)[:300] if i not in seen][:99]
            ranks[r] = int((s[cand] > s[t]).sum())
    per_user = {}
    for k in ks:
        per_user[f"hr@{k}"] = (ranks < k).astype(np.float64)
        per_user[f"ndcg@{k}"] = np.where(ranks < k, 1.0 / np.log2(ranks + 2.0), 0.0)
    warm = data.item_popularity("train")[targets] > 0
    return ShimResult(per_user, warm)


@pytest.fixture
def evaluator(monkeypatch):
    """The project's evaluator if this checkout has it, else the stand-in above."""
    import fedvlr_plus.evaluation as ev

    if not hasattr(ev, "evaluate"):
        monkeypatch.setattr(ev, "evaluate", shim_evaluate, raising=False)
    return ev.evaluate


def recbole_ml100k_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("recbole")
    if spec is None or spec.origin is None:
        pytest.skip("recbole is not installed, so MovieLens-100K is unavailable")
    path = Path(spec.origin).parent / "dataset_example" / "ml-100k" / "ml-100k.inter"
    if not path.exists():
        pytest.skip(f"{path} is missing")
    return path


def load_ml100k(n_users: int | None = None) -> InteractionData:
    """ML-100K (all ratings as implicit feedback), optionally its first ``n_users`` users, leave-one-out."""
    try:
        from fedvlr_plus.datasets import load  # the project loader, once it exists
        data = load("ml-100k")
        if n_users is None:
            return leave_one_out(dedup(data))
        raw_users = data.user_ids[data.inter["user"].to_numpy()]
        raw_items = data.item_ids[data.inter["item"].to_numpy()]
        df = pd.DataFrame({"u": raw_users, "i": raw_items, "t": data.inter["timestamp"].to_numpy()})
    except ImportError:
        df = pd.read_csv(recbole_ml100k_path(), sep="\t")
        df.columns = ["u", "i", "r", "t"]
    if n_users is not None:
        keep = pd.unique(df["u"])[:n_users]
        df = df[df["u"].isin(keep)]
    data = InteractionData.from_raw("ml-100k" if n_users is None else f"ml-100k-{n_users}u",
                                    df["u"].to_numpy(), df["i"].to_numpy(), timestamp=df["t"].to_numpy())
    return leave_one_out(dedup(data))


def load_ku() -> InteractionData:
    folder = shared_data("ku")
    try:
        from fedvlr_plus.datasets import load
        return load(str(folder))
    except ImportError:
        df = pd.read_csv(folder / "inter.csv")
        return InteractionData.from_raw("ku", df["userID"].to_numpy(), df["itemID"].to_numpy(),
                                        timestamp=df["timestamp"].to_numpy(), split=df["split_label"].to_numpy(),
                                        item_order=np.arange(560))


def pop_scorer(data):
    pop = data.item_popularity("train").astype(np.float64)

    def score(users):
        return np.tile(pop, (len(users), 1))
    return score
