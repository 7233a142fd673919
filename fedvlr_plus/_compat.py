"""RecBole 1.2.1 compatibility shim. Call :func:`patch_recbole` before any ``import recbole...``.

RecBole 1.2.1 predates NumPy 2, torch's ``weights_only`` default (torch >= 2.6), SciPy's removal of
``dok_matrix._update`` and pandas copy-on-write (``Dataset._fill_nan``); see the project's ecosystem notes.
The shim restores exactly what RecBole uses.
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

    for alias, target in (
        ("float_", np.float64),
        ("complex_", np.complex128),
        ("unicode_", np.str_),
        ("bool8", np.bool_),
        ("float", np.float64),
        ("int", np.int_),
    ):
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

        assert callable(_trainer.torch.load)  # the module imported and kept torch's loader
        _trainer.torch = _TorchProxy(torch, load)
    _patch_fill_nan()
    _PATCHED = True


def _patch_fill_nan() -> None:
    """pandas copy-on-write: RecBole's ``Dataset._fill_nan`` calls ``feat[field].fillna(..., inplace=True)`` on a
    column, which pandas >= 3 turns into a silent no-op (pandas 2.x warns ``ChainedAssignmentError``). Same
    imputation, written as an assignment. (The other chained ``fillna`` in ``_load_feat`` only touches sequence
    fields; the RecBole adapter loads id/rating/timestamp columns only.)"""
    import numpy as np
    from recbole.data.dataset import dataset as _ds
    from recbole.utils import FeatureType

    if getattr(_ds.Dataset._fill_nan, "_fedvlr_plus_patched", False):
        return

    def _fill_nan(self):
        for feat_name in self.feat_name_list:
            feat = getattr(self, feat_name)
            for field in feat:
                ftype = self.field2type[field]
                if ftype == FeatureType.TOKEN:
                    feat[field] = feat[field].fillna(value=0)
                elif ftype == FeatureType.FLOAT:
                    feat[field] = feat[field].fillna(value=feat[field].mean())
                else:
                    dtype = np.int64 if ftype == FeatureType.TOKEN_SEQ else np.float64
                    feat[field] = feat[field].apply(
                        lambda x, dtype=dtype: np.array([], dtype=dtype) if isinstance(x, float) else x
                    )

    _fill_nan._fedvlr_plus_patched = True
    _fill_nan._original = _ds.Dataset._fill_nan
    _ds.Dataset._fill_nan = _fill_nan


class _TorchProxy:
    """``torch`` as seen from RecBole's trainer module, with ``load`` defaulting to ``weights_only=False``."""

    def __init__(self, torch_module, load):
        self._torch = torch_module
        self.load = load

    def __getattr__(self, name):
        return getattr(self._torch, name)
