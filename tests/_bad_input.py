"""Helpers for the bad-input suite (``tests/bad_input/``): run the CLI and check that a user's mistake gets
exactly one clear line, exit code 2, and no traceback."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class CliResult:
    code: int
    out: str
    err: str


def run_cli(*args: str) -> CliResult:
    """Run ``fedvlr-plus ARGS`` in this process (fast: no interpreter start, imports are shared)."""
    from fedvlr_plus.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse exits on bad flags
            code = exc.code if isinstance(exc.code, int) else 2
    return CliResult(int(code), out.getvalue(), err.getvalue())


def run_cli_process(*args: str, timeout: float = 300, env: dict | None = None, cwd=None) -> CliResult:
    """Run ``fedvlr-plus ARGS`` as a separate process (for kills, signals and file-system faults)."""
    # PYTHONSAFEPATH: with ``-m`` the working directory (the checkout) would come first on sys.path, and its
    # top-level ``datasets/`` folder would shadow Hugging Face's package for transformers
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONSAFEPATH": "1", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "fedvlr_plus.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def assert_user_error(res: CliResult, *needles: str) -> str:
    """Exit code 2, no traceback, and one ``error: ...`` line on stderr that names every needle."""
    assert res.code == 2, f"exit code {res.code}, expected 2\nstdout: {res.out}\nstderr: {res.err}"
    assert "Traceback" not in res.err and "Traceback" not in res.out, res.err
    lines = [line for line in res.err.splitlines() if line.startswith("error:") or ": error:" in line]
    assert len(lines) == 1, f"expected one error line, got {lines!r}\nstderr: {res.err}"
    line = lines[0]
    for needle in needles:
        assert needle in line, f"{needle!r} not in the error line {line!r}"
    _log_message(line)
    return line


def _log_message(line: str) -> None:
    """With ``FEDVLR_BAD_INPUT_LOG=FILE``, append ``test id<TAB>message`` (to tabulate the suite's messages)."""
    log = os.environ.get("FEDVLR_BAD_INPUT_LOG")
    if log:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{test}\t{line}\n")


def files_under(folder: Path) -> set[str]:
    """Every file below ``folder`` (relative paths), to check that a failure left nothing half-written."""
    return {str(p.relative_to(folder)) for p in Path(folder).rglob("*") if p.is_file()}
