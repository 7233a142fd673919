"""FedMPT's loss and figures: the asymmetric multi-label loss, mAP, per-class and overall P / R / F1, the
spurious-activation rate, and the per-label F1 thresholds from the clients' summed counts."""

from __future__ import annotations

import numpy as np
import torch


# ----------------------------------------------------------------------------------------------- losses, metrics
def asymmetric_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    gamma_neg: float = 2.0,
    gamma_pos: float = 1.0,
    margin: float = 0.05,
    eps: float = 1e-8,
) -> torch.Tensor:
    """ASL: -y (1-p)^g+ log p - (1-y) p_m^g- log(1-p_m), p_m = max(p - m, 0); summed over labels, mean over items."""
    p = torch.sigmoid(logits)
    p_m = (p - margin).clamp_min(0.0) if margin > 0 else p
    pos = targets * (1 - p).pow(gamma_pos) * torch.log(p.clamp_min(eps))
    neg = (1 - targets) * p_m.pow(gamma_neg) * torch.log((1 - p_m).clamp_min(eps))
    return -(pos + neg).sum(-1).mean()


def average_precision(scores: np.ndarray, y: np.ndarray) -> float:
    """AP of one label: mean precision at the rank of each positive (ties broken by order, scores descending)."""
    order = np.argsort(-scores, kind="stable")
    hits = y[order] > 0
    if not hits.any():
        return float("nan")
    prec = np.cumsum(hits) / np.arange(1, len(hits) + 1)
    return float(prec[hits].mean())


def usual_co_labels(labels: np.ndarray, min_count: int = 5) -> dict[int, int]:
    """For each label j, the label i != j it co-occurs with most often (at least ``min_count`` items)."""
    co = labels.T @ labels
    np.fill_diagonal(co, 0)
    out = {}
    for j in range(labels.shape[1]):
        i = int(np.argmax(co[j]))
        if co[j, i] >= min_count:
            out[j] = i
    return out


def multilabel_metrics(
    scores: np.ndarray, labels: np.ndarray, co_label: dict[int, int], threshold: float = 0.5
) -> dict:
    """mAP (over labels with a positive), CP/CR/CF1 (per-label means), OP/OR/OF1 (pooled), spurious rate.

    ``scores`` are probabilities; a label is predicted when its probability exceeds ``threshold`` (a scalar or one
    value per label). The spurious
    activation rate pools, over labels j with a usual co-label i, the items where i is present and j absent, and
    counts how often j is predicted there; ``spurious_rate_at_r`` does the same when each label j is predicted on
    exactly its top-R_j items (R_j its positives), the same count for every model. ``co_label_auc`` is threshold-free:
    per such label, the AUC of j's score
    between the items that carry j and the items that carry only its co-label (higher = fewer spurious
    activations at any threshold), averaged over labels.
    """
    y = labels > 0
    pred = scores > threshold
    ap_all = [average_precision(scores[:, j], y[:, j]) if y[:, j].any() else None for j in range(y.shape[1])]
    aps = [a for a in ap_all if a is not None]
    tp = (pred & y).sum(0).astype(float)
    n_pred, n_true = pred.sum(0).astype(float), y.sum(0).astype(float)
    has = n_true > 0
    cp = float(np.mean(np.where(n_pred[has] > 0, tp[has] / np.maximum(n_pred[has], 1), 0.0)))
    cr = float(np.mean(tp[has] / n_true[has]))
    op = float(tp.sum() / max(n_pred.sum(), 1.0))
    orr = float(tp.sum() / max(n_true.sum(), 1.0))
    f1 = lambda p, r: 2 * p * r / (p + r) if p + r > 0 else 0.0  # noqa: E731
    # rank-matched companion: label j predicted on its top-R_j items (R_j = its number of positives here), so two
    # models predict exactly as many items per label and the spurious rate compares rankings, not thresholds
    pred_r = np.zeros_like(y)
    for j in range(y.shape[1]):
        r = int(y[:, j].sum())
        if r:
            pred_r[np.argsort(-scores[:, j], kind="stable")[:r], j] = True
    eligible = fired = fired_r = 0
    aucs = []
    for j, i in co_label.items():
        rows = y[:, i] & ~y[:, j]
        eligible += int(rows.sum())
        fired += int(pred[rows, j].sum())
        fired_r += int(pred_r[rows, j].sum())
        # threshold-free companion: how well j's score separates true j items from co-label-only items
        pos, neg = scores[y[:, j], j], scores[rows, j]
        if len(pos) and len(neg):
            diff = pos[:, None] - neg[None, :]
            aucs.append(float((diff > 0).mean() + 0.5 * (diff == 0).mean()))
    return {
        "mAP": float(np.mean(aps)) if aps else float("nan"),
        "CP": cp,
        "CR": cr,
        "CF1": f1(cp, cr),
        "OP": op,
        "OR": orr,
        "OF1": f1(op, orr),
        "spurious_rate": fired / eligible if eligible else float("nan"),
        "spurious_eligible": eligible,
        "spurious_rate_at_r": fired_r / eligible if eligible else float("nan"),
        "co_label_auc": float(np.mean(aucs)) if aucs else float("nan"),
        "ap_per_label": ap_all,
    }


THRESHOLD_GRID = np.round(np.arange(0.05, 0.951, 0.025), 3)


def f1_thresholds(counts: list[dict], grid: np.ndarray = THRESHOLD_GRID) -> np.ndarray:
    """Per-label threshold maximising F1 over the clients' summed training counts (ties: the one nearest 0.5;
    a label with no positive keeps 0.5). ``counts`` are :meth:`TaggingClient.threshold_counts` outputs."""
    pred = sum(c["pred"] for c in counts)
    tp = sum(c["tp"] for c in counts)
    pos = sum(c["pos"] for c in counts)
    f1 = 2 * tp / np.maximum(pred + pos[None], 1e-12)  # [G, L]
    out = np.full(f1.shape[1], 0.5)
    for j in range(f1.shape[1]):
        if pos[j] > 0:
            best = np.flatnonzero(f1[:, j] >= f1[:, j].max() - 1e-12)
            out[j] = grid[best[np.argmin(np.abs(grid[best] - 0.5))]]
    return out
