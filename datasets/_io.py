"""Reading helpers shared by the loaders.

Delimited files are parsed with pandas (fast), but pandas is lenient: short rows are padded, some long rows
are silently cut, and its own error messages count lines differently from an editor. So every table is
read with one spare column and checked afterwards; when a check fails, the file is re-scanned with the
:mod:`csv` module (same separator and quoting) to find the physical line, 1-based as an editor shows it.

Also here: gzip-transparent text opening, JSON-lines iteration with line numbers, text cleaning for
scraped titles and descriptions (broken HTML, entities, stray whitespace), a builder that turns raw id
columns into an :class:`InteractionData` with catalogue order, and atomic folder writes.
"""

from __future__ import annotations

import ast
import contextlib
import csv
import gzip
import html
import io
import json
import os
import re
import shutil
import tempfile
import warnings
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .core import UNSPLIT, DataError, InteractionData, _inter_frame

_EXTRA = "\x00extra"  # spare column that catches rows with too many fields


# ---------------------------------------------------------------------------------------------- opening
def open_text(path: str | os.PathLike, encoding: str = "utf-8", newline: str = "") -> io.TextIOBase:
    """Open a text file for reading, gunzipping ``*.gz`` transparently (``newline=''`` suits the csv module)."""
    path = Path(path)
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding=encoding, newline=newline)
    return open(path, encoding=encoding, newline=newline)


def first_line(path: str | os.PathLike, encoding: str = "utf-8") -> str | None:
    """The first non-blank line (without its line break), or None for an empty file.

    Lines are decoded one at a time: a text reader decodes a whole buffer at once, so a bad byte on
    line 51 would fail here and be blamed on line 1. Such a byte is reported, with its line, by the
    reader that reads that far.
    """
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                try:
                    line = raw.decode(encoding)
                except UnicodeDecodeError:
                    raise DataError(f"{path}: line {lineno}: not valid {encoding} text") from None
                if line.strip():
                    return line.rstrip("\r\n").lstrip("\ufeff")
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise DataError(f"{path}: not a readable gzip file ({e})") from None
    return None


def _decode_error_line(path: Path, encoding: str) -> int | None:
    """1-based line of the first byte sequence that does not decode, or None."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                raw.decode(encoding)
            except UnicodeDecodeError:
                return lineno
    return None


# ---------------------------------------------------------------------------------------------- tables
@dataclass
class Table:
    """A parsed delimited file: ``frame`` plus ``line(row)`` giving a row's 1-based line in the file."""

    frame: pd.DataFrame
    path: Path
    line: Callable[[int], int]

    def where(self, row: int) -> str:
        return f"{self.path}: line {self.line(row)}"


def _records(source: Callable[[], io.TextIOBase], sep: str, quoting: int) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of every non-blank record, the way pandas' C parser splits them."""
    with source() as f:
        reader = csv.reader(f, delimiter=sep, quoting=quoting, quotechar='"', doublequote=True, strict=False)
        for fields in reader:
            if fields:  # pandas skips blank lines
                yield reader.line_num, fields


@dataclass
class _Scan:
    """Re-scans of one delimited file with the csv module, to name the physical line of a data row.

    pandas does not say which line a row came from, so a row's line is found only when a message needs it.
    """

    path: Path
    source: Callable[[], io.TextIOBase]
    sep: str
    quoting: int
    header_line: int
    n_fields: int

    def data_records(self) -> Iterator[tuple[int, list[str]]]:
        return (r for r in _records(self.source, self.sep, self.quoting) if r[0] > self.header_line)

    def line_map(self, rows: Sequence[int]) -> dict[int, tuple[int, int]]:
        """row -> (line, field count)."""
        want = set(int(r) for r in rows)
        found: dict[int, tuple[int, int]] = {}
        if not want:
            return found
        last = max(want)
        for i, (lineno, fields) in enumerate(self.data_records()):
            if i in want:
                found[i] = (lineno, len(fields))
            if i >= last:
                break
        return found

    def line(self, row: int) -> int:
        return self.line_map([row]).get(int(row), (0, 0))[0]

    def field_count_problem(self) -> DataError | None:
        """The first record whose field count is wrong, as an error (a trailing empty field is tolerated)."""
        n = self.n_fields
        for lineno, fields in _records(self.source, self.sep, self.quoting):
            if lineno <= self.header_line:
                continue
            k = len(fields)
            if k != n and not (k == n + 1 and fields[-1] == ""):
                return DataError(f"{self.path}: line {lineno}: expected {n} fields, found {k}")
        return None

    def row_error(self, row: int, message: str) -> DataError:
        """``message`` about a data row; a row with too few fields is reported as that instead."""
        n = self.n_fields
        lineno, k = self.line_map([row]).get(int(row), (0, n))
        if k < n:
            return DataError(f"{self.path}: line {lineno}: expected {n} fields, found {k}")
        return DataError(f"{self.path}: line {lineno}: {message}")


def read_table(
    path: str | os.PathLike,
    *,
    sep: str,
    names: Sequence[str] | None = None,
    required: Sequence[str] = (),
    numbers: Sequence[str] = (),
    integers: Sequence[str] = (),
    nonempty: Sequence[str] = (),
    encoding: str = "utf-8",
    quoting: int = csv.QUOTE_MINIMAL,
    text: str | None = None,
) -> Table:
    """Read a delimited file; every problem is a :class:`DataError` naming the file and the line or column.

    ``names`` given: the file has no header row. Otherwise the first non-blank line is the header, and
    ``required`` columns must be in it. ``numbers`` columns must hold finite numbers (float64),
    ``integers`` whole numbers (int64), ``nonempty`` non-empty strings; all other columns are strings.
    ``text``: the file's content already transformed (e.g. ``::`` replaced by tabs), same line structure.
    """
    path = Path(path)
    if text is not None:
        source = lambda: io.StringIO(text)  # noqa: E731
    else:
        source = lambda: open_text(path, encoding)  # noqa: E731
    header_line, columns = _header_columns(path, source, sep, quoting, names, required, encoding)
    scan = _Scan(path, source, sep, quoting, header_line, len(columns))
    numeric = set(numbers) | set(integers)
    frame = _parse_frame(path, scan, columns, numeric, encoding, text is not None)
    _check_field_counts(frame, scan, columns, numeric)
    for c in columns:
        if c in numeric:
            frame[c] = _number_column(frame[c], c, c in integers, scan)
        elif c in nonempty:
            empty = frame[c].to_numpy() == ""
            if empty.any():
                raise scan.row_error(int(np.flatnonzero(empty)[0]), f"column {c!r} is empty")
    return Table(frame, path, scan.line)


def _header_columns(
    path: Path,
    source: Callable[[], io.TextIOBase],
    sep: str,
    quoting: int,
    names: Sequence[str] | None,
    required: Sequence[str],
    encoding: str,
) -> tuple[int, list[str]]:
    """(line of the header, 0 without one; the column names), the header checked for required and
    duplicate columns."""
    records = _records(source, sep, quoting)
    header_line = 0
    try:
        if names is None:
            try:
                header_line, columns = next(records)
            except StopIteration:
                raise DataError(f"{path}: the file is empty (expected a header line)") from None
            columns = [c.strip().lstrip("\ufeff") for c in columns]
            missing = [c for c in required if c not in columns]
            if missing:
                raise DataError(
                    f"{path}: line {header_line}: missing column{'s' if len(missing) > 1 else ''} "
                    f"{', '.join(repr(c) for c in missing)} (columns found: {', '.join(columns)})"
                )
            dup = sorted({c for c in columns if columns.count(c) > 1})
            if dup:
                raise DataError(f"{path}: line {header_line}: duplicate column name(s) {', '.join(dup)}")
        else:
            columns = list(names)
    except UnicodeDecodeError:
        raise DataError(f"{path}: line {_decode_error_line(path, encoding) or 1}: not valid {encoding} text") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise DataError(f"{path}: not a readable gzip file ({e})") from None
    finally:
        records.close()
    return header_line, columns


def _parse_frame(
    path: Path, scan: _Scan, columns: list[str], numeric: set[str], encoding: str, from_text: bool
) -> pd.DataFrame:
    """The data rows parsed by pandas' C reader, with one spare column; every column not in ``numeric`` a
    string. pandas' own errors become a :class:`DataError` that names the line."""
    dtype = {c: str for c in columns if c not in numeric}
    dtype[_EXTRA] = str
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)
            return pd.read_csv(
                scan.source() if from_text else path,
                sep=scan.sep,
                header=None,
                names=columns + [_EXTRA],
                skiprows=scan.header_line,
                dtype=dtype,
                keep_default_na=False,
                na_values=[],
                quoting=scan.quoting,
                encoding=encoding,
                index_col=False,
                engine="c",
                skip_blank_lines=True,
                compression="gzip" if path.name.endswith(".gz") and not from_text else None,
            )
    except UnicodeDecodeError:
        raise DataError(
            f"{path}: line {_decode_error_line(path, encoding) or '?'}: not valid {encoding} text"
        ) from None
    except (pd.errors.ParserError, pd.errors.ParserWarning) as e:
        problem = scan.field_count_problem()
        raise (problem or DataError(f"{path}: could not parse the file ({e})")) from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise DataError(f"{path}: not a readable gzip file ({e})") from None


def _check_field_counts(frame: pd.DataFrame, scan: _Scan, columns: list[str], numeric: set[str]) -> None:
    """Drop the spare column; a row with too many or too few fields is reported before anything else."""
    extra = frame.pop(_EXTRA).to_numpy()
    if len(extra) and (extra != "").any():
        problem = scan.field_count_problem()
        if problem is not None:
            raise problem
    if len(frame):
        # A short row is padded with empty strings; a wrong field count is reported before anything else.
        last = columns[-1]
        if last not in numeric and (frame[last].to_numpy() == "").any():
            problem = scan.field_count_problem()
            if problem is not None:
                raise problem


def _number_column(col: pd.Series, c: str, integer: bool, scan: _Scan) -> np.ndarray:
    """A column as finite float64, or as int64 when ``integer``; the first bad value names its line."""
    values = col.to_numpy() if col.dtype.kind in "iuf" else pd.to_numeric(col, errors="coerce").to_numpy()
    values = values.astype(np.float64, copy=False) if values.dtype.kind == "f" else values
    bad = ~np.isfinite(values) if values.dtype.kind == "f" else np.zeros(len(values), bool)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise scan.row_error(r, f"column {c!r}: {str(col.iloc[r])!r} is not a finite number")
    if integer:
        if values.dtype.kind == "f":
            frac = values != np.round(values)
            if frac.any():
                r = int(np.flatnonzero(frac)[0])
                raise scan.row_error(r, f"column {c!r}: {str(col.iloc[r])!r} is not a whole number")
        return values.astype(np.int64)
    return values.astype(np.float64)


# ---------------------------------------------------------------------------------------------- JSON lines
def iter_json_lines(
    path: str | os.PathLike, *, python_literals: bool = False, want: Callable[[str], bool] | None = None
) -> Iterator[tuple[int, dict]]:
    """Yield ``(line number, object)`` for every non-blank line of a JSON-lines file (``.gz`` allowed).

    ``python_literals``: lines may be Python dict literals (Amazon 2014 metadata), parsed with
    :func:`ast.literal_eval` (never ``eval``). ``want(line) -> bool`` lets a caller skip lines cheaply
    before parsing them.
    """
    path = Path(path)
    lineno = 0
    try:
        # Records end at '\n' only: a stray '\r' inside scraped text must not split a record.
        with open_text(path, newline="\n") as f:
            for lineno, line in enumerate(f, 1):
                s = line.strip()
                if not s or (want is not None and not want(s)):
                    continue
                try:
                    obj = json.loads(s, strict=False)  # strict=False: raw control characters inside strings
                except json.JSONDecodeError as e:
                    if not python_literals:
                        raise DataError(f"{path}: line {lineno}: broken JSON ({e.msg}, column {e.colno})") from None
                    try:
                        obj = ast.literal_eval(s)
                    except (ValueError, SyntaxError, MemoryError, RecursionError) as e2:
                        raise DataError(
                            f"{path}: line {lineno}: neither JSON nor a Python literal ({type(e2).__name__}: {e2})"
                        ) from None
                if not isinstance(obj, dict):
                    raise DataError(f"{path}: line {lineno}: expected an object {{...}}, found {type(obj).__name__}")
                yield lineno, obj
    except UnicodeDecodeError:
        raise DataError(
            f"{path}: line {_decode_error_line(path, 'utf-8') or lineno + 1}: not valid UTF-8 text"
        ) from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise DataError(f"{path}: not a readable gzip file, or cut off after line {lineno} ({e})") from None


# ---------------------------------------------------------------------------------------------- text
_TAG = re.compile(r"<[^<>]*>")
# A tag cut off by the end of the field, e.g. Amazon 2018 magazine titles '<span class="a-size-medium"'.
_OPEN_TAIL = re.compile(r"<[A-Za-z/!][^<>]*$")
# The end of a tag whose start was cut off, e.g. ' Magazines" />'.
_CLOSE_HEAD = re.compile(r"""^[^<>]*["']\s*/?>""")
_SPACE = re.compile(r"\s+")


def clean_text(value) -> str:
    """Plain text from a scraped field: tags (also cut-off ones) removed, entities decoded, whitespace collapsed.

    Lists are joined with spaces; None gives ''. Text that is nothing but markup becomes ''.
    """
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return " ".join(t for t in (clean_text(v) for v in value) if t)
    s = str(value)
    if "<" in s or ">" in s:
        s = _CLOSE_HEAD.sub(" ", s)
        s = _TAG.sub(" ", s)
        s = _OPEN_TAIL.sub(" ", s)
    s = html.unescape(s)
    return _SPACE.sub(" ", s).strip()


def squash(value) -> str:
    """Whitespace collapsed to single spaces (no markup handling): for clean sources such as MovieLens."""
    return "" if value is None else _SPACE.sub(" ", str(value)).strip()


# ---------------------------------------------------------------------------------------------- building
def show(value) -> str:
    """An id as a user would write it: numbers plain, strings quoted (numpy scalars unwrapped)."""
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value)


def _codes(raw: np.ndarray, order: np.ndarray, *, what: str, catalogue: str, where: Callable[[int], str]) -> np.ndarray:
    index = pd.Index(order)
    if not index.is_unique:
        dup = index[index.duplicated()][0]
        raise DataError(f"{catalogue}: {what} id {show(dup)} appears more than once")
    codes = index.get_indexer(raw)
    if (codes < 0).any():
        r = int(np.flatnonzero(codes < 0)[0])
        raise DataError(f"{where(r)}: {what} {show(raw[r])} is not in {catalogue}")
    return codes.astype(np.int64)


def assemble(
    name: str,
    raw_users,
    raw_items,
    *,
    rating=None,
    timestamp=None,
    split=None,
    user_order=None,
    item_order=None,
    user_catalogue: str = "",
    item_catalogue: str = "",
    where: Callable[[int], str],
    source: str = "",
    format: str = "",
) -> InteractionData:
    """Build an :class:`InteractionData` from raw id columns.

    Ids follow ``user_order`` / ``item_order`` (a catalogue file's order, every entry kept) when given,
    otherwise first appearance. An id missing from its catalogue is a :class:`DataError` naming the row via
    ``where(row)`` (e.g. ``"ratings.csv: line 12"``).
    """
    raw_users = np.asarray(raw_users)
    raw_items = np.asarray(raw_items)
    if user_order is None:
        u, user_ids = pd.factorize(raw_users, sort=False)
        user_ids = np.asarray(user_ids)
    else:
        user_ids = np.asarray(user_order)
        u = _codes(raw_users, user_ids, what="user", catalogue=user_catalogue, where=where)
    if item_order is None:
        i, item_ids = pd.factorize(raw_items, sort=False)
        item_ids = np.asarray(item_ids)
    else:
        item_ids = np.asarray(item_order)
        i = _codes(raw_items, item_ids, what="item", catalogue=item_catalogue, where=where)
    inter = _inter_frame(u, i, rating, timestamp, split)
    return InteractionData(name, _ids(user_ids), _ids(item_ids), inter, source=source, format=format)


def _ids(arr: np.ndarray) -> np.ndarray:
    """Raw ids as int64 when they are integers, else as an object array of str."""
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    return np.array([str(x) for x in arr], dtype=object)


def empty_content(n: int) -> pd.DataFrame:
    """Item content with nothing known: '' titles and descriptions, no categories, no image."""
    return pd.DataFrame(
        {"title": [""] * n, "description": [""] * n, "categories": [[] for _ in range(n)], "image": [None] * n}
    )


def check_nonempty(data: InteractionData, path) -> None:
    if data.n_inter == 0:
        raise DataError(f"{path}: no interactions (the file has no data rows)")


def split_column(values: np.ndarray, table: Table, column: str) -> np.ndarray:
    """Split labels 0/1/2 from an integer column; anything else names the line."""
    bad = ~np.isin(values, (0, 1, 2))
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise DataError(f"{table.where(r)}: column {column!r}: split label {values[r]} is not 0, 1 or 2")
    return values.astype(np.int8)


def require_splits(split: np.ndarray, where: str) -> None:
    """With split labels present, train and test must not be empty (valid may be)."""
    if split is None or (split == UNSPLIT).all():
        return
    for code, label in ((0, "train"), (2, "test")):
        if not (split == code).any():
            raise DataError(f"{where}: the {label} split is empty (no row has split label {code})")


# ---------------------------------------------------------------------------------------------- writing
@contextlib.contextmanager
def atomic_folder(folder: str | os.PathLike, stale: Sequence[str] = ()):
    """Write files into a temporary folder beside ``folder``; on success move them into place.

    A new folder appears in one rename. Into an existing folder each file is moved with :func:`os.replace`
    (other files there are left alone) and the names in ``stale`` are removed when not written this time.
    On error nothing is changed.
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the result should look like any new folder
        if not folder.exists():
            os.rename(tmp, folder)
            return
        if not folder.is_dir():
            raise NotADirectoryError(f"{folder} exists and is not a folder")
        written = set()
        for f in sorted(tmp.iterdir()):
            os.replace(f, folder / f.name)
            written.add(f.name)
        for name in stale:
            if name not in written and (folder / name).exists():
                (folder / name).unlink()
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
