"""The Python API's argument checks: every mistake a caller can make with ``load``, the recipes, ``Experiment``
and its result is refused here, as a :class:`~fedvlr_plus.errors.UserError` that names the argument, before any
model trains. Messages speak Python (``FedAvg(lr=...)``, ``Experiment(seeds=...)``), never command-line flags
the caller did not type.
"""

from __future__ import annotations

import numbers
import warnings
from dataclasses import fields

from ..errors import ConfigError

#: numpy seeds every run; a seed outside [0, 2**32) fails deep inside it
SEED_LIMIT = 1 << 32


class ArgumentTypeError(ConfigError, TypeError):
    """An argument of the wrong kind (a string where a recipe belongs, a number where a data set belongs). A
    TypeError as well, so code that caught the old TypeError still does."""


_KINDS = {
    "int": (lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool), "an integer"),
    "float": (lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool), "a number"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "bool": (lambda v: isinstance(v, bool), "True or False"),
    "tuple": (lambda v: isinstance(v, (tuple, list)), "a list"),
    "None": (lambda v: v is None, "None"),
}


def _type_ok(annotation: str, value) -> tuple[bool, str]:
    """Whether ``value`` fits the FedConfig field typed ``annotation`` (``"float | None"``), and what fits."""
    kinds = [_KINDS[k.strip()] for k in str(annotation).split("|") if k.strip() in _KINDS]
    if not kinds:  # a field type this check does not know: FedConfig's own checks judge it
        return True, ""
    return any(ok(value) for ok, _ in kinds), " or ".join(what for _, what in kinds)


def check_training(owner: str, options: dict) -> None:
    """``options`` (FedConfig fields given to ``owner``, e.g. ``FedAvg`` or ``Experiment``): known names, values
    of the right type, in range. ``owner(name=value)`` is named in the message."""
    from ..federation.config import FedConfig

    known = {f.name: f.type for f in fields(FedConfig)}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(
            f"{owner}({unknown[0]}=...)",
            f"unknown training option{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))}",
            "training options are FedConfig fields, e.g. rounds, lr, dim, local_epochs, server_lr",
        )
    check_types(owner, options, FedConfig)
    try:
        FedConfig(**options)
    except ValueError as exc:
        name = next((k for k in options if str(exc).startswith(f"FedConfig: {k} ")), None)
        where = f"{owner}({name}={options[name]!r})" if name else f"{owner}(...)"
        raise ConfigError(where, str(exc).removeprefix("FedConfig: ")) from None


def check_int(where: str, value, *, low: int, high: int | None = None) -> int:
    """``value`` as an int in [low, high) (high: None for no bound), else a ConfigError naming ``where``."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise ArgumentTypeError(where, f"must be an integer, got {value!r}")
    if value < low or (high is not None and value >= high):
        span = f">= {low}" if high is None else f"in [{low}, {high})"
        raise ConfigError(where, f"must be {span}, got {value}")
    return int(value)


def check_data(data, where: str = "Experiment(data)"):
    """A split data set, as :func:`fedvlr_plus.load` returns; else one line that says how to get one."""
    from ..datasets.core import InteractionData

    if not isinstance(data, InteractionData):
        raise ArgumentTypeError(
            where,
            f"expected a data set, got {type(data).__name__} {_short(data)}",
            "load one first: data = fedvlr_plus.load('ml-100k')",
        )
    data.require_split(need=("train", "valid", "test"))
    return data


def check_types(owner: str, given: dict, record) -> None:
    """``given`` values against the field types of the dataclass ``record`` (FedVLROptions, FedConfig)."""
    types = {f.name: f.type for f in fields(record)}
    for name, value in given.items():
        ok, want = _type_ok(types.get(name, ""), value)
        if not ok:
            raise ConfigError(f"{owner}({name}={value!r})", f"{name} must be {want}, got {type(value).__name__}")


def check_metrics(metrics, data, *, default: bool = False) -> tuple[tuple, tuple, list]:
    """``metrics`` (a list of ``"ndcg@10"`` names, or one comma-separated string) parsed, with every cut-off no
    larger than the catalogue (a top-K over fewer than K items is every item: the figure says nothing)."""
    from ..metric_spec import parse_metrics

    if isinstance(metrics, str):
        metrics = metrics.split(",")
    if not isinstance(metrics, (list, tuple)) or not all(isinstance(m, str) for m in metrics):
        raise ArgumentTypeError("Experiment(metrics=...)", f"expected a list of names like 'ndcg@10', got {metrics!r}")
    try:
        parsed = parse_metrics(",".join(metrics))
    except ValueError as exc:
        raise ConfigError("Experiment(metrics=...)", str(exc)) from None
    too_big = [k for k in parsed[1] if k > data.n_items]
    if too_big:
        # said, not refused: the command line's default cut-offs reach 50, and a small catalogue is a valid test
        where = f"Experiment(metrics=None: the default {', '.join(metrics)})" if default else "Experiment(metrics=...)"
        warnings.warn(
            f"{where}: cut-off {max(too_big)} is larger than the catalogue of {data.name} ({data.n_items} items), "
            f"so every item is in its top list (use cut-offs <= {data.n_items} for a figure that ranks)",
            UserWarning,
            stacklevel=3,
        )
    return parsed


def check_recipes(models, *, references: bool, to_run: bool = False) -> list:
    """``models`` as a list of recipes with distinct labels (two recipes under one label would both train and
    the table would keep one of them). Empty only where the experiment is not run (``to_run``): an experiment
    with no recipes is a harness for :meth:`Experiment.test` and :meth:`Experiment.start`."""
    from .models import REFERENCES, Model, Reference

    if isinstance(models, (str, Model, Reference)) or not hasattr(models, "__iter__"):
        raise ArgumentTypeError(
            "Experiment(models)",
            f"expected a list of recipes, got {_short(models)}",
            "e.g. [FedAvg(), FedVLR(FedAvg())]",
        )
    models = list(models)
    if not models and to_run:
        raise ConfigError(
            "Experiment(models)",
            "the list of recipes is empty: nothing to compare",
            "e.g. [FedAvg(), FedVLR(FedAvg())]",
        )
    for i, m in enumerate(models):
        if not isinstance(m, (Model, Reference)):
            raise ArgumentTypeError(
                f"Experiment(models[{i}])",
                f"not a model recipe: {_short(m)}",
                "use FedAvg(), FedVLR(FedAvg()), Pop(), ...",
            )
    seen = {}
    refs = {make().label for make in REFERENCES} if references else set()
    for i, m in enumerate(models):
        if m.label in seen:
            raise ConfigError(
                f"Experiment(models[{i}])",
                f"label {m.label!r} is already used by models[{seen[m.label]}]; the table keeps one row per label",
                "give each reference ranker once"
                if isinstance(m, Reference)
                else f"name them apart, e.g. {type(m).__name__}(..., label='{m.label} (2)')",
            )
        if m.label in refs and not isinstance(m, Reference):
            raise ConfigError(
                f"Experiment(models[{i}])",
                f"label {m.label!r} is a reference ranker's",
                "give the recipe another label=",
            )
        seen[m.label] = i
    return models


def check_label(label, owner: str):
    """A recipe's ``label=``: a non-empty string (it names the row of the result)."""
    if label is not None and (not isinstance(label, str) or not label.strip()):
        raise ArgumentTypeError(f"{owner}(label={label!r})", "a label must be a non-empty string")
    return label


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
