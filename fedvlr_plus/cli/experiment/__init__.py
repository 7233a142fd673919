"""``fedvlr-plus experiment``: the command and the paper table (:mod:`.command`), poisoning (:mod:`.poisoning`),
the privacy table and leakage (:mod:`.privacy`), view routing and the planted benchmark (:mod:`.view_routing`)."""

from .command import register

__all__ = ["register"]
