"""``fedvlr-plus report RUN_DIR``: the folder's results as one HTML page (see :mod:`fedvlr_plus.report`)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "report",
        help="one self-contained HTML page of a run, coldstart or paper-table folder",
        description="Write RUN_DIR/report.html: the run's figures and the reference rankers with their intervals, "
        "learning curves per seed, the router's weights (FedVLR layer), per-bucket gains and cold-start curves, "
        "as far as the folder holds them. The page needs no network to open.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the --out folder of run, coldstart or experiment paper-table")
    p.add_argument("--out", metavar="FILE", default=None, help="where to write the page (default: RUN_DIR/report.html)")
    p.set_defaults(func=cmd_report, out_kind="file")


def cmd_report(args) -> int:
    from ..report import write_report

    path = write_report(args.run_dir, args.out)
    print(f"wrote {path}")
    print(f"next: open it in a browser (xdg-open {path}, or on macOS open {path}); it needs no network")
    return 0
