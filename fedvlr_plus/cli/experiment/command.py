"""``fedvlr-plus experiment paper-table SOURCE ...`` (and the privacy experiments of :mod:`.privacy`)."""
from __future__ import annotations

import argparse
import json
import sys

from ...experiments.variants import DEFAULT_VARIANTS, VARIANTS


def _variant_list(text: str) -> str:
    bad = [v.strip() for v in text.split(",") if v.strip() and v.strip() not in VARIANTS]
    if bad or not text.strip():
        raise argparse.ArgumentTypeError(f"unknown variant {', '.join(bad) or text!r}; choose from "
                                         f"{', '.join(VARIANTS)}")
    return text


def _backbone_list(text: str) -> str:
    from ...federation.config import FEDERATED_BACKBONES

    bad = [b.strip() for b in text.split(",") if b.strip() and b.strip() not in FEDERATED_BACKBONES]
    if bad or not text.strip():
        raise argparse.ArgumentTypeError(f"unknown backbone {', '.join(bad) or text!r}; choose from "
                                         f"{', '.join(FEDERATED_BACKBONES)}")
    return text


def add_table_arguments(p: argparse.ArgumentParser) -> None:
    """What the table holds: which backbones, which variants of each, per-run overrides."""
    g = p.add_argument_group("table")
    g.add_argument("--backbones", type=_backbone_list, default="fedavg,fedncf,fcf,pfedrec,fedrap",
                   help="comma-separated federated backbones (default: the five of the paper's Table 2)")
    g.add_argument("--variants", type=_variant_list, default=",".join(DEFAULT_VARIANTS),
                   help="none (backbone alone, its own aggregation), fedgrad (backbone alone, aggregated as FedVLR "
                        "is: averaged gradients + server step), sum|mlp|gate (one server fusion expert), uniform "
                        "(the three experts, fixed equal weights), fedvlr (private router over experts); "
                        "sum,gate,uniform with fedvlr are the router ablation")
    g.add_argument("--override", action="append", default=[], metavar="SELECTOR:FIELD=VALUE",
                   help="training setting for some runs only, e.g. fedvlr:server_lr=3 or fedncf+fedvlr:lr=0.05 "
                        "(SELECTOR: a backbone, a variant or backbone+variant); repeatable")


def register(sub) -> argparse.ArgumentParser:
    from ..argtypes import metric_list
    from ..common import DEFAULT_METRICS, add_data_arguments
    from ..fusion_args import add_fusion_arguments
    from ..run.args import add_run_arguments

    p = sub.add_parser("experiment", help="experiments that produce the tables of a report")
    ex = p.add_subparsers(dest="experiment", metavar="EXPERIMENT", required=True)
    t = ex.add_parser("paper-table", help="the FedVLR paper's Table 2: every backbone alone, +mlp, +fedvlr",
                      usage="%(prog)s SOURCE [--backbones B,...] [--variants V,...] [options]",
                      description="Train every backbone alone, with the single-MLP fusion and with FedVLR (each "
                                  "selected on validation), over several seeds, and print test figures overall, "
                                  "for warm and cold targets and for cold targets ranked among cold items, beside "
                                  "pop/random/antipop and a content-only ranker, with bootstrap CIs and paired "
                                  "tests. --out writes table.csv, table.md, table.png and result.json.")
    add_data_arguments(t)
    add_table_arguments(t)
    o = t.add_argument_group("evaluation and output")
    o.add_argument("--metrics", type=metric_list, default=DEFAULT_METRICS, help="comma-separated metric@K list")
    o.add_argument("--out", metavar="DIR", default=None, help="report folder (CSV, Markdown, plot, JSON, runs)")
    o.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    o.add_argument("--mask-history", default="train", choices=["train", "all"],
                   help="mask only training items at test (paper protocol) or training and validation items")
    add_run_arguments(t, command="experiment")
    add_fusion_arguments(t)
    _add_recipe_arguments(t)
    t.set_defaults(func=cmd_paper_table, seeds=3)
    from .poisoning import register as register_poisoning
    from .privacy import register as register_privacy

    register_poisoning(ex)
    register_privacy(ex)
    from .view_routing import register as register_view_routing

    register_view_routing(ex)
    pr = ex.add_parser("paired", help="two finished run folders compared over the same test users (paired tests)",
                       description="Reads each seed's per_user_test.csv of two `run --out` folders, averages "
                                   "each user over the seeds and pairs the runs over their common users: mean "
                                   "difference A - B, paired t-test and Wilcoxon signed-rank test per metric.")
    pr.add_argument("run_a", metavar="RUN_A", help="the --out folder of the first run")
    pr.add_argument("run_b", metavar="RUN_B", help="the --out folder of the run it is compared with")
    pr.add_argument("--metrics", type=metric_list, default=None,
                    help="comma-separated metric@K list (default: every metric both runs have)")
    pr.add_argument("--by-history", action="store_true",
                    help="also pair the runs within each bucket of the users' training interactions (1-10, 11-20, "
                         "21-50, ...): where a change helps sparse users, dense ones, or both")
    pr.add_argument("--also", nargs=2, action="append", metavar=("RUN_A", "RUN_B"), default=[],
                    help="another pair of run folders, on another draw of the split (coldstart --split-seed); "
                         "repeatable: every pair's users' differences are then also pooled in one t-test")
    pr.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    pr.set_defaults(func=cmd_paired)
    return p



def _add_recipe_arguments(t) -> None:
    from ..common import add_halving_argument

    recipe = t.add_argument_group("recipe")
    recipe.add_argument(
        "--tune", action="store_true",
        help="choose each fusion row's recipe on validation first: the grid of 'run --tune' trained on the first "
             "seed, the best by --valid-metric kept for every seed; reported under 'tuning' in result.json")
    add_halving_argument(recipe, "each fusion row's grid")


def cmd_paired(args) -> int:
    from ...experiments.paired_runs import format_paired, paired_runs
    from ...jsonio import json_default

    metrics = args.metrics.split(",") if args.metrics else None
    result = paired_runs(args.run_a, args.run_b, metrics, by_history=args.by_history)
    text = format_paired(result)
    if args.also:
        from ...experiments.pooled_pairs import format_pooled, pooled_pairs

        result["pooled_draws"] = pooled_pairs([(args.run_a, args.run_b)] + [tuple(p) for p in args.also], metrics)
        text += "\n" + format_pooled(result["pooled_draws"])
    print(text, file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(result, default=json_default))
    return 0


def parse_overrides(items: list[str]) -> tuple[tuple[str, str, str], ...]:
    """``--override SELECTOR:field=value`` where SELECTOR is a backbone, a variant or ``backbone+variant``."""
    from ...errors import ConfigError

    out = []
    for it in items or []:
        try:
            sel, rest = it.split(":", 1)
            field, value = rest.split("=", 1)
        except ValueError:
            raise ConfigError(f"--override {it}", "expected SELECTOR:field=value",
                              "e.g. fedvlr:server_lr=3") from None
        out.append((sel.strip(), field.strip().replace("-", "_"), value.strip()))
    return tuple(out)


def paper_table_options(args):
    """The table's typed options from the parsed flags."""
    from pathlib import Path

    from ...adapters import backbone_options
    from ...experiments.paper.table import PaperTableOptions
    from ...metric_spec import parse_metrics
    from ..common import continued_folder
    from ..fusion import options_from_args
    from ..run.args import config_from_args

    folder = continued_folder(args, "table")
    _, ks, keys = parse_metrics(args.metrics)
    backbones = tuple(b.strip() for b in args.backbones.split(",") if b.strip())
    return PaperTableOptions(
        backbones=backbones, backbone_options={b: backbone_options(b, args) for b in backbones},
        variants=tuple(v.strip() for v in args.variants.split(",") if v.strip()),
        training=config_from_args(args, ks=ks), fedvlr=options_from_args(args, mode="fedvlr"), metrics=keys,
        overrides=parse_overrides(args.override),
        folder=Path(folder) if folder else None, resume=bool(args.resume), progress=not args.no_progress,
        tune=args.tune, halving=args.halving, jobs=args.jobs)


def cmd_paper_table(args) -> int:
    from ...experiments.paper.report import print_table
    from ...experiments.paper.table import run_paper_table
    from ...jsonio import json_default
    from ..common import load_for_run, say_written

    options = paper_table_options(args)
    data, _ = load_for_run(args)
    print(f"paper table on {args.source}: backbones {args.backbones}, variants {args.variants}, {args.seeds} seeds "
          f"each" + (f"; writing to {args.resume or args.out}" if (args.resume or args.out) else ""),
          file=sys.stderr)
    result = run_paper_table(data, options)
    print_table(result, file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(result, default=json_default))
    say_written(args, args.resume or args.out, "table.md, table.csv, table.png, result.json, every run's folder",
                read="table.md")
    return 0
