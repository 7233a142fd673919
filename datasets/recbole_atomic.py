"""RecBole atomic files: read a dataset folder, write one, and load the ML-100K copy inside the recbole wheel.

Format (RecBole documentation, "Atomic Files"; Zhao et al., "RecBole: Towards a Unified, Comprehensive and
Efficient Framework for Recommendation Algorithms", CIKM 2021): a folder ``{name}/`` holds ``{name}.inter``
(interactions) and optionally ``{name}.item`` and ``{name}.user`` (features). Files are tab-separated; the
header names every column as ``field:type`` with type ``token`` (one string), ``token_seq`` (space-separated
strings), ``float`` or ``float_seq`` (space-separated numbers). Pre-split data is
``{name}.train.inter`` / ``{name}.valid.inter`` / ``{name}.test.inter``, which RecBole loads with
``benchmark_filename: [train, valid, test]``.

Reading maps the usual field names: ``user_id``, ``item_id``, ``rating``, ``timestamp`` for interactions;
``movie_title``/``title`` -> ``title``, ``class``/``categories``/``genre`` -> ``categories`` (a list),
``description``, ``image`` for item content; every other ``.item``/``.user`` field is kept under its own
name (token -> str, float -> float64, token_seq -> list of str, float_seq -> list of float). Ids are kept
as the raw token strings. Internal ids follow the ``.user``/``.item`` files' order (every entry kept, so
items without interactions stay in the catalogue), then ids that appear only in the interactions, in
order of first appearance.
"""

from __future__ import annotations

import csv
import importlib.util
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ._io import atomic_folder, empty_content, first_line, read_table, require_splits, show, squash
from .core import TEST, TRAIN, UNSPLIT, VALID, DataError, InteractionData, _inter_frame

FIELD_TYPES = ("token", "token_seq", "float", "float_seq")
SPLIT_SUFFIXES = ("train", "valid", "test")
_SPLIT_CODE = {"train": TRAIN, "valid": VALID, "test": TEST}

# RecBole splits token_seq fields on single spaces, so a space inside one category ("Gift Cards") is written
# as U+00A0 NO-BREAK SPACE and turned back into a space when read: the round trip is exact, RecBole sees
# one token, and the file still reads naturally in an editor.
_NBSP = "\u00a0"

_ITEM_ALIASES = {
    "movie_title": "title",
    "title": "title",
    "class": "categories",
    "categories": "categories",
    "category": "categories",
    "genre": "categories",
    "genres": "categories",
    "description": "description",
    "image": "image",
    "image_url": "image",
    "imUrl": "image",
}


# ---------------------------------------------------------------------------------------------- reading
def _header(path: Path) -> list[tuple[str, str]]:
    line = first_line(path)
    if line is None:
        raise DataError(f"{path}: the file is empty (expected a header line such as 'user_id:token')")
    fields = []
    for col in line.split("\t"):
        name, sep, ftype = col.strip().rpartition(":")
        if not sep or not name:
            raise DataError(f"{path}: line 1: column {col!r} is not 'name:type' (type one of {', '.join(FIELD_TYPES)})")
        if ftype not in FIELD_TYPES:
            raise DataError(
                f"{path}: line 1: field {name!r} has unknown type {ftype!r} (expected one of {', '.join(FIELD_TYPES)})"
            )
        fields.append((name, ftype))
    return fields


def _read_file(path: Path, required: tuple[str, ...] = ()) -> tuple[pd.DataFrame, dict[str, str], object]:
    """One atomic file as a frame of typed columns (named by field), its field types and its Table."""
    fields = _header(path)
    names = [n for n, _ in fields]
    missing = [r for r in required if r not in names]
    if missing:
        raise DataError(
            f"{path}: line 1: missing field{'s' if len(missing) > 1 else ''} "
            f"{', '.join(repr(m) for m in missing)} (fields found: {', '.join(names)})"
        )
    cols = [f"{n}:{t}" for n, t in fields]
    table = read_table(
        path,
        sep="\t",
        required=cols,
        numbers=[c for c, (_, t) in zip(cols, fields) if t == "float"],
        nonempty=[f"{r}:token" for r in required if dict(fields).get(r) == "token"],
    )
    frame = table.frame
    frame.columns = names
    for name, ftype in fields:
        if ftype == "token_seq":
            frame[name] = [[t.replace(_NBSP, " ") for t in s.split(" ") if t] for s in frame[name].to_numpy()]
        elif ftype == "float_seq":
            out = []
            for r, s in enumerate(frame[name].to_numpy()):
                try:
                    vals = [float(t) for t in s.split(" ") if t]
                except ValueError:
                    raise DataError(f"{table.where(r)}: field {name!r}: {s!r} is not a list of numbers") from None
                if not all(math.isfinite(v) for v in vals):
                    raise DataError(f"{table.where(r)}: field {name!r}: {s!r} holds NaN or inf")
                out.append(vals)
            frame[name] = out
    return frame, dict(fields), table


def _names_in(folder: Path) -> list[str]:
    """Dataset names with atomic interaction files in ``folder`` (``x.inter`` or ``x.train.inter``...)."""
    names = set()
    for p in folder.glob("*.inter"):
        stem = p.name[: -len(".inter")]
        base, dot, suffix = stem.rpartition(".")
        names.add(base if dot and suffix in SPLIT_SUFFIXES else stem)
    return sorted(names)


def atomic_name(folder: str | Path, name: str | None = None) -> str:
    """The dataset name in an atomic folder: ``name``, else the folder's name, else the only one there."""
    folder = Path(folder)
    if name is not None:
        return name
    names = _names_in(folder)
    if folder.name in names:
        return folder.name
    if len(names) == 1:
        return names[0]
    if not names:
        raise DataError(f"{folder}: no RecBole atomic interaction file (*.inter) in this folder")
    raise DataError(f"{folder}: several atomic datasets ({', '.join(names)}); pass name= one of them")


def _text(values: list, ftype: str) -> list[str]:
    if ftype == "token_seq":
        return [" ".join(v) for v in values]
    return [str(v) for v in values]


def _catalogue_order(catalogue: np.ndarray | None, seen: np.ndarray) -> np.ndarray:
    """Catalogue ids in file order, then ids seen only in interactions, in order of first appearance."""
    first = pd.unique(seen)
    if catalogue is None:
        return np.asarray(first, dtype=object)
    extra = first[~pd.Index(first).isin(catalogue)]
    return np.concatenate([np.asarray(catalogue, dtype=object), np.asarray(extra, dtype=object)])


def _feature_frame(
    frame: pd.DataFrame, types: dict[str, str], id_field: str, order: np.ndarray, table, *, content: bool
) -> pd.DataFrame:
    """Rows of an .item/.user file aligned to ``order`` (ids not in the file get empty values)."""
    ids = frame[id_field].to_numpy()
    index = pd.Index(ids)
    if not index.is_unique:
        r = int(np.flatnonzero(index.duplicated())[0])
        raise DataError(f"{table.where(r)}: {id_field} {ids[r]!r} appears more than once")
    pos = index.get_indexer(order)
    n = len(order)
    out = empty_content(n) if content else pd.DataFrame(index=pd.RangeIndex(n))
    for name, ftype in types.items():
        if name == id_field:
            continue
        col = frame[name].to_numpy()
        target = _ITEM_ALIASES.get(name, name) if content else name
        if target in ("title", "description"):
            vals = _text(list(col), ftype)
            out[target] = [vals[p] if p >= 0 else "" for p in pos]
        elif target == "categories":
            vals = list(col) if ftype == "token_seq" else [[v] if v else [] for v in col]
            out[target] = [list(vals[p]) if p >= 0 else [] for p in pos]
        elif target == "image":
            vals = [" ".join(v) if isinstance(v, list) else v for v in col]
            out[target] = [(vals[p] or None) if p >= 0 else None for p in pos]
        elif ftype == "float":
            out[target] = np.where(pos >= 0, col[np.maximum(pos, 0)] if len(col) else np.nan, np.nan)
        elif ftype in ("token_seq", "float_seq"):
            out[target] = [list(col[p]) if p >= 0 else [] for p in pos]
        else:
            out[target] = [col[p] if p >= 0 else "" for p in pos]
    return out


@dataclass(frozen=True)
class _Fields:
    """The interaction field names of one atomic dataset."""

    user: str
    item: str
    rating: str
    time: str


def read_atomic(
    folder: str | Path,
    name: str | None = None,
    *,
    splits: bool = True,
    user_field: str = "user_id",
    item_field: str = "item_id",
    rating_field: str = "rating",
    time_field: str = "timestamp",
) -> InteractionData:
    """Read a RecBole atomic dataset folder.

    ``name`` defaults to the folder's name (RecBole's convention) or the only dataset in the folder.
    With ``splits`` and ``{name}.train.inter`` present, split labels come from the benchmark files
    (``train`` and ``test`` required, ``valid`` optional); when ``{name}.inter`` is there too its row
    order is kept and each of its rows is matched to one row of the split files. A missing rating is 1,
    a missing timestamp 0.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder")
    name = atomic_name(folder, name)
    fields = _Fields(user_field, item_field, rating_field, time_field)
    inter_path = folder / f"{name}.inter"
    split_paths = {s: folder / f"{name}.{s}.inter" for s in SPLIT_SUFFIXES}
    if splits and any(p.exists() for p in split_paths.values()):
        raw = _split_rows(folder, name, inter_path, split_paths, fields)
        split = raw["s"].to_numpy(np.int8)
    else:
        if not inter_path.exists():
            raise DataError(
                f"{inter_path}: missing (files in {folder}: "
                f"{', '.join(sorted(p.name for p in folder.iterdir())) or 'none'})"
            )
        raw, _ = _interaction_rows(inter_path, UNSPLIT, fields)
        split = np.full(len(raw), UNSPLIT, np.int8)
    user_order, item_order, users, items = _catalogues(folder, name, raw, fields)
    u = pd.Index(user_order).get_indexer(raw["u"].to_numpy(dtype=object))
    i = pd.Index(item_order).get_indexer(raw["i"].to_numpy(dtype=object))
    inter = _inter_frame(u, i, raw["r"].to_numpy(), raw["t"].to_numpy(), split)
    data = InteractionData(
        name,
        np.asarray(user_order, dtype=object),
        np.asarray(item_order, dtype=object),
        inter,
        items=items,
        users=users,
        source=str(folder),
        format="recbole-atomic",
    )
    require_splits(split, str(folder))
    return data.validate()


def _interaction_rows(path: Path, label: int, fields: _Fields):
    """One interaction file as raw columns ``u, i, r, t`` (rating 1 and time 0 when absent), and its table."""
    frame, types, table = _read_file(path, (fields.user, fields.item))
    if len(frame) == 0 and label in (UNSPLIT, TRAIN, TEST):
        what = "no interactions" if label == UNSPLIT else "an empty split"
        raise DataError(f"{path}: {what} (the file has a header but no data rows)")
    out = pd.DataFrame(
        {
            "u": frame[fields.user].to_numpy(dtype=object),
            "i": frame[fields.item].to_numpy(dtype=object),
            "r": frame[fields.rating].to_numpy(np.float64)
            if types.get(fields.rating) == "float"
            else np.ones(len(frame)),
            "t": frame[fields.time].to_numpy(np.float64) if types.get(fields.time) == "float" else np.zeros(len(frame)),
        }
    )
    return out, table


def _split_rows(
    folder: Path, name: str, inter_path: Path, split_paths: dict[str, Path], fields: _Fields
) -> pd.DataFrame:
    """The rows of the split files with their label in column ``s``, in ``{name}.inter``'s order when
    that file is there (each of its rows matched to one split row, equal rows in turn)."""
    for s in ("train", "test"):
        if not split_paths[s].exists():
            raise DataError(
                f"{split_paths[s]}: missing; a split dataset needs {name}.train.inter and "
                f"{name}.test.inter ({name}.valid.inter is optional)"
            )
    parts = []
    for s, p in split_paths.items():
        if p.exists():
            part, _ = _interaction_rows(p, _SPLIT_CODE[s], fields)
            parts.append(part.assign(s=np.int8(_SPLIT_CODE[s])))
    labelled = pd.concat(parts, ignore_index=True)
    if not inter_path.exists():
        return labelled
    raw, table = _interaction_rows(inter_path, UNSPLIT, fields)
    key = ["u", "i", "r", "t"]
    raw = raw.assign(k=raw.groupby(key, sort=False).cumcount())
    labelled = labelled.assign(k=labelled.groupby(key, sort=False).cumcount())
    merged = raw.merge(labelled, on=key + ["k"], how="left", sort=False)
    if merged["s"].isna().any():
        r = int(np.flatnonzero(merged["s"].isna().to_numpy())[0])
        raise DataError(
            f"{table.where(r)}: this interaction is in none of the split files "
            f"{', '.join(p.name for p in split_paths.values() if p.exists())}"
        )
    if len(labelled) != len(raw):
        raise DataError(
            f"{folder}: the split files hold {len(labelled)} interactions but {inter_path.name} holds {len(raw)}"
        )
    return merged.drop(columns="k")


def _catalogues(folder: Path, name: str, raw: pd.DataFrame, fields: _Fields):
    """(user order, item order, user attributes, item content): the ``.user`` / ``.item`` files' order,
    then ids seen only in the interactions."""
    feats = {}
    for kind, id_field in (("item", fields.item), ("user", fields.user)):
        p = folder / f"{name}.{kind}"
        if p.exists():
            feats[kind] = _read_file(p, (id_field,))

    user_order = _catalogue_order(
        feats["user"][0][fields.user].to_numpy(dtype=object) if "user" in feats else None,
        raw["u"].to_numpy(dtype=object),
    )
    item_order = _catalogue_order(
        feats["item"][0][fields.item].to_numpy(dtype=object) if "item" in feats else None,
        raw["i"].to_numpy(dtype=object),
    )
    # Ids are unique within each catalogue file (checked in _feature_frame), so get_indexer is safe in the caller.
    if "item" in feats:
        frame, types, table = feats["item"]
        items = _feature_frame(frame, types, fields.item, item_order, table, content=True)
    else:
        items = empty_content(len(item_order))
    if "user" in feats:
        frame, types, table = feats["user"]
        users = _feature_frame(frame, types, fields.user, user_order, table, content=False)
    else:
        users = pd.DataFrame()
    return user_order, item_order, users, items


# ---------------------------------------------------------------------------------------------- the wheel
def ml100k_folder() -> Path:
    """The ML-100K atomic folder shipped inside the installed recbole wheel (recbole is not imported)."""
    spec = importlib.util.find_spec("recbole")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "ml-100k: the embedded copy lives in the recbole wheel, which is not installed; "
            "install recbole==1.2.1 or pass the path of an ML-100K folder"
        )
    for loc in spec.submodule_search_locations:
        p = Path(loc) / "dataset_example" / "ml-100k"
        if (p / "ml-100k.inter").is_file():
            return p
    raise DataError(
        f"ml-100k: recbole is installed but has no dataset_example/ml-100k/ml-100k.inter "
        f"(looked in {', '.join(spec.submodule_search_locations)})"
    )


def load_ml100k() -> InteractionData:
    """MovieLens-100K from the recbole wheel: 943 users, 1,682 items, 100,000 ratings (1-5, Unix seconds).

    Items carry ``title`` (RecBole's copy drops the year from the title), ``categories`` (19 genres) and
    ``release_year`` (a string; one item has RecBole's literal token ``unkonwn``); users carry ``age``
    (int), ``gender``, ``occupation`` and ``zip_code``. Harper & Konstan, "The MovieLens Datasets", TiiS 2015.
    """
    data = read_atomic(ml100k_folder(), "ml-100k")
    users = data.users
    if "age" in users.columns:
        users = users.assign(age=pd.to_numeric(users["age"]).astype(np.int64))
    return data.replace(users=users)


# ---------------------------------------------------------------------------------------------- writing
_BAD_TOKEN = re.compile(r"[\t\r\n]")


def _fmt_float(x: float) -> str:
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(x)
    if x == int(x) and abs(x) < 2**53:
        return str(int(x))
    return repr(x)  # shortest text that reads back as the same float64


def _token(value, what: str) -> str:
    s = "" if value is None else str(value)
    if _BAD_TOKEN.search(s):
        raise DataError(f"{what}: {s!r} contains a tab or line break, which an atomic token cannot hold")
    return s


def _seq_token(value) -> str:
    return squash(value).replace(" ", _NBSP)


def _column_type(values: pd.Series) -> str:
    if values.dtype.kind in "biuf":
        return "float"
    non_null = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if non_null and all(isinstance(v, (list, tuple, np.ndarray)) for v in non_null):
        flat = [x for v in non_null for x in v]
        if flat and all(isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) for x in flat):
            return "float_seq"
        return "token_seq"
    return "token"


def _encode(values: pd.Series, ftype: str, what: str, text: bool = False) -> list[str]:
    out = []
    for row, v in enumerate(values):
        where = f"{what}, row {row}"
        if ftype == "float":
            try:
                out.append(_fmt_float(v))
            except (TypeError, ValueError):
                raise DataError(f"{where}: {show(v)} is not a finite number (atomic files must not hold NaN)") from None
        elif ftype == "float_seq":
            try:
                out.append(" ".join(_fmt_float(x) for x in (v if v is not None else [])))
            except (TypeError, ValueError):
                raise DataError(f"{where}: {show(v)} holds a value that is not a finite number") from None
        elif ftype == "token_seq" and text:
            out.append(squash(v))  # free text: words are the tokens
        elif ftype == "token_seq":
            seq = [] if v is None or (isinstance(v, float) and math.isnan(v)) else v
            out.append(" ".join(t for t in (_seq_token(x) for x in seq) if t))
        else:
            if v is None or (isinstance(v, float) and math.isnan(v)):
                v = ""
            out.append(_token(v, where))
    return out


def _write_tsv(path: Path, header: list[str], columns: list[list[str]]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        # QUOTE_MINIMAL quotes fields holding '"' exactly as RecBole's pandas reader expects.
        w = csv.writer(f, delimiter="\t", quotechar='"', quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
        w.writerow(header)
        w.writerows(zip(*columns))


def _feature_columns(frame: pd.DataFrame, id_field: str, ids: list[str], what: str, content: bool):
    header, columns = [f"{id_field}:token"], [ids]
    for col in frame.columns:
        values = frame[col]
        if content and col in ("title", "description"):
            ftype, text = "token_seq", True
        elif content and col == "categories":
            ftype, text = "token_seq", False
        elif content and col == "image":
            ftype, text = "token", False
        else:
            ftype, text = _column_type(values), False
        name = str(col)
        if not re.fullmatch(r"[A-Za-z0-9_\-.]+", name):
            raise DataError(f"{what}: column name {name!r} cannot be an atomic field name")
        header.append(f"{name}:{ftype}")
        columns.append(_encode(values, ftype, f"{what} column {name!r}", text))
    return header, columns


def _split_mode(labels: np.ndarray, splits: bool, where: str) -> bool:
    """Whether split files are written: asked for and the data is split (fully, train and test non-empty)."""
    split_mode = splits and bool((labels != UNSPLIT).any())
    if split_mode:
        if (labels == UNSPLIT).any():
            r = int(np.flatnonzero(labels == UNSPLIT)[0])
            raise DataError(
                f"{where}: interaction row {r} has no split label while others do; "
                "split the data fully or pass splits=False"
            )
        require_splits(labels, where)
    return split_mode


def _id_tokens(data: InteractionData, where: str) -> tuple[list[str], list[str]]:
    """Raw user and item ids as tokens, each unique as text."""
    user_tok = [_token(u, f"{where}: user id") for u in data.user_ids]
    item_tok = [_token(i, f"{where}: item id") for i in data.item_ids]
    if len(set(user_tok)) != len(user_tok) or len(set(item_tok)) != len(item_tok):
        raise DataError(f"{where}: raw ids are not unique as text; they cannot be written as tokens")
    return user_tok, item_tok


def write_atomic(data: InteractionData, folder: str | Path, name: str | None = None, *, splits: bool = True) -> Path:
    """Write ``data`` as a RecBole atomic dataset into ``folder`` (RecBole expects ``{data_path}/{name}/``).

    Files: ``{name}.inter`` (all rows: ``user_id:token item_id:token rating:float timestamp:float``);
    with ``splits`` and split data, ``{name}.train.inter``, ``.valid.inter``, ``.test.inter`` for
    ``benchmark_filename`` (train and test must be non-empty; partly split data is refused);
    ``{name}.item`` listing every item in internal-id order (so items without interactions stay in
    RecBole's id space) with ``title``/``description`` as token_seq (words), ``categories`` as token_seq
    (one token per category; a space inside a category is written as U+00A0 and read back as a space),
    ``image`` as a token, other columns by type (numbers -> float, lists -> float_seq/token_seq, else
    token); ``{name}.user`` listing every user with its attributes. Missing text is written as an empty
    field, never as ``nan``; a missing number is an error. Text is whitespace-normalised.

    The files are written to a temporary folder beside ``folder`` and then moved into place; split files
    left from an earlier write of the same name are removed when this write has none. Returns ``folder``.
    """
    folder = Path(folder)
    name = name or data.name
    if not name or not re.fullmatch(r"[A-Za-z0-9_\-.]+", name) or name.startswith("."):
        raise DataError(f"dataset name {name!r}: use letters, digits, '_', '-' or '.' (it becomes a file name)")
    data.validate()
    where = f"{data.source or data.name}"
    inter = data.inter
    labels = inter["split"].to_numpy()
    split_mode = _split_mode(labels, splits, where)
    user_tok, item_tok = _id_tokens(data, where)
    u_arr = np.asarray(user_tok, dtype=object)
    i_arr = np.asarray(item_tok, dtype=object)
    header = ["user_id:token", "item_id:token", "rating:float", "timestamp:float"]

    def inter_columns(frame: pd.DataFrame):
        return [
            list(u_arr[frame["user"].to_numpy()]),
            list(i_arr[frame["item"].to_numpy()]),
            _encode(frame["rating"].astype(np.float64), "float", f"{where}: rating"),
            _encode(frame["timestamp"], "float", f"{where}: timestamp"),
        ]

    items = data.items if len(data.items.columns) else pd.DataFrame(index=pd.RangeIndex(data.n_items))
    users = data.users if len(data.users.columns) else pd.DataFrame(index=pd.RangeIndex(data.n_users))
    if len(users) != data.n_users:
        raise DataError(f"{where}: user attributes have {len(users)} rows for {data.n_users} users")
    item_header, item_cols = _feature_columns(items, "item_id", item_tok, f"{where} items", content=True)
    user_header, user_cols = _feature_columns(users, "user_id", user_tok, f"{where} users", content=False)

    stale = [f"{name}.{s}.inter" for s in SPLIT_SUFFIXES]
    with atomic_folder(folder, stale=stale) as tmp:
        _write_tsv(tmp / f"{name}.inter", header, inter_columns(inter))
        if split_mode:
            for s in SPLIT_SUFFIXES:
                part = inter[labels == _SPLIT_CODE[s]]
                _write_tsv(tmp / f"{name}.{s}.inter", header, inter_columns(part))
        _write_tsv(tmp / f"{name}.item", item_header, item_cols)
        _write_tsv(tmp / f"{name}.user", user_header, user_cols)
    return folder
