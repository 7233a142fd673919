"""Buffers a batched simulator keeps from one chunk to the next for the intermediates of a chunk's steps.

A step's intermediates are megabytes (``[C L, k]`` for ten to twenty thousand examples), and a fresh tensor of that
size is new memory from the operating system each time: writing it first costs a page fault every 4 KB, several
times the cost of the write itself on one thread. The steps of a chunk, and the chunks of a round, reuse these
buffers instead. Only intermediates that do not outlive a step go here (nothing an upload or a stored state
holds).
"""

from __future__ import annotations

import math

import torch

#: room a buffer is given beyond the size asked for, so that slightly larger chunks do not reallocate it
HEADROOM = 1.25


class Scratch:
    """Named flat buffers, grown when a chunk needs more; :meth:`get` returns a view of the first elements."""

    def __init__(self):
        self._flat: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A ``shape`` view of buffer ``name`` (uninitialised); valid until the next :meth:`get` of that name."""
        n = math.prod(shape)
        buf = self._flat.get(name)
        if buf is None or buf.numel() < n or buf.dtype != dtype or buf.device != device:
            buf = self._flat[name] = torch.empty(int(n * HEADROOM) + 1, dtype=dtype, device=device)
        return buf[:n].view(shape)
