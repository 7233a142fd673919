"""Every command's ``--out`` checked before any work starts: a folder that is a file, or a place nothing can be
written, is one line at once, not a traceback after minutes of training.

A command's parser says what its ``--out`` names with ``set_defaults(out_kind=...)``: ``folder`` (the default),
``file``, or ``own`` where the command checks it itself (its meaning depends on other flags).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UserError


def check_out_path(args) -> None:
    """Refuse ``args.out`` where it cannot be what the command writes."""
    out = getattr(args, "out", None)
    kind = getattr(args, "out_kind", "folder")
    if not out or kind == "own":
        return
    path = Path(out)
    if kind == "folder" and path.exists() and not path.is_dir():
        raise UserError(f"--out {out}", "is a file, and this command writes a folder there", "give a folder path")
    if kind == "file" and path.is_dir():
        raise UserError(f"--out {out}", "is a folder, and this command writes one file there", "give a file path")
    _check_writable(out, path)


def _check_writable(out: str, path: Path) -> None:
    """The nearest existing folder on the way to ``path`` must be a folder this process may write into."""
    probe = path if path.is_dir() else path.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"--out {out}", f"{probe} is a file, so no folder can be made under it", "give another path")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"--out {out}", f"{probe} is not writable by this user", "give a path you may write to")
