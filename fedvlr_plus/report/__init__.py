"""``fedvlr-plus report RUN_DIR``: one self-contained HTML page of what a run, coldstart or paper-table folder
holds: tables with intervals, learning curves, the router's weights, per-bucket gains and cold-start curves.

:mod:`.gather` reads the folder, :mod:`.tables` and :mod:`.plots` turn it into tables and PNG plots,
:mod:`.sections` decides what each kind of folder shows, :mod:`.html` writes the page and :mod:`.write` ties them.
"""

from .write import REPORT_FILE, write_report

__all__ = ["REPORT_FILE", "write_report"]
