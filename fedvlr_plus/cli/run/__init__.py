"""``fedvlr-plus run``: the command (:mod:`.command`), its flags (:mod:`.args`), a federated run from the flags
(:mod:`.federated`) and the layer's recipe chosen on validation (:mod:`.tune`)."""

from .command import register

__all__ = ["register"]
