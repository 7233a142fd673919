"""Errors raised by the server-side view pipeline.

Each message names what is wrong and, where there is one, the file at fault and what to pass instead.
"""

from __future__ import annotations

from ..errors import UserError


class ViewStoreError(UserError, ValueError):
    """A ViewStore request that cannot be answered: unknown view or item, wrong dimension, bad rows."""


class CorruptStoreError(ViewStoreError):
    """A ViewStore folder whose files do not match its manifest (checksum, shape, dims, NaN). Names the file."""


class EncoderUnavailable(UserError, RuntimeError):
    """The requested encoder cannot run here (weights missing offline, package missing). Says what to pass."""
