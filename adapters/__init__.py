"""Backbones as adapters. Each declares shared vs private parameters and how it scores (see ``base``).

Import as ``fedvlr_plus.adapters`` (never a top-level ``adapters``).
"""
from __future__ import annotations

from .base import Backbone, ParamSpec, rowdot, take_rows
from .fcf import FCF
from .fedavg import FedAvgMF
from .fedncf import FedNCF
from .fedrap import FedRAP
from .pfedrec import PFedRec

#: federated backbones by CLI name
BACKBONES: dict[str, type[Backbone]] = {
    "fedavg": FedAvgMF,
    "fedncf": FedNCF,
    "fcf": FCF,
    "pfedrec": PFedRec,
    "fedrap": FedRAP,
}


def make_backbone(name: str, n_items: int, dim: int = 64, **options) -> Backbone:
    """Instantiate a federated backbone by name; unknown names are an error listing the known ones."""
    try:
        cls = BACKBONES[name]
    except KeyError:
        raise ValueError(f"unknown backbone {name!r}; choose one of {', '.join(sorted(BACKBONES))}") from None
    return cls(n_items, dim, **options)


__all__ = ["BACKBONES", "Backbone", "ParamSpec", "make_backbone", "rowdot", "take_rows",
           "FCF", "FedAvgMF", "FedNCF", "FedRAP", "PFedRec"]
