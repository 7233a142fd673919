"""How ``run`` hands back a result: its files with ``--out``, the console table, with ``--json`` one JSON line
last (a summary; the per-round history stays in ``RUN_DIR/result.json``), and on stderr what it wrote."""

from __future__ import annotations

from pathlib import Path

from .common import emit_json, say


def report_run(args, result: dict, keys: list[str], test_result=None, data=None) -> None:
    from ..evaluation.run_report import format_run_report, run_summary, write_run_files

    files = {}
    if args.out:
        from .config_file import write_resolved_config

        write_run_files(args.out, result, test_result, data)
        files = {"run_dir": str(args.out), "result": str(Path(args.out) / "result.json")}
        config = write_resolved_config(args.out, args)
        if config is not None:
            files["config"] = str(config)
    print(format_run_report(result, keys))
    if args.json:
        emit_json(run_summary(result, files, history=getattr(args, "json_history", False)))
    if files:
        say(_wrote(files))


def _wrote(files: dict) -> str:
    """One line: what ``run --out`` wrote, and how to repeat it."""
    line = f"wrote {files['run_dir']}: result.json (figures, settings and the per-round history), per-user test figures"
    from ..errors import shell_word

    if "config" in files:
        line += f", config.toml (repeat the run: fedvlr-plus run --config {shell_word(files['config'])} --out NEW_DIR)"
    return line + f"\na page with its tables and curves: fedvlr-plus report {shell_word(files['run_dir'])}"
