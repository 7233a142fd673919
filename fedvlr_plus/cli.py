"""The ``fedvlr-plus`` command: a thin layer over the Python API.

Commands: ``data stats``, ``run``. Other subsystems register their own commands through ``register``.
With ``--json`` the last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from fedvlr_plus.jsonio import json_default, write_json_atomic

REFERENCE_BACKBONES = ("pop", "random", "antipop")
DEFAULT_METRICS = "hr@10,ndcg@10,hr@50,ndcg@50"


# ---------------------------------------------------------------------------------------------- helpers
def _emit_json(obj) -> None:
    print(json.dumps(obj, default=json_default))


def parse_metrics(text: str) -> tuple[tuple[str, ...], tuple[int, ...], list[str]]:
    """``"hr@10,ndcg@50"`` -> (metric names, cut-offs, the requested keys in order)."""
    names, ks, keys = [], [], []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        if "@" not in part:
            raise argparse.ArgumentTypeError(f"metric {part!r} needs a cut-off, e.g. {part}@10")
        name, k = part.split("@", 1)
        if name not in ("hr", "ndcg", "recall", "mrr"):
            raise argparse.ArgumentTypeError(f"unknown metric {name!r} (hr, ndcg, recall, mrr)")
        try:
            k_int = int(k)
        except ValueError:
            raise argparse.ArgumentTypeError(f"cut-off of {part!r} is not an integer") from None
        if k_int < 1:
            raise argparse.ArgumentTypeError(f"cut-off of {part!r} must be >= 1")
        names.append(name)
        ks.append(k_int)
        keys.append(f"{name}@{k_int}")
    if not keys:
        raise argparse.ArgumentTypeError("no metric given")
    return tuple(dict.fromkeys(names)), tuple(sorted(set(ks))), keys


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
    g.add_argument("--k-core", type=int, default=0, metavar="K",
                   help="iterative K-core filter on users and items before splitting (default: none)")


def load_for_run(args):
    """Load SOURCE and apply the requested preprocessing and split."""
    from fedvlr_plus.datasets import load
    from fedvlr_plus.datasets import splits

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
    return data, split


# ---------------------------------------------------------------------------------------------- data stats
def cmd_data_stats(args) -> int:
    from fedvlr_plus.datasets import detect_format, load

    fmt = detect_format(args.source)
    data = load(args.source)
    stats = data.stats()
    stats["detected_format"] = fmt
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
    if stats["content"]:
        print(f"  item content: {', '.join(stats['content'])}")
    for k, shape in stats["features"].items():
        print(f"  features '{k}': {shape[0]:,} x {shape[1]}")
    return 0


# ---------------------------------------------------------------------------------------------- run
def _format_table(rows: list[tuple[str, dict, dict]], keys: list[str]) -> str:
    head = f"{'':<14}" + "".join(f"{k:>12}" for k in keys)
    lines = [head]
    for label, means, n in rows:
        lines.append(f"{label:<14}" + "".join(f"{means.get(k, float('nan')):>12.4f}" for k in keys)
                     + (f"   ({n} users)" if n is not None else ""))
    return "\n".join(lines)


def cmd_run(args) -> int:
    from fedvlr_plus.evaluation import evaluate, reference_scorer

    names, ks, keys = parse_metrics(args.metrics)
    protocol = "sampled" if args.protocol == "sampled99" else "full"
    data, split_used = load_for_run(args)
    if args.backbone not in REFERENCE_BACKBONES:
        return _run_federated(args, data, split_used, names, ks, keys, protocol)
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
    _report_run(args, result, keys, test)
    return 0


def reference_table(data, keys: list[str], **common) -> dict:
    """Test figures of the reference rankers (pop, random, antipop), overall and by warm/cold target."""
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


def _report_run(args, result: dict, keys: list[str], test_result=None) -> None:
    if args.out:
        out = Path(args.out)
        write_json_atomic(out / "result.json", result)
        if test_result is not None:
            from fedvlr_plus.atomic_write import atomic_write

            atomic_write(out / "per_user_test.csv", lambda tmp: test_result.per_user.to_csv(tmp, index=False))
    rows = [("valid", result["valid"], None), ("test", result["test"], result.get("n_users"))]
    for part in ("warm", "cold"):
        if f"test_{part}" in result:
            rows.append((f"test {part}", result[f"test_{part}"], result.get(f"test_{part}_n_users")))
    print(f"{result['dataset']} | {result['backbone']} | {result['protocol']} | split {result['split']}")
    print(_format_table(rows, keys))
    if result.get("baselines"):
        print("reference rankers on the same test (overall / warm / cold):")
        for name, parts in result["baselines"].items():
            print(_format_table([(f"  {name} {p}", v, None) for p, v in parts.items()], keys).split("\n", 1)[1])
    if "test_ci" in result:
        ci = result["test_ci"]
        print("95% CI (bootstrap over users): " + ", ".join(
            f"{k} [{ci[k][0]:.4f}, {ci[k][1]:.4f}]" for k in keys if k in ci))
    if args.json:
        _emit_json(result)


def _run_federated(args, data, split_used, names, ks, keys, protocol) -> int:
    from fedvlr_plus.federation import cli_run

    result = cli_run(args, data, split_used=split_used, metrics=names, ks=ks, keys=keys, protocol=protocol)
    _report_run(args, result, keys)
    return 0


# ---------------------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedvlr-plus",
        description="Personalised multimodal fusion for federated recommenders.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p_data = sub.add_parser("data", help="inspect data sources")
    data_sub = p_data.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True)
    p_stats = data_sub.add_parser("stats", help="users, items, interactions, per split, sparsity",
                                  description="Print users, items, interactions (per split) and sparsity of SOURCE, "
                                              "and which format was detected.")
    p_stats.add_argument("source", metavar="SOURCE",
                         help="'ml-100k' (embedded) or a path; the format is detected")
    p_stats.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p_stats.set_defaults(func=cmd_data_stats)

    p_run = sub.add_parser("run", help="train (if needed) and evaluate one backbone",
                           description="Train a backbone on SOURCE (federated backbones) or use a reference "
                                       "ranker, select on validation, and report test metrics with bootstrap "
                                       "confidence intervals, split into warm and cold targets.")
    add_data_arguments(p_run)
    p_run.add_argument("--backbone", default="pop", metavar="NAME",
                       help="reference rankers: pop (training popularity), random, antipop (fewest training "
                            "interactions first); federated backbones where installed")
    p_run.add_argument("--protocol", default="full", choices=["full", "sampled99"],
                       help="full: rank all items with the user's training items masked; sampled99: the target "
                            "among 99 sampled negatives (seeded)")
    p_run.add_argument("--mask-history", default="train", choices=["train", "all"],
                       help="at test time mask only training items (FedVLR protocol; the validation item stays a "
                            "candidate) or training and validation items (RecBole's behaviour)")
    p_run.add_argument("--metrics", default=DEFAULT_METRICS, help=f"comma-separated metric@K list "
                                                                  f"(hr, ndcg, recall, mrr; default {DEFAULT_METRICS})")
    p_run.add_argument("--seed", type=int, default=0, help="seed for sampling, splits and the random ranker")
    p_run.add_argument("--out", metavar="RUN_DIR", default=None,
                       help="write result.json and per-user test metrics (CSV) into RUN_DIR")
    p_run.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    from fedvlr_plus.federation import add_run_arguments
    from fedvlr_plus.fusion_cli import add_fusion_arguments

    add_run_arguments(p_run)
    add_fusion_arguments(p_run)
    p_run.set_defaults(func=cmd_run)

    from fedvlr_plus.views import cli as views_cli

    views_cli.register(sub).set_defaults(func=views_cli.run)

    from fedvlr_plus.federation import commands as federation_commands

    federation_commands.register(sub)  # bench round

    from fedvlr_plus.alignment import cli as alignment_cli

    alignment_cli.register(sub)

    from fedvlr_plus.experiments import cli as experiments_cli

    experiments_cli.register(sub)

    from fedvlr_plus import flower_cli

    flower_cli.register(sub)  # flower superlink|supernode|run

    from fedvlr_plus.coldstart import cli as coldstart_cli

    coldstart_cli.register(sub)
    return parser


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
