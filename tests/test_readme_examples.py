"""The README's Python example runs as written."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _block(marker: str) -> str:
    text = README.read_text(encoding="utf-8")
    found = re.search(rf"<!-- test: {marker} -->\n```python\n(.*?)```", text, flags=re.S)
    assert found, f"README.md has no python block after <!-- test: {marker} -->"
    return found.group(1)


@pytest.mark.slow
def test_the_python_api_example_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDVLR_CACHE", str(tmp_path / "cache"))  # its view store is built, not read from ~/.cache
    out = io.StringIO()
    scope: dict = {}
    with contextlib.redirect_stdout(out):
        exec(compile(_block("python-api"), str(README), "exec"), scope)
    printed = out.getvalue()
    for label in ("| FedAvg |", "| FedAvg + FedVLR |", "| pop |", "| random |", "| antipop |"):
        assert label in printed, printed
    paired = scope["result"].paired("FedAvg + FedVLR", "FedAvg", "ndcg@10")
    assert paired["n"] == scope["data"].test()["user"].nunique()
    assert 0.0 <= paired["t_pvalue"] <= 1.0
