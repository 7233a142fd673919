"""The ``--out-dir DIR`` of the ``align`` methods that run several seeds: ``DIR/result.json`` and ``DIR/table.md``.

No torch import (the parser is built without it).
"""

from __future__ import annotations

import os
import sys


def check_out_dir(out_dir) -> None:
    from ...errors import ConfigError

    if out_dir and os.path.exists(out_dir) and not os.path.isdir(out_dir):
        # checked before training, so a mistyped path does not cost the whole run
        raise ConfigError(
            f"--out-dir {out_dir}: exists and is not a folder (it names a folder for result.json and table.md)"
        )


def write_table(report: dict, folder: str, markdown) -> None:
    """result.json and table.md (``markdown(report, command)``) in ``folder``, each written atomically."""
    from pathlib import Path

    from ...atomic_write import atomic_write_text, make_dirs
    from ...jsonio import write_json_atomic

    out = make_dirs(folder)
    write_json_atomic(Path(out) / "result.json", report)
    atomic_write_text(Path(out) / "table.md", markdown(report, command_line()))


def command_line() -> str:
    """The command as typed, for the table's first line."""
    return "fedvlr-plus " + " ".join(sys.argv[1:])
