"""FedDTL's item classes when a catalogue has no usable labels: k-means clusters of the item content vectors, and
the base / novel split of those classes (the paper's base-to-novel regimes: novel classes never train).

On lfm2k the content vectors are the shipped MiniLM embeddings of each artist's tag text, so a cluster is a group
of artists with similar tags (a music style); a user's history is concentrated on few of them, which is what
makes a Dirichlet split over the users' dominant class skewed at the item level.
"""

from __future__ import annotations

import numpy as np

from ...errors import ConfigError


def kmeans_classes(content: np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    """Class id per item: seeded k-means (k-means++ start) of the unit-normalised content rows.

    Clusters are renumbered by size (0 = largest) so the ids do not depend on the start's order."""
    from scipy.cluster.vq import kmeans2

    x = np.asarray(content, np.float64)
    if not 2 <= k <= len(x):
        raise ConfigError(f"--classes {k}: the number of item classes must be between 2 and the {len(x)} items")
    x = x / np.linalg.norm(x, axis=1, keepdims=True).clip(1e-12)
    _, lab = kmeans2(x, k, seed=int(seed), minit="++")
    sizes = np.bincount(lab, minlength=k)
    rank = np.empty(k, np.int64)
    rank[np.argsort(-sizes, kind="stable")] = np.arange(k)
    return rank[lab]


def novel_classes(item_class: np.ndarray, n_novel: int, seed: int = 0) -> np.ndarray:
    """A seeded random choice of ``n_novel`` of the classes that have items (sorted ids)."""
    present = np.unique(item_class)
    if not 1 <= n_novel < len(present):
        raise ConfigError(
            f"--novel-classes {n_novel}: must be at least 1 and fewer than the {len(present)} classes "
            "(some classes must stay base)"
        )
    rng = np.random.default_rng([int(seed), 7])
    return np.sort(rng.choice(present, size=n_novel, replace=False))


def class_weights(item_class: np.ndarray) -> np.ndarray:
    """[n_items, n_classes] one-hot rows: the item label weights :func:`.dtl_task.label_skew` reads."""
    out = np.zeros((len(item_class), int(item_class.max()) + 1))
    out[np.arange(len(item_class)), item_class] = 1.0
    return out
