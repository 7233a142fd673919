"""Optional compiled kernels: a module of numba kernels, or nothing where it does not import.

The package's kernels (the initial draw's, the FedVLR layer's step) are speed only: each has a numpy or torch path
beside it, so a missing or broken numba must cost time, never a result or a run.
"""
from __future__ import annotations

import importlib


def load_compiled(module: str):
    """``module`` imported, or False where it does not import (its caller then takes its plain path)."""
    try:
        return importlib.import_module(module)
    except Exception:
        return False
