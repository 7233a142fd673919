"""The FedVLR layer around a RecBole model: the model's item embedding tables become the ID modality of the
server's fusion. It lives with the method, not with the adapter, so the adapters never import the method."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..adapters.recbole.backbone import RecBoleBackbone
from ..adapters.recbole.models import RefusedModel
from .builder import build_fedvlr
from .options import FedVLROptions

__all__ = ["fedvlr"]


def fedvlr(
    backbone: RecBoleBackbone, views: dict[str, np.ndarray] | None = None, data=None, options=None, **option_fields
):
    """The FedVLR layer around a RecBole backbone: the model's item embedding tables become the ID modality
    ``D`` of the server's fusion, and each client replaces them by its router-weighted fused views.

    Built by :func:`fedvlr_plus.fedvlr.build_fedvlr` from ``options`` (a :class:`~fedvlr_plus.fedvlr.FedVLROptions`;
    ``option_fields`` such as ``mode="sum"`` or ``cold_neighbours=0`` replace its fields). ``views`` are loaded as
    the options say when not given; without ``data`` there is no cold-item rule."""
    if not backbone.item_table_names:
        raise RefusedModel(
            f"{backbone.name} has no item embedding table (no parameter with one row per item); "
            f"the FedVLR layer has nothing to wrap"
        )
    bad = [n for n in backbone.item_table_names if backbone.template.get_parameter(n).dim() != 2]
    if bad:
        raise RefusedModel(
            f"{backbone.name}: item tables {bad} are not [n_items, d] matrices; the FedVLR layer "
            f"fuses 2-d embedding tables only"
        )
    # the same builder (and cold-item rule) as every other backbone
    return build_fedvlr(data, backbone, replace(options or FedVLROptions(), **option_fields), views)
