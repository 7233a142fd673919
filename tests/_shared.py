"""Locate the shared real-data folder for tests; skip (with the reason) when it is absent."""
from __future__ import annotations

import os
from pathlib import Path

import pytest


def shared_root() -> Path:
    env = os.environ.get("FEDVLR_SHARED_DATA")
    if env:
        return Path(env)
    # <checkout>/tests/_shared.py -> <checkout>/.. / shared / data
    return Path(__file__).resolve().parents[2] / "shared" / "data"


def shared_data(name: str) -> Path:
    """``<shared data>/<name>``, or ``pytest.skip`` when it does not exist on this machine."""
    path = shared_root() / name
    if not path.exists():
        pytest.skip(f"real data {path} is absent (set FEDVLR_SHARED_DATA to the shared data folder)")
    return path
