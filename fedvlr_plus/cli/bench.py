"""``fedvlr-plus bench round SOURCE --backbone B [--fusion F]``: time federated rounds, batched against sequential
(``B`` a federated backbone or ``recbole:<Model>``)."""
from __future__ import annotations

import argparse
import json
import sys

from .argtypes import positive_int
from .common import add_data_arguments, load_for_run


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``bench round``."""
    from ..federation.config import FEDERATED_BACKBONES
    from .fusion_args import add_fusion_arguments
    from .run_args import add_run_arguments

    p = subparsers.add_parser("bench", help="speed benchmarks of the federated engine")
    sub = p.add_subparsers(dest="bench_command", metavar="{round}", required=True)
    r = sub.add_parser("round", help="time one full round (all clients, local epochs, no evaluation), batched "
                                     "and sequential",
                       usage="%(prog)s SOURCE --backbone NAME [options]",
                       description="Time one full federated round for the batched simulator and the sequential "
                                   "reference in one process and print both and their ratio. SOURCE may also "
                                   "be synthetic:USERSxITEMS (e.g. synthetic:35000x18000).")
    add_data_arguments(r)
    r.add_argument("--backbone", required=True, metavar="NAME",
                   help=f"federated backbone to time: {', '.join(FEDERATED_BACKBONES)} or recbole:<Model>")
    r.add_argument("--repeats", type=positive_int, default=3, help="time each simulator this many times, keep the best")
    r.add_argument("--timed-rounds", type=positive_int, default=1, metavar="N",
                   help="train N rounds in a row and report the median of rounds 2..N (default 1: the first "
                        "round, best of --repeats)")
    r.add_argument("--no-sequential", action="store_true", help="time the batched simulator only")
    r.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_run_arguments(r, command="bench")
    add_fusion_arguments(r)
    r.set_defaults(func=cmd_bench_round)
    return p


def cmd_bench_round(args) -> int:
    from ..errors import ConfigError
    from ..federation.config import FEDERATED_BACKBONES
    from ..federation.engine import bench_round, format_bench
    from .run_args import config_from_args
    from .run_federated import build_backbone

    is_recbole = args.backbone.startswith("recbole:")
    if args.backbone not in FEDERATED_BACKBONES and not is_recbole:
        raise ConfigError(f"--backbone {args.backbone}", "unknown backbone",
                          f"choose from {', '.join(FEDERATED_BACKBONES)} or recbole:<Model>")
    data = load_for_run(args)[0]
    cfg = config_from_args(args)
    backbone = build_backbone(args, data, cfg.dim, is_recbole)
    res = bench_round(data, backbone, cfg, sequential=not args.no_sequential, repeats=args.repeats,
                      rounds=args.timed_rounds)
    print(format_bench(res), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(res))
    return 0
