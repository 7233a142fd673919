"""FedDTL's task on a rating dataset: item texts and their content embeddings, warm and cold items, the users'
dominant labels and the label-skewed Dirichlet split of users over clients."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError


@dataclass
class RecTask:
    """Item content embeddings, per-user train histories and held-out targets, cold items."""

    content: np.ndarray  #: [n_items, d] frozen, unit-norm
    histories: list[np.ndarray]  #: per user: train item ids (warm items only)
    warm_target: np.ndarray  #: [n_users] item id or -1
    cold_target: np.ndarray  #: [n_users] item id or -1
    warm_items: np.ndarray  #: ids of the items with training interactions
    cold_items: np.ndarray
    user_genre: np.ndarray  #: [n_users] dominant genre index (for the label-skewed split)
    #: per user: the train items that may be a training target (few-shot: :func:`few_shot_targets`); None = all
    labelled: list[np.ndarray] | None = None
    #: [n_items] one class per item, for the label skew over examples (:mod:`.dtl_examples`); None = not set
    item_class: np.ndarray | None = None

    @property
    def n_items(self) -> int:
        return int(self.content.shape[0])

    @property
    def dim(self) -> int:
        return int(self.content.shape[1])


def item_texts(data) -> list[str]:
    """ "title. genre, genre. year" per item (what the server tower reads)."""
    items = data.items.reindex(range(data.n_items))
    out = []
    for _, row in items.iterrows():
        parts = [str(row.get("title") or "").strip()]
        cats = row.get("categories")
        if isinstance(cats, (list, tuple, np.ndarray)) and len(cats):
            parts.append(", ".join(map(str, cats)))
        year = row.get("release_year")
        if year is not None and str(year).strip().isdigit():
            parts.append(str(year).strip())
        out.append(". ".join(p for p in parts if p) or "untitled")
    return out


def _category_labels(data) -> list[list[int]]:
    """Label ids per item from ``data.items["categories"]`` (an item without one gets the label "(none)")."""
    cats = data.items["categories"].reindex(range(data.n_items)) if "categories" in data.items.columns else None
    names: dict[str, int] = {}
    item_labels = []
    for i in range(data.n_items):
        cs = cats.iloc[i] if cats is not None else None
        cs = list(cs) if isinstance(cs, (list, tuple, np.ndarray)) and len(cs) else ["(none)"]
        item_labels.append([names.setdefault(c, len(names)) for c in cs])
    return item_labels


def dominant_labels(
    data, histories: list[np.ndarray], rule: str = "count", min_share: float = 0.1, item_class: np.ndarray | None = None
) -> np.ndarray:
    """Each user's dominant genre/category over its train items (an item's labels share weight 1).

    ``rule="count"``: the genre with the largest weight in the history (on ml-100k 623 of 943 users get Drama, so a
    Dirichlet split over it is only a mild skew). ``rule="lift"``: the genre most over-represented in the history,
    ``argmax_c share_u(c) / share_all(c)`` (the global share over all users' train histories), among the genres
    that make up at least ``min_share`` of the history (so one odd item cannot decide); a user with no such genre
    falls back to the count rule. ``item_class`` (one class id per item) replaces the catalogue's categories.
    """
    if rule not in ("count", "lift"):
        raise ValueError(f"dominant-genre rule must be 'count' or 'lift', got {rule!r}")
    item_labels = _category_labels(data) if item_class is None else [[int(c)] for c in item_class]
    n_labels = max((c for cs in item_labels for c in cs), default=0) + 1
    w = np.zeros((len(histories), n_labels))
    for u, h in enumerate(histories):
        for i in h:
            for c in item_labels[i]:
                w[u, c] += 1.0 / len(item_labels[i])
    out = np.argmax(w, 1).astype(np.int64)
    if rule == "lift":
        share = w / np.maximum(w.sum(1, keepdims=True), 1e-12)
        glob = w.sum(0) / max(w.sum(), 1e-12)
        lift = np.where((share >= min_share) & (glob > 0)[None], share / np.maximum(glob, 1e-12)[None], -np.inf)
        ok = np.isfinite(lift).any(1)
        out[ok] = np.argmax(lift[ok], 1)
    out[w.sum(1) == 0] = 0
    return out


def build_task(
    data,
    content: np.ndarray,
    *,
    cold_share: float = 0.2,
    seed: int = 0,
    dominant: str = "count",
    item_class: np.ndarray | None = None,
    novel: np.ndarray | None = None,
    valid: bool = False,
) -> RecTask:
    """Cold items (a random ``cold_share`` of the rated items, or with ``novel`` every rated item of those
    classes of ``item_class``) lose every training interaction. Per user, the latest warm interaction and the
    latest cold interaction are held out; the other warm ones are the history. Without timestamps (all equal)
    "latest" is a seeded random order. ``valid``: those test targets are dropped first and the next latest are
    held out instead (the test targets never enter the task). ``dominant``: how a user's label for the
    label-skewed split is chosen (:func:`dominant_labels`, over ``item_class`` when given)."""
    rng = np.random.default_rng(seed)
    inter = _ordered(data.inter, seed)
    rated = np.unique(inter["item"].to_numpy())
    if novel is not None:
        cold = rated[np.isin(np.asarray(item_class)[rated], novel)]
    else:
        cold = np.sort(rng.choice(rated, size=int(round(cold_share * len(rated))), replace=False))
    is_cold = np.zeros(data.n_items, bool)
    is_cold[cold] = True
    histories, wt, ct = [], np.full(data.n_users, -1), np.full(data.n_users, -1)
    for u, grp in inter.groupby("user", sort=True):
        items = grp["item"].to_numpy()
        warm = items[~is_cold[items]]
        cold_u = items[is_cold[items]]
        if valid:  # the test targets are removed, as if never observed
            warm = warm[:-1] if len(warm) >= 2 else warm
            cold_u = cold_u[:-1]
        if len(warm) >= 2:
            wt[u] = warm[-1]
            warm = warm[:-1]
        if len(cold_u):
            ct[u] = cold_u[-1]
        histories.append(np.unique(warm))
    while len(histories) < data.n_users:
        histories.append(np.zeros(0, np.int64))
    warm_items = np.flatnonzero(~is_cold & np.isin(np.arange(data.n_items), rated))
    content = np.asarray(content, np.float32)
    content = content / np.linalg.norm(content, axis=1, keepdims=True).clip(1e-12)
    return RecTask(
        content=content,
        histories=histories,
        warm_target=wt,
        cold_target=ct,
        warm_items=warm_items,
        cold_items=cold,
        user_genre=dominant_labels(data, histories, dominant, item_class=item_class),
    )


def few_shot_targets(histories: list[np.ndarray], shots: int, seed: int) -> list[np.ndarray]:
    """Per user, the train items that stay labelled when every item (a class here) keeps at most ``shots``
    training examples over all users, drawn with ``seed``: the few-shot regime of base-to-novel prompt learning
    (K labelled examples per class). A user's whole history stays its input (the context of every example and
    what evaluation masks); only which of its items may be a training target is limited."""
    items = np.concatenate([np.asarray(h, np.int64) for h in histories] + [np.zeros(0, np.int64)])
    rng = np.random.default_rng([int(seed), 13])
    order = rng.permutation(len(items))
    order = order[np.argsort(items[order], kind="stable")]  # each item's examples in a seeded random order
    by_item = items[order]
    rank = np.arange(len(order)) - np.searchsorted(by_item, by_item, side="left")  # position among its item's
    keep = order[rank < shots]
    kept = np.zeros(len(items), bool)
    kept[keep] = True
    bounds = np.cumsum([0] + [len(h) for h in histories])
    return [items[bounds[u] : bounds[u + 1]][kept[bounds[u] : bounds[u + 1]]] for u in range(len(histories))]


def _ordered(inter, seed: int):
    """Interactions by user, then time; a log without timestamps gets a seeded random order per user instead."""
    if inter["timestamp"].nunique() > 1:
        return inter.sort_values(["user", "timestamp", "item"], kind="stable")
    key = np.random.default_rng([int(seed), 11]).permutation(len(inter))
    return inter.assign(_order=key).sort_values(["user", "_order"], kind="stable").drop(columns="_order")


def label_shares(rng, n_labels: int, n_clients: int, alpha: float, present) -> np.ndarray:
    """``[n_labels, n_clients]``: each label's shares over the clients, a Dirichlet(alpha) draw per label, or for
    ``alpha == 0`` the Dirichlet's limit, every label wholly at one client: the ``present`` labels (those with
    something to deal) in a shuffled order dealt round-robin, so that every client holds one when there are as
    many labels as clients (the pathological split of McMahan et al., arXiv 1602.05629)."""
    if alpha > 0:
        return rng.dirichlet(np.full(n_clients, alpha), size=n_labels)
    present = np.asarray(present, np.int64)
    if len(present) < n_clients:
        raise ConfigError(
            f"--alpha 0 --clients {n_clients}",
            f"each class goes to one client, and only {len(present)} classes have training examples",
            "use fewer clients or --alpha > 0",
        )
    shares = np.zeros((n_labels, n_clients))
    shares[rng.permutation(present), np.arange(len(present)) % n_clients] = 1.0
    return shares


def dirichlet_split(labels: np.ndarray, n_clients: int, alpha: float, seed: int = 0) -> np.ndarray:
    """Client id per user: for every label, its users are dealt to clients in Dirichlet(alpha) proportions
    (Hsu, Qi & Brown, arXiv 1909.06335); ``alpha == 0``: each label's users all to one client
    (:func:`label_shares`). Redraws until every client has a user."""
    rng = np.random.default_rng(seed)
    for _ in range(100):
        out = np.zeros(len(labels), np.int64)
        present = np.unique(labels)
        if alpha == 0:
            limit = label_shares(rng, int(present.max()) + 1, n_clients, 0.0, present)
        for g in present:
            users = rng.permutation(np.flatnonzero(labels == g))
            props = limit[g] if alpha == 0 else rng.dirichlet(np.full(n_clients, alpha))
            out[users] = rng.choice(n_clients, size=len(users), p=props)
        if len(np.unique(out)) == n_clients:
            return out
    raise ConfigError(
        f"--clients {n_clients} --alpha {alpha}",
        "no draw of 100 gave every client a user",
        "use fewer clients or a larger --alpha",
    )


def class_mix(item_lists, weights: np.ndarray) -> np.ndarray:
    """The label shares of the items in ``item_lists`` (arrays of item ids, repeats counted), from ``weights``:
    [n_items, n_labels] item label weights, rows summing to 1 or 0."""
    items = np.concatenate(list(item_lists) + [np.zeros(0, np.int64)]).astype(np.int64)
    x = np.bincount(items, minlength=weights.shape[0]).astype(np.float64) @ weights
    return x / max(x.sum(), 1e-12)


def label_skew(genres: np.ndarray, task: RecTask, assign: np.ndarray) -> list[float]:
    """Per client, the total-variation distance between the label mix of its users' train items and the global
    mix (``genres``: [n_items, n_labels] item label weights, rows summing to 1 or 0): how skewed the split is over
    the items, which are the classes here."""
    return client_skew(
        [[task.histories[u] for u in np.flatnonzero(assign == c)] for c in range(int(assign.max()) + 1)], genres
    )


def client_skew(per_client: list, weights: np.ndarray) -> list[float]:
    """Per client, the total-variation distance between the label mix of its item lists (``per_client[c]``: arrays
    of item ids) and the mix of every client's lists together (``weights`` as in :func:`class_mix`)."""
    everything = class_mix([items for lists in per_client for items in lists], weights)
    return [float(0.5 * np.abs(class_mix(lists, weights) - everything).sum()) for lists in per_client]


def item_label_weights(data) -> np.ndarray:
    """[n_items, n_labels] genre weights (an item's labels share weight 1; items without labels are zero rows)."""
    cats = data.items["categories"].reindex(range(data.n_items)) if "categories" in data.items.columns else None
    lists = [
        list(c) if isinstance(c, (list, tuple, np.ndarray)) else []
        for c in (cats if cats is not None else [None] * data.n_items)
    ]
    names = {c: j for j, c in enumerate(sorted({c for cs in lists for c in cs}))}
    out = np.zeros((data.n_items, max(len(names), 1)))
    for i, cs in enumerate(lists):
        for c in cs:
            out[i, names[c]] += 1.0 / len(cs)
    return out


def minilm_content(data, device: str = "cpu", cache_dir=None) -> np.ndarray:
    """MiniLM embeddings of :func:`item_texts`; kept in ``cache_dir`` (keyed by the texts) when one is given."""
    from ...views.sentence_encoder import SentenceEncoder

    embed = SentenceEncoder(device=device, progress=False).embed
    if cache_dir:
        from ..fedmpt.encoders import cached_encoders

        embed = cached_encoders(None, embed, cache_dir)[1]
    return embed(item_texts(data))
