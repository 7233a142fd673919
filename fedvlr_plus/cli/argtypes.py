"""Value checks for command-line flags, used as argparse ``type=`` functions.

A flag out of range is refused while the command line is parsed, before any data is read, with one line that
names the flag, the allowed range and the value given. Nothing here imports torch, numpy or pandas: the parser
is built on every start, ``--help`` included.
"""

from __future__ import annotations

import argparse
import math

from ..metric_spec import metric_at_k, parse_metrics


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
share_below_one = bounded(float, 0, 1, high_open=True, name="share_below_one")
port = bounded(int, 1, 65535, name="port")


def every_or_auto(text: str) -> int | None:
    """``--checkpoint-every``: a count of rounds (>= 1), or ``auto`` (None)."""
    if text.strip().lower() == "auto":
        return None
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 or auto, got {text!r}") from None


def metric_list(text: str) -> str:
    """``--metrics``: checked now, kept as the text (commands parse it again with :func:`parse_metrics`)."""
    _, _, keys = _checked(parse_metrics, text)
    return ",".join(keys)


def one_metric(text: str) -> str:
    """A single ``metric@K`` such as ``hr@50`` (a model-selection metric)."""
    name, k = _checked(metric_at_k, text.strip().lower())
    return f"{name}@{k}"


def _checked(parse, text: str):
    """``parse(text)`` with its ValueError as argparse's error (one line naming the flag)."""
    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def backbone_arg(text: str) -> str:
    """``--backbone`` of ``run``: a federated backbone, ``recbole:<Model>`` or a reference ranker."""
    from ..backbones import normalise_backbone

    return _checked(normalise_backbone, text)


def clients_per_round(text: str) -> float:
    """``0.1`` = a fraction of the clients; ``50`` = a count (``1`` is one client, ``1.0`` all of them)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction like 0.1 or a count like 50, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    if "." in text or "e" in text.lower():
        if value > 1:
            raise argparse.ArgumentTypeError("a fractional value must be in (0, 1]; give a count as an integer")
        return value
    return int(value)


def int_list(low: int = 1, name: str = "int_list"):
    """Comma-separated integers, each >= ``low`` (``10,20,50``), as a tuple in the order given."""

    def check(text: str) -> tuple:
        try:
            values = tuple(int(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers like 10,20,50, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError("expected at least one integer")
        if min(values) < low:
            raise argparse.ArgumentTypeError(f"every value must be >= {low}, got {text}")
        return values

    check.__name__ = name
    return check


def auto_or_non_negative_int(text: str):
    """``auto`` (the command decides from the data) or an integer >= 0."""
    return "auto" if text.strip().lower() == "auto" else non_negative_int(text)
