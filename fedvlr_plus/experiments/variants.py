"""The variants of every backbone in the paper table (kept apart so that the CLI can name them without
importing the experiment's numeric code)."""

#: none: the backbone alone; fedgrad: alone but aggregated as FedVLR is; the others: with the fusion layer
#: (sum, mlp, gate: one server expert; uniform: the three experts mixed with equal fixed weights; fedvlr: mixed by
#: the private router). sum, gate and uniform are the router ablation, asked for by name.
VARIANTS = ("none", "fedgrad", "sum", "mlp", "gate", "uniform", "fedvlr")
DEFAULT_VARIANTS = ("none", "fedgrad", "mlp", "fedvlr")
FUSION_VARIANTS = ("sum", "mlp", "gate", "uniform", "fedvlr")
#: the rows FedVLR is tested against to show what its router adds
ROUTER_ABLATION = ("sum", "mlp", "gate", "uniform")
