"""The variants of every backbone in the paper table (kept apart so that the CLI can name them without
importing the experiment's numeric code)."""

#: none: the backbone alone; fedgrad: alone but aggregated as FedVLR is; mlp, fedvlr: with the fusion layer
VARIANTS = ("none", "fedgrad", "mlp", "fedvlr")
FUSION_VARIANTS = ("mlp", "fedvlr")
