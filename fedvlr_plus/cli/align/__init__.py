"""``fedvlr-plus align METHOD``: the command (:mod:`.command`), the preference methods MoR and FedVPA-GP
(:mod:`.preference`), the vision-language methods FedDTL and FedMPT (:mod:`.vlm`) and their tables
(:mod:`.tables`)."""

from .command import register

__all__ = ["register"]
