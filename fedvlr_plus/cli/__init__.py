"""The ``fedvlr-plus`` command: a thin layer over the Python API, and the only code that sees argparse.

One module per command registers its parser and turns the parsed flags into calls of library functions:
``data`` (data.py), ``run`` (run.py), ``views`` (views.py), ``bench`` (bench.py), ``experiment``
(experiment.py), ``coldstart`` (coldstart.py), ``align`` (align.py), ``flower`` (flower.py), ``report``
(html_report.py). With ``--json`` the
last line printed is one JSON object. Building the parser imports no torch, pandas or RecBole.
"""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
