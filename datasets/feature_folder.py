"""Feature folders: interactions with precomputed item features, as used by FedVLR and MMRec.

FedVLR (Li, Long, Jiang, Zhang & Yang, "Federated Vision-Language-Recommendation with Personalized
Fusion", AAAI 2026, arXiv 2410.08478) ships the NineRec KU data as ``inter.csv``
(``userID,itemID,rating,timestamp,split_label``; 0 train, 1 valid, 2 test), ``image_features.npy`` and
``text_features.npy`` (float16 ``[n_items, d]``, row i = item i), and optionally ``i_id_mapping.csv``
(``asin,itemID``) and ``u_id_mapping.csv`` (``user_id,userID``) with the original ids. MMRec (Zhou,
"MMRec: Simplifying Multimodal Recommendation", 2023; github.com/enoche/MMRec) uses the same idea with a
tab-separated ``<name>.inter`` whose split column is ``x_label`` and features ``image_feat.npy`` /
``text_feat.npy``.

Ids in the file are already 0-based internal ids and are kept unchanged, so row i of every feature matrix
stays item i. The catalogue size is ``max(max itemID + 1, feature rows, mapped items)``; every feature
file must have exactly that many rows (a mismatch names the file, an itemID beyond a feature file names
the interactions line). Ids should be nearly contiguous: without a mapping file, an id space larger than
10 x the distinct ids + 1000 is refused, naming the line of the first id beyond that (it would size every
array). With a mapping file, every id in the interactions must be listed there and the mapping must cover
0..n-1. Features are returned as float32 under ``features['image']`` / ``['text']``; every other ``.npy``
file in the folder is one more item feature matrix (row i = item i), returned under its file name without
``.npy`` (``whisper.npy`` -> ``features['whisper']``), so a folder can carry any number of content modalities
(text and two audio views as well as text and image) with no code per data set; such a file with the wrong
number of rows is an error naming it, like the named ones. NaN or inf rows are errors. Without mapping files the raw
ids are the internal ids. Rating defaults to
1 and timestamp to 0 when the columns are absent; without a split column the data is unsplit. With
one, train and test must be non-empty.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ._io import Table, empty_content, first_line, read_table, require_splits, split_column
from .core import UNSPLIT, DataError, InteractionData, _inter_frame, check_features

FEATURE_FILES = {
    "image": ("image_features.npy", "image_feat.npy"),
    "text": ("text_features.npy", "text_feat.npy"),
}
SPLIT_COLUMNS = ("split_label", "x_label")


def _sep(path: Path) -> str:
    line = first_line(path) or ""
    return "\t" if "\t" in line else ","


def interactions_file(folder: str | Path) -> Path | None:
    """``inter.csv``, or an MMRec ``<name>.inter`` (plain ``userID``/``itemID`` header, no ``:type``)."""
    folder = Path(folder)
    if (folder / "inter.csv").is_file():
        return folder / "inter.csv"
    found = []
    for p in sorted(folder.glob("*.inter")):
        header = first_line(p) or ""
        cols = [c.strip() for c in header.replace("\t", ",").split(",")]
        if "userID" in cols and "itemID" in cols and not any(":" in c for c in cols):
            found.append(p)
    if len(found) > 1:
        raise DataError(f"{folder}: several MMRec interaction files ({', '.join(p.name for p in found)}); "
                        "pass the one to use")
    return found[0] if found else None


def _load_matrix(path: Path) -> np.ndarray:
    try:
        arr = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise DataError(f"{path}: not a readable .npy array ({e})") from None
    if not isinstance(arr, np.ndarray) or arr.ndim != 2:
        raise DataError(f"{path}: expected a 2-D array [n_items, d], got shape {getattr(arr, 'shape', None)}")
    if arr.dtype.kind not in "fiu":
        raise DataError(f"{path}: expected numbers, got dtype {arr.dtype}")
    return arr


def _mapping(path: Path, id_col: str) -> tuple[Table, str]:
    t = read_table(path, sep=_sep(path), required=(id_col,), integers=(id_col,))
    others = [c for c in t.frame.columns if c != id_col]
    if not others:
        raise DataError(f"{path}: line 1: expected a raw-id column beside {id_col!r}")
    ids = t.frame[id_col].to_numpy()
    if len(ids) and ids.min() < 0:
        r = int(np.flatnonzero(ids < 0)[0])
        raise DataError(f"{t.where(r)}: {id_col} {ids[r]} is negative")
    dup = pd.Index(ids).duplicated()
    if dup.any():
        r = int(np.flatnonzero(dup)[0])
        raise DataError(f"{t.where(r)}: {id_col} {ids[r]} is listed twice")
    return t, others[0]


# Ids here are row numbers into the catalogues (feature matrices, mapping files), so they should be nearly
# contiguous. Some gaps are normal (rows filtered out after numbering), but every per-user and per-item
# array is sized by the largest id, so one stray 999999999 would ask for gigabytes. Without a mapping file
# that lists every id up to it, an id space larger than 10 x the distinct ids + 1000 is refused: data that
# uses at least ~10 % of its ids passes, and so does any small hand-made folder.
_SPARSE_FACTOR, _SPARSE_SLACK = 10, 1000


def _id_space(ids: np.ndarray, col: str, t: Table, mapping: tuple[Table, str] | None, catalogue_rows: int = 0) -> int:
    """The number of ids (largest id + 1), after checking that the mapping or the data explains it.

    ``catalogue_rows``: rows of the feature files, which size the item catalogue themselves (an itemID beyond
    them is reported against them).
    """
    if mapping is not None:
        mt, _ = mapping
        listed = mt.frame[col].to_numpy()
        unknown = ~np.isin(ids, listed)
        if unknown.any():
            r = int(np.flatnonzero(unknown)[0])
            raise DataError(f"{t.where(r)}: no row for {col} {ids[r]} in {mt.path.name} ({len(listed):,} ids "
                            f"listed there)")
        ordered = np.sort(listed)  # unique and >= 0 (checked in _mapping), so position k should hold id k
        gap = np.flatnonzero(ordered != np.arange(len(ordered)))
        n = max(int(ordered[-1]) + 1, catalogue_rows)
        if len(gap) or catalogue_rows > len(ordered):
            missing = int(gap[0]) if len(gap) else len(ordered)
            raise DataError(f"{mt.path}: no row for {col} {missing} (the mapping covers {len(ordered):,} "
                            f"of {n:,} ids)")
        return n
    n = max(int(ids.max()) + 1, catalogue_rows)
    distinct = len(np.unique(ids))
    bound = _SPARSE_FACTOR * distinct + _SPARSE_SLACK
    if catalogue_rows == 0 and n > bound:
        r = int(np.flatnonzero(ids >= bound)[0])
        raise DataError(f"{t.where(r)}: {col} {ids[r]} is far beyond the {distinct:,} distinct "
                        f"{col}s in the file (ids are 0-based row numbers here; without a mapping file listing "
                        f"them, {col}s from {bound:,} on are refused)")
    return n


def _raw_ids(n: int, mapping: tuple[Table, str] | None, id_col: str) -> np.ndarray:
    """Raw id of every internal id: the mapping's (which covers 0..n-1, see _id_space) or the id itself."""
    if mapping is None:
        return np.arange(n, dtype=np.int64)
    t, raw_col = mapping
    out = np.empty(n, dtype=object)
    out[t.frame[id_col].to_numpy()] = t.frame[raw_col].to_numpy(dtype=object)
    return out


def _feature_files(folder: Path) -> dict[str, tuple[Path, np.ndarray]]:
    """Name -> (file, matrix) of every item feature file: the named image/text files, then every other ``.npy``
    under its stem (a stem that repeats a named modality, e.g. a second ``text.npy``, is refused)."""
    feats, named = {}, set()
    for name, candidates in FEATURE_FILES.items():
        named.update(candidates)
        for fname in candidates:
            if (folder / fname).is_file():
                feats[name] = (folder / fname, _load_matrix(folder / fname))
                break
    for path in sorted(folder.glob("*.npy")):
        if path.name in named or not path.is_file():
            continue
        if path.stem in feats:
            raise DataError(f"{path}: a second feature matrix for modality {path.stem!r} (already read from "
                            f"{feats[path.stem][0].name}); rename one of them")
        feats[path.stem] = (path, _load_matrix(path))
    return feats


def load_feature_folder(folder: str | Path) -> InteractionData:
    """Load a FedVLR/MMRec feature folder (see the module docstring)."""
    folder = Path(folder)
    inter_path = interactions_file(folder)
    if inter_path is None:
        raise DataError(f"{folder}: no inter.csv (or MMRec <name>.inter) in this folder")
    header = (first_line(inter_path) or "").replace("\t", ",").split(",")
    header = [c.strip().lstrip("\ufeff") for c in header]
    split_col = next((c for c in SPLIT_COLUMNS if c in header), None)
    numbers = [c for c in ("rating", "timestamp") if c in header]
    t = read_table(inter_path, sep=_sep(inter_path), required=("userID", "itemID"),
                   integers=("userID", "itemID") + ((split_col,) if split_col else ()), numbers=numbers)
    f = t.frame
    if len(f) == 0:
        raise DataError(f"{inter_path}: no interactions (the file has a header but no data rows)")
    users = f["userID"].to_numpy()
    items = f["itemID"].to_numpy()
    for col, ids in (("userID", users), ("itemID", items)):
        if ids.min() < 0:
            r = int(np.flatnonzero(ids < 0)[0])
            raise DataError(f"{t.where(r)}: {col} {ids[r]} is negative (ids are 0-based)")
    split = split_column(f[split_col].to_numpy(), t, split_col) if split_col else None
    if split is not None:
        require_splits(split, str(inter_path))

    feats = _feature_files(folder)
    i_map = _mapping(folder / "i_id_mapping.csv", "itemID") if (folder / "i_id_mapping.csv").is_file() else None
    u_map = _mapping(folder / "u_id_mapping.csv", "userID") if (folder / "u_id_mapping.csv").is_file() else None

    max_item = int(items.max())
    feature_rows = max([a.shape[0] for _, a in feats.values()], default=0)
    n_items = _id_space(items, "itemID", t, i_map, feature_rows)
    features = {}
    for name, (path, arr) in feats.items():
        if arr.shape[0] != n_items:
            if arr.shape[0] <= max_item:
                r = int(np.flatnonzero(items >= arr.shape[0])[0])
                raise DataError(f"{t.where(r)}: itemID {items[r]} is out of range for {path.name}, "
                                f"which has {arr.shape[0]} rows (items 0..{arr.shape[0] - 1})")
            raise DataError(f"{path}: {arr.shape[0]} rows, but the catalogue has {n_items} items "
                            f"(max itemID {max_item} in {inter_path.name}; "
                            + ", ".join(f"{p.name}: {a.shape[0]} rows" for p, a in feats.values()) + ")")
        features[name] = check_features(arr, n_items, str(path))
    n_users = _id_space(users, "userID", t, u_map)
    inter = _inter_frame(users, items,
                         f["rating"].to_numpy() if "rating" in f else None,
                         f["timestamp"].to_numpy() if "timestamp" in f else None,
                         split if split is not None else np.full(len(f), UNSPLIT, np.int8))
    data = InteractionData(folder.name, _raw_ids(n_users, u_map, "userID"), _raw_ids(n_items, i_map, "itemID"),
                           inter, items=empty_content(n_items), features=features, source=str(folder),
                           format="feature-folder")
    return data.validate()
