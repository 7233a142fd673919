"""Data sanity findings a careful researcher wants to be told about: one list of ``{code, count, message}``.

:meth:`InteractionData.sanity` returns the findings for the data as it is now, plus what earlier steps
recorded in ``data.notes`` when they removed rows. Codes (``splits`` gives the count per split label):

- ``duplicates_dropped``: repeated (user, item) rows removed by :func:`splits.dedup` (which every
  leave-one-out / ratio / cold split runs first, and the Amazon loader by default). The earliest row
  of each pair is kept (by timestamp; ties: the first in the file); ``splits`` names the split label the
  dropped rows carried.
- ``duplicate_rows``: repeated (user, item) rows still present within one split. Data that comes with its
  own split (a feature folder's ``split_label``, RecBole benchmark files) is kept as its owner made it,
  so the rows stay: the training matrix counts a pair once, but row counts (popularity) count every row.
  Unsplit data keeps them until a split drops them (``duplicates_dropped``).
- ``train_leak``: valid/test rows whose (user, item) pair is also a training row. Kept, for the same
  reason; the evaluation masks training items, so such a target can never be ranked.
- ``valid_test_overlap``: test rows whose (user, item) pair is also a validation row.
- ``users_without_train``: users with valid/test rows but no training row (expected after a cold-user
  split; otherwise often a filtering mistake).
- ``k_core_cut``: the users, items and rows an iterative k-core filter (``--k-core K``) removed, with the counts
  before and after. Printed as a note, not a warning: it is what the user asked for, told in numbers.
- ``items_without_attributes`` / ``attributes_unused``: recorded by the sequence loader
  (:mod:`fedvlr_plus.datasets.sequences`) for catalogue items its attributes file does not list (an all-zero
  content row) and for listed items that occur in no sequence (left out).

Items that occur only in valid/test rows are cold items; ``stats()`` reports them, not this list.
"""

from __future__ import annotations

from typing import TextIO

import numpy as np

from .core import SPLIT_NAMES, TEST, TRAIN, UNSPLIT, VALID

#: findings about a step the user asked for (a filter), printed as ``note:`` lines rather than warnings
TOLD_NOT_WARNED = frozenset({"k_core_cut"})


def finding(code: str, count: int, message: str, splits: dict[str, int] | None = None) -> dict:
    out = {"code": code, "count": int(count), "message": message}
    if splits:
        out["splits"] = {k: int(v) for k, v in splits.items()}
    return out


def _per_split(labels: np.ndarray) -> dict[str, int]:
    codes, counts = np.unique(labels, return_counts=True)
    return {SPLIT_NAMES[int(c)]: int(n) for c, n in zip(codes, counts)}


def _in_words(splits: dict[str, int]) -> str:
    return ", ".join(f"{name} {n:,}" for name, n in splits.items() if n)


def _pair_keys(data, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
    # one int64 per (user, item): ids are contiguous, so user * n_items + item is unique and fits easily
    inter = data.inter
    return inter["user"].to_numpy()[rows] * np.int64(max(data.n_items, 1)) + inter["item"].to_numpy()[rows]


def dropped_duplicates(labels: np.ndarray, kept: str = "earliest") -> dict:
    """The note :func:`splits.dedup` records for the rows it removed (``labels``: their split labels)."""
    return _dropped_note(_per_split(labels), kept)


def _dropped_note(splits: dict[str, int], kept: str) -> dict:
    n = sum(splits.values())
    where = "" if set(splits) == {"unsplit"} else f" ({_in_words(splits)})"
    out = finding(
        "duplicates_dropped",
        n,
        f"duplicate (user, item) rows dropped: {n:,}{where}; the {kept} row of each pair "
        f"is kept (by timestamp, then file order)",
        splits,
    )
    return {**out, "kept": kept}


def k_core_cut(k: int, before, after) -> dict:
    """The note :func:`splits.k_core` records: users, items and rows of ``before`` that ``after`` keeps."""
    parts = [
        (name, int(before[col].nunique()) if col else len(before), int(after[col].nunique()) if col else len(after))
        for name, col in (("users", "user"), ("items", "item"), ("interactions", None))
    ]
    kept = ", ".join(f"{name} from {old:,} to {new:,}" for name, old, new in parts)
    return {**finding("k_core_cut", len(before) - len(after), f"the {k}-core filter cut {kept}"), "k": int(k)}


def merge_notes(notes: list[dict], new: dict) -> list[dict]:
    """``notes`` with the ``duplicates_dropped`` note ``new`` added (summed into an earlier one)."""
    old = next((n for n in notes if n["code"] == new["code"]), None)
    if old is None:
        return [*notes, new]
    splits = dict(old.get("splits", {}))
    for k, v in new.get("splits", {}).items():
        splits[k] = splits.get(k, 0) + v
    kept = old["kept"] if old["kept"] == new["kept"] else "earliest or latest"
    return [_dropped_note(splits, kept) if n is old else n for n in notes]


def _duplicates(data) -> dict | None:
    inter = data.inter
    labels = inter["split"].to_numpy()
    keys = _pair_keys(data) * 4 + (labels.astype(np.int64) + 1)  # the pair within its split label
    _, first = np.unique(keys, return_index=True)
    repeated = np.ones(len(keys), bool)
    repeated[first] = False
    if not repeated.any():
        return None
    splits = _per_split(labels[repeated])
    n = int(repeated.sum())
    if set(splits) == {"unsplit"}:
        return finding(
            "duplicate_rows",
            n,
            f"duplicate (user, item) rows: {n:,}; splitting (leave-one-out, "
            "ratio, cold) drops them, keeping the earliest row of each pair",
            splits,
        )
    return finding(
        "duplicate_rows",
        n,
        f"duplicate (user, item) rows within one split: {n:,} "
        f"({_in_words(splits)}); kept as the data's own split has them; the "
        "training matrix counts each pair once, row counts such as popularity "
        "count every row",
        splits,
    )


def _overlap(data, held_out: int, against: int) -> np.ndarray:
    """Boolean mask over the ``held_out`` rows whose pair also occurs in the ``against`` rows."""
    labels = data.inter["split"].to_numpy()
    return np.isin(_pair_keys(data, labels == held_out), _pair_keys(data, labels == against))


def _split_findings(data) -> list[dict]:
    labels = data.inter["split"].to_numpy()
    out = []
    leaks = {SPLIT_NAMES[c]: int(_overlap(data, c, TRAIN).sum()) for c in (VALID, TEST)}
    n_leak = sum(leaks.values())
    if n_leak:
        out.append(
            finding(
                "train_leak",
                n_leak,
                f"valid/test rows whose (user, item) pair is also in train: {n_leak:,} ({_in_words(leaks)}); "
                "kept as the data's split has them (full ranking masks training items, so these "
                "targets count as misses)",
                leaks,
            )
        )
    n_overlap = int(_overlap(data, TEST, VALID).sum())
    if n_overlap:
        out.append(
            finding(
                "valid_test_overlap", n_overlap, f"test rows whose (user, item) pair is also in valid: {n_overlap:,}"
            )
        )
    users = data.inter["user"].to_numpy()
    trained = np.zeros(data.n_users, bool)
    trained[users[labels == TRAIN]] = True
    held = np.zeros(data.n_users, bool)
    held[users[(labels == VALID) | (labels == TEST)]] = True
    n_cold = int((held & ~trained).sum())
    if n_cold:
        out.append(
            finding(
                "users_without_train",
                n_cold,
                f"users with valid/test rows but no training row: {n_cold:,} (ranked with no history of their own)",
            )
        )
    return out


def findings(data) -> list[dict]:
    """Recorded notes, then the checks on the data as it is now (see the module docstring)."""
    out = list(data.notes)
    if data.n_inter == 0:
        return out
    dup = _duplicates(data)
    if dup is not None:
        out.append(dup)
    if (data.inter["split"].to_numpy() != UNSPLIT).any():
        out.extend(_split_findings(data))
    return out


def print_warnings(data, stream: TextIO, found: list[dict] | None = None) -> list[dict]:
    """Print each finding as one ``warning: <source>: <message>`` line on ``stream``; return them."""
    found = data.sanity() if found is None else found
    where = data.source or data.name
    for f in found:
        print(f"{'note' if f['code'] in TOLD_NOT_WARNED else 'warning'}: {where}: {f['message']}", file=stream)
    return found
