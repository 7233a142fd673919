"""MoR's reference policy on a rating dataset: the users' taste vectors (the policy's context), a federated
backbone trained on the split (its scores cached on disk) and each user's candidate items."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


def user_taste(data, feats: np.ndarray, splits=(0,)) -> np.ndarray:
    """Each user's taste vector: mean of (r - mean_u) x item features over the user's ratings in ``splits``."""
    inter = data.inter[data.inter["split"].isin(list(splits))].dropna(subset=["rating"])
    u = inter["user"].to_numpy(np.int64)
    r = inter["rating"].to_numpy(np.float64)
    n = int(data.n_users)
    cnt = np.maximum(np.bincount(u, minlength=n), 1)
    mean_u = np.bincount(u, r, minlength=n) / cnt
    x = np.zeros((n, feats.shape[1]))
    np.add.at(x, u, (r - mean_u[u])[:, None] * feats[inter["item"].to_numpy(np.int64)])
    return (x / np.maximum(cnt - 2, 1)[:, None]).astype(np.float32)


def train_backbone(
    split,
    *,
    backbone: str = "fedavg",
    rounds: int = 20,
    dim: int = 32,
    seed: int = 0,
    progress: bool = False,
    cache_dir=None,
) -> tuple[np.ndarray, dict]:
    """Train a federated backbone on the split data (:class:`~fedvlr_plus.federation.engine.FederatedRun`);
    return its item scores [n_users, n_items] and its test figures. With ``cache_dir`` the scores are kept on disk
    under a key of the dataset identity and the run settings (a rerun with the same settings skips training)."""
    import hashlib
    import json
    import os
    from pathlib import Path

    from ...federation import FedConfig
    from ...federation.engine import FederatedRun, dataset_identity

    cfg = FedConfig(rounds=rounds, dim=dim, seed=seed, eval_every=rounds, ks=(10,), patience=rounds)
    key = hashlib.sha256(
        json.dumps([dataset_identity(split), backbone, cfg.to_dict()], sort_keys=True, default=str).encode()
    ).hexdigest()[:24]
    path = Path(cache_dir) / "mor-backbones" / f"{backbone}-{key}.npz" if cache_dir is not None else None
    if path is not None and path.exists():
        z = np.load(path, allow_pickle=False)
        return z["scores"], json.loads(str(z["result"]))
    run = FederatedRun(split, backbone, cfg, progress=progress)
    full = run.run()
    with torch.no_grad():
        scores = run.sim.scores(np.arange(split.n_users), run.shared).float().numpy()
    result = {
        "selected_round": full.get("selected_round"),
        "test": {
            k: v
            for k, v in _flat(full).items()
            if k.startswith("test") and "sampled" not in k and ("hr@" in k or "ndcg@" in k)
        },
    }
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}.npz")
        np.savez(tmp, scores=scores, result=json.dumps(result))
        os.replace(tmp, path)
    return scores, result


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, name + "."))
        elif isinstance(v, (int, float)):
            out[name] = v
    return out


#: users whose full rows of scores are ranked together (the reference's candidates, and the targets' ranks of
#: mor_policy): bounds the masked copy and the sort's memory
RANK_BLOCK = 1024


class ReferenceRanking(NamedTuple):
    """The frozen reference policy's side of GRPO: the backbone's scores, the training items it must not
    recommend, and each user's top-C unseen candidates with their scores (the reference logits)."""

    scores: np.ndarray  # [n_users, n_items]
    train_mask: np.ndarray  # [n_users, n_items] bool
    cand: np.ndarray  # [n_users, C]
    logits: np.ndarray  # [n_users, C]


def reference_candidates(split, ref_scores: np.ndarray, candidates: int) -> ReferenceRanking:
    """Each user's top-``candidates`` items by the backbone, training items masked (stable ties)."""
    n_users, n_items = split.n_users, split.n_items
    train_mask = np.zeros((n_users, n_items), bool)
    tr = split.train()
    train_mask[tr["user"].to_numpy(), tr["item"].to_numpy()] = True
    C = min(candidates, n_items)
    # a block of users at a time: sorting every row at once held the masked scores twice and an int64 order of
    # the whole [n_users, n_items] table (about 4 GB at Amazon 2014 Toys' size); each row's order is its own
    cand = (
        np.concatenate(
            [
                np.argsort(
                    -np.where(train_mask[a : a + RANK_BLOCK], -np.inf, ref_scores[a : a + RANK_BLOCK]),
                    axis=1,
                    kind="stable",
                )[:, :C]
                for a in range(0, n_users, RANK_BLOCK)
            ]
        )
        if n_users
        else np.zeros((0, C), np.int64)
    )
    return ReferenceRanking(ref_scores, train_mask, cand, np.take_along_axis(ref_scores, cand, 1))
