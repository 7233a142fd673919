"""The code passes the project's linter and formatter, with the rule set stated in pyproject.toml ([tool.ruff]):
pycodestyle, pyflakes, import order, bugbear and pyupgrade. ruff comes with the test extra."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is not installed: pip install -e '.[test]' brings it")
    return subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_ruff_check_is_clean():
    done = _ruff("check", "--output-format", "concise", ".")
    assert done.returncode == 0, f"ruff check found problems (fix them, or `ruff check --fix`):\n{done.stdout}"


def test_ruff_format_is_clean():
    done = _ruff("format", "--check", ".")
    assert done.returncode == 0, f"ruff format would change these files (run `ruff format`):\n{done.stdout}"


def test_the_linter_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")  # an unused import
    exe = shutil.which("ruff")
    done = subprocess.run([exe, "check", "--select", "F", "--isolated", str(bad)], capture_output=True, text=True)
    assert done.returncode != 0 and "F401" in done.stdout, done.stdout + done.stderr
