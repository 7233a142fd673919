"""Preference pairs ``(context, chosen, rejected)`` from real data, and client partitions with different tastes.

Two sources:

- **Ratings** (:func:`rating_pairs`): for each user, every pair of rated items whose ratings differ by at least
  ``min_gap`` gives (context = the user's taste vector, chosen = the higher-rated item's features, rejected = the
  lower-rated one's). The taste vector is the mean of the user's *other* rated items' features weighted by the
  centred rating (r_k - mean_u), so the two items of a pair never leak into their own context.
- **HH-RLHF** (:func:`hh_pairs`; Bai et al., "Training a Helpful and Harmless Assistant with RLHF",
  arXiv 2204.05862): each dialogue pair is split at its last ``"\\n\\nAssistant:"`` into a shared prompt and the two
  final responses (pairs whose responses are equal are dropped). Texts are embedded with the offline text encoder
  (all-MiniLM-L6-v2 by default): context = e(last human turn), chosen/rejected = e(last human turn + response).
  The prompt is cut to its last human turn because MiniLM truncates at 256 tokens: the whole dialogue would cut off
  the responses and make chosen and rejected embed alike. Embeddings are cached on disk (atomic ``.npz``).

Clients whose preferences genuinely differ: helpful-base vs harmless-base (the standard conflicting setting),
MovieLens-100K user groups by age band, gender or occupation (mild differences, see docs/alignment.md,
"Preference pairs"), or taste groups (k-means over users' centred genre profiles), and the VPL-style annotator
types on real items (:func:`annotator_pairs`: "quality" vs "family" raters; only the pairs where they disagree).

The harmless-base split holds offensive red-team text: nothing here logs or prints dialogue text.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..errors import ConfigError

HH_SPLITS = ("harmless-base", "helpful-base", "helpful-online", "helpful-rejection-sampled")
ASSISTANT = "\n\nAssistant:"
HUMAN = "\n\nHuman:"
#: genres the "family" annotator likes / avoids (the annotator types: docs/alignment.md, "Preference pairs")
FAMILY_LIKES = ("Children's", "Animation", "Musical")
FAMILY_AVOIDS = ("Horror", "Thriller", "Crime")
CACHE_VERSION = 1


@dataclass
class PreferencePairs:
    """Preference pairs as aligned arrays (row n is one pair).

    ``context`` [N, dc], ``chosen`` / ``rejected`` [N, d] float32 features; ``client`` [N] the client holding the
    pair; ``group`` [N] the client type (an index into ``group_names``); ``user`` / ``chosen_item`` /
    ``rejected_item`` [N] ids where the pairs come from ratings (-1 otherwise).
    """

    context: np.ndarray
    chosen: np.ndarray
    rejected: np.ndarray
    client: np.ndarray
    group: np.ndarray
    group_names: tuple[str, ...]
    user: np.ndarray | None = None
    chosen_item: np.ndarray | None = None
    rejected_item: np.ndarray | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        n = len(self.context)
        for name in ("chosen", "rejected", "client", "group"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"PreferencePairs: {name} has {len(getattr(self, name))} rows, context has {n}")
        if self.chosen.shape != self.rejected.shape:
            raise ValueError(f"PreferencePairs: chosen {self.chosen.shape} and rejected {self.rejected.shape} differ")
        for name in ("user", "chosen_item", "rejected_item"):
            if getattr(self, name) is None:
                setattr(self, name, np.full(n, -1, np.int64))

    def __len__(self) -> int:
        return len(self.context)

    @property
    def n_clients(self) -> int:
        return int(self.client.max()) + 1 if len(self) else 0

    def take(self, idx) -> PreferencePairs:
        idx = np.asarray(idx)
        return replace(self, context=self.context[idx], chosen=self.chosen[idx], rejected=self.rejected[idx],
                       client=self.client[idx], group=self.group[idx], user=self.user[idx],
                       chosen_item=self.chosen_item[idx], rejected_item=self.rejected_item[idx])

    def of_client(self, cid: int) -> PreferencePairs:
        return self.take(np.flatnonzero(self.client == cid))

    def client_groups(self) -> np.ndarray:
        """The type of each client 0..n_clients-1 (a client holds pairs of one type)."""
        out = np.full(self.n_clients, -1, np.int64)
        out[self.client] = self.group
        return out


# ------------------------------------------------------------------------------------------------ splitting
def holdout_split(pairs: PreferencePairs, test_fraction: float = 0.2, *, seed: int = 0,
                  by: str = "client") -> tuple[PreferencePairs, PreferencePairs]:
    """Split each client's pairs into train / held-out (``by="client"``), or, for rating pairs, hold out whole
    users inside each client (``by="user"``) so that no held-out pair shares its user with a training pair."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if by not in ("client", "user"):
        raise ValueError(f"by must be 'client' or 'user', got {by!r}")
    rng = np.random.default_rng(seed)
    test = np.zeros(len(pairs), bool)
    if by == "user" and len(pairs) and (pairs.user >= 0).all():
        # whole users, drawn within each client's users, held out everywhere (a user may span clients)
        held = []
        for c in np.unique(pairs.client):
            users = np.unique(pairs.user[pairs.client == c])
            held.append(rng.choice(users, size=max(1, int(round(test_fraction * len(users)))), replace=False))
        test = np.isin(pairs.user, np.concatenate(held))
        return pairs.take(np.flatnonzero(~test)), pairs.take(np.flatnonzero(test))
    for c in np.unique(pairs.client):
        rows = np.flatnonzero(pairs.client == c)
        k = max(1, int(round(test_fraction * len(rows))))
        test[rng.choice(rows, size=min(k, len(rows) - 1) if len(rows) > 1 else 0, replace=False)] = True
    return pairs.take(np.flatnonzero(~test)), pairs.take(np.flatnonzero(test))


def assign_clients(group: np.ndarray, clients_per_group: int | Sequence[int], *, seed: int = 0) -> np.ndarray:
    """Deal the rows of each group at random over ``clients_per_group`` clients of that group.

    Client ids are contiguous per group: group 0 gets 0..k0-1, group 1 gets k0..k0+k1-1, ...
    """
    group = np.asarray(group)
    groups = np.unique(group)
    ks = [clients_per_group] * len(groups) if np.isscalar(clients_per_group) else list(clients_per_group)
    if len(ks) != len(groups) or min(ks) < 1:
        raise ValueError(f"clients_per_group must be positive, one per group ({len(groups)} groups), got {ks}")
    rng = np.random.default_rng(seed)
    client = np.empty(len(group), np.int64)
    start = 0
    for g, k in zip(groups, ks):
        rows = rng.permutation(np.flatnonzero(group == g))
        client[rows] = start + np.arange(len(rows)) % k
        start += k
    return client


# ------------------------------------------------------------------------------------------------ ratings
def genre_matrix(items) -> tuple[np.ndarray, tuple[str, ...]]:
    """Multi-hot genres [n_items, n_genres] from the ``categories`` column of an items frame."""
    if items is None or "categories" not in items:
        raise ValueError("the items frame has no 'categories' column (genres are needed)")
    cats = [c if isinstance(c, (list, tuple, np.ndarray)) else [] for c in items["categories"]]
    names = tuple(sorted({g for c in cats for g in c}))
    index = {g: j for j, g in enumerate(names)}
    m = np.zeros((len(cats), len(names)), np.float32)
    for i, c in enumerate(cats):
        for g in c:
            m[i, index[g]] = 1.0
    return m, names


def shipped_features(data, name: str, *, other: str = "") -> np.ndarray:
    """The feature array ``name`` the data set ships (``data.features``), as stored; an unknown name is refused in
    one line listing the arrays it does ship (``other``: what else ``--content`` accepts there)."""
    arrays = sorted(getattr(data, "features", {}) or {})
    if name not in arrays:
        raise ConfigError(f"--content {name}", f"not a feature array of {getattr(data, 'name', 'the data')}",
                          f"its arrays: {', '.join(arrays) or 'none'}{other}")
    return np.asarray(data.features[name])


def content_flag_hint(data) -> str:
    """What to pass as ``--content`` on ``data``: its feature arrays, or, where it ships none, where its format
    reads item content from."""
    arrays = sorted(getattr(data, "features", {}) or {})
    if arrays:
        return f"pass --content NAME, one of its feature arrays: {', '.join(arrays)}"
    from ..fedvlr.views import content_remedy

    return f"it ships no feature array either: {content_remedy(data)}"


def content_profiles(data, item_vectors: np.ndarray) -> np.ndarray:
    """Each user's mean item vector over ``data.inter``, centred on the mean of the users who have one, unit
    norm [n_users, d] (a user without interactions keeps zeros)."""
    n = int(data.n_users)
    u = data.inter["user"].to_numpy(np.int64)
    vec = np.asarray(item_vectors, np.float64)
    prof = np.zeros((n, vec.shape[1]))
    np.add.at(prof, u, vec[data.inter["item"].to_numpy(np.int64)])
    cnt = np.bincount(u, minlength=n)
    has = cnt > 0
    prof[has] = prof[has] / cnt[has, None] - (prof[has] / cnt[has, None]).mean(0)
    return prof / np.maximum(np.linalg.norm(prof, axis=1, keepdims=True), 1e-9)


def item_features(data, *, text: str = "none", encoder=None, cache_dir: str | os.PathLike | None = None,
                  progress: bool = False) -> np.ndarray:
    """Content features of every item: genres (multi-hot), a release-year code and, with ``text="title"``, the
    unit-norm MiniLM embedding of the title (cached). Float32 [n_items, d]."""
    genres, _ = genre_matrix(data.items)
    parts = [genres]
    if "release_year" in data.items:
        year = np.asarray(pd_numeric(data.items["release_year"]), np.float64)
        known = np.isfinite(year)
        fill = np.nanmedian(year) if known.any() else 1990.0
        year = np.where(known, year, fill)
        parts.append(((year - 1990.0) / 20.0)[:, None].astype(np.float32))
    if text == "title":
        titles = [str(t) if t is not None else "" for t in data.items.get("title", [""] * data.n_items)]
        parts.append(embed_texts(titles, encoder=encoder, cache_dir=cache_dir, progress=progress))
    elif text != "none":
        raise ValueError(f"text must be 'none' or 'title', got {text!r}")
    return np.concatenate(parts, axis=1).astype(np.float32)


def item_stats(data) -> np.ndarray:
    """Two rating statistics per item, standardised: mean rating (0 when unrated) and log(1 + number of ratings).
    Real item features a "quality" preference can be read from."""
    inter = data.inter.dropna(subset=["rating"])
    cnt = np.bincount(inter["item"], minlength=data.n_items).astype(np.float64)
    mean = np.bincount(inter["item"], inter["rating"], minlength=data.n_items) / np.maximum(cnt, 1)
    mean[cnt == 0] = mean[cnt > 0].mean() if (cnt > 0).any() else 0.0
    out = np.stack([mean, np.log1p(cnt)], 1)
    return ((out - out.mean(0)) / np.maximum(out.std(0), 1e-9)).astype(np.float32)


def pd_numeric(col):
    import pandas as pd

    return pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64)


def rating_pairs(data, feats: np.ndarray, *, min_gap: float = 2.0, max_pairs_per_user: int | None = 40,
                 splits: Sequence[int] | None = None, user_group: np.ndarray | None = None,
                 group_names: Sequence[str] = ("all",), seed: int = 0) -> PreferencePairs:
    """Pairs (user, higher-rated item, lower-rated item) with a rating gap >= ``min_gap``.

    ``splits`` restricts the ratings used (e.g. ``(0,)`` for the training part of a split dataset; None = all).
    ``user_group`` [n_users] assigns each user's pairs to a group (the client type; -1 drops the user); each group
    is one client. At most ``max_pairs_per_user`` pairs per user are drawn (seeded) so that heavy raters do not
    dominate.
    """
    inter = data.inter
    if splits is not None:
        inter = inter[inter["split"].isin(list(splits))]
    inter = inter.dropna(subset=["rating"])
    rng = np.random.default_rng(seed)
    ctx, ch, rj, us = [], [], [], []
    for u, df in inter.groupby("user", sort=True):
        items = df["item"].to_numpy(np.int64)
        r = df["rating"].to_numpy(np.float64)
        if user_group is not None and user_group[u] < 0:
            continue
        hi, lo = np.nonzero(r[:, None] - r[None, :] >= min_gap)
        if not len(hi):
            continue
        if max_pairs_per_user and len(hi) > max_pairs_per_user:
            keep = rng.choice(len(hi), max_pairs_per_user, replace=False)
            hi, lo = hi[keep], lo[keep]
        w = (r - r.mean())[:, None] * feats[items]            # centred-rating weighted features
        total = w.sum(0)
        denom = max(len(items) - 2, 1)
        # taste vector without the pair's own two items (no leakage of the label into the context)
        ctx.append((total[None, :] - w[hi] - w[lo]) / denom)
        ch.append(items[hi])
        rj.append(items[lo])
        us.append(np.full(len(hi), u, np.int64))
    if not ctx:
        raise ValueError(f"{getattr(data, 'name', 'data')}: no rating pair with a gap >= {min_gap}")
    user = np.concatenate(us)
    chosen_item, rejected_item = np.concatenate(ch), np.concatenate(rj)
    group = user_group[user] if user_group is not None else np.zeros(len(user), np.int64)
    return PreferencePairs(context=np.concatenate(ctx).astype(np.float32), chosen=feats[chosen_item],
                           rejected=feats[rejected_item], client=group.astype(np.int64).copy(),
                           group=group.astype(np.int64), group_names=tuple(group_names), user=user,
                           chosen_item=chosen_item, rejected_item=rejected_item,
                           meta={"source": "ratings", "min_gap": float(min_gap)})


def user_groups(data, by: str = "age", *, k: int = 4, seed: int = 0,
                item_vectors: np.ndarray | None = None) -> tuple[np.ndarray, tuple[str, ...]]:
    """A group per user [n_users] and the group names.

    ``age``: under 25 / 25-44 / 45 and over; ``gender``; ``occupation`` (the ``k`` most frequent, others -1);
    ``taste``: k-means (k groups) over each user's centred genre profile (mean of (r - mean_u) x genres), or, with
    ``item_vectors`` [n_items, d], over each user's mean item vector minus the users' mean (implicit feedback:
    what a user interacted with, whatever its rating).
    """
    n = int(data.n_users)
    if by == "taste" and item_vectors is not None:
        labels, _ = kmeans(content_profiles(data, item_vectors), k, seed=seed)
        return labels.astype(np.int64), tuple(f"taste-{j}" for j in range(k))
    if by == "taste":
        genres, _ = genre_matrix(data.items)
        inter = data.inter.dropna(subset=["rating"])
        u = inter["user"].to_numpy(np.int64)
        r = inter["rating"].to_numpy(np.float64)
        mean_u = np.bincount(u, r, minlength=n) / np.maximum(np.bincount(u, minlength=n), 1)
        prof = np.zeros((n, genres.shape[1]))
        np.add.at(prof, u, (r - mean_u[u])[:, None] * genres[inter["item"].to_numpy(np.int64)])
        prof /= np.maximum(np.linalg.norm(prof, axis=1, keepdims=True), 1e-9)
        labels, _ = kmeans(prof, k, seed=seed)
        return labels.astype(np.int64), tuple(f"taste-{j}" for j in range(k))
    users = data.users
    if users is None or len(users) != n:
        raise ValueError(f"grouping by {by!r} needs the users attribute frame ({n} rows)")
    if by == "age":
        age = pd_numeric(users["age"])
        g = np.where(age < 25, 0, np.where(age < 45, 1, 2))
        g[~np.isfinite(age)] = -1
        return g.astype(np.int64), ("age<25", "age25-44", "age45+")
    if by == "gender":
        names = tuple(sorted(users["gender"].dropna().astype(str).unique()))
        idx = {s: j for j, s in enumerate(names)}
        return np.array([idx.get(str(s), -1) for s in users["gender"]], np.int64), names
    if by == "occupation":
        counts = users["occupation"].astype(str).value_counts()
        names = tuple(counts.index[:k])
        idx = {s: j for j, s in enumerate(names)}
        return np.array([idx.get(str(s), -1) for s in users["occupation"]], np.int64), names
    raise ValueError(f"unknown grouping {by!r} (age, gender, occupation, taste)")


#: draws per wanted pair before the annotator pairs give up (real MovieLens data needs about 10)
ANNOTATOR_TRIES = 1000


def _data_name(data) -> str:
    return str(getattr(data, "source", None) or getattr(data, "name", "the data"))


def _annotator_scores(data) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean rating, family score, items rated at least 20 times) for the two annotator types; data without
    ratings or without the family genres cannot give them, and is refused in one line."""
    genres, names = genre_matrix(data.items) if "categories" in data.items else (np.zeros((data.n_items, 0)), ())
    inter = data.inter.dropna(subset=["rating"])
    cnt = np.bincount(inter["item"], minlength=data.n_items)
    mean = np.bincount(inter["item"], inter["rating"], minlength=data.n_items) / np.maximum(cnt, 1)
    col = {g: j for j, g in enumerate(names)}
    fam = np.zeros(data.n_items, np.float32)
    for g in FAMILY_LIKES + FAMILY_AVOIDS:
        if g in col:
            fam += genres[:, col[g]] * (1.0 if g in FAMILY_LIKES else -1.0)
    pool = np.flatnonzero(cnt >= 20)                          # items with a reliable mean rating
    if len(pool) < 2 or np.ptp(fam[pool]) < 1:
        family = FAMILY_LIKES + FAMILY_AVOIDS
        raise ConfigError(_data_name(data), "the simulated annotator types need ratings and MovieLens genres (a "
                          f"family score from {', '.join(family)}); it has {len(pool)} items rated 20 or more "
                          f"times and {sum(g in col for g in family)} of those genres",
                          "use ml-100k or an HH-RLHF folder")
    return mean, fam, pool


def annotator_pairs(data, feats: np.ndarray, *, n_clients_per_type: int = 10, pairs_per_client: int = 40,
                    seed: int = 0) -> PreferencePairs:
    """VPL-style annotator types on real MovieLens items (Poddar et al. 2024; docs/alignment.md, "Preference pairs").

    Type 0 "quality" prefers the item with the higher mean rating; type 1 "family" prefers the item with the higher
    family score (+1 per Children's / Animation / Musical genre, -1 per Horror / Thriller / Crime). Only conflict
    pairs (the two types disagree, both with a clear margin) are kept, so a model that ignores the type is at 50%.
    Context = the mean features of the two items (the type is not visible in the context).
    """
    mean, fam, pool = _annotator_scores(data)
    rng = np.random.default_rng(seed)
    need = 2 * n_clients_per_type * pairs_per_client
    a, b = [], []
    for _ in range(ANNOTATOR_TRIES * need):
        if len(a) >= need:
            break
        i, j = rng.choice(pool, 2, replace=False)
        dq, df = mean[i] - mean[j], fam[i] - fam[j]
        if abs(dq) >= 0.5 and abs(df) >= 1 and np.sign(dq) != np.sign(df):
            a.append(i)
            b.append(j)
    if len(a) < need:
        raise ConfigError(_data_name(data), f"only {len(a)} of the {need} conflict pairs the two annotator types "
                          f"need were found in {ANNOTATOR_TRIES * need} draws", "use fewer clients or pairs per client")
    a, b = np.array(a), np.array(b)
    group = np.repeat([0, 1], n_clients_per_type * pairs_per_client)
    client = np.concatenate([np.arange(n_clients_per_type * pairs_per_client) % n_clients_per_type,
                             n_clients_per_type + np.arange(n_clients_per_type * pairs_per_client)
                             % n_clients_per_type])
    # quality prefers the higher mean rating, family the higher family score
    a_wins = np.where(group == 0, mean[a] > mean[b], fam[a] > fam[b])
    chosen = np.where(a_wins, a, b)
    rejected = np.where(a_wins, b, a)
    ctx = 0.5 * (feats[chosen] + feats[rejected])
    return PreferencePairs(context=ctx.astype(np.float32), chosen=feats[chosen], rejected=feats[rejected],
                           client=client.astype(np.int64), group=group.astype(np.int64),
                           group_names=("quality", "family"), chosen_item=chosen, rejected_item=rejected,
                           meta={"source": "annotators"})


# ------------------------------------------------------------------------------------------------ HH-RLHF
def split_dialogue(chosen: str, rejected: str) -> tuple[str, str, str] | None:
    """(prompt, chosen response, rejected response) split at the last ``Assistant:`` turn; None when the two
    dialogues do not share that prompt or the responses are equal."""
    k = chosen.rfind(ASSISTANT)
    if k < 0:
        return None
    prompt = chosen[:k]
    if not rejected.startswith(prompt + ASSISTANT):
        return None
    a = chosen[k + len(ASSISTANT):].strip()
    b = rejected[k + len(ASSISTANT):].strip()
    if a == b:
        return None
    return prompt, a, b


def last_human_turn(prompt: str, max_chars: int = 400) -> str:
    k = prompt.rfind(HUMAN)
    turn = prompt[k + len(HUMAN):] if k >= 0 else prompt
    return turn.strip()[-max_chars:]


def read_hh(path: str | os.PathLike, limit: int | None = None) -> list[tuple[str, str, str]]:
    """Read one HH-RLHF split file (gzip JSON lines); returns (prompt, chosen, rejected) triples."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"HH-RLHF file not found: {path}")
    out = []
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                trip = split_dialogue(row["chosen"], row["rejected"])
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{path}: line {lineno}: not an HH-RLHF pair ({type(e).__name__})") from None
            if trip is not None:
                out.append(trip)
                if limit is not None and len(out) >= limit:
                    break
    return out


def hh_file(root: str | os.PathLike, split: str) -> Path:
    if split not in HH_SPLITS:
        raise ValueError(f"unknown HH-RLHF split {split!r}; one of {', '.join(HH_SPLITS)}")
    root = Path(root)
    for name in (f"{split}-test.jsonl.gz", f"{split}.jsonl.gz", f"{split}-test.jsonl"):
        if (root / name).exists():
            return root / name
    raise FileNotFoundError(f"no file for HH-RLHF split {split!r} in {root} (looked for {split}-test.jsonl.gz)")


def default_cache_dir() -> Path:
    return Path(os.environ.get("FEDVLR_CACHE", Path.home() / ".cache" / "fedvlr_plus"))


def embed_texts(texts: list[str], *, encoder=None, cache_dir=None, progress: bool = False) -> np.ndarray:
    """Embed texts with ``encoder`` (anything with ``embed(list[str]) -> [n, d]``; default the offline MiniLM),
    cached on disk under a hash of the texts and the encoder's name."""
    name = getattr(encoder, "model_name", None) or getattr(encoder, "name", None) or "all-MiniLM-L6-v2"
    h = hashlib.sha256(f"v{CACHE_VERSION}|{name}|".encode())
    for t in texts:
        h.update(t.encode("utf-8", "replace"))
        h.update(b"\0")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = cache / "text-embeddings" / f"{h.hexdigest()[:32]}.npy"
    if path.exists():
        arr = np.load(path)
        if arr.shape[0] == len(texts):
            return arr
    if encoder is None:
        from ..views.sentence_encoder import SentenceEncoder

        encoder = SentenceEncoder(progress=progress)
    arr = np.asarray(encoder.embed(list(texts)), np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.npy")
    np.save(tmp, arr)
    os.replace(tmp, path)
    return arr


def hh_pairs(root: str | os.PathLike, splits: Sequence[str] = ("helpful-base", "harmless-base"), *,
             limit_per_split: int | None = None, encoder=None, cache_dir=None, clients_per_split: int = 1,
             seed: int = 0, progress: bool = False) -> PreferencePairs:
    """HH-RLHF pairs, one client type per split (group j = ``splits[j]``), dealt over ``clients_per_split``
    clients per type. Embeddings come from ``encoder`` (default offline MiniLM) and are cached."""
    triples, group = [], []
    for j, s in enumerate(splits):
        t = read_hh(hh_file(root, s), limit_per_split)
        triples += t
        group += [j] * len(t)
    if not triples:
        raise ValueError(f"no usable HH-RLHF pairs in {root} for {list(splits)}")
    turns = [last_human_turn(p) for p, _, _ in triples]
    texts = turns + [f"{h}\nAssistant: {a}" for h, (_, a, _) in zip(turns, triples)] + \
        [f"{h}\nAssistant: {b}" for h, (_, _, b) in zip(turns, triples)]
    emb = embed_texts(texts, encoder=encoder, cache_dir=cache_dir, progress=progress)
    n = len(triples)
    group = np.asarray(group, np.int64)
    return PreferencePairs(context=emb[:n], chosen=emb[n:2 * n], rejected=emb[2 * n:],
                           client=assign_clients(group, clients_per_split, seed=seed), group=group,
                           group_names=tuple(splits), meta={"source": "hh-rlhf", "splits": list(splits)})


# ------------------------------------------------------------------------------------------------ k-means
def kmeans(x: np.ndarray, k: int, *, seed: int = 0, iters: int = 50, balanced: bool = False,
           init: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's k-means with k-means++ seeding (or the given ``init`` centres, so that cluster j starts at
    ``init[j]``); ``balanced=True`` caps every cluster at ceil(n / k) members (assignment in order of how much a
    point prefers its best centre). Returns (labels, centres)."""
    x = np.asarray(x, np.float64)
    n = len(x)
    if k < 1 or n < k:
        raise ValueError(f"k-means needs 1 <= k <= n points, got k={k}, n={n}")
    rng = np.random.default_rng(seed)
    if init is not None:
        c = np.array(init, np.float64).reshape(k, x.shape[1])
    else:
        centres = [x[rng.integers(n)]]
        for _ in range(1, k):
            d = np.min(((x[:, None, :] - np.array(centres)[None]) ** 2).sum(-1), axis=1)
            p = d / d.sum() if d.sum() > 0 else np.full(n, 1.0 / n)
            centres.append(x[rng.choice(n, p=p)])
        c = np.array(centres)
    labels = np.zeros(n, np.int64)
    for it in range(iters):
        d = ((x[:, None, :] - c[None]) ** 2).sum(-1)
        new = _balanced_assign(d) if balanced else d.argmin(1)
        if it and np.array_equal(new, labels):
            break
        labels = new
        for j in range(k):
            if (labels == j).any():
                c[j] = x[labels == j].mean(0)
    return labels, c


def _balanced_assign(d: np.ndarray) -> np.ndarray:
    n, k = d.shape
    cap = int(np.ceil(n / k))
    srt = np.sort(d, axis=1)
    margin = srt[:, 1] - srt[:, 0] if k > 1 else np.zeros(n)
    labels = np.full(n, -1, np.int64)
    size = np.zeros(k, np.int64)
    for i in np.argsort(-margin, kind="stable"):      # the most decided points choose first
        for j in np.argsort(d[i], kind="stable"):
            if size[j] < cap:
                labels[i] = j
                size[j] += 1
                break
    return labels


def purity(labels: np.ndarray, truth: np.ndarray) -> float:
    """Fraction of points whose cluster's majority true type equals their own."""
    labels, truth = np.asarray(labels), np.asarray(truth)
    hit = 0
    for c in np.unique(labels):
        t = truth[labels == c]
        hit += np.bincount(t).max()
    return hit / len(labels)


def silhouette(x: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette coefficient (Rousseeuw 1987), Euclidean; 0 when there is a single label."""
    x, labels = np.asarray(x, np.float64), np.asarray(labels)
    if len(np.unique(labels)) < 2:
        return 0.0
    d = np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))
    s = []
    for i in range(len(x)):
        same = labels == labels[i]
        same[i] = False
        if not same.any():
            s.append(0.0)
            continue
        a = d[i, same].mean()
        b = min(d[i, labels == o].mean() for o in np.unique(labels) if o != labels[i])
        s.append((b - a) / max(a, b) if max(a, b) > 0 else 0.0)
    return float(np.mean(s))


def pairwise_accuracy(score_chosen, score_rejected) -> float:
    """Fraction of pairs with r(chosen) > r(rejected); ties count one half."""
    c, r = np.asarray(score_chosen, np.float64), np.asarray(score_rejected, np.float64)
    if not len(c):
        return float("nan")
    return float(((c > r) + 0.5 * (c == r)).mean())
