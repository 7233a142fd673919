"""A plain interactions table: one delimited file whose header names a user column and an item column.

Most logs a recommender team holds are such a file (``user_id,item_id,rating,timestamp``, a tab-separated
export, a ``;``-separated spreadsheet). The columns are found by their names, compared without case, ``_``,
``-``, ``.`` or spaces (``user_id``, ``userId`` and ``User ID`` are one name):

- user: :data:`USER_NAMES`; item: :data:`ITEM_NAMES` (both required);
- rating: :data:`RATING_NAMES`, optional (every row then counts 1);
- time: :data:`TIME_NAMES`, optional: numbers (Unix seconds or milliseconds), or dates and times that pandas
  reads (``2023-05-01``, ``2023-05-01T10:00:00Z``), kept as Unix seconds. Without it the rows keep file order
  within a user, which the time-ordered splits then follow.

Other columns are ignored. Ids are kept as written (strings: ``007`` stays ``007``), users and items in order
of first appearance. The table holds no item content: the FedVLR layer needs a view store built from content
(a feature folder holds one). The separator is the first of tab, ``,`` and ``;`` found in the header.
Ambiguity is an error: two columns that both look like the user (or item, rating, time) column are named, and
a file with no user or item column is not read as a table.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from ._io import Table, assemble, check_nonempty, empty_content, first_line, read_table
from .core import DataError, InteractionData

TABLE_FORMAT = "interactions-table"
#: the file endings read as a table (a ``.txt`` is a sequence file; see :mod:`.sequences`)
TABLE_ENDINGS = (".csv", ".tsv", ".csv.gz", ".tsv.gz")

USER_NAMES = ("user_id", "userId", "user", "uid", "reviewerID", "customer_id", "visitor_id", "client_id")
ITEM_NAMES = (
    "item_id", "itemId", "item", "iid", "movieId", "asin", "parent_asin", "product_id", "track_id", "artist_id",
    "book_id", "isbn", "business_id", "song_id", "video_id", "article_id",
)  # fmt: skip
RATING_NAMES = ("rating", "score", "stars", "overall")
TIME_NAMES = ("timestamp", "time", "ts", "datetime", "date", "unixReviewTime", "event_time", "created_at")
_ROLES = {"user": USER_NAMES, "item": ITEM_NAMES, "rating": RATING_NAMES, "time": TIME_NAMES}
_SEPARATORS = ("\t", ",", ";")
#: how a number is written (a time column whose first value is one is read as numbers)
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _key(name: str) -> str:
    """A column name as compared: lower case, without ``_``, ``-``, ``.`` and spaces."""
    return re.sub(r"[\s_.\-]+", "", name.strip().lstrip("\ufeff")).lower()


def table_columns(path: str | Path) -> tuple[str, dict[str, str]] | str:
    """``(separator, {role: column})`` of a table file (roles ``user``, ``item`` and those of ``rating`` and
    ``time`` it has), or a short reason why the file is not one. Two columns of one role raise
    :class:`DataError`: the file is a table, but which column is meant is not clear."""
    path = Path(path)
    header = first_line(path)
    if header is None:
        return "the file is empty"
    sep = next((s for s in _SEPARATORS if s in header), None)
    if sep is None:
        return "its first line holds one field"
    columns = [c.strip().strip('"').lstrip("\ufeff") for c in header.split(sep)]
    roles = {}
    for role, names in _ROLES.items():
        wanted = {_key(n) for n in names}
        found = [c for c in columns if _key(c) in wanted]
        if len(found) > 1:
            raise DataError(
                f"{path}: line 1: columns {', '.join(repr(c) for c in found)} all look like the {role} column; "
                f"keep one of them"
            )
        if found:
            roles[role] = found[0]
    missing = [role for role in ("user", "item") if role not in roles]
    if missing:
        looked = "; ".join(f"{role}: {', '.join(_ROLES[role])}" for role in missing)
        return f"no {' or '.join(missing)} column in its header (looked for {looked})"
    return sep, roles


def load_interactions_table(path: str | Path) -> InteractionData:
    """Read a plain interactions table (see the module docstring)."""
    path = Path(path)
    found = table_columns(path)
    if isinstance(found, str):
        raise DataError(f"{path}: not an interactions table: {found}")
    sep, roles = found
    numbers = [roles["rating"]] if "rating" in roles else []
    nonempty = [roles[role] for role in ("user", "item", "time") if role in roles]
    table = read_table(path, sep=sep, required=(roles["user"], roles["item"]), numbers=numbers, nonempty=nonempty)
    frame = table.frame
    data = assemble(
        _name(path),
        frame[roles["user"]].to_numpy(),
        frame[roles["item"]].to_numpy(),
        rating=frame[roles["rating"]].to_numpy() if "rating" in roles else None,
        timestamp=_seconds(frame[roles["time"]], roles["time"], table) if "time" in roles else None,
        where=table.where,
        source=str(path),
        format=TABLE_FORMAT,
    )
    check_nonempty(data, path)
    return data.replace(items=empty_content(data.n_items)).validate()


def _name(path: Path) -> str:
    """The data set's name: the file name without its endings."""
    name = path.name
    for ending in TABLE_ENDINGS:
        if name.endswith(ending):
            return name[: -len(ending)]
    return name


def _seconds(column: pd.Series, name: str, table: Table) -> np.ndarray:
    """A time column as float seconds: numbers as written where its first value is written as one, else dates read
    by pandas (UTC); the first value that does not read names its line."""
    numeric = pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float64)
    if not len(numeric) or _NUMBER.fullmatch(str(column.iloc[0]).strip()):
        values, what = numeric, "a finite number"
    else:
        dates = pd.to_datetime(column, errors="coerce", utc=True, format="mixed")
        values, what = (dates - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy(dtype=np.float64), "a date"
    bad = ~np.isfinite(values)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise DataError(f"{table.where(r)}: column {name!r}: {column.iloc[r]!r} is not {what}")
    return values
