"""The per-user plot of the view-routing ablation and the planted benchmark: how each user's private router
weighs the views, and what routing gains for that user over one fixed fusion (``--fusion sum``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: bins of the largest router weight in the gain panel (a router over J views has its largest weight >= 1/J)
TOP_WEIGHT_BINS = np.linspace(0.0, 1.0, 11)


def plot_per_user(per_user: dict, title: str, path: Path) -> None:
    """Two panels into ``path`` (PNG): the users' weight on the first view (split by the known group where the
    data has one), and the mean gain over ``--fusion sum`` by how decided the router is."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    _weights_panel(left, per_user)
    _gain_panel(right, per_user)
    fig.suptitle(title)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")  # a figure half written is never left under the real name
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def _weights_panel(ax, per_user: dict) -> None:
    """Histogram of each user's weight on the first view: with two views this is the whole routing."""
    w = np.asarray(per_user["weights"])
    first = per_user["experts"][0]
    bins = np.linspace(0.0, 1.0, 21)
    groups = per_user.get("group")
    if groups is None:
        ax.hist(w[:, 0], bins=bins, color="tab:blue")
    else:
        groups = np.asarray(groups)
        for g in sorted(set(groups.tolist())):
            ax.hist(w[groups == g, 0], bins=bins, histtype="step", linewidth=2, label=f"users planted with {g}")
        ax.legend(fontsize=8)
    ax.set_xlabel(f"router weight on {first}")
    ax.set_ylabel("users")


def _gain_panel(ax, per_user: dict) -> None:
    """The mean gain over ``--fusion sum`` per bin of the router's largest weight, with a 95% interval (normal
    approximation over the bin's users): single users' gains are too discrete to read as dots."""
    top = np.asarray(per_user["weights"]).max(1)
    gain = np.asarray(per_user["gain_over_sum"])
    which = np.digitize(top, TOP_WEIGHT_BINS[1:-1])
    centres = (TOP_WEIGHT_BINS[:-1] + TOP_WEIGHT_BINS[1:]) / 2
    kept = [b for b in range(len(centres)) if (which == b).sum() >= 5]
    means = np.array([gain[which == b].mean() for b in kept])
    half = np.array([1.96 * gain[which == b].std(ddof=1) / np.sqrt((which == b).sum()) for b in kept])
    ax.errorbar(centres[kept], means, yerr=half, marker="o", color="tab:red", capsize=3)
    for b, m, h in zip(kept, means, half):
        ax.annotate(f"{(which == b).sum()}", (centres[b], m + h), ha="center", va="bottom", fontsize=7)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xlim(0.0, 1.0)
    ax.set_xlabel("largest router weight (bins of 5+ users; users above each point)")
    ax.set_ylabel(f"{per_user['metric']}: FedVLR (views) − sum")
