"""Item sequences, one line per user, as released with S3Rec and the sequential benchmarks after it.

Format (Zhou et al., "S3-Rec: Self-Supervised Learning for Sequential Recommendation with Mutual Information
Maximization", CIKM 2020): ``<name>.txt`` holds one line per user, ``user item item ...``, whitespace
separated, the items in time order; ``<name>_item2attributes.json`` beside it (optional) maps each item id to
its attribute ids (``{"4": [1, 2, 3]}``; for the Amazon sets, category and brand ids). The benchmark's split
is leave-one-out by time (last item = test, second-to-last = valid), so each interaction's timestamp is its
0-based position in its user's sequence and :func:`splits.leave_one_out` reproduces that split exactly.

Ids are kept as the raw integers in ``user_ids`` / ``item_ids``: users in file order, items in ascending id
order (so the usual 1-based item ids map to internal ``id - 1``). Items listed in the attributes file but in
no sequence are left out of the catalogue. Attributes become ``features['attributes']``: a float32 multi-hot
matrix ``[n_items, n_attributes]`` (columns: the distinct attribute ids, ascending), rows L2-normalised so
that every item weighs the same in a dot product whatever its number of attributes. Items the file does not
list keep an all-zero row; their count, and that of listed items in no sequence, are recorded in ``notes``
and printed as warnings. Repeated items within one sequence are kept as read (``splits.dedup`` drops them
before a split, as for every source).

Recognised conservatively: a ``.txt`` whose first :data:`SNIFF_LINES` non-blank lines are all integer
tokens, at least two per line. Anything else in a ``.txt`` is never read as sequences.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ._io import empty_content
from .core import DataError, InteractionData, _inter_frame

SEQUENCE_FORMAT = "sequences"
ATTRIBUTES_SUFFIX = "_item2attributes.json"
ATTRIBUTES_FEATURE = "attributes"
SNIFF_LINES = 5
_LINE_SHAPE = "each line is 'user item item ...': integer ids, whitespace-separated, items in time order"


def _is_id(token: str) -> bool:
    return token.isascii() and token.isdigit()


def _lines(path: Path):
    """(1-based line number, text) of every non-blank line; a line that is not UTF-8 names itself."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{path}: line {lineno}: not valid utf-8 text") from None
            if text.strip():
                yield lineno, text.lstrip("\ufeff")


def sniff_sequences(path: str | Path) -> str | None:
    """None when ``path`` looks like a sequence file (see the module docstring), else why it does not."""
    path = Path(path)
    seen = 0
    for lineno, text in _lines(path):
        tokens = text.split()
        bad = next((t for t in tokens if not _is_id(t)), None)
        if bad is not None:
            return f"line {lineno}: {bad!r} is not an integer id"
        if len(tokens) < 2:
            return f"line {lineno}: fewer than two ids (a user and at least one item)"
        seen += 1
        if seen == SNIFF_LINES:
            break
    return None if seen else "the file is empty"


def sequence_files(folder: str | Path) -> list[Path]:
    """The ``.txt`` files in ``folder`` that look like sequence files."""
    return [p for p in sorted(Path(folder).glob("*.txt")) if p.is_file() and sniff_sequences(p) is None]


def attributes_file(sequences: Path) -> Path:
    """Where the attributes of ``<name>.txt`` are looked for: ``<name>_item2attributes.json`` beside it."""
    return sequences.with_name(sequences.stem + ATTRIBUTES_SUFFIX)


def _pairs_hint(first_line_of: dict, items: list, tokens: list[str]) -> str:
    """A hint when every line so far held one item: then the file is likely one 'user item' pair a line."""
    if len(tokens) == 2 and len(items) == len(first_line_of):
        return "; this file looks like one 'user item' pair a line, which is not this format"
    return ""


def read_sequences(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(user, item, position)`` per interaction (raw ids), in file order; bad lines name themselves."""
    users, items, positions = [], [], []
    first_line_of: dict[int, int] = {}
    for lineno, text in _lines(path):
        tokens = text.split()
        bad = next((t for t in tokens if not _is_id(t)), None)
        if bad is not None:
            raise DataError(f"{path}: line {lineno}: {bad!r} is not an integer id ({_LINE_SHAPE})")
        user = int(tokens[0])
        if len(tokens) == 1:
            raise DataError(f"{path}: line {lineno}: user {user} has no items ({_LINE_SHAPE})")
        if user in first_line_of:
            raise DataError(
                f"{path}: line {lineno}: user {user} already has a sequence on line "
                f"{first_line_of[user]} (one line per user{_pairs_hint(first_line_of, items, tokens)})"
            )
        first_line_of[user] = lineno
        seq = [int(t) for t in tokens[1:]]
        users.extend([user] * len(seq))
        items.extend(seq)
        positions.extend(range(len(seq)))
    if not users:
        raise DataError(f"{path}: no sequences (the file is empty; {_LINE_SHAPE})")
    return (np.asarray(users, np.int64), np.asarray(items, np.int64), np.asarray(positions, np.float64))


def _key_line(text: str, key: str) -> int:
    """1-based line of the key ``"key":`` in the JSON text (json itself does not say where a value was)."""
    m = re.search(r'"' + re.escape(key) + r'"\s*:', text)
    return text.count("\n", 0, m.start()) + 1 if m else 1


def read_attributes(path: Path) -> dict[int, list[int]]:
    """``{item id: [attribute ids]}`` from the JSON file; anything else names the line and the item."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not valid utf-8 text (byte {e.start})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: line {e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
    shape = "expected {item id: [attribute ids]}"
    if not isinstance(raw, dict):
        raise DataError(f"{path}: line 1: {shape}, got a JSON {type(raw).__name__}")
    out = {}
    for key, value in raw.items():
        where = f"{path}: line {_key_line(text, key)}: item {key!r}"
        if not _is_id(key):
            raise DataError(f"{where}: the key is not an integer item id ({shape})")
        if not isinstance(value, list):
            raise DataError(f"{where}: {shape}, got {type(value).__name__} {json.dumps(value)[:40]}")
        bad = next((v for v in value if isinstance(v, bool) or not isinstance(v, int) or v < 0), None)
        if bad is not None:
            raise DataError(f"{where}: attribute {json.dumps(bad)[:40]} is not a non-negative integer id")
        out[int(key)] = value
    return out


def attribute_matrix(attributes: dict[int, list[int]], item_ids: np.ndarray) -> tuple[np.ndarray, int, int]:
    """``(matrix, items without attributes, listed items not in item_ids)``; see the module docstring."""
    columns = np.unique(np.fromiter((a for attrs in attributes.values() for a in attrs), np.int64))
    matrix = np.zeros((len(item_ids), len(columns)), np.float32)
    row_of = {int(raw): i for i, raw in enumerate(item_ids)}
    rows, cols = [], []
    for item, attrs in attributes.items():
        if item in row_of and attrs:
            rows.extend([row_of[item]] * len(attrs))
            cols.extend(attrs)
    if rows:
        matrix[np.asarray(rows), np.searchsorted(columns, np.asarray(cols, np.int64))] = 1.0
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    np.divide(matrix, norms, out=matrix, where=norms > 0)
    unused = sum(1 for item in attributes if item not in row_of)
    return matrix, int((norms[:, 0] == 0).sum()), unused


def _attribute_notes(path: Path, missing: int, unused: int, n_items: int) -> list[dict]:
    from .sanity import finding

    notes = []
    if missing:
        notes.append(
            finding(
                "items_without_attributes",
                missing,
                f"{missing:,} of {n_items:,} items have no attributes in {path.name} (an all-zero content row)",
            )
        )
    if unused:
        notes.append(
            finding(
                "attributes_unused", unused, f"{unused:,} items listed in {path.name} occur in no sequence (left out)"
            )
        )
    return notes


def load_sequences(path: str | Path) -> InteractionData:
    """Load ``<name>.txt`` (and ``<name>_item2attributes.json`` when it is there); see the module docstring."""
    path = Path(path)
    users, items, positions = read_sequences(path)
    item_ids = np.unique(items)
    user_codes, user_ids = pd.factorize(users, sort=False)  # internal user id = rank of the user's line
    inter = _inter_frame(user_codes, np.searchsorted(item_ids, items), timestamp=positions)
    features, notes = {}, []
    attr_path = attributes_file(path)
    if attr_path.is_file():
        matrix, missing, unused = attribute_matrix(read_attributes(attr_path), item_ids)
        if matrix.shape[1] == 0:
            raise DataError(f"{attr_path}: no attribute ids at all (every item's list is empty)")
        features[ATTRIBUTES_FEATURE] = matrix
        notes = _attribute_notes(attr_path, missing, unused, len(item_ids))
    data = InteractionData(
        path.stem,
        np.asarray(user_ids, np.int64),
        item_ids,
        inter,
        items=empty_content(len(item_ids)),
        features=features,
        source=str(path),
        format=SEQUENCE_FORMAT,
        notes=notes,
    )
    return data.validate()
