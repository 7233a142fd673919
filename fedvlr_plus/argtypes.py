"""Value checks for command-line flags, used as argparse ``type=`` functions.

A flag out of range is refused while the command line is parsed, before any data is read, with one line that
names the flag, the allowed range and the value given. Nothing here imports torch, numpy or pandas: the parser
is built on every start, ``--help`` included.
"""
from __future__ import annotations

import argparse
import math

METRIC_NAMES = ("hr", "ndcg", "recall", "mrr")


def _number(kind, text: str):
    name = "an integer" if kind is int else "a number"
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {name}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def bounded(kind, low=None, high=None, *, low_open: bool = False, high_open: bool = False, name: str = ""):
    """A ``type=`` function for ``kind`` (int or float) values between ``low`` and ``high``.

    ``low_open``/``high_open`` leave the bound itself out (``> 0`` instead of ``>= 0``)."""

    def check(text: str):
        value = _number(kind, text)
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        if too_low or too_high:
            raise argparse.ArgumentTypeError(f"must be {_describe(low, high, low_open, high_open)}, got {text}")
        return value

    check.__name__ = name or f"{kind.__name__}_range"
    return check


def _describe(low, high, low_open: bool, high_open: bool) -> str:
    if high is None:
        return f"{'>' if low_open else '>='} {low}"
    if low is None:
        return f"{'<' if high_open else '<='} {high}"
    return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


positive_int = bounded(int, 1, name="positive_int")
non_negative_int = bounded(int, 0, name="non_negative_int")
positive_float = bounded(float, 0, low_open=True, name="positive_float")
non_negative_float = bounded(float, 0, name="non_negative_float")
probability = bounded(float, 0, 1, name="probability")
open_fraction = bounded(float, 0, 1, low_open=True, high_open=True, name="open_fraction")
port = bounded(int, 1, 65535, name="port")


def parse_metrics(text: str) -> tuple[tuple[str, ...], tuple[int, ...], list[str]]:
    """``"hr@10,ndcg@50"`` -> (metric names, cut-offs, the requested keys in order)."""
    names, ks, keys = [], [], []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        name, k = _metric_at_k(part)
        names.append(name)
        ks.append(k)
        keys.append(f"{name}@{k}")
    if not keys:
        raise argparse.ArgumentTypeError("no metric given (e.g. hr@10,ndcg@10)")
    return tuple(dict.fromkeys(names)), tuple(sorted(set(ks))), keys


def _metric_at_k(part: str) -> tuple[str, int]:
    if "@" not in part:
        raise argparse.ArgumentTypeError(f"metric {part!r} needs a cut-off, e.g. {part}@10")
    name, k = part.split("@", 1)
    if name not in METRIC_NAMES:
        raise argparse.ArgumentTypeError(f"unknown metric {name!r} ({', '.join(METRIC_NAMES)})")
    try:
        k_int = int(k)
    except ValueError:
        raise argparse.ArgumentTypeError(f"cut-off of {part!r} is not an integer") from None
    if k_int < 1:
        raise argparse.ArgumentTypeError(f"cut-off of {part!r} must be >= 1")
    return name, k_int


def metric_list(text: str) -> str:
    """``--metrics``: checked now, kept as the text (commands parse it again with :func:`parse_metrics`)."""
    _, _, keys = parse_metrics(text)
    return ",".join(keys)


def one_metric(text: str) -> str:
    """A single ``metric@K`` such as ``hr@50`` (a model-selection metric)."""
    name, k = _metric_at_k(text.strip().lower())
    return f"{name}@{k}"


def int_list(low: int = 1, name: str = "int_list"):
    """Comma-separated integers, each >= ``low`` (``10,20,50``), as a tuple in the order given."""

    def check(text: str) -> tuple:
        try:
            values = tuple(int(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers like 10,20,50, got {text!r}") \
                from None
        if not values:
            raise argparse.ArgumentTypeError("expected at least one integer")
        if min(values) < low:
            raise argparse.ArgumentTypeError(f"every value must be >= {low}, got {text}")
        return values

    check.__name__ = name
    return check
