"""How ``run`` hands back a result: its files with ``--out``, the console table, and with ``--json`` one JSON
line last."""

from __future__ import annotations

from .common import emit_json


def report_run(args, result: dict, keys: list[str], test_result=None, data=None) -> None:
    from ..evaluation.run_report import format_run_report, write_run_files

    if args.out:
        write_run_files(args.out, result, test_result, data)
    print(format_run_report(result, keys))
    if args.json:
        emit_json(result)
