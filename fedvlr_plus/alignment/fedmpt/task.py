"""FedMPT's tagging task on real data: the items' content and usage-feature tokens, rater tokens, the label matrix
and the condition sentences of the prompts, and the split of the labelled items."""
from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

import numpy as np

from ...errors import ConfigError


@dataclass
class TaggingTask:
    """Everything the method needs about the items, already numeric. No raw text travels past this point."""

    tokens: np.ndarray                 #: [n_items, T, d] frozen text-token embeddings (zero-padded)
    token_mask: np.ndarray             #: [n_items, T] bool
    side: dict[str, np.ndarray]        #: feature group -> [n_items, k] standardised features (one token each)
    labels: np.ndarray                 #: [n_items, L] float32 multi-hot
    label_names: list[str]
    prompt_emb: np.ndarray             #: [N, L, d] frozen embeddings of the condition sentences
    base_prompt_emb: np.ndarray        #: [L, d] frozen embeddings of the baseline sentence
    condition_names: list[str]
    #: optional set-valued evidence: one token per sampled rater of the item, [n_items, K, k] (a label-free user
    #: embedding and the rating given; see :func:`rater_tokens`) and its mask [n_items, K]
    raters: np.ndarray | None = None
    rater_mask: np.ndarray | None = None

    @property
    def n_items(self) -> int:
        return int(self.labels.shape[0])

    @property
    def dim(self) -> int:
        return int(self.tokens.shape[-1])


def load_conditions(path=None) -> dict:
    """A condition list: the shipped one (``fedvlr_plus/alignment/fedmpt/data/fedmpt_conditions.json``, written for
    films) or a JSON file of the same layout (``baseline`` and ``conditions[].template`` with ``{label}``)."""
    if path is None:
        where = "fedmpt_conditions.json"
        text = resources.files(__package__).joinpath("data/fedmpt_conditions.json").read_text(encoding="utf-8")
    else:
        where = str(path)
        with open(path, encoding="utf-8") as f:
            text = f.read()
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e})") from e
    if not spec.get("conditions") or "baseline" not in spec:
        raise ValueError(f"{where}: needs a 'baseline' template and a non-empty 'conditions' list")
    for k, c in enumerate(spec["conditions"]):
        if "{label}" not in c.get("template", "") or "name" not in c:
            raise ValueError(f"{where}: conditions[{k}] needs a 'name' and a 'template' containing {{label}}")
    return spec


def prompt_sentences(label_names: list[str], conditions: dict) -> tuple[list[list[str]], list[str]]:
    """Condition sentences [N][L] and baseline sentences [L] for these labels."""
    rename = conditions.get("label_text", {})
    text = [rename.get(c, c.lower()) for c in label_names]
    cond = [[c["template"].format(label=t) for t in text] for c in conditions["conditions"]]
    base = [conditions["baseline"].format(label=t) for t in text]
    return cond, base


def item_side_features(data, idx_items: int | None = None) -> dict[str, np.ndarray]:
    """Per-item usage features from the interactions and user attributes (none of them reads the labels).

    Groups: ``year`` (release decade one-hot + standardised year, when ``release_year`` exists), ``ratings``
    (5-bin rating histogram shares and mean), ``popularity`` (log count), and where user attributes exist ``age``
    (rater shares in six bands), ``gender`` (share of each value) and ``occupation`` (shares). Every column is
    standardised over all items.
    """
    n = data.n_items if idx_items is None else idx_items
    inter = data.inter
    groups: dict[str, np.ndarray] = {}
    if "release_year" in data.items.columns:
        import pandas as pd

        yr = pd.to_numeric(data.items["release_year"].reindex(range(n)), errors="coerce").to_numpy(np.float64)
        ok = np.isfinite(yr)
        dec = np.zeros((n, 8))
        bins = np.clip(((np.nan_to_num(yr, nan=1990) - 1930) // 10).astype(int), 0, 7)
        dec[np.arange(n)[ok], bins[ok]] = 1
        groups["year"] = np.column_stack([dec, np.where(ok, yr, np.nanmean(yr) if ok.any() else 0.0)])
    items = inter["item"].to_numpy()
    cnt = np.bincount(items, minlength=n).astype(np.float64)
    denom = np.maximum(cnt, 1)[:, None]
    r = inter["rating"].to_numpy().astype(np.float64)
    if np.unique(r).size > 1:
        rb = np.clip(np.rint(r).astype(int), 1, 5) - 1
        hist = np.zeros((n, 5))
        np.add.at(hist, (items, rb), 1)
        mean = np.bincount(items, weights=r, minlength=n) / np.maximum(cnt, 1)
        groups["ratings"] = np.column_stack([hist / denom, mean])
    groups["popularity"] = np.log1p(cnt)[:, None]
    users = data.users
    if len(users):
        u = inter["user"].to_numpy()
        if "age" in users.columns:
            age = np.asarray(users["age"].reindex(range(data.n_users)), dtype=np.float64)
            band = np.digitize(np.nan_to_num(age, nan=30), [18, 25, 35, 45, 55])
            sh = np.zeros((n, 6))
            np.add.at(sh, (items, band[u]), 1)
            groups["age"] = sh / denom
        for col in ("gender", "occupation"):
            if col in users.columns:
                codes, _ = users[col].reindex(range(data.n_users)).astype(str).factorize()
                sh = np.zeros((n, codes.max() + 1))
                np.add.at(sh, (items, codes[u]), 1)
                groups[col] = sh / denom
    out = {}
    for g, x in groups.items():
        sd = x.std(0)
        out[g] = ((x - x.mean(0)) / np.where(sd > 0, sd, 1.0)).astype(np.float32)
    return out


def item_label_matrix(data, *, min_count: int = 2, max_share: float = 0.9) -> tuple[np.ndarray, list[str]]:
    """Multi-hot labels from ``items.categories``; drops labels on fewer than ``min_count`` items or on more than
    ``max_share`` of the labelled items (a catalogue-wide tag such as "Magazine Subscriptions" says nothing)."""
    if "categories" not in data.items.columns:
        raise ConfigError(f"{data.source or data.name}", "the items have no 'categories' column to use as labels")
    cats = [list(c) if isinstance(c, (list, tuple, np.ndarray)) else [] for c in
            data.items["categories"].reindex(range(data.n_items))]
    names = sorted({c for cs in cats for c in cs})
    col = {c: j for j, c in enumerate(names)}
    y = np.zeros((data.n_items, len(names)), np.float32)
    for i, cs in enumerate(cats):
        for c in cs:
            y[i, col[c]] = 1
    labelled = y.any(1).sum()
    keep = (y.sum(0) >= min_count) & (y.sum(0) <= max_share * max(labelled, 1))
    if keep.sum() < 2:
        raise ConfigError(f"{data.source or data.name}", "fewer than 2 usable labels in items.categories, each "
                          f"needing >= {min_count} items and <= {max_share:.0%} of the labelled items",
                          "FedMPT's labels are the items' categories: use a data set whose items have them")
    return y[:, keep], [n for n, k in zip(names, keep) if k]


def build_task(data, embed_tokens, embed_sentences, conditions: dict | None = None, *, max_tokens: int = 16,
               min_count: int = 2, proj_dim: int | None = 96, raters: int = 0,
               rater_dim: int = 32) -> tuple[TaggingTask, np.ndarray]:
    """A :class:`TaggingTask` from an :class:`InteractionData` and two offline encoders.

    ``embed_tokens(texts) -> list of [T_i, d] arrays`` (token outputs of the text encoder) and
    ``embed_sentences(texts) -> [n, d]``. Items text = title (description when there is no title). Returns the task
    and the ids of the items that carry at least one kept label (the only ones used for training and testing).
    ``proj_dim``: project tokens and prompts onto this many fixed directions (None keeps the encoder's width).
    ``raters``: also give every item up to this many rater tokens (:func:`rater_tokens`, rank ``rater_dim``; 0: none).
    """
    conditions = conditions or load_conditions()
    y, names = item_label_matrix(data, min_count=min_count)
    items = data.items.reindex(range(data.n_items))
    title = items["title"].fillna("").astype(str) if "title" in items.columns else None
    desc = items["description"].fillna("").astype(str) if "description" in items.columns else None
    texts = []
    for i in range(data.n_items):
        t = title.iloc[i].strip() if title is not None else ""
        if not t and desc is not None:
            t = desc.iloc[i].strip()
        texts.append(t or "untitled")
    tok_list = embed_tokens(texts)
    d = int(np.asarray(tok_list[0]).shape[-1])
    tokens = np.zeros((data.n_items, max_tokens, d), np.float32)
    mask = np.zeros((data.n_items, max_tokens), bool)
    for i, t in enumerate(tok_list):
        t = np.asarray(t, dtype=np.float32)[:max_tokens]
        tokens[i, :len(t)] = t
        mask[i, :len(t)] = True
    cond, base = prompt_sentences(names, conditions)
    flat = embed_sentences([s for row in cond for s in row])
    prompt_emb = np.asarray(flat, np.float32).reshape(len(cond), len(names), -1)
    base_emb = np.asarray(embed_sentences(base), np.float32)
    if proj_dim and proj_dim < d:
        # one fixed linear map for tokens and prompts alike (the top right-singular vectors of the stacked,
        # uncentred token and prompt embeddings): cosines keep most of their structure and every step gets
        # d / proj_dim times cheaper; no label is read
        stack = np.concatenate([tokens[mask], prompt_emb.reshape(-1, d), base_emb])
        basis = np.linalg.svd(stack.astype(np.float64), full_matrices=False)[2][:proj_dim].T.astype(np.float32)
        tokens = tokens @ basis
        prompt_emb = prompt_emb @ basis
        base_emb = base_emb @ basis
    task = TaggingTask(tokens=tokens, token_mask=mask, side=item_side_features(data), labels=y, label_names=names,
                       prompt_emb=prompt_emb, base_prompt_emb=base_emb,
                       condition_names=[c["name"] for c in conditions["conditions"]])
    if raters:
        task.raters, task.rater_mask = rater_tokens(data, max_raters=raters, dim=rater_dim)
    return task, np.flatnonzero(y.any(1))


def split_items(ids: np.ndarray, test_share: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    perm = rng.permutation(ids)
    n_test = int(round(test_share * len(ids)))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def rater_tokens(data, *, max_raters: int = 32, dim: int = 32, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Set-valued item evidence: for each item, up to ``max_raters`` of its raters, each one token.

    A rater's token is ``[u, r - mean_u]``: ``u`` its row of a rank-``dim`` truncated SVD of the binary user x item
    matrix (every interaction; no label is read: genres never enter), scaled by the singular values' square roots,
    and the rating it gave this item centred on its own mean rating. Items with more raters keep a seeded random
    sample of them. Returns ``(tokens [n_items, K, dim + 1] float32, mask [n_items, K] bool)``; columns are
    standardised over all rater tokens.
    """
    import scipy.sparse as sp
    from scipy.sparse.linalg import svds

    inter = data.inter
    u = inter["user"].to_numpy()
    i = inter["item"].to_numpy()
    r = inter["rating"].to_numpy().astype(np.float64) if "rating" in inter.columns else np.ones(len(u))
    n_u, n_i = int(data.n_users), int(data.n_items)
    k = max(1, min(dim, min(n_u, n_i) - 1))
    m = sp.csr_matrix((np.ones(len(u)), (u, i)), shape=(n_u, n_i))
    m.data[:] = 1.0                                                         # repeated pairs count once
    uu, ss, _ = svds(m, k=k, random_state=seed)
    emb = uu[:, ::-1] * np.sqrt(ss[::-1])[None]
    mean_u = np.bincount(u, weights=r, minlength=n_u) / np.maximum(np.bincount(u, minlength=n_u), 1)
    feat = np.column_stack([emb[u], r - mean_u[u]])                        # one row per interaction
    sd = feat.std(0)
    feat = ((feat - feat.mean(0)) / np.where(sd > 0, sd, 1.0)).astype(np.float32)
    rng = np.random.default_rng(seed)
    order = np.argsort(i, kind="stable")
    starts = np.searchsorted(i[order], np.arange(n_i + 1))
    tokens = np.zeros((n_i, max_raters, feat.shape[1]), np.float32)
    mask = np.zeros((n_i, max_raters), bool)
    for item in range(n_i):
        rows = order[starts[item]:starts[item + 1]]
        if len(rows) > max_raters:
            rows = np.sort(rng.choice(rows, max_raters, replace=False))
        tokens[item, :len(rows)] = feat[rows]
        mask[item, :len(rows)] = True
    return tokens, mask
