"""The argument parser of every ``fedvlr-plus`` command: one error line instead of a usage block, and help
that shows each option's default.

Sub-commands inherit the class (argparse's ``add_subparsers`` uses the parent's class), so a mistake in any
command reads ``error: --rounds: must be >= 1, got 0 (see fedvlr-plus run --help)`` on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import sys

_NO_DEFAULT = (None, False, argparse.SUPPRESS)
_HELP_OF = "_cli_help_of"  # namespace attribute: the command whose help lists the flags it takes


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help unless it has no meaningful default or already says it."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if "default" in text.lower() or not action.option_strings:
            return text
        if any(default is d for d in _NO_DEFAULT) or default in ([], ()):
            return text
        if isinstance(default, (tuple, list)):
            return f"{text} (default: {','.join(str(v) for v in default)})"
        return text + " (default: %(default)s)"


class CliParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line naming the flag, with the help command to read."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and not hasattr(namespace, _HELP_OF):
            # the innermost command returns first: its help is the one that lists what it takes
            setattr(namespace, _HELP_OF, self.prog)
        return namespace, extras

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self._fail(f"unrecognized arguments: {' '.join(extras)}", getattr(namespace, _HELP_OF, self.prog))
        return namespace

    def error(self, message: str):
        self._fail(message, self.prog)

    def _fail(self, message: str, prog: str):
        if message.startswith("argument "):  # "argument --rounds: ..." -> "--rounds: ..."
            message = message[len("argument ") :]
        self.exit(2, f"error: {message} (see {prog} --help)\n")

    def exit(self, status: int = 0, message: str | None = None):
        if message:
            sys.stderr.write(message)
        raise SystemExit(status)
