"""Backbones as adapters. Each declares shared vs private parameters and how it scores (see ``base``).

Import as ``fedvlr_plus.adapters`` (never a top-level ``adapters``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields

from .base import Backbone, ParamSpec, rowdot, take_rows
from .fcf import FCF
from .fedavg import FedAvgMF
from .fedncf import FedNCF
from .fedrap import FedRAP, FedRAPOptions
from .pfedrec import PFedRec

#: federated backbones by CLI name
BACKBONES: dict[str, type[Backbone]] = {
    "fedavg": FedAvgMF,
    "fedncf": FedNCF,
    "fcf": FCF,
    "pfedrec": PFedRec,
    "fedrap": FedRAP,
}


def backbone_options(name: str, settings) -> dict:
    """The options registered backbone ``name`` declares as its own (the fields of its ``options_type``: FedRAP's
    penalties), read from ``settings``: a mapping, or any object with those attribute names (parsed flags).
    Options that ``settings`` lacks or sets to None are left out: the backbone's defaults apply."""
    fields_of = getattr(BACKBONES.get(name), "options_type", None)
    if fields_of is None:
        return {}
    if isinstance(settings, Mapping):
        given = {f.name: settings.get(f.name) for f in fields(fields_of)}
    else:
        given = {f.name: getattr(settings, f.name, None) for f in fields(fields_of)}
    return {k: v for k, v in given.items() if v is not None}


def option_names() -> frozenset[str]:
    """The names of every registered backbone's own options (to tell them from a run's other settings)."""
    return frozenset(
        f.name for cls in BACKBONES.values() if cls.options_type is not None for f in fields(cls.options_type)
    )


def make_backbone(name: str, n_items: int, dim: int = 64, **options) -> Backbone:
    """Instantiate a federated backbone by name; unknown names are an error listing the known ones."""
    try:
        cls = BACKBONES[name]
    except KeyError:
        raise ValueError(f"unknown backbone {name!r}; choose one of {', '.join(sorted(BACKBONES))}") from None
    return cls(n_items, dim, **options)


__all__ = [
    "BACKBONES",
    "Backbone",
    "ParamSpec",
    "backbone_options",
    "make_backbone",
    "option_names",
    "rowdot",
    "take_rows",
    "FCF",
    "FedAvgMF",
    "FedNCF",
    "FedRAP",
    "FedRAPOptions",
    "PFedRec",
]
