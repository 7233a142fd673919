"""``fedvlr-plus experiment privacy-table SOURCE ...`` and ``fedvlr-plus experiment leakage SOURCE ...``."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from ...errors import ConfigError


def _float_list(text: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not out or any(x < 0 for x in out):
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers >= 0, got {text!r}")
    return out


def _pad_list(text: str) -> list[int]:
    from ..run.args import _pad_rows

    try:
        out = [_pad_rows(x.strip()) for x in text.split(",") if x.strip()]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected comma-separated row counts or 'all', got {text!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("expected at least one padding")
    return out


def _common(p: argparse.ArgumentParser, command: str) -> None:
    from ...federation.config import FEDERATED_BACKBONES
    from ..common import add_data_arguments
    from ..fusion_args import add_fusion_arguments
    from ..run.args import add_run_arguments

    add_data_arguments(p)
    g = p.add_argument_group("model and output")
    g.add_argument("--backbone", choices=FEDERATED_BACKBONES, default="fedavg", help="federated backbone")
    g.add_argument("--metric", default="ndcg@50", help="the table's figure (also the validation metric)")
    g.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="report folder (table.md, table.csv, result.json); every run is checkpointed into DIR/runs/ "
        "(continue a killed table with --resume DIR)",
    )
    g.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_run_arguments(p, command=command)
    add_fusion_arguments(p)


def register(ex) -> None:
    t = ex.add_parser(
        "privacy-table",
        help="the FedVLR paper's Table 4: noise levels -> test figure, with epsilon",
        usage="%(prog)s SOURCE [--backbone B] [--fusion fedvlr] [--noise 0,0.1,...] [options]",
        description="Train the unprotected model, then one per noise multiplier with every upload "
        "clipped at --upload-clip (default 1; sigma 0 = clipping alone), over several "
        "seeds, each selected on validation, and report the test figure with its "
        "bootstrap CI, a paired test against the unprotected run and the accounted "
        "client-level (epsilon, delta). --out writes table.md, table.csv, table.png, "
        "result.json.",
    )
    _common(t, "privacy")
    t.add_argument(
        "--noise",
        type=_float_list,
        default=[0.0, 0.1, 0.5, 1.0],
        metavar="S,...",
        help="noise multipliers (default 0,0.1,0.5,1)",
    )
    t.set_defaults(func=cmd_privacy_table, seeds=3)
    lk = ex.add_parser(
        "leakage",
        help="item-set leakage: a server-side attack with and without decoy padding",
        usage="%(prog)s SOURCE [--backbone B] [--pads 0,all] [--noise 0,1] [options]",
        description="Train with every padding and noise level while a server-side attacker guesses "
        "each client's training items from its uploads (row ids; change magnitudes); "
        "report the attacks' precision/recall, the test figure and bytes per round.",
    )
    _common(lk, "leakage")
    lk.add_argument(
        "--pads",
        type=_pad_list,
        default=[0, -1],
        metavar="K,...",
        help="upload paddings: 0 (none), a row count, or all (dense); default 0,all",
    )
    lk.add_argument(
        "--noise", type=_float_list, default=[0.0, 1.0], metavar="S,...", help="noise multipliers (default 0,1)"
    )
    lk.set_defaults(func=cmd_leakage, seeds=1)


@dataclass
class FlagsBackbone:
    """What ``run`` trains from the same flags, built afresh for every seed (a class, not a closure: a worker
    process gets it by pickling)."""

    args: argparse.Namespace
    data: object
    dim: int

    def __call__(self):
        from ..run.federated import build_backbone

        return build_backbone(self.args, self.data, self.dim, is_recbole=False)


def _setup(args):
    from ..common import load_for_run
    from ..run.args import config_from_args

    if args.target_epsilon is not None:
        raise ConfigError("--target-epsilon", "the table sets the noise of each row itself (--noise)")
    if "@" not in args.metric:
        raise ConfigError(f"--metric {args.metric}", "expected METRIC@K", "e.g. ndcg@50")
    data, _ = load_for_run(args)
    cfg = config_from_args(args, valid_metric=args.metric)
    backbone = FlagsBackbone(args, data, cfg.dim)
    label = args.backbone + ("" if args.fusion == "none" else f"+{args.fusion}")
    return data, cfg, backbone, label


def _finish(args, result, markdown, write, files: str) -> int:
    from ...jsonio import json_default
    from ..common import say_written

    print(markdown(result), file=sys.stderr if args.json else sys.stdout)
    if args.out:
        write(result, args.out)
    if args.json:
        print(json.dumps(result, default=json_default))
    say_written(args, args.out, files, read="table.md")
    return 0


def cmd_privacy_table(args) -> int:
    from ...experiments.privacy_table import format_markdown, run_privacy_table, write_privacy_table
    from ..common import continued_folder

    args.out = continued_folder(args, "table")  # (the report goes beside the runs it continues)
    data, cfg, backbone, label = _setup(args)
    print(f"privacy table on {args.source}: {label}, noise {args.noise}, {cfg.seeds} seeds", file=sys.stderr)
    how = {"jobs": args.jobs, "folder": args.out, "resume": bool(args.resume)}  # (how the runs train, not what)
    result = run_privacy_table(data, backbone, cfg, args.noise, metric=args.metric, label=label, **how)
    return _finish(
        args, result, format_markdown, write_privacy_table, "table.md, table.csv, table.png, result.json, runs/"
    )


def cmd_leakage(args) -> int:
    from ...experiments.leakage import format_markdown, run_leakage, write_leakage
    from ..common import continued_folder

    args.out = continued_folder(args, "table")  # (the report goes beside the runs it continues)
    data, cfg, backbone, label = _setup(args)
    print(
        f"leakage on {args.source}: {label}, paddings {args.pads}, noise {args.noise}, {cfg.seeds} seeds",
        file=sys.stderr,
    )
    how = {"jobs": args.jobs, "folder": args.out, "resume": bool(args.resume)}  # (how the runs train, not what)
    result = run_leakage(data, backbone, cfg, args.pads, args.noise, metric=args.metric, label=label, **how)
    return _finish(args, result, format_markdown, write_leakage, "table.md, table.csv, result.json, runs/")
