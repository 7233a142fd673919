"""``write_report``: a folder's report page, gathered, laid out and written atomically."""

from __future__ import annotations

from pathlib import Path

from ..atomic_write import atomic_write_text
from .gather import gather
from .html import page
from .sections import sections, summary

REPORT_FILE = "report.html"


def write_report(folder, out=None) -> Path:
    """Write the report page of ``folder`` (a run, coldstart or paper-table folder) to ``out`` (default:
    ``folder/report.html``) and return its path."""
    contents = gather(folder)
    result = contents.result
    model = result["model"] if isinstance(result.get("model"), str) else result.get("backbone", "model")
    title = f"{contents.kind} report: {model} on {result.get('dataset', '?')}"
    if contents.kind == "paper-table":
        title = f"paper table: {result.get('dataset', '?')}"
    path = Path(out) if out is not None else Path(folder) / REPORT_FILE
    atomic_write_text(path, page(title, summary(contents), sections(contents)))
    return path
