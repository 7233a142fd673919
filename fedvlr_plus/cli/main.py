"""The parser of every command, and the one place a user's mistake becomes an exit status.

A :class:`~fedvlr_plus.errors.UserError` raised anywhere below prints ``error: <message>`` as one line on stderr
and exits 2 (``--debug`` shows the traceback instead); a bad flag is refused the same way while parsing.
"""

from __future__ import annotations

import argparse
import sys

#: the command modules of this package, in the order their commands are listed in ``--help`` (html_report
#: registers ``report``: report.py is how ``run`` reports its result)
COMMANDS = ("data", "run", "views", "bench", "align", "experiment", "flower", "coldstart", "html_report")


def build_parser() -> argparse.ArgumentParser:
    """Every command's parser. Building it imports no torch, pandas or RecBole (``--help`` stays fast);
    each command imports what it needs when it runs."""
    from importlib import import_module

    from .. import __version__
    from .config_file import add_config_flags
    from .parser import CliParser

    parser = CliParser(prog="fedvlr-plus", description="Personalised multimodal fusion for federated recommenders.")
    parser.add_argument("--version", action="version", version=f"fedvlr-plus {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        import_module(f".{name}", __package__).register(sub)
    add_config_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser()
    from ..errors import UserError
    from .config_file import apply_config_file
    from .out_path import check_out_path

    try:
        apply_config_file(parser, argv)  # the file's settings first: the flags parsed next win over them
        args = parser.parse_args(argv)
        check_out_path(args)  # before any data is read or any round trained
        return int(args.func(args) or 0)
    except UserError as exc:
        # a user's mistake gets one line; --debug shows where it was raised
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedvlr-plus: interrupted", file=sys.stderr)
        return 130
