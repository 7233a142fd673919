"""RecBole 1.2.1 compatibility shim. Call :func:`patch_recbole` before any ``import recbole...``.

RecBole 1.2.1 predates NumPy 2, torch's ``weights_only`` default (torch >= 2.6) and SciPy's removal of
``dok_matrix._update``; see the project's ecosystem notes. The shim restores exactly what RecBole uses.
``recbole.quick_start`` is never imported (it pulls Ray 2.6.3, which needs ``pkg_resources``).
"""
from __future__ import annotations

import functools

_PATCHED = False


def patch_recbole() -> None:
    global _PATCHED
    if _PATCHED:
        return
    import numpy as np

    for alias, target in (("float_", np.float64), ("complex_", np.complex128), ("unicode_", np.str_),
                          ("bool8", np.bool_), ("float", np.float64), ("int", np.int_)):
        # RecBole's metric classes use np.float; its Config() would set it, but we also use them without one.
        if not hasattr(np, alias):
            setattr(np, alias, target)

    import scipy.sparse as sp

    if not hasattr(sp.dok_matrix, "_update"):
        # LightGCN/NGCF/... call dok_matrix._update(dict); SciPy >= 1.13 removed it.
        def _update(self, data):
            for key, value in dict(data).items():
                self[key] = value

        sp.dok_matrix._update = _update

    import torch

    if not getattr(torch.load, "_fedvlr_plus_patched", False):
        original = torch.load

        @functools.wraps(original)
        def load(*args, **kwargs):
            # RecBole pickles whole checkpoints (config, state dict, ...); it only loads files it wrote itself.
            kwargs.setdefault("weights_only", False)
            return original(*args, **kwargs)

        load._fedvlr_plus_patched = True
        load._original = original
        # Patch only RecBole's own reference, never torch.load globally.
        import recbole.trainer.trainer as _trainer  # noqa: E402  (the shim must run first: np aliases above)

        _trainer.torch.load  # ensure module import worked
        _trainer.torch = _TorchProxy(torch, load)
    _PATCHED = True


class _TorchProxy:
    """``torch`` as seen from RecBole's trainer module, with ``load`` defaulting to ``weights_only=False``."""

    def __init__(self, torch_module, load):
        self._torch = torch_module
        self.load = load

    def __getattr__(self, name):
        return getattr(self._torch, name)
