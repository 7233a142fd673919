"""A FedMPT client (its training items stay private; it uploads every trained array and, for the decision rule,
only summed threshold counts) and the k-means label clients the items are dealt to."""

from __future__ import annotations

import numpy as np
import torch

from ...federation.messages import ClientUpdate
from .metrics import asymmetric_loss, multilabel_metrics, usual_co_labels
from .model import MPTConfig, forward, predict
from .task import TaggingTask


class TaggingClient:
    """One client of the tagging task: its training items (private) and, optionally, local held-out items.

    Uploads every trained array (the whole model is shared under FedAvg); never its items, tokens or labels.
    """

    def __init__(self, cid: int, task: TaggingTask, train_idx, cfg: MPTConfig, *, eval_idx=None, seed: int = 0):
        self.cid = int(cid)
        self.task = task
        self.train_idx = np.asarray(train_idx, dtype=np.int64)
        self.eval_idx = np.asarray(eval_idx if eval_idx is not None else [], dtype=np.int64)
        self.cfg = cfg
        self.seed = int(seed)
        if len(self.train_idx) == 0:
            raise ValueError(f"client {cid} has no training items")

    def fit(self, shared: dict, config: dict) -> ClientUpdate:
        cfg = self.cfg
        p = {k: torch.as_tensor(v, dtype=torch.float32).clone().requires_grad_(True) for k, v in shared.items()}
        opt = torch.optim.Adam(list(p.values()), lr=float(config.get("lr", cfg.lr)), weight_decay=cfg.weight_decay)
        rng = np.random.default_rng([self.seed, self.cid, int(config.get("round", 0))])
        losses, gate_h = [], []
        for _ in range(int(config.get("epochs", cfg.local_epochs))):
            order = rng.permutation(self.train_idx)
            for s in range(0, len(order), cfg.batch_size):
                idx = order[s : s + cfg.batch_size]
                logits, diag = forward(p, self.task, idx, cfg)
                loss = asymmetric_loss(
                    logits, torch.from_numpy(self.task.labels[idx]), cfg.gamma_neg, cfg.gamma_pos, cfg.margin
                )
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
                if "gate_entropy" in diag:
                    gate_h.append(diag["gate_entropy"])
        metrics = {"loss": float(np.mean(losses)), "steps": len(losses)}
        if gate_h:
            metrics["gate_entropy"] = float(np.mean(gate_h))
        return ClientUpdate(
            cid=self.cid,
            kind="params",
            arrays={k: v.detach().clone() for k, v in p.items()},
            num_examples=len(self.train_idx),
            metrics=metrics,
        )

    def threshold_counts(self, shared: dict, grid: np.ndarray) -> dict[str, np.ndarray]:
        """Per-label counts on this client's training items for every candidate threshold: predicted [G, L],
        true positives [G, L], positives [L]. Only these sums leave the client (no item, score or label)."""
        p = {k: torch.as_tensor(v, dtype=torch.float32) for k, v in shared.items()}
        probs = predict(p, self.task, self.train_idx, self.cfg)
        y = self.task.labels[self.train_idx] > 0
        pred = probs[None] > grid[:, None, None]  # [G, n, L]
        return {
            "pred": pred.sum(1).astype(np.float64),
            "tp": (pred & y[None]).sum(1).astype(np.float64),
            "pos": y.sum(0).astype(np.float64),
        }

    def evaluate(self, shared: dict, config: dict) -> dict:
        idx = self.eval_idx if len(self.eval_idx) else self.train_idx
        p = {k: torch.as_tensor(v, dtype=torch.float32) for k, v in shared.items()}
        probs = predict(p, self.task, idx, self.cfg)
        co = config.get("co_label") or usual_co_labels(self.task.labels[self.train_idx])
        return {"n": int(len(idx)), **multilabel_metrics(probs, self.task.labels[idx], co)}


def kmeans_label_clients(labels: np.ndarray, k: int, seed: int = 0, iters: int = 50) -> np.ndarray:
    """Cluster id per item by Lloyd's k-means on the label vectors (k-means++ seeding); every cluster non-empty."""
    n = len(labels)
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= clients <= items, got {k} clients for {n} items")
    rng = np.random.default_rng(seed)
    x = labels.astype(np.float64)
    centres = [x[rng.integers(n)]]
    for _ in range(1, k):
        d2 = np.min(((x[:, None] - np.array(centres)[None]) ** 2).sum(-1), 1)
        probs = d2 / d2.sum() if d2.sum() > 0 else np.full(n, 1.0 / n)
        centres.append(x[rng.choice(n, p=probs)])
    c = np.array(centres)
    assign = np.zeros(n, dtype=np.int64)
    for _ in range(iters):
        new = np.argmin(((x[:, None] - c[None]) ** 2).sum(-1), 1)
        for j in range(k):  # an empty cluster takes the point farthest from its centre, never another's last one
            if not (new == j).any():
                d2 = ((x - c[new]) ** 2).sum(-1)
                d2[np.bincount(new, minlength=k)[new] <= 1] = -1.0
                new[int(np.argmax(d2))] = j
        if np.array_equal(new, assign):
            break
        assign = new
        c = np.array([x[assign == j].mean(0) for j in range(k)])
    return assign
