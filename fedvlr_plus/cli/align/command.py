"""``fedvlr-plus align METHOD SOURCE ...``: one sub-command per alignment method.

Each method module named in ``METHOD_MODULES`` exposes ``register(subparsers)`` which adds its sub-command and sets
``func``. Modules are imported lazily at parser-build time, so they must not import torch at module level.
"""

from __future__ import annotations

import argparse
from importlib import import_module

#: method command modules, relative to this package
METHOD_MODULES: tuple[str, ...] = ("preference", "vlm")


def register(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "align",
        help="federated alignment modules (MoR, FedVPA-GP, FedDTL, FedMPT)",
        description="Run one alignment method on real data and report its figures.",
    )
    methods = p.add_subparsers(dest="align_method", metavar="METHOD", required=True)
    for name in METHOD_MODULES:
        import_module(f".{name}", __package__).register(methods)
    return p
