"""Test helper: a module of compiled kernels, or a skip where numba is not installed."""

from __future__ import annotations

import pytest


def compiled_or_skip(lazy):
    """``lazy.get()`` (a :class:`fedvlr_plus.compiled.LazyKernels`), skipping the test where numba is missing."""
    pytest.importorskip("numba", reason="numba is not installed here: the code keeps its numpy or torch path")
    module = lazy.get()
    assert module is not None
    return module
