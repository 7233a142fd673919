"""``fedvlr-plus bench`` (registered by the main CLI when this module imports)."""
from .commands import cmd_bench_round, register

__all__ = ["cmd_bench_round", "register"]
