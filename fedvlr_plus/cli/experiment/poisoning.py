"""``fedvlr-plus experiment poisoning SOURCE ...``: the item-promotion attack under every aggregation rule."""
from __future__ import annotations

import argparse
import json
import sys
import time

from ...federation.config import FEDERATED_BACKBONES, STRATEGIES

#: the popular items the attacker knows unless --popular-pool says (fewer on a smaller catalogue)
DEFAULT_POPULAR_POOL = 100


def _strategy_list(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in STRATEGIES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown strategy {', '.join(bad) or repr(text)}; choose from "
                                         f"{', '.join(STRATEGIES)}")
    return list(dict.fromkeys(names))


def _fraction_list(text: str) -> list[float]:
    try:
        values = [float(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of fractions") from None
    bad = [v for v in values if not 0.0 <= v < 1.0]
    if bad or not values:
        raise argparse.ArgumentTypeError(f"attacker fractions must lie in [0, 1) (e.g. 0,0.01,0.05,0.1), got "
                                         f"{text!r}")
    return sorted(set(values))


def _positive(kind):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not v > 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return v
    return parse


def register(ex) -> argparse.ArgumentParser:
    """Add the ``poisoning`` experiment to ``experiment``'s sub-commands."""
    from ..common import add_data_arguments
    from ..run.args import add_run_arguments

    p = ex.add_parser("poisoning", help="item-promotion attack: target exposure and NDCG per aggregation rule",
                      usage="%(prog)s SOURCE --backbone B [--strategies S,...] [--attackers F,...] [options]",
                      description="Add fake clients (each fraction of the real clients) that promote one "
                                  "unpopular target item (docs/security.md, 'Poisoning'); train under each "
                                  "aggregation rule over several seeds; report the target's HR@K among users who "
                                  "never interacted with it and the overall test NDCG, at the round selected on "
                                  "validation. --out writes poisoning.md, poisoning.csv, poisoning.png and "
                                  "result.json.")
    add_data_arguments(p)
    a = p.add_argument_group("attack")
    a.add_argument("--backbone", default="fedavg", choices=FEDERATED_BACKBONES, help="federated backbone")
    a.add_argument("--strategies", type=_strategy_list, default=["fedavg", "fedgrad", "median", "trimmed-mean"],
                   help="comma-separated aggregation rules")
    a.add_argument("--attackers", type=_fraction_list, default=[0.0, 0.01, 0.05, 0.1], metavar="F,...",
                   help="fractions of fake clients, relative to the real clients (0 is the unattacked row)")
    a.add_argument("--boost", type=_positive(float), default=1.0,
                   help="length of the target row's step relative to the attacker's own largest honest row step")
    a.add_argument("--popular-pool", type=_positive(int), default=None, metavar="N",
                   help="the N most popular items the attacker knows (fake profiles and the push direction; "
                        f"default {DEFAULT_POPULAR_POOL}, or every item but the target on a smaller catalogue)")
    a.add_argument("--target-quantile", type=_positive(float), default=0.1, metavar="Q",
                   help="the target is drawn from the least popular Q of the warm items (by training count)")
    o = p.add_argument_group("output")
    o.add_argument("--out", metavar="DIR", default=None,
                   help="report folder (Markdown, CSV, plot, JSON); each finished run is kept in DIR/cells, "
                        "so the same command run again resumes the grid")
    o.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    # the cold-start command's set of engine flags: no --resume (this experiment keeps no run folders)
    add_run_arguments(p, command="poisoning")
    # fedgrad's server lr: the ml-100k setting of docs/results.md (the backbone's sum-rule default diverges there)
    p.set_defaults(func=cmd_poisoning, seeds=3, rounds=60, eval_every=10, patience=3, server_lr=3.0)
    return p


def cmd_poisoning(args) -> int:
    from ...adapters import backbone_options
    from ...errors import ConfigError
    from ...experiments.poisoning import run_grid, summarise
    from ...experiments.poisoning_report import markdown_table, write_report
    from ...federation.config import config_from_options
    from ...jsonio import json_default
    from ..common import load_for_run, say_written

    if args.target_quantile > 1:
        raise ConfigError(f"--target-quantile {args.target_quantile}", "is a fraction of the warm items",
                          "pass a value in (0, 1], e.g. 0.1")
    data, _ = load_for_run(args)
    if args.popular_pool is None:
        args.popular_pool = min(DEFAULT_POPULAR_POOL, data.n_items - 1)
    elif args.popular_pool >= data.n_items:  # the pool leaves out the target: a strict part of the catalogue
        raise ConfigError(f"--popular-pool {args.popular_pool}", f"is not smaller than the {data.n_items:,} items of "
                          f"{data.name}", f"give a pool below {data.n_items}, or leave it out")
    # (--jobs is how the grid runs, not a setting of its cells: a rerun with other --jobs reads them back)
    cfg = config_from_options(args, ks=(10, 50), metrics=("hr", "ndcg"), seeds=1, strategy=None, jobs=None)
    print(f"poisoning on {args.source}: {args.backbone}, strategies {','.join(args.strategies)}, attackers "
          f"{','.join(f'{f:g}' for f in args.attackers)}, {args.seeds} seeds, up to {cfg.rounds} rounds",
          file=sys.stderr)
    wall, cpu = time.perf_counter(), time.process_time()
    log = None if args.no_progress else (lambda line: print(line, file=sys.stderr))
    cells = run_grid(data, args.backbone, cfg, args.strategies, args.attackers, args.seeds,
                     target_quantile=args.target_quantile, pool_size=args.popular_pool, boost=args.boost, log=log,
                     folder=args.out, options=backbone_options(args.backbone, args), jobs=args.jobs)
    rows = summarise(cells, args.strategies, args.attackers, seed=cfg.seed)
    result = {"settings": {"dataset": data.name, "backbone": args.backbone, "seeds": args.seeds,
                           "targets": sorted({c["target"] for c in cells}), "boost": args.boost,
                           "popular_pool": args.popular_pool, "target_quantile": args.target_quantile,
                           "config": cfg.to_dict()},
              "rows": rows, "cells": [{k: v for k, v in c.items() if k != "per_user"} for c in cells],
              "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
    if args.out:
        write_report(result, args.out)
    print(markdown_table(result), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(result, default=json_default))
    say_written(args, args.out, "poisoning.md, poisoning.csv, poisoning.png, result.json", read="poisoning.md")
    return 0
