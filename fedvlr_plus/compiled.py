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


#: how much cheaper a module of kernels is to load once another one has loaded: the first pays for importing and
#: starting numba (0.5-0.6 s CPU), each later one only for its own cached machine code (5-12 ms)
LOADED_DISCOUNT = 64


class LazyKernels:
    """A module of kernels imported on first use. :meth:`get` returns it, or None where it does not import; the
    outcome is kept in ``module`` (None: not tried yet, False: failed), so a process imports numba at most once,
    and only when a large enough piece of work asks for a kernel. Tests set ``module`` to either state."""

    #: whether any module of kernels has loaded in this process (numba's start-up is then paid)
    numba_started = False

    def __init__(self, name: str):
        self.name = name
        self.module = None
        self.work_done = 0  # units of the work the kernels serve, done so far without them

    def get(self):
        if self.module is None:
            self.module = load_compiled(self.name)
            LazyKernels.numba_started |= bool(self.module)
        return self.module or None

    def once_worth_it(self, work: int, threshold: int):
        """The module once this process has done ``threshold`` units of the work the kernels serve (``work`` more
        now), else None: importing numba costs about half a second of CPU once, which a small run never repays.
        Once another module has paid that, ``threshold / LOADED_DISCOUNT`` units are enough."""
        self.work_done += int(work)
        if LazyKernels.numba_started:
            threshold //= LOADED_DISCOUNT
        return self.get() if self.work_done >= threshold else None

    def prepare(self, tiny_call) -> bool:
        """Compile the kernels, or load them from numba's cache, by ``tiny_call(module)`` with the argument types a
        run passes (numba compiles per type signature); False where they do not import. ``bench suite`` prepares
        every module before its cases, so that a case's figures hold no one-time compilation."""
        kernels = self.get()
        if kernels is None:
            return False
        tiny_call(kernels)
        return True
