"""The ``fedvlr-plus`` command: a thin layer over the Python API.

Commands: ``data stats``, ``run``. Other subsystems register their own commands through ``register``.
With ``--json`` the last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fedvlr_plus.argtypes import metric_list, non_negative_int, parse_metrics
from fedvlr_plus.jsonio import json_default, write_json_atomic

REFERENCE_BACKBONES = ("pop", "random", "antipop")
DEFAULT_METRICS = "hr@10,ndcg@10,hr@50,ndcg@50"


# ---------------------------------------------------------------------------------------------- helpers
def _emit_json(obj) -> None:
    print(json.dumps(obj, default=json_default))


def backbone_names() -> str:
    """Every name ``--backbone`` takes, for its help and for the unknown-backbone error."""
    from fedvlr_plus.federation.config import FEDERATED_BACKBONES

    return (f"federated: {', '.join(FEDERATED_BACKBONES)}, recbole:<Model> (any RecBole general recommender, "
            f"e.g. recbole:BPR); reference rankers: {', '.join(REFERENCE_BACKBONES)}")


def backbone_arg(text: str) -> str:
    """``--backbone`` of ``run``: a federated backbone, ``recbole:<Model>`` or a reference ranker."""
    from fedvlr_plus.federation.config import FEDERATED_BACKBONES

    name = text.strip()
    if name.lower() in FEDERATED_BACKBONES + REFERENCE_BACKBONES:
        return name.lower()
    if name.lower().startswith("recbole:"):
        if not name.split(":", 1)[1].strip():
            raise argparse.ArgumentTypeError("recbole:<Model> needs a model name, e.g. recbole:BPR")
        return "recbole:" + name.split(":", 1)[1].strip()
    raise argparse.ArgumentTypeError(f"unknown backbone {text!r}; choose from {backbone_names()}")


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """Flags that say how SOURCE is read and split (shared by every command that trains or evaluates)."""
    g = p.add_argument_group("data")
    g.add_argument("source", metavar="SOURCE",
                   help="'ml-100k' (embedded, from the recbole wheel) or a path to a data folder/file; "
                        "the format is detected")
    g.add_argument("--split", default="auto",
                   choices=["auto", "loo", "ratio", "predefined", "cold-items", "cold-users"],
                   help="auto: the data's own split labels when it has them, else leave-one-out by time "
                        "(last = test, second-to-last = valid)")
    g.add_argument("--implicit-threshold", type=float, default=None, metavar="R",
                   help="keep only interactions with rating >= R as positives (default: all interactions)")
    g.add_argument("--k-core", type=non_negative_int, default=0, metavar="K",
                   help="iterative K-core filter on users and items before splitting (default: none)")


def load_for_run(args):
    """Load SOURCE and apply the requested preprocessing and split."""
    from fedvlr_plus.datasets import load, print_warnings
    from fedvlr_plus.datasets import splits
    from fedvlr_plus.federation.synthetic import SYNTHETIC_PREFIX

    if args.source.startswith(SYNTHETIC_PREFIX):
        return _synthetic_for_run(args), "loo"
    data = load(args.source)
    split = args.split
    if split == "auto":
        split = "predefined" if data.is_split else "loo"
    if split == "predefined":
        data = splits.predefined(data)
    else:
        data = splits.standard(data, threshold=args.implicit_threshold, k=args.k_core, split=split,
                               seed=getattr(args, "seed", 0))
    data.require_split(need=("train", "valid", "test"))
    print_warnings(data, sys.stderr)  # duplicates, leaks, users without training rows: one line each
    return data, split


def _synthetic_for_run(args):
    """``synthetic:USERSxITEMS``: generated and split leave-one-out, so the split flags cannot change it."""
    from fedvlr_plus.errors import ConfigError
    from fedvlr_plus.federation.synthetic import synthetic_source

    for flag, value, default in (("--split", args.split, "auto"), ("--k-core", args.k_core, 0),
                                 ("--implicit-threshold", args.implicit_threshold, None)):
        if value != default and not (flag == "--split" and value == "loo"):
            raise ConfigError(f"{flag} {value}", f"{args.source} is generated already split leave-one-out",
                              f"drop {flag}")
    return synthetic_source(args.source, seed=getattr(args, "seed", 0))


# ---------------------------------------------------------------------------------------------- data stats
def cmd_data_stats(args) -> int:
    from fedvlr_plus.datasets import detect_format, load, print_warnings

    fmt = detect_format(args.source)
    data = load(args.source)
    stats = data.stats()
    stats["detected_format"] = fmt
    print_warnings(data, sys.stderr, stats["warnings"])
    if args.json:
        _emit_json(stats)
        return 0
    print(f"{stats['dataset']}  (detected format: {fmt})")
    print(f"  users         {stats['users']:>10,}")
    print(f"  items         {stats['items']:>10,}")
    print(f"  interactions  {stats['interactions']:>10,}")
    print(f"  sparsity      {stats['sparsity']:>10.4%}")
    for name, s in stats["splits"].items():
        print(f"  {name:<13} {s['interactions']:>10,} interactions, {s['users']:,} users, {s['items']:,} items")
    if "cold_items" in stats:
        print(f"  items never in train: {stats['cold_items']:,}; cold targets: valid {stats['valid_cold_targets']:,}, "
              f"test {stats['test_cold_targets']:,}")
    if stats["content_coverage"]:  # only fields some item holds a value in, with how many items do
        print("  item content: " + ", ".join(f"{k} {n:,}/{stats['items']:,}"
                                             for k, n in stats["content_coverage"].items()))
    for k, shape in stats["features"].items():
        print(f"  features '{k}': {shape[0]:,} x {shape[1]}")
    if stats["warnings"]:
        print(f"  warnings: {len(stats['warnings'])} (on stderr; codes {', '.join(w['code'] for w in stats['warnings'])})")
    return 0


# ---------------------------------------------------------------------------------------------- run
def _has_figures(means) -> bool:
    return isinstance(means, dict) and any(isinstance(v, (int, float)) and v == v for v in means.values())


def _format_table(rows: list[tuple], keys: list[str]) -> str:
    """Rows ``(label, means, n_users[, note])``; a row without figures prints its note (or why) instead."""
    head = f"{'':<14}" + "".join(f"{k:>12}" for k in keys)
    lines = [head]
    for label, means, n, *note in rows:
        if not _has_figures(means):
            lines.append(f"{label:<14}   ({note[0] if note and note[0] else 'no users'})")
            continue
        cells = "".join(f"{v:>12.4f}" if isinstance(v, (int, float)) and v == v else f"{'–':>12}"
                        for v in (means.get(k) for k in keys))
        lines.append(f"{label:<14}" + cells + (f"   ({n} users)" if n is not None else ""))
    return "\n".join(lines)


def cmd_run(args) -> int:
    from fedvlr_plus.evaluation import evaluate, reference_scorer

    names, ks, keys = parse_metrics(args.metrics)
    protocol = "sampled" if args.protocol == "sampled99" else "full"
    data, split_used = load_for_run(args)
    _say(_run_plan(args, data.name))
    if args.backbone not in REFERENCE_BACKBONES:
        code = _run_federated(args, data, split_used, names, ks, keys, protocol)
        _say(_next_step(args))
        return code
    scorer = reference_scorer(args.backbone, data, seed=args.seed)
    common = dict(protocol=protocol, ks=ks, metrics=names, mask_history=args.mask_history, seed=args.seed)
    valid = evaluate(data, scorer, split="valid", **common)
    test = evaluate(data, scorer, split="test", **common)
    result = {
        "dataset": data.name,
        "backbone": args.backbone,
        "protocol": args.protocol,
        "split": split_used,
        "mask_history": args.mask_history,
        "seed": args.seed,
        "metrics": keys,
        "valid": {k: valid.summary()[k] for k in keys},
    }
    tj = test.to_json(prefix="test")
    result.update({k: _select(v, keys) for k, v in tj.items() if k not in result})
    result["n_users"] = int(len(test.per_user))
    result["baselines"] = reference_table(data, keys, **common)
    result["data_warnings"] = data.sanity()
    _report_run(args, result, keys, test)
    _say(_next_step(args))
    return 0


def _say(message: str) -> None:
    """What a long step is doing, on stderr: stdout stays the table, or with --json one JSON line."""
    print(message, file=sys.stderr, flush=True)


def _run_plan(args, dataset: str) -> str:
    """One line that says what ``run`` is about to do and where it writes."""
    where = (f"writing to {args.resume or args.out}" if (args.resume or args.out)
             else "nothing written (add --out RUN_DIR to keep the result)")
    if args.backbone in REFERENCE_BACKBONES:
        return f"ranking {dataset} with the reference ranker {args.backbone} (no training); {where}"
    seeds = list(range(args.seed, args.seed + args.seeds))
    model = args.backbone + ("" if args.fusion == "none" else f" + {args.fusion} fusion")
    return (f"training {model} on {dataset}: {len(seeds)} seed{'s' * (len(seeds) > 1)} "
            f"({', '.join(map(str, seeds))}), up to {args.rounds} rounds, patience {args.patience}; {where}")


def _next_step(args) -> str:
    """Where to go from a finished ``run``."""
    src = args.source
    if args.backbone in REFERENCE_BACKBONES:
        return f"next: train a federated backbone, e.g. fedvlr-plus run {src} --backbone fedavg"
    base = args.backbone if not args.backbone.startswith("recbole:") else "fedavg"
    if args.fusion == "none":
        return (f"next: add the FedVLR layer with --fusion fedvlr, or a cold-start study with "
                f"fedvlr-plus coldstart {src} --backbone {base}")
    return (f"next: every backbone alone and with the fusion layer, with paired tests: "
            f"fedvlr-plus experiment paper-table {src}")


def reference_table(data, keys: list[str], **common) -> dict:
    """Test figures of the reference rankers (pop, random, antipop), overall and by warm/cold target. A part the
    test does not have (no cold targets, say) is left out here; the result's ``notes`` say so."""
    from fedvlr_plus.evaluation import evaluate, reference_scorer

    out = {}
    for name in REFERENCE_BACKBONES:
        res = evaluate(data, reference_scorer(name, data, seed=common.get("seed", 0)), split="test", **common)
        out[name] = {part: {k: v for k, v in res.summary(part).items() if k in keys}
                     for part in ("all", "warm", "cold") if res.n_users(part)}
    return out


def _select(value, keys):
    if isinstance(value, dict) and all(isinstance(k, str) for k in value) and any(k in value for k in keys):
        return {k: value[k] for k in keys if k in value}
    return value


def _part_rows(result: dict) -> list[tuple]:
    """The console rows of a run: valid, test, then test warm / cold, each with its note when it is empty."""
    from fedvlr_plus.evaluation.results import empty_part_reason

    rows = [("valid", result.get("valid"), None, "no validation figures"),
            ("test", result.get("test"), result.get("n_users"), "no test figures")]
    for part in ("warm", "cold"):
        n = result.get(f"test_{part}_n_users")
        if f"test_{part}" not in result and n is None:
            continue
        why = empty_part_reason(part) if n == 0 else "not combined over seeds: absent in some (see notes)"
        rows.append((f"test {part}", result.get(f"test_{part}"), n, why))
    return rows


def _report_run(args, result: dict, keys: list[str], test_result=None) -> None:
    if args.out:
        out = Path(args.out)
        write_json_atomic(out / "result.json", result)
        if test_result is not None:
            from fedvlr_plus.atomic_write import atomic_write

            atomic_write(out / "per_user_test.csv", lambda tmp: test_result.per_user.to_csv(tmp, index=False))
    print(f"{result['dataset']} | {result['backbone']} | {result['protocol']} | split {result['split']}")
    print(_format_table(_part_rows(result), keys))
    if result.get("baselines"):
        present = [p for p in ("all", "warm", "cold") if any(p in v for v in result["baselines"].values())]
        names = {"all": "overall", "warm": "warm", "cold": "cold"}
        print(f"reference rankers on the same test ({' / '.join(names[p] for p in present)}):")
        for name, parts in result["baselines"].items():
            print(_format_table([(f"  {name} {p}", v, None) for p, v in parts.items()], keys).split("\n", 1)[1])
    ci = result.get("test_ci") or {}
    shown = [k for k in keys if isinstance(ci.get(k), list) and None not in ci[k]]
    if shown:
        print("95% CI (bootstrap over users): " + ", ".join(f"{k} [{ci[k][0]:.4f}, {ci[k][1]:.4f}]" for k in shown))
    for note in result.get("notes", []):
        print(f"note: {note}")
    if args.json:
        _emit_json(result)


def _run_federated(args, data, split_used, names, ks, keys, protocol) -> int:
    from fedvlr_plus.federation import cli_run

    result = cli_run(args, data, split_used=split_used, metrics=names, ks=ks, keys=keys, protocol=protocol)
    _report_run(args, result, keys)
    return 0


# ---------------------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    """Every command's parser. Building it imports no torch, pandas or RecBole (``--help`` stays fast);
    each command imports what it needs when it runs."""
    from fedvlr_plus import __version__
    from fedvlr_plus.cli_parser import CliParser

    parser = CliParser(prog="fedvlr-plus",
                       description="Personalised multimodal fusion for federated recommenders.")
    parser.add_argument("--version", action="version", version=f"fedvlr-plus {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_data_command(sub)
    _add_run_command(sub)
    from fedvlr_plus.alignment import cli as alignment_cli
    from fedvlr_plus.coldstart import cli as coldstart_cli
    from fedvlr_plus.experiments import cli as experiments_cli
    from fedvlr_plus.federation import commands as federation_commands
    from fedvlr_plus.views import cli as views_cli
    from fedvlr_plus import flower_cli

    views_cli.register(sub).set_defaults(func=views_cli.run)
    federation_commands.register(sub)  # bench round
    alignment_cli.register(sub)
    experiments_cli.register(sub)
    flower_cli.register(sub)  # flower superlink|supernode|run
    coldstart_cli.register(sub)
    return parser


def _add_data_command(sub) -> None:
    p_data = sub.add_parser("data", help="inspect data sources")
    data_sub = p_data.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True)
    p_stats = data_sub.add_parser("stats", help="users, items, interactions, per split, sparsity",
                                  description="Print users, items, interactions (per split) and sparsity of SOURCE, "
                                              "and which format was detected.")
    p_stats.add_argument("source", metavar="SOURCE",
                         help="'ml-100k' (embedded) or a path; the format is detected")
    p_stats.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p_stats.set_defaults(func=cmd_data_stats)


def _add_run_command(sub) -> None:
    from fedvlr_plus.federation.config import add_run_arguments
    from fedvlr_plus.fusion_args import add_fusion_arguments

    p_run = sub.add_parser("run", help="train (if needed) and evaluate one backbone",
                           usage="%(prog)s SOURCE [--backbone NAME] [options]",
                           description="Train a backbone on SOURCE (federated backbones) or use a reference "
                                       "ranker, select on validation, and report test metrics with bootstrap "
                                       "confidence intervals, split into warm and cold targets.")
    add_data_arguments(p_run)
    g = p_run.add_argument_group("model and evaluation")
    g.add_argument("--backbone", type=backbone_arg, default="pop", metavar="NAME",
                   help=f"what to train or rank with; {backbone_names()}. pop: training popularity, "
                        f"antipop: fewest training interactions first")
    g.add_argument("--protocol", default="full", choices=["full", "sampled99"],
                   help="full: rank all items with the user's training items masked; sampled99: the target "
                        "among 99 sampled negatives (seeded)")
    g.add_argument("--mask-history", default="train", choices=["train", "all"],
                   help="at test time mask only training items (FedVLR protocol; the validation item stays a "
                        "candidate) or training and validation items (RecBole's behaviour)")
    g.add_argument("--metrics", type=metric_list, default=DEFAULT_METRICS,
                   help="comma-separated metric@K list (hr, ndcg, recall, mrr)")
    g.add_argument("--seed", type=non_negative_int, default=0,
                   help="seed for sampling, splits, the random ranker and the first training seed")
    o = p_run.add_argument_group("output")
    o.add_argument("--out", metavar="RUN_DIR", default=None,
                   help="write result.json and per-user test metrics (CSV) into RUN_DIR (federated backbones "
                        "also checkpoint there)")
    o.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_run_arguments(p_run)
    add_fusion_arguments(p_run)
    p_run.set_defaults(func=cmd_run)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser()
    args = parser.parse_args(argv)
    from fedvlr_plus.errors import UserError

    try:
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


if __name__ == "__main__":
    sys.exit(main())
