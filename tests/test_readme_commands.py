"""The README's commands work as written.

Every ``fedvlr-plus ...`` line in the README's bash blocks must parse with the command line's own parser (a
renamed or removed flag fails here). The blocks that follow a ``<!-- test: fast-commands -->`` marker are also run
for real, one process per command, because each takes seconds on the embedded MovieLens-100K; a README edit that
breaks one of them fails here. Mark only commands that finish in well under 20 seconds on a 2-core machine.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FAST_MARKER = "<!-- test: fast-commands -->"
PROGRAM = "fedvlr-plus"


def bash_blocks(text: str, marker: str | None = None) -> list[str]:
    """The bodies of the ```bash blocks in ``text``; with ``marker``, only those right after a line holding it."""
    lead = rf"{re.escape(marker)}[ \t]*\n" if marker else r"(?:^|\n)"
    return re.findall(lead + r"```bash\n(.*?)```", text, flags=re.S)


def commands(block: str) -> list[str]:
    """The ``fedvlr-plus`` command lines of a bash block: continuations joined, trailing comments dropped."""
    out, pending = [], ""
    for raw in block.splitlines():
        line = (pending + " " + raw.strip()).strip() if pending else raw.strip()
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        pending = ""
        words = shlex.split(line, comments=True)
        if words and words[0] == PROGRAM:
            out.append(shlex.join(words))
    return out


def parse_error(command: str) -> str | None:
    """None when the CLI's parser accepts ``command``, else the one-line error it prints."""
    from fedvlr_plus.cli.config_file import apply_config_file
    from fedvlr_plus.cli.main import build_parser
    from fedvlr_plus.errors import UserError

    err = io.StringIO()
    argv = shlex.split(command)[1:]
    parser = build_parser()
    try:
        # as the command runs from the repository's root: a --config file's settings first, then the flags
        with contextlib.chdir(ROOT), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            apply_config_file(parser, argv)
            parser.parse_args(argv)
    except UserError as exc:
        return f"error: {exc}"
    except SystemExit as exc:
        return None if exc.code in (0, None) else (err.getvalue().strip() or f"exit {exc.code}")
    return None


TEXT = README.read_text(encoding="utf-8")
ALL_COMMANDS = [c for block in bash_blocks(TEXT) for c in commands(block)]
FAST_COMMANDS = [c for block in bash_blocks(TEXT, FAST_MARKER) for c in commands(block)]


def test_the_readme_has_commands_to_check():
    assert len(ALL_COMMANDS) >= 8, ALL_COMMANDS
    assert FAST_COMMANDS, f"README.md has no bash block after {FAST_MARKER}"
    assert set(FAST_COMMANDS) <= set(ALL_COMMANDS)


@pytest.mark.parametrize("command", ALL_COMMANDS)
def test_every_readme_command_parses(command):
    error = parse_error(command)
    assert error is None, f"README.md: {command}\n{error}"


@pytest.mark.parametrize("command", FAST_COMMANDS)
def test_the_fast_readme_commands_run(command, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", FEDVLR_CACHE=str(tmp_path / "cache"))
    args = shlex.split(command)[1:]
    done = subprocess.run(
        [sys.executable, "-m", "fedvlr_plus.cli", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stderr[-2000:]}"
    assert done.stdout.strip(), f"{command}: printed nothing"
    if "--json" in args:
        last = json.loads(done.stdout.strip().splitlines()[-1])
        assert isinstance(last, dict) and last, f"{command}: the last line is not a JSON object"


def test_the_checks_can_fail():
    text = (
        "intro\n```bash\nfedvlr-plus run ml-100k \\\n    --backbone pop   # a comment\necho no\n```\n"
        f"{FAST_MARKER}\n```bash\nfedvlr-plus --help\n```\n"
    )
    assert [c for b in bash_blocks(text) for c in commands(b)] == [
        "fedvlr-plus run ml-100k --backbone pop",
        "fedvlr-plus --help",
    ]
    assert [c for b in bash_blocks(text, FAST_MARKER) for c in commands(b)] == ["fedvlr-plus --help"]
    assert parse_error("fedvlr-plus run ml-100k --backbone pop") is None
    assert "--no-such-flag" in parse_error("fedvlr-plus run ml-100k --no-such-flag")
    assert "--rounds" in parse_error("fedvlr-plus run ml-100k --rounds zero")
