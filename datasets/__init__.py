"""Data layer: loaders for every supported source, one in-memory type, preprocessing and splits.

Importable only as ``fedvlr_plus.datasets`` (never as a top-level ``datasets``).

``load(source)`` reads any supported source into an :class:`InteractionData`; ``detect_format(source)``
says which format it would use. Sources: the string ``"ml-100k"`` (the copy inside the recbole wheel,
unless a path of that name exists), or a folder or file path:

=====================  =========================================================================
format                 recognised by
=====================  =========================================================================
feature-folder         ``inter.csv`` with ``userID,itemID`` (or an MMRec ``<name>.inter`` without types)
recbole-atomic         ``<name>.inter`` with a ``field:type`` header
movielens-csv          ``ratings.csv`` (ml-latest-small, ml-25m, ...)
movielens-1m           ``ratings.dat``
movielens-100k-raw     ``u.data``
amazon-2014/2018/2023  a reviews file (``.json``, ``.jsonl``, ``.csv``, optionally ``.gz``), by its first line
sequences              ``<name>.txt`` of lines ``user item item ...`` (S3Rec), ``<name>_item2attributes.json``
interactions-table     any other ``.csv`` / ``.tsv`` (optionally ``.gz``) whose header names a user and an item
                       column (``user_id,item_id,rating,timestamp``, ...; see :mod:`.interactions_table`)
=====================  =========================================================================

A folder holding several Amazon review files, or several sequence files, is ambiguous; pass one of the files
instead.

``data.sanity()`` lists what a careful researcher wants to know before trusting the numbers (duplicate rows,
valid/test rows that repeat a training pair, users without training rows) as ``{code, count, message}``
dicts; see :mod:`fedvlr_plus.datasets.sanity` for the codes and what is dropped or kept.
"""

from __future__ import annotations

import os
from pathlib import Path

from .amazon import AMAZON_FORMATS, detect_amazon_version, expected_meta, find_meta, load_amazon, meta_candidates
from .core import (
    CONTENT_COLUMNS,
    INTER_COLUMNS,
    SPLIT_CODES,
    SPLIT_NAMES,
    TEST,
    TRAIN,
    UNSPLIT,
    VALID,
    DataError,
    InteractionData,
    check_features,
    compact,
)
from .feature_folder import interactions_file, load_feature_folder
from .interactions_table import TABLE_ENDINGS, TABLE_FORMAT, load_interactions_table, table_columns
from .movielens import MOVIELENS_FORMATS, load_ml1m, load_ml100k_raw, load_movielens, load_movielens_csv
from .recbole_atomic import load_ml100k, ml100k_folder, read_atomic, write_atomic
from .sanity import print_warnings
from .sequences import SEQUENCE_FORMAT, load_sequences, sequence_files, sniff_sequences

__all__ = [
    "CONTENT_COLUMNS",
    "INTER_COLUMNS",
    "SPLIT_CODES",
    "SPLIT_NAMES",
    "TEST",
    "TRAIN",
    "UNSPLIT",
    "VALID",
    "DataError",
    "InteractionData",
    "check_features",
    "compact",
    "FORMATS",
    "detect_format",
    "load",
    "load_amazon",
    "detect_amazon_version",
    "find_meta",
    "meta_candidates",
    "expected_meta",
    "load_feature_folder",
    "load_movielens",
    "load_movielens_csv",
    "load_ml1m",
    "load_ml100k_raw",
    "read_atomic",
    "write_atomic",
    "load_ml100k",
    "ml100k_folder",
    "load_sequences",
    "load_interactions_table",
    "print_warnings",
]

FORMATS = (
    "feature-folder",
    "recbole-atomic",
    "movielens-csv",
    "movielens-1m",
    "movielens-100k-raw",
    *AMAZON_FORMATS,
    SEQUENCE_FORMAT,
    TABLE_FORMAT,
)
EMBEDDED = "ml-100k"
_REVIEW_ENDINGS = (".json", ".jsonl", ".csv", ".json.gz", ".jsonl.gz", ".csv.gz")
_LOOKED_FOR = (
    "inter.csv (feature folder), <name>.inter (RecBole atomic), ratings.csv (MovieLens CSV), "
    "ratings.dat (MovieLens-1M), u.data (MovieLens-100K raw), or one Amazon reviews or ratings-only file "
    "(*.json, *.jsonl, *.csv, optionally .gz), one sequence file (<name>.txt of lines "
    "'user item item ...'), or one interactions table (*.csv, *.tsv, optionally .gz, with a header naming a "
    "user and an item column)"
)


def _has_types(path: Path) -> bool:
    from ._io import first_line

    header = first_line(path) or ""
    return ":" in header.split("\t")[0]


def _amazon_candidates(folder: Path) -> list[Path]:
    out = []
    for p in sorted(folder.iterdir()):
        if p.is_file() and p.name.endswith(_REVIEW_ENDINGS) and not p.name.startswith("meta_"):
            try:
                detect_amazon_version(p)
            except DataError:
                continue
            out.append(p)
    return out


def _resolve(source) -> tuple[str, Path, dict]:
    """(format, path to hand to the loader, extra loader arguments)."""
    if isinstance(source, str) and source == EMBEDDED and not os.path.exists(source):
        return "recbole-atomic", ml100k_folder(), {"name": EMBEDDED, "embedded": True}
    path = Path(source).expanduser()
    if not path.exists():
        raise DataError(
            f"{path}: no such file or folder (pass a dataset folder, an Amazon reviews file, "
            f"or '{EMBEDDED}' for the copy in the recbole wheel)"
        )
    if path.is_file():
        return _resolve_file(path)
    inter = interactions_file(path)
    if inter is not None:
        return "feature-folder", path, {}
    if any(path.glob("*.inter")):
        typed = [p for p in path.glob("*.inter") if _has_types(p)]
        if typed:
            return "recbole-atomic", path, {}  # read_atomic picks the name (or refuses an ambiguous folder)
    for fname, (fmt, _) in MOVIELENS_FORMATS.items():
        if (path / fname).is_file():
            if fname == "ratings.csv" and not _movielens_header(path / fname):
                continue  # a ratings.csv of other columns: an interactions table
            return fmt, path, {}
    review = _only_one(path, _amazon_candidates(path), "Amazon review files")
    if review is not None:
        return detect_amazon_version(review), review, {}
    sequence = _only_one(path, sequence_files(path), "sequence files")
    if sequence is not None:
        return SEQUENCE_FORMAT, sequence, {}
    table = _only_one(path, _table_candidates(path), "interactions tables")
    if table is not None:
        return TABLE_FORMAT, table, {}
    raise DataError(f"{path}: no recognised dataset in this folder (looked for {_LOOKED_FOR})")


def _only_one(folder: Path, files: list[Path], what: str) -> Path | None:
    """The folder's one file of a kind, or None; several are ambiguous: the user passes the one meant."""
    if len(files) > 1:
        raise DataError(
            f"{folder}: several {what}; pass one of them instead of the folder: " + ", ".join(str(p) for p in files)
        )
    return files[0] if files else None


def _movielens_header(path: Path) -> bool:
    """Whether a ``ratings.csv`` has MovieLens' header (else it is read as an interactions table)."""
    from ._io import first_line

    header = first_line(path) or ""
    return "userId" in header and "movieId" in header


def _table_candidates(folder: Path) -> list[Path]:
    """The folder's files that read as an interactions table."""
    out = []
    for p in sorted(folder.iterdir()):
        if p.is_file() and p.name.endswith(TABLE_ENDINGS) and not isinstance(table_columns(p), str):
            out.append(p)
    return out


def _resolve_file(path: Path) -> tuple[str, Path, dict]:
    name = path.name
    if name == "inter.csv":
        return "feature-folder", path.parent, {}
    if name.endswith(".inter"):
        if not _has_types(path):
            return "feature-folder", path.parent, {}
        stem = name[: -len(".inter")]
        base, dot, suffix = stem.rpartition(".")
        return "recbole-atomic", path.parent, {"name": base if dot and suffix in ("train", "valid", "test") else stem}
    if name in MOVIELENS_FORMATS and (name != "ratings.csv" or _movielens_header(path)):
        return MOVIELENS_FORMATS[name][0], path.parent, {}
    if name.endswith(_REVIEW_ENDINGS + TABLE_ENDINGS):
        return _review_or_table(path)
    if name.endswith(".txt"):
        why_not = sniff_sequences(path)
        if why_not is None:
            return SEQUENCE_FORMAT, path, {}
        raise DataError(
            f"{path}: not a sequence file ({why_not}; a .txt is read as lines 'user item item ...' of integer ids)"
        )
    raise DataError(
        f"{path}: unrecognised file (pass a dataset folder, an Amazon reviews file, inter.csv, "
        f"a .inter file, ratings.csv, ratings.dat, u.data, a <name>.txt sequence file or an interactions "
        f"table: .csv or .tsv with a header naming a user and an item column)"
    )


def _review_or_table(path: Path) -> tuple[str, Path, dict]:
    """An Amazon reviews file where its first line says so, else an interactions table; a file that is neither
    is refused with both reasons."""
    try:
        return detect_amazon_version(path), path, {}
    except DataError as not_amazon:
        found = table_columns(path)
        if not isinstance(found, str):
            return TABLE_FORMAT, path, {}
        if not path.name.endswith(_REVIEW_ENDINGS):
            raise DataError(f"{path}: not an interactions table: {found}") from None
        raise DataError(f"{not_amazon}; nor is it an interactions table: {found}") from None


def detect_format(source) -> str:
    """The format name :func:`load` would use for ``source`` (one of :data:`FORMATS`)."""
    return _resolve(source)[0]


def load(source, **options) -> InteractionData:
    """Load ``source`` (``"ml-100k"``, a folder or a file) into a validated :class:`InteractionData`.

    ``options`` go to the loader: ``meta``, ``dedup``, ``version`` (Amazon); ``keep_unrated_items``
    (MovieLens); ``name``, ``splits`` (RecBole atomic).
    """
    fmt, path, extra = _resolve(source)
    if fmt == "recbole-atomic":
        if extra.pop("embedded", False):
            if options:
                raise TypeError(f"load('{EMBEDDED}') takes no options, got {', '.join(sorted(options))}")
            return load_ml100k()
        return read_atomic(path, **{**extra, **options})
    if fmt == "feature-folder":
        return load_feature_folder(path, **options)
    if fmt == SEQUENCE_FORMAT:
        return load_sequences(path, **options)
    if fmt == TABLE_FORMAT:
        return load_interactions_table(path, **options)
    if fmt in AMAZON_FORMATS:
        return load_amazon(path, version=options.pop("version", fmt), **options)
    loader = {f: l for f, l in MOVIELENS_FORMATS.values()}[fmt]
    return loader(path, **options)
