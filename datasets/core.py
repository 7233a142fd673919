"""The one in-memory type every loader produces: :class:`InteractionData`.

Ids are contiguous ints (``0..n_users-1``, ``0..n_items-1``); the raw ids are kept in ``user_ids`` /
``item_ids`` (index = internal id). Interactions are one pandas frame with fixed columns; item content
(titles, descriptions, categories, image paths/URLs) is a second frame indexed by internal item id, and
precomputed feature arrays are kept in ``features`` (name -> ``[n_items, d]`` float32).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import scipy.sparse as sp

from fedvlr_plus.errors import UserError

TRAIN, VALID, TEST, UNSPLIT = 0, 1, 2, -1
SPLIT_NAMES = {TRAIN: "train", VALID: "valid", TEST: "test", UNSPLIT: "unsplit"}
SPLIT_CODES = {v: k for k, v in SPLIT_NAMES.items()}

INTER_COLUMNS = ("user", "item", "rating", "timestamp", "split")
CONTENT_COLUMNS = ("title", "description", "categories", "image")


class DataError(UserError, ValueError):
    """Bad input data. The message names the file and the line, row or field at fault."""


def _inter_frame(user, item, rating=None, timestamp=None, split=None) -> pd.DataFrame:
    user = np.asarray(user, dtype=np.int64)
    n = len(user)
    return pd.DataFrame(
        {
            "user": user,
            "item": np.asarray(item, dtype=np.int64),
            "rating": np.ones(n, np.float32) if rating is None else np.asarray(rating, dtype=np.float32),
            "timestamp": np.zeros(n, np.float64) if timestamp is None else np.asarray(timestamp, dtype=np.float64),
            "split": np.full(n, UNSPLIT, np.int8) if split is None else np.asarray(split, dtype=np.int8),
        }
    )


@dataclass
class InteractionData:
    """Users, items, interactions (with timestamps, ratings and split labels) and item content.

    ``inter`` has the columns ``user, item, rating, timestamp, split`` (split: 0 train, 1 valid, 2 test,
    -1 not yet split). ``items`` is indexed by internal item id and may hold ``title``, ``description``,
    ``categories`` (list of str), ``image`` (path or URL, or None). ``users`` holds user attributes.
    :meth:`sanity` lists duplicate rows, train/test leaks and users without training rows.
    """

    name: str
    user_ids: np.ndarray
    item_ids: np.ndarray
    inter: pd.DataFrame
    items: pd.DataFrame = field(default_factory=pd.DataFrame)
    users: pd.DataFrame = field(default_factory=pd.DataFrame)
    features: dict[str, np.ndarray] = field(default_factory=dict)
    source: str = ""
    format: str = ""
    # findings recorded by steps that removed rows (e.g. duplicates dropped); see sanity()
    notes: list[dict] = field(default_factory=list)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_raw(
        cls,
        name: str,
        raw_users: Iterable,
        raw_items: Iterable,
        rating=None,
        timestamp=None,
        split=None,
        *,
        item_order: Iterable | None = None,
        source: str = "",
        format: str = "",
    ) -> InteractionData:
        """Build from raw ids; internal ids follow first appearance (or ``item_order`` for items)."""
        raw_users = pd.Series(
            np.asarray(list(raw_users) if not isinstance(raw_users, (np.ndarray, pd.Series)) else raw_users)
        )
        raw_items = pd.Series(
            np.asarray(list(raw_items) if not isinstance(raw_items, (np.ndarray, pd.Series)) else raw_items)
        )
        u_codes, u_uniques = pd.factorize(raw_users, sort=False)
        if item_order is not None:
            i_uniques = pd.Index(list(item_order))
            i_codes = i_uniques.get_indexer(raw_items)
            if (i_codes < 0).any():
                bad = raw_items[i_codes < 0].iloc[0]
                raise DataError(f"{source or name}: item {bad!r} is not in the item catalogue")
            i_uniques = np.asarray(i_uniques)
        else:
            i_codes, i_uniques = pd.factorize(raw_items, sort=False)
        inter = _inter_frame(u_codes, i_codes, rating, timestamp, split)
        return cls(name, np.asarray(u_uniques), np.asarray(i_uniques), inter, source=source, format=format)

    # ------------------------------------------------------------------ basic facts
    @property
    def n_users(self) -> int:
        return len(self.user_ids)

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    @property
    def n_inter(self) -> int:
        return len(self.inter)

    @property
    def is_split(self) -> bool:
        return bool(len(self.inter)) and not (self.inter["split"].to_numpy() == UNSPLIT).any()

    def part(self, split: str | int) -> pd.DataFrame:
        code = SPLIT_CODES[split] if isinstance(split, str) else split
        return self.inter[self.inter["split"].to_numpy() == code]

    def train(self) -> pd.DataFrame:
        return self.part(TRAIN)

    def valid(self) -> pd.DataFrame:
        return self.part(VALID)

    def test(self) -> pd.DataFrame:
        return self.part(TEST)

    def matrix(self, splits: Iterable[str | int] = ("train",)) -> sp.csr_matrix:
        """Binary user x item CSR matrix of the interactions in ``splits``."""
        codes = [SPLIT_CODES[s] if isinstance(s, str) else s for s in splits]
        df = self.inter[np.isin(self.inter["split"].to_numpy(), codes)]
        m = sp.csr_matrix(
            (np.ones(len(df), np.float32), (df["user"].to_numpy(), df["item"].to_numpy())),
            shape=(self.n_users, self.n_items),
        )
        m.data[:] = 1.0  # duplicates (if any) count once
        return m

    def item_popularity(self, split: str = "train") -> np.ndarray:
        return np.bincount(self.part(split)["item"].to_numpy(), minlength=self.n_items).astype(np.int64)

    def user_history_length(self, split: str = "train") -> np.ndarray:
        """``[n_users]``: each user's number of interactions in ``split`` (what sparsity buckets group by)."""
        return np.bincount(self.part(split)["user"].to_numpy(), minlength=self.n_users).astype(np.int64)

    def cold_items(self) -> np.ndarray:
        """Boolean mask over items: True for items with no training interaction."""
        return self.item_popularity("train") == 0

    # ------------------------------------------------------------------ checks and copies
    def replace(self, **changes) -> InteractionData:
        return dataclasses.replace(self, **changes)

    def validate(self) -> InteractionData:
        """Raise :class:`DataError` for out-of-range ids, bad split codes or misaligned content/features."""
        where = self.source or self.name
        u = self.inter["user"].to_numpy()
        i = self.inter["item"].to_numpy()
        if len(u) and (u.min() < 0 or u.max() >= self.n_users):
            row = int(np.flatnonzero((u < 0) | (u >= self.n_users))[0])
            raise DataError(f"{where}: interaction row {row}: user id {u[row]} out of range [0, {self.n_users})")
        if len(i) and (i.min() < 0 or i.max() >= self.n_items):
            row = int(np.flatnonzero((i < 0) | (i >= self.n_items))[0])
            raise DataError(f"{where}: interaction row {row}: item id {i[row]} out of range [0, {self.n_items})")
        s = self.inter["split"].to_numpy()
        bad = ~np.isin(s, list(SPLIT_NAMES))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise DataError(f"{where}: interaction row {row}: split label {s[row]} is not one of 0, 1, 2")
        for name, arr in self.features.items():
            check_features(arr, self.n_items, f"{where} feature '{name}'")
        if len(self.items) and len(self.items) != self.n_items:
            raise DataError(f"{where}: item content has {len(self.items)} rows for {self.n_items} items")
        return self

    def require_split(self, *, need: Iterable[str] = ("train", "test")) -> None:
        where = self.source or self.name
        if not self.is_split:
            raise DataError(f"{where}: the data is not split yet (apply a split from fedvlr_plus.datasets.splits)")
        for name in need:
            if len(self.part(name)) == 0:
                raise DataError(f"{where}: the '{name}' split is empty")

    def sanity(self) -> list[dict]:
        """Findings ``{code, count, message[, splits]}`` about this data (module ``sanity`` lists the codes)."""
        from .sanity import findings

        return findings(self)

    def _distinct_pairs(self) -> int:
        keys = self.inter["user"].to_numpy() * np.int64(max(self.n_items, 1)) + self.inter["item"].to_numpy()
        return int(len(np.unique(keys)))

    def content_coverage(self) -> dict[str, int]:
        """Items holding a value, per content column; columns empty for every item are left out."""
        out = {}
        for col in self.items.columns:
            n = int(sum(_has_value(v) for v in self.items[col].to_numpy()))
            if n:
                out[str(col)] = n
        return out

    def stats(self) -> dict:
        """Sizes, per-split counts, sparsity, content fields that hold values (``content_coverage``:
        items with a value, out of ``items``), features, cold items, and the sanity ``warnings``."""
        n_u, n_i, n = self.n_users, self.n_items, self.n_inter
        coverage = self.content_coverage()
        per_split = {}
        for code, name in SPLIT_NAMES.items():
            df = self.part(code)
            if len(df) or name in ("train", "valid", "test") and self.is_split:
                per_split[name] = {
                    "interactions": int(len(df)),
                    "users": int(df["user"].nunique()),
                    "items": int(df["item"].nunique()),
                }
        out = {
            "dataset": self.name,
            "format": self.format,
            "users": int(n_u),
            "items": int(n_i),
            "interactions": int(n),
            # distinct (user, item) pairs: a repeated row fills no extra cell of the matrix
            "sparsity": float(1.0 - self._distinct_pairs() / (n_u * n_i)) if n_u and n_i else 1.0,
            "splits": per_split,
            "content": sorted(coverage),
            "content_coverage": coverage,
            "features": {k: list(v.shape) for k, v in self.features.items()},
        }
        if self.is_split:
            cold = self.cold_items()
            out["cold_items"] = int(cold.sum())
            for name in ("valid", "test"):
                df = self.part(name)
                out[f"{name}_cold_targets"] = int(cold[df["item"].to_numpy()].sum())
        out["warnings"] = self.sanity()
        return out


def _has_value(v) -> bool:
    """A content value that says something: not None/NaN, not blank text, not an empty list."""
    if v is None:
        return False
    if isinstance(v, str):
        return bool(v.strip())
    if isinstance(v, (list, tuple, np.ndarray)):
        return len(v) > 0
    if isinstance(v, (float, np.floating)):
        return bool(np.isfinite(v))
    return True


def check_features(arr: np.ndarray, n_items: int, what: str) -> np.ndarray:
    """Raise DataError unless ``arr`` is a finite ``[n_items, d]`` matrix; return it as float32."""
    if arr.ndim != 2:
        raise DataError(f"{what}: expected a 2-D array [n_items, d], got shape {tuple(arr.shape)}")
    if arr.shape[0] != n_items:
        raise DataError(f"{what}: {arr.shape[0]} rows but the catalogue has {n_items} items")
    arr = np.asarray(arr, dtype=np.float32)
    finite = np.isfinite(arr)
    if not finite.all():
        row = int(np.flatnonzero(~finite.all(axis=1))[0])
        raise DataError(f"{what}: row {row} (item {row}) contains NaN or inf")
    return arr


def compact(data: InteractionData, *, keep_all_items: bool = False) -> InteractionData:
    """Drop users (and, unless ``keep_all_items``, items) without interactions and renumber contiguously."""
    inter = data.inter
    users = np.unique(inter["user"].to_numpy())
    items = np.arange(data.n_items) if keep_all_items else np.unique(inter["item"].to_numpy())
    u_map = np.full(data.n_users, -1, np.int64)
    u_map[users] = np.arange(len(users))
    i_map = np.full(data.n_items, -1, np.int64)
    i_map[items] = np.arange(len(items))
    new_inter = inter.copy()
    new_inter["user"] = u_map[inter["user"].to_numpy()]
    new_inter["item"] = i_map[inter["item"].to_numpy()]
    return data.replace(
        user_ids=data.user_ids[users],
        item_ids=data.item_ids[items],
        inter=new_inter.reset_index(drop=True),
        items=data.items.iloc[items].reset_index(drop=True) if len(data.items) else data.items,
        users=data.users.iloc[users].reset_index(drop=True) if len(data.users) else data.users,
        features={k: v[items] for k, v in data.features.items()},
    )
