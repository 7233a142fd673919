"""The one way a FedVLR layer is built from options: the command line, the Python API, Flower, the paper table,
the cold-start study and the RecBole adapter all call :func:`build_fedvlr`, so the same options give the same
model everywhere.

FedVLR: Li et al., "Federated Vision-Language-Recommendation with Personalized Fusion", AAAI-26, arXiv 2410.08478;
see docs/method.md.
"""

from __future__ import annotations

import numpy as np

from ..adapters.base import Backbone
from .cold import ColdItemRule
from .layer import FusionLayer
from .options import FedVLROptions
from .views import load_views, select_views


def build_fedvlr(
    data,
    backbone: Backbone | str,
    options: FedVLROptions | None = None,
    views: dict[str, np.ndarray] | None = None,
    purpose: str | None = None,
) -> FusionLayer:
    """The FedVLR layer around ``backbone`` (an adapter, or a registered name built at its default size).

    ``views`` (name -> ``[n_items, d]``, rows aligned with ``data``'s items) are loaded as ``options`` say when not
    given; ``options.drop_modality`` applies either way. ``data`` gives the item count and the cold-item flags (it
    may be None when ``views`` and an adapter are given: no cold-item rule then). A backbone the layer cannot wrap,
    or views that do not fit, raise ``ValueError``. ``purpose``: what asked for the views, named in their errors
    (default: the ``--fusion`` flag; the Python API names its recipe)."""
    options = options or FedVLROptions()
    if isinstance(backbone, str):
        from ..adapters import make_backbone

        backbone = make_backbone(backbone, data.n_items)
    if views is None:
        names = list(options.fusion_views) if options.fusion_views else None
        views = load_views(
            data, options.views, names, progress=options.progress, purpose=purpose or f"--fusion {options.mode}"
        )
    views, use_id = select_views(views, options.drop_modality)
    cold = ColdItemRule(data.cold_items(), options.cold_neighbours) if data is not None else None
    return FusionLayer(
        backbone,
        views,
        mode=options.mode,
        router_over=options.router_over,
        temperature=options.temperature,
        router_hidden=options.router_hidden,
        use_id=use_id,
        balance=options.balance,
        cold_items=cold,
        residual=options.residual,
        personal_offset=options.personal_offset,
        content_preference=options.content_preference,
        view_scale=options.view_scale,
        id_dropout=options.id_dropout,
        residual_gate=options.residual_gate,
    )
