"""Finished cells of an experiment grid, kept in its report folder so that a killed grid resumes where it stopped.

A grid (poisoning: seeds × rules × attacker fractions) runs for minutes per cell. Each finished cell is written at
once, atomically, as ``cells/<key>.json`` together with the settings it was trained under; a later run of the same
command with the same ``--out`` reads those cells back instead of training them again. A cell written under other
settings is refused with the first setting that differs, so a changed command never mixes its rows with old ones.
The folder is locked (``federation.run_folder.locked``) while the grid runs, so two runs cannot write it at once.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ..errors import ResumeMismatch, RunFolderError
from ..jsonio import first_difference, write_json_atomic

CELLS = "cells"


def cell_file(folder, key: str) -> Path:
    """The file of cell ``key`` (its characters kept to letters, digits, ``._-``)."""
    return Path(folder) / CELLS / (re.sub(r"[^A-Za-z0-9._-]", "_", key) + ".json")


def load_cell(folder, key: str, settings: dict) -> dict | None:
    """The finished cell ``key`` (per-user arrays as numpy), or None when it was not finished."""
    path = cell_file(folder, key)
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        cell, their = saved["cell"], saved["settings"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RunFolderError(
            str(path), f"unreadable finished cell ({exc})", "remove the file to train that cell again"
        ) from None
    diff = first_difference(json.loads(json.dumps(settings)), their)
    if diff:
        raise ResumeMismatch(
            str(path), f"was trained under other settings ({diff})", "use the same command, or another --out folder"
        )
    cell["per_user"] = {k: np.asarray(v, dtype=np.float64) for k, v in cell.get("per_user", {}).items()}
    return cell


def save_cell(folder, key: str, settings: dict, cell: dict) -> None:
    write_json_atomic(cell_file(folder, key), {"settings": settings, "cell": cell}, indent=None)
