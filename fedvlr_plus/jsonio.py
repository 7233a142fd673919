"""JSON output shared by the CLI and the engine: numpy/torch/path values, atomic file writes."""

from __future__ import annotations

import json
from pathlib import Path

from .atomic_write import atomic_write_text


def json_default(o):
    import numpy as np

    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    if type(o).__module__.startswith("torch") and hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def write_json_atomic(path, obj, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON to ``path`` through a temporary file and a rename (never half-written; a full or
    read-only disk is one :class:`~fedvlr_plus.errors.UserError` naming the path)."""
    text = json.dumps(obj, indent=indent, default=json_default)  # before any file exists: a bad value writes nothing
    atomic_write_text(path, text)


def first_difference(a, b, path: str = "") -> str | None:
    """The first setting (a dotted path) whose value differs between ``a`` (now) and ``b`` (saved), in words."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            diff = first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else k)
            if diff:
                return diff
        return None
    return None if a == b else f"{path}: {b!r} there, {a!r} now"
