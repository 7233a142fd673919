"""FedVLR: personalised multimodal fusion for federated recommenders, as one layer around any backbone.

Li, Long, Jiang, Zhang, Yang, "Federated Vision-Language-Recommendation with Personalized Fusion", AAAI-26
(arXiv 2410.08478). The server fuses the ID table with content views by several experts; a private router on each
device mixes the experts per user. See docs/method.md.

- :mod:`.layer`: :class:`FusionLayer`, the backbone wrapper (client forward, server forward, specs);
- :mod:`.experts`: the server's projections and ``sum`` / ``mlp`` / ``gate`` experts, and the mixture;
- :mod:`.router`: the private router (one implementation, used by the layer and by the report);
- :mod:`.server`: :class:`ServerFusion`, the Algorithm-1 server strategy;
- :mod:`.cold`: the cold-item rule (:class:`ColdItemRule`);
- :mod:`.views`: where the content views come from;
- :mod:`.options`, :mod:`.builder`: :class:`FedVLROptions` and :func:`build_fedvlr`, the one builder;
- :mod:`.report`: the router report.
"""

from .builder import build_fedvlr
from .cold import ColdItemRule, content_neighbours
from .experts import EXPERTS, mix
from .layer import FUSED, MODES, OFFSET, FusionLayer, wrap_refusal
from .options import FedVLROptions
from .report import router_report

__all__ = [
    "build_fedvlr",
    "ColdItemRule",
    "content_neighbours",
    "EXPERTS",
    "mix",
    "FUSED",
    "MODES",
    "OFFSET",
    "FusionLayer",
    "wrap_refusal",
    "FedVLROptions",
    "router_report",
]
