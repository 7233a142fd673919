"""Amazon review data from the McAuley lab, three releases.

- ``amazon-2014`` (McAuley, Targett, Shi & van den Hengel, "Image-based Recommendations on Styles and
  Substitutes", SIGIR 2015; He & McAuley, WWW 2016): reviews are JSON lines with ``reviewerID, asin,
  overall, unixReviewTime`` (and ``helpful``); metadata lines are *Python dict literals* (single quotes),
  parsed with :func:`ast.literal_eval`: ``title, description, categories`` (a list of category paths),
  ``imUrl``.
- ``amazon-2018`` (Ni, Li & McAuley, "Justifying Recommendations using Distantly-Labeled Reviews and
  Fine-Grained Aspects", EMNLP 2019): gzip JSON lines, reviews as in 2014 (plus ``verified``, ``vote``,
  ``style``); metadata ``title`` (sometimes broken HTML), ``description`` (list), ``category`` (list),
  ``image`` or ``imageURL``/``imageURLHighRes`` (lists of URLs); an asin may appear more than once.
- ``amazon-2023`` (Hou, Li, He, Yan, Chen & McAuley, "Bridging Language and Items for Retrieval and
  Recommendation", 2024): reviews ``user_id, parent_asin, rating, timestamp`` (milliseconds) as JSON lines
  or as the benchmark CSV files; metadata JSON lines keyed by ``parent_asin`` with ``title``,
  ``description`` (list), ``categories``, ``main_category``, ``images`` (``{thumb, large, hi_res, variant}``).
- The header-less "ratings only" CSV files of 2014 (``ratings_<Category>.csv``: ``user,asin,rating,time``) and
  2018 (``<Category>.csv``: ``asin,user,rating,time``), told apart by which column holds product ids.

The release is recognised from the first line of the reviews file (a ratings-only file: from its first rows).
Items are the reviewed products (2023: ``parent_asin``) in order of first appearance; users likewise. Metadata
is joined by asin: found automatically as a sibling ``meta_<Category>.json[.gz]`` (2014/2018) or
``meta_<Category>.jsonl[.gz]`` (2023) where ``<Category>`` is the reviews file name without ``reviews_`` or
``ratings_``, ``_5`` and extensions, or
passed as ``meta=``. Items without metadata keep empty content; for an asin listed twice the first
entry wins. Text is cleaned (tags, including cut-off ones, removed; HTML entities decoded; whitespace
collapsed), so a title that is only markup becomes ''. The image is the main product image: 2023 the
``large`` URL of the ``MAIN`` variant (else the first image), 2018 the first ``imageURLHighRes`` (else the
first ``imageURL``/``image`` with Amazon's size suffix such as ``._SX38_SY50_CR,0,0,38,50_`` removed,
which names the full-size picture), 2014 ``imUrl``. Categories: the category lists flattened, de-duplicated
in order, falling back to the main category when empty. ``brand`` (2023: ``store``) is kept as an extra
column because multimodal recommenders (e.g. MMRec) put it into the item text.

Repeated (user, item) reviews (the 2018 files repeat them across product variants) are removed by
default, keeping the earliest (ties: the first in the file; the count is kept in ``notes`` as
``duplicates_dropped`` and reported by ``sanity()``); timestamps are kept as given (seconds for
2014/2018, milliseconds for 2023).
"""

from __future__ import annotations

import ast
import csv
import itertools
import json
import re
from pathlib import Path

import numpy as np

from . import splits as _splits
from ._io import assemble, clean_text, empty_content, first_line, iter_json_lines, open_text, read_table
from .core import DataError, InteractionData

AMAZON_FORMATS = ("amazon-2014", "amazon-2018", "amazon-2023")
_REVIEW_FIELDS = {
    "amazon-2014": ("reviewerID", "asin", "overall", "unixReviewTime"),
    "amazon-2018": ("reviewerID", "asin", "overall", "unixReviewTime"),
    "amazon-2023": ("user_id", "parent_asin", "rating", "timestamp"),
}
_SUFFIXES = (".json.gz", ".jsonl.gz", ".csv.gz", ".json", ".jsonl", ".csv")
_SIZE_SUFFIX = re.compile(r"\._[^/]*_(\.[A-Za-z0-9]+)$")


def _strip_ext(name: str) -> str:
    for suf in _SUFFIXES:
        if name.endswith(suf):
            return name[: -len(suf)]
    return name


def detect_amazon_version(path: str | Path) -> str:
    """``amazon-2014``, ``amazon-2018`` or ``amazon-2023`` from the first line of a reviews file."""
    path = Path(path)
    line = first_line(path)
    if line is None:
        raise DataError(f"{path}: the file is empty")
    s = line.strip()
    if s.startswith("{"):
        try:
            obj = json.loads(s)
        except json.JSONDecodeError as e:
            try:  # some 2014 files are Python literals throughout, reviews included
                obj = ast.literal_eval(s)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                raise DataError(f"{path}: line 1: broken JSON ({e.msg}, column {e.colno})") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}: line 1: expected a JSON object")
        if "user_id" in obj and ("parent_asin" in obj or "asin" in obj):
            return "amazon-2023"
        if "reviewerID" in obj and "asin" in obj:
            # 2018 records always carry 'verified'; 2014 ones carry 'helpful' and none of the 2018 additions.
            if "helpful" in obj and not any(k in obj for k in ("verified", "vote", "style", "image")):
                return "amazon-2014"
            return "amazon-2018"
        hint = (
            " (this looks like a metadata file; pass the reviews file)"
            if "title" in obj or "parent_asin" in obj
            else ""
        )
        raise DataError(
            f"{path}: line 1 is not an Amazon review: expected reviewerID and asin (2014/2018) or "
            f"user_id and parent_asin (2023); keys found: {', '.join(sorted(obj)[:12])}{hint}"
        )
    cols = [c.strip().lstrip("\ufeff") for c in next(csv.reader([s]))]
    if "user_id" in cols and "parent_asin" in cols:
        return "amazon-2023"
    release = _ratings_only_release(path)
    if release is not None:
        return release
    raise DataError(
        f"{path}: line 1 is neither a JSON review, an Amazon 2023 CSV header "
        f"(user_id,parent_asin,rating,timestamp) nor a ratings-only row (user,asin,rating,time or "
        f"asin,user,rating,time); found {s[:80]!r}"
    )


#: an Amazon product id: a 10-character ASIN, or a book's ISBN-10
_ASIN = re.compile(r"B[0-9A-Z]{9}|[0-9]{9}[0-9X]")
#: the columns of the header-less "ratings only" CSV files, by release
RATINGS_ONLY_COLUMNS = {
    "amazon-2014": ("user", "item", "rating", "timestamp"),
    "amazon-2018": ("item", "user", "rating", "timestamp"),
}


def _ratings_only_release(path: Path, sample: int = 500) -> str | None:
    """The release of a header-less Amazon "ratings only" CSV, told by which column holds the product ids: 2014
    files are ``user,asin,rating,time``, 2018 files ``asin,user,rating,time`` (user ids start with ``A`` and
    never look like an ASIN). None when the first ``sample`` rows are not such a file; their numbers are
    checked by the reader, which names the line of a bad one."""
    with open_text(path) as f:
        rows = [r for r in csv.reader(itertools.islice(f, sample)) if r]
    if not rows or len(rows[0]) != 4:
        return None
    rows = [r for r in rows if len(r) == 4]  # a malformed row is the reader's to name, with its line
    share = [np.mean([_ASIN.fullmatch(r[c].strip()) is not None for r in rows]) for c in (0, 1)]
    if share[1] >= 0.9 and share[0] <= 0.1:
        return "amazon-2014"
    if share[0] >= 0.9 and share[1] <= 0.1:
        return "amazon-2018"
    return None


def _meta_categories(reviews: Path) -> list[str]:
    """The categories whose metadata may describe ``reviews``: its own name's, then, for a 5-core file
    (``<Category>_5``), its category's, which is the name Amazon publishes the metadata under."""
    stem = _strip_ext(reviews.name).split(".")[0]  # 2023 benchmark files: Category.train.csv.gz
    for prefix in ("reviews_", "ratings_"):
        if stem.startswith(prefix):
            stem = stem[len(prefix) :]
    return [stem, stem[:-2]] if stem.endswith("_5") else [stem]


def _meta_exts(version: str) -> tuple[str, ...]:
    return (
        (".jsonl.gz", ".jsonl", ".json.gz", ".json")
        if version == "amazon-2023"
        else (".json.gz", ".json", ".jsonl.gz", ".jsonl")
    )


def meta_candidates(reviews: str | Path, version: str | None = None) -> list[Path]:
    """Where the metadata of ``reviews`` may be (``meta_<Category>...`` beside it), in the order it is looked for."""
    reviews = Path(reviews)
    exts = _meta_exts(version or detect_amazon_version(reviews))
    return [reviews.parent / f"meta_{cat}{ext}" for cat in _meta_categories(reviews) for ext in exts]


def expected_meta(reviews: str | Path, version: str | None = None) -> Path:
    """The metadata file to put beside ``reviews`` when there is none: its category's, in the loader's first form."""
    reviews = Path(reviews)
    exts = _meta_exts(version or detect_amazon_version(reviews))
    return reviews.parent / f"meta_{_meta_categories(reviews)[-1]}{exts[0]}"


def find_meta(reviews: str | Path, version: str | None = None) -> Path | None:
    """The metadata file beside ``reviews`` (``meta_<Category>...``), or None."""
    return next((p for p in meta_candidates(reviews, version) if p.is_file()), None)


def _number(value, path, lineno, field):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise DataError(f"{path}: line {lineno}: field {field!r}: {value!r} is not a number") from None
        else:
            raise DataError(f"{path}: line {lineno}: field {field!r}: {value!r} is not a number")
    value = float(value)
    if not np.isfinite(value):
        raise DataError(f"{path}: line {lineno}: field {field!r}: {value!r} is not a finite number")
    return value


def _read_reviews(path: Path, version: str):
    ukey, ikey, rkey, tkey = _REVIEW_FIELDS[version]
    if not (first_line(path) or "").lstrip().startswith("{"):
        if version == "amazon-2023":
            t = read_table(
                path, sep=",", required=(ukey, ikey, rkey, tkey), numbers=(rkey, tkey), nonempty=(ukey, ikey)
            )
        else:
            ukey, ikey, rkey, tkey = "user", "item", "rating", "timestamp"
            t = read_table(
                path, sep=",", names=RATINGS_ONLY_COLUMNS[version], numbers=(rkey, tkey), nonempty=(ukey, ikey)
            )
        f = t.frame
        return (
            f[ukey].to_numpy(dtype=object),
            f[ikey].to_numpy(dtype=object),
            f[rkey].to_numpy(),
            f[tkey].to_numpy(),
            t.where,
        )
    users, items, ratings, times, lines = [], [], [], [], []
    for lineno, obj in iter_json_lines(path, python_literals=version == "amazon-2014"):
        for key in (ukey, ikey, rkey, tkey):
            if key not in obj:
                raise DataError(
                    f"{path}: line {lineno}: missing field {key!r} (fields found: {', '.join(sorted(obj))})"
                )
        u, i = obj[ukey], obj[ikey]
        for key, v in ((ukey, u), (ikey, i)):
            if not isinstance(v, (str, int)) or isinstance(v, bool) or str(v) == "":
                raise DataError(f"{path}: line {lineno}: field {key!r}: {v!r} is not an id")
        users.append(str(u))
        items.append(str(i))
        ratings.append(_number(obj[rkey], path, lineno, rkey))
        times.append(_number(obj[tkey], path, lineno, tkey))
        lines.append(lineno)
    line_of = np.asarray(lines, dtype=np.int64)
    return (
        np.asarray(users, dtype=object),
        np.asarray(items, dtype=object),
        np.asarray(ratings),
        np.asarray(times),
        lambda r: f"{path}: line {line_of[r]}",
    )


def _categories(obj: dict) -> list[str]:
    raw = obj.get("categories", obj.get("category"))
    flat: list = []

    def walk(v):
        if isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif v is not None:
            flat.append(v)

    walk(raw)
    if not flat:
        walk(obj.get("main_category", obj.get("main_cat")))
    out, seen = [], set()
    for c in flat:
        c = clean_text(c)
        if c and c not in seen:
            seen.add(c)
            out.append(c)
    return out


def _first_url(value) -> str | None:
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, str) and v.strip():
                return v.strip()
    return None


def _image(obj: dict, version: str) -> str | None:
    images = obj.get("images")
    if version == "amazon-2023" or isinstance(images, (list, dict)) and images:
        entries = images
        if isinstance(images, dict):  # Hugging Face's column-wise form: {"large": [...], "variant": [...]}
            keys = list(images)
            n = max((len(v) for v in images.values() if isinstance(v, list)), default=0)
            entries = [
                {k: (images[k][j] if isinstance(images[k], list) and j < len(images[k]) else None) for k in keys}
                for j in range(n)
            ]
        entries = [e for e in (entries or []) if isinstance(e, dict)]
        main = [e for e in entries if str(e.get("variant") or "").upper() == "MAIN"]
        for e in main + entries:
            for key in ("large", "hi_res", "thumb"):
                url = _first_url(e.get(key))
                if url:
                    return url
        if version == "amazon-2023":
            return None
    url = _first_url(obj.get("imageURLHighRes"))
    if url:
        return url
    url = _first_url(obj.get("imageURL")) or _first_url(obj.get("image"))
    if url:
        return _SIZE_SUFFIX.sub(r"\1", url)
    return _first_url(obj.get("imUrl"))


def _read_meta(path: Path, version: str, item_ids: np.ndarray):
    """Content rows for the items in ``item_ids`` found in the metadata file (first entry per asin)."""
    key = "parent_asin" if version == "amazon-2023" else "asin"
    wanted = {str(a): k for k, a in enumerate(item_ids)}
    # Cheap pre-filter: most metadata lines describe products that were never reviewed in this file.
    pattern = re.compile(r"""["']""" + key + r"""["']\s*:\s*["']([^"']*)["']""")

    def want(line: str) -> bool:
        m = pattern.search(line)
        return m is None or m.group(1) in wanted

    found: dict[int, dict] = {}
    for lineno, obj in iter_json_lines(path, python_literals=True, want=want):
        if key not in obj:
            if version == "amazon-2023" and "asin" in obj:
                asin = obj["asin"]
            else:
                raise DataError(
                    f"{path}: line {lineno}: missing field {key!r} (fields found: {', '.join(sorted(obj)[:12])})"
                )
        else:
            asin = obj[key]
        k = wanted.get(str(asin))
        if k is None or k in found:
            continue  # not reviewed here, or a repeated asin: the first entry wins
        found[k] = {
            "title": clean_text(obj.get("title")),
            "description": clean_text(obj.get("description")),
            "categories": _categories(obj),
            "image": _image(obj, version),
            "brand": clean_text(obj.get("brand", obj.get("store"))),
        }
    return found


def load_amazon(
    reviews: str | Path,
    meta: str | Path | bool | None = None,
    *,
    version: str | None = None,
    dedup: bool = True,
    name: str | None = None,
) -> InteractionData:
    """Load an Amazon reviews file (2014, 2018 or 2023) with its metadata.

    ``meta``: the metadata file; None finds the sibling ``meta_<Category>`` file (no content when there is
    none); False skips metadata. ``dedup``: drop repeated (user, item) pairs, keeping the earliest.
    """
    path = Path(reviews)
    if not path.is_file():
        raise DataError(f"{path}: no such file (pass an Amazon reviews file)")
    version = version or detect_amazon_version(path)
    if version not in AMAZON_FORMATS:
        raise ValueError(f"version must be one of {', '.join(AMAZON_FORMATS)}")
    users, items, ratings, times, where = _read_reviews(path, version)
    if len(users) == 0:
        raise DataError(f"{path}: no reviews (the file has no data lines)")
    data = assemble(
        name or _strip_ext(path.name),
        users,
        items,
        rating=ratings,
        timestamp=times,
        where=where,
        source=str(path),
        format=version,
    )
    if dedup:
        data = _splits.dedup(data, keep="first")
    meta_path = None if meta is False else (find_meta(path, version) if meta in (None, True) else Path(meta))
    if meta is True and meta_path is None:
        raise DataError(f"{path}: no metadata file meta_<Category>.json[l][.gz] beside it")
    if meta_path is not None:
        if not meta_path.is_file():
            raise DataError(f"{meta_path}: no such metadata file")
        found = _read_meta(meta_path, version, data.item_ids)
    else:
        found = {}
    content = empty_content(data.n_items)
    content["brand"] = ""
    for col in content.columns:
        values = list(content[col])
        for k, row in found.items():
            values[k] = row[col]
        content[col] = values
    return data.replace(items=content).validate()
