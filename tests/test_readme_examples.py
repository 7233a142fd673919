"""The README's Python example runs as written, and the README stays one screen of intent."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
#: the README's limits: a reader sees what the package is for and how to use it, and follows links for the rest
MAX_LINES, MAX_BYTES, MAX_LINE_CHARS = 150, 12 * 1024, 120


def size_problems(text: str) -> list[str]:
    """What makes ``text`` longer than the README may be: too many lines, too many bytes, or lines too wide."""
    lines = text.splitlines()
    problems = [
        f"line {n}: {len(line)} characters (at most {MAX_LINE_CHARS})"
        for n, line in enumerate(lines, 1)
        if len(line) > MAX_LINE_CHARS
    ]
    if len(lines) > MAX_LINES:
        problems.append(f"{len(lines)} lines (at most {MAX_LINES})")
    if len(text.encode("utf-8")) > MAX_BYTES:
        problems.append(f"{len(text.encode('utf-8'))} bytes (at most {MAX_BYTES})")
    return problems


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


def test_the_readme_stays_within_its_size():
    problems = size_problems(README.read_text(encoding="utf-8"))
    assert not problems, "README.md is too long; move detail into docs/ and link it:\n" + "\n".join(problems)


def test_the_size_check_can_fail():
    assert size_problems("short\n" * 10) == []
    assert size_problems("x" * (MAX_LINE_CHARS + 1)) == [f"line 1: {MAX_LINE_CHARS + 1} characters (at most 120)"]
    assert size_problems("x\n" * (MAX_LINES + 1)) == [f"{MAX_LINES + 1} lines (at most 150)"]
    assert any("bytes" in p for p in size_problems(("é" * 100 + "\n") * 70))
