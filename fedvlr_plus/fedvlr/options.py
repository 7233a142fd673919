"""Every option of the FedVLR layer in one typed record, with the command line's defaults.

One record so that the command line, the Python API, Flower, the paper table, the cold-start study and the RecBole
adapter build the same layer from the same settings (:func:`fedvlr_plus.fedvlr.build_fedvlr`). The method is
FedVLR (Li et al., AAAI-26, arXiv 2410.08478); see docs/method.md for what each option changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: what the fused item vectors are scaled to (FedVLROptions.view_scale)
VIEW_SCALES = ("model", "unit")


@dataclass(frozen=True)
class FedVLROptions:
    #: ``fedvlr``: the three experts mixed by the private router; ``sum`` / ``mlp`` / ``gate``: one expert, no router
    mode: str = "fedvlr"
    #: what the router (and ``uniform``) mixes: ``views``, one expert per content view (ID row + that view);
    #: ``operators``, the sum / mlp / gate experts over every modality (the original release's form); ``auto``
    #: (default), the views where there are two or more content views, else the operators. Chosen on the planted
    #: benchmark and KU (docs/personal-fusion.md): the view router recovers a planted preference that operator
    #: experts cannot express, and is level with or above the operators on real data
    router_over: str = "auto"
    #: softmax temperature of the router
    temperature: float = 1.0
    #: weight of the entropy term that keeps a user's routing from collapsing onto one expert
    balance: float = 0.0
    #: hidden width of the router's MLP
    router_hidden: int = 64
    #: add the raw ID row to the fused item vector (``D_i + Σ_j w_uj F_ij``)
    residual: bool = False
    #: with ``residual``: the fused part scaled by a learnt factor per expert and item table of the backbone,
    #: starting at zero (the layer starts as the backbone's own item rows)
    residual_gate: bool = False
    #: size of the fused item vectors: ``model``, the norm of the backbone's own initial item rows
    #: (``Backbone.fused_item_norm``); ``unit``, unit vectors (the same for the package's own backbones)
    view_scale: str = "model"
    #: VBPR-style private user preference over projected content, ``θ_u · P_i``, added to the head's logit
    content_preference: bool = False
    #: PFedRec: its personalised item embedding as a private offset on the fused vector
    personal_offset: bool = False
    #: cold items take the mean ID row of their K nearest warm content neighbours (0: off)
    cold_neighbours: int = 10
    #: share of warm items whose ID input the server's backward replaces, each round, by their content neighbours'
    #: mean ID row (DropoutNet-style), so the fusion learns to rank an item whose ID row is a content estimate
    id_dropout: float = 0.0
    #: a view store folder (None: the data's own features, else the cache under $FEDVLR_CACHE)
    views: str | None = None
    #: names of the store's views to fuse (None: its raw modalities)
    fusion_views: tuple[str, ...] | None = None
    #: modalities left out (``id`` or view names)
    drop_modality: tuple[str, ...] = field(default_factory=tuple)
    #: progress bars while a view store is built
    progress: bool = True

    def __post_init__(self):
        from .layer import MODES

        if self.mode not in MODES:
            raise ValueError(f"fusion mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        from .view_experts import ROUTER_OVER

        if self.router_over not in ROUTER_OVER:
            raise ValueError(f"router over must be one of {', '.join(ROUTER_OVER)}, got {self.router_over!r}")
        if self.temperature <= 0:
            raise ValueError(f"router temperature must be positive, got {self.temperature}")
        if self.view_scale not in VIEW_SCALES:
            raise ValueError(f"view scale must be one of {', '.join(VIEW_SCALES)}, got {self.view_scale!r}")
        if not 0.0 <= self.id_dropout < 1.0:
            raise ValueError(f"ID dropout must be in [0, 1), got {self.id_dropout}")
        if self.residual_gate and not self.residual:
            raise ValueError("the residual gate needs the residual ID path (residual=True, --fusion-residual)")
        if self.balance < 0 or self.cold_neighbours < 0:
            raise ValueError("router balance and cold neighbours must not be negative")
        object.__setattr__(self, "drop_modality", tuple(self.drop_modality))
        if self.fusion_views is not None:
            object.__setattr__(self, "fusion_views", tuple(self.fusion_views))

    @property
    def use_id(self) -> bool:
        return "id" not in self.drop_modality
