"""Synthetic data with a planted modality preference: the truth a personal router should recover.

Every item has two independent content vectors (``image`` and ``text``, 64-d by default). In each modality the
items fall into clusters drawn independently of the other modality's, so an item's image says nothing about its
text. Each user is given one modality (``data.users["planted"]``) and a taste in it: a cluster centre of that
modality with a personal offset. The user chooses items by that modality alone, without replacement, with
probability ``∝ exp(cos(v_i^m, t_u) / τ) · pop_i^β``, and the other modality is noise to them. Choices are
ordered at random in time and split leave-one-out, so validation and test targets come from the same preference.

``preference`` says who prefers what: ``mixed`` (each user draws image or text with equal chance) or one modality
name (the control: every user shares it, so routing between views has nothing to personalise).

Source strings: ``synthetic-planted:USERSxITEMS`` (mixed) and ``synthetic-planted:USERSxITEMS:MODALITY``.
"""

from __future__ import annotations

import numpy as np

PLANTED_PREFIX = "synthetic-planted:"
MODALITIES = ("image", "text")
PREFERENCES = ("mixed",) + MODALITIES


def _modality_vectors(g: np.random.Generator, n_items: int, dim: int, clusters: int, noise: float) -> np.ndarray:
    """``[n_items, dim]`` unit vectors: a random cluster centre plus isotropic noise (``noise`` its norm's scale)."""
    centres = g.standard_normal((clusters, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    which = g.integers(0, clusters, n_items)
    v = centres[which] + noise * g.standard_normal((n_items, dim)) / np.sqrt(dim)
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def _user_choices(
    g,
    vectors: np.ndarray,
    lengths: np.ndarray,
    modality: np.ndarray,
    log_pop: np.ndarray,
    tau: float,
    taste_noise: float,
) -> list[np.ndarray]:
    """Each user's items, drawn without replacement from ``softmax(cos(v^m, t_u)/τ + β log pop)`` (Gumbel top-k),
    in a random order (the order becomes time)."""
    n_items, dim = vectors.shape[1:]
    out = []
    for length, m in zip(lengths, modality):
        anchor = vectors[m, g.integers(0, n_items)]  # a taste near an item: inside one of the modality's clusters
        taste = anchor + taste_noise * g.standard_normal(dim) / np.sqrt(dim)
        taste /= np.linalg.norm(taste)
        logits = vectors[m] @ taste / tau + log_pop + g.gumbel(size=n_items)
        top = np.argpartition(-logits, length - 1)[:length]
        out.append(g.permutation(top))
    return out


def planted_data(
    n_users: int = 1600,
    n_items: int = 1200,
    mean_items: float = 20.0,
    *,
    preference: str = "mixed",
    dim: int = 64,
    clusters: int = 16,
    noise: float = 1.0,
    tau: float = 0.1,
    taste_noise: float = 0.5,
    popularity: float = 0.5,
    min_items: int = 5,
    seed: int = 0,
    name: str | None = None,
):
    """The planted-preference data (split leave-one-out), its two modalities in ``data.features`` and each user's
    planted modality in ``data.users["planted"]`` (indexed by internal user id)."""
    import pandas as pd

    from ..datasets import InteractionData
    from ..datasets.splits import leave_one_out

    if preference not in PREFERENCES:
        raise ValueError(f"preference must be one of {', '.join(PREFERENCES)}, got {preference!r}")
    if n_items < 4 * min_items:
        raise ValueError("n_items must be at least four times min_items")
    g = np.random.default_rng(seed)
    vectors = np.stack([_modality_vectors(g, n_items, dim, clusters, noise) for _ in MODALITIES])
    if preference == "mixed":
        modality = g.integers(0, len(MODALITIES), n_users)
    else:
        modality = np.full(n_users, MODALITIES.index(preference))
    lengths = np.minimum(min_items + g.geometric(1.0 / max(mean_items - min_items + 1, 1.0), n_users) - 1, n_items // 4)
    # a popularity every user shares (the ID table's part of the signal), independent of either modality
    log_pop = popularity * np.log(1.0 / np.arange(1, n_items + 1))[g.permutation(n_items)]
    items = _user_choices(g, vectors, lengths, modality, log_pop, tau, taste_noise)
    user = np.repeat(np.arange(n_users), lengths)
    data = InteractionData.from_raw(
        name or f"synthetic-planted-{n_users}x{n_items}-{preference}",
        user,
        np.concatenate(items),
        timestamp=np.arange(len(user), dtype=np.float64),
        item_order=np.arange(n_items),
    )
    raw = np.asarray(data.user_ids, dtype=np.int64)
    data.users = pd.DataFrame({"planted": np.asarray(MODALITIES)[modality[raw]]})
    data.features = {m: vectors[k] for k, m in enumerate(MODALITIES)}
    data = leave_one_out(data)
    return data


def planted_source(source: str, seed: int = 0):
    """The data a ``synthetic-planted:USERSxITEMS[:PREFERENCE]`` source names (20 interactions per user on average,
    16 clusters per modality), split leave-one-out."""
    from ..errors import ConfigError
    from .synthetic import source_sizes

    parts = source[len(PLANTED_PREFIX) :].lower().split(":")
    users, items = source_sizes(
        parts[0],
        source,
        "a planted source is synthetic-planted:USERSxITEMS[:PREFERENCE]",
        "e.g. synthetic-planted:1600x1200 or synthetic-planted:1600x1200:image",
    )
    preference = parts[1] if len(parts) > 1 else "mixed"
    if len(parts) > 2 or preference not in PREFERENCES:
        raise ConfigError(f"SOURCE {source!r}", f"the preference must be one of {', '.join(PREFERENCES)}")
    if users < 1 or items < 20:
        raise ConfigError(f"SOURCE {source!r}", "a planted source needs at least 1 user and 20 items")
    return planted_data(users, items, preference=preference, seed=seed)
