"""The command-line flags of the FedVLR fusion layer (``--fusion``, ``--views``, ...), shared by ``run``,
``coldstart`` and ``experiment paper-table``. Torch-free, so building the parser stays fast; the modes are
checked against :data:`fedvlr_plus.fedvlr.MODES` by a test."""
from __future__ import annotations

import argparse

from .argtypes import non_negative_float, non_negative_int, positive_float, share_below_one

#: the fusion modes of :class:`fedvlr_plus.fedvlr.FusionLayer`
FUSION_MODES = ("sum", "mlp", "gate", "fedvlr", "uniform")
#: what the router mixes (:data:`fedvlr_plus.fedvlr.view_experts.ROUTER_OVER`, checked by a test)
ROUTER_OVER = ("auto", "views", "operators")


def add_fusion_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("FedVLR fusion (federated backbones only)")
    g.add_argument("--fusion", default="none", choices=("none",) + FUSION_MODES,
                   help="none: the backbone alone; sum|mlp|gate: one server fusion expert of ID and content views; "
                        "fedvlr: the three experts mixed by a private per-user router (the paper's method); "
                        "uniform: the three experts mixed with fixed equal weights (the router ablation)")
    g.add_argument("--views", metavar="DIR", default=None,
                   help="a ViewStore (fedvlr-plus views build); built there when missing. Default: the data's "
                        "precomputed features, else a store cached under $FEDVLR_CACHE (~/.cache/fedvlr_plus)")
    g.add_argument("--fusion-views", metavar="NAMES", default=None,
                   help="comma-separated view names of the store to fuse (default: its raw modalities, e.g. "
                        "text,image or title,metadata)")
    g.add_argument("--drop-modality", action="append", default=[], metavar="M",
                   help="ablation: leave out a modality (id, text, image, or a view name); repeatable")
    g.add_argument("--router-over", choices=ROUTER_OVER, default=None,
                   help="what the private router (and --fusion uniform) mixes: views, one expert per content view "
                        "(the ID row plus that view), so a user's weights say which modality serves them; or "
                        "operators, the sum / mlp / gate experts over every modality (the original release's "
                        "form); auto: views where there are two or more content views, else operators. "
                        "Default: auto")
    g.add_argument("--router-temperature", type=positive_float, default=1.0, help="softmax temperature of the router")
    g.add_argument("--router-balance", type=non_negative_float, default=0.0,
                   help="weight of the entropy term that keeps a user's routing from collapsing (default 0)")
    g.add_argument("--fusion-residual", action="store_true",
                   help="add the raw ID row to the fused item vector (D_i + Σ_j w_uj F_ij) instead of passing ID "
                        "only through the projected, LayerNorm-ed fusion")
    g.add_argument("--fusion-residual-gate", action="store_true",
                   help="the residual ID path (implies --fusion-residual) with the fused part scaled by a "
                        "server-learnt factor per expert and item table of the backbone, starting at zero, so the "
                        "layer starts as the backbone's own item rows (D_i + Σ_j w_uj a_j ⊙ F_ij)")
    g.add_argument("--fusion-view-scale", choices=("model", "unit"), default=None,
                   help="size of the fused item vectors: model (default), the norm of the backbone's own initial "
                        "item rows (a RecBole model's; 1 for the package's backbones), or unit vectors")
    g.add_argument("--content-preference", action="store_true",
                   help="add a VBPR-style private user preference over projected content (θ_u · P_i) to every "
                        "logit; θ_u starts at zero, so the layer starts as the paper's form")
    g.add_argument("--personal-offset", action="store_true",
                   help="PFedRec + FedVLR: add PFedRec's personalised item embedding as a private offset on the "
                        "fused vector, restarted every round (off by default: worse on validation on KU and "
                        "ml-100k; the score function and router are personal either way)")
    g.add_argument("--cold-neighbours", type=non_negative_int, default=10, metavar="K",
                   help="cold items take the mean ID row of their K nearest warm content neighbours (0: off)")
    g.add_argument("--id-dropout", type=share_below_one, default=0.0, metavar="P",
                   help="each round the server's backward reads a random share P of the warm items through their "
                        "content neighbours' mean ID row instead of their own (DropoutNet-style), so the fusion "
                        "learns to rank items whose ID row is a content estimate, as cold items' is (default 0)")
