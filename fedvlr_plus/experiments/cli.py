"""``fedvlr-plus experiment paper-table SOURCE ...``."""
from __future__ import annotations

import argparse
import json
import sys


def register(sub) -> argparse.ArgumentParser:
    from ..cli import DEFAULT_METRICS, add_data_arguments
    from ..federation.config import add_run_arguments
    from ..fusion_cli import add_fusion_arguments

    p = sub.add_parser("experiment", help="experiments that produce the tables of a report")
    ex = p.add_subparsers(dest="experiment", metavar="EXPERIMENT", required=True)
    t = ex.add_parser("paper-table", help="the FedVLR paper's Table 2: every backbone alone, +mlp, +fedvlr",
                      description="Train every backbone alone, with the single-MLP fusion and with FedVLR (each "
                                  "selected on validation), over several seeds, and print test figures overall, "
                                  "for warm and cold targets and for cold targets ranked among cold items, beside "
                                  "pop/random/antipop and a content-only ranker, with bootstrap CIs and paired "
                                  "tests. --out writes table.csv, table.md, table.png and result.json.")
    add_data_arguments(t)
    from .paper_table import add_arguments

    add_arguments(t)
    t.add_argument("--metrics", default=DEFAULT_METRICS,
                   help=f"comma-separated metric@K list (default {DEFAULT_METRICS})")
    t.add_argument("--out", metavar="DIR", default=None, help="report folder (CSV, Markdown, plot, JSON, runs)")
    t.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    t.add_argument("--mask-history", default="train", choices=["train", "all"],
                   help="mask only training items at test (paper protocol) or training and validation items")
    add_run_arguments(t)
    add_fusion_arguments(t)
    t.set_defaults(func=cmd_paper_table, seeds=3)
    return p


def cmd_paper_table(args) -> int:
    from ..cli import load_for_run, parse_metrics
    from ..jsonio import json_default
    from .paper_table import print_table, run_paper_table

    names, ks, keys = parse_metrics(args.metrics)
    data, _ = load_for_run(args)
    result = run_paper_table(args, data, keys, ks, names)
    print_table(result, file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(result, default=json_default))
    return 0
