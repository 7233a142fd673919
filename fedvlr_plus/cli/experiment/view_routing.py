"""``fedvlr-plus experiment planted`` (the planted-preference benchmark) and ``fedvlr-plus experiment view-routing
SOURCE`` (the same ablation rows on any data set): the router over the server's views beside every single view,
the fixed mixture, the operator experts, the like-for-like row and a content ranker (docs/personal-fusion.md)."""

from __future__ import annotations

import argparse
import json
import sys

from ..argtypes import positive_float, positive_int
from ..common import say

#: the row groups of fedvlr_plus.experiments.view_routing.ROW_GROUPS (checked by a test; the parser stays torch-free)
ROW_GROUPS = ("operators", "uniform", "sum", "single", "fedgrad")


def _row_groups(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if n not in ROW_GROUPS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown row group {', '.join(bad)}; choose from {', '.join(ROW_GROUPS)}")
    return names


PLANTED_METRICS = "ndcg@10,hr@10,ndcg@50,hr@50"
REAL_METRICS = "ndcg@50,hr@50,ndcg@10,hr@10"


def _common(p: argparse.ArgumentParser, metrics: str) -> None:
    """Rows, seeds, output and the training flags every row shares."""
    from ...federation.config import FEDERATED_BACKBONES
    from ..argtypes import metric_list
    from ..run.args import add_run_arguments

    g = p.add_argument_group("rows and output")
    g.add_argument(
        "--backbone",
        default="fedavg",
        choices=FEDERATED_BACKBONES,
        help="the backbone every row wraps (default fedavg)",
    )
    g.add_argument(
        "--metrics",
        type=metric_list,
        default=metrics,
        help=f"comma-separated metric@K list; paired tests use the first (default {metrics})",
    )
    g.add_argument(
        "--rows",
        type=_row_groups,
        default=",".join(ROW_GROUPS),
        help="row groups trained beside FedVLR (views): operators, uniform, sum, single (every single "
        "view), fedgrad (the backbone alone) (default: all of them)",
    )
    g.add_argument("--router-temperature", type=positive_float, default=1.0, help="softmax temperature of the routers")
    g.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="write report.md and result.json into DIR, and checkpoint every run into DIR/runs/ (continue a "
        "killed experiment with --resume DIR)",
    )
    g.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_run_arguments(p, command="routing")
    p.set_defaults(seeds=3)


def register(ex) -> None:
    """Add ``planted`` and ``view-routing`` to ``experiment``'s sub-commands."""
    from ..common import add_data_arguments

    p = ex.add_parser(
        "planted",
        help="planted-preference benchmark: does the router over views recover each user's modality, and does it pay?",
        usage="%(prog)s [--users N] [--items N] [--control MODALITY] [options]",
        description="Generate synthetic users who each choose items by one of two independent "
        "content modalities (image, text), then train FedVLR routing over the views, every "
        "single view, the fixed uniform mixture, the sum expert, operator experts and the "
        "backbone alone (fedgrad), each selected on validation, over --seeds seeds; add a "
        "content kNN ranker and two oracles that know each user's modality. Reports the "
        "routers' weight recovery against the truth and paired tests over users, for the "
        "mixed set and for a control where every user shares one modality.",
    )
    d = p.add_argument_group("planted data")
    d.add_argument("--users", type=positive_int, default=1600, help="users (default 1600)")
    d.add_argument("--items", type=positive_int, default=1200, help="items (default 1200)")
    d.add_argument(
        "--control",
        default="image",
        choices=("image", "text", "none"),
        help="the modality every user of the control set chooses by (none: no control)",
    )
    d.add_argument(
        "--control-only",
        action="store_true",
        help="train the control set only (e.g. beside a --control none run in another process)",
    )
    d.add_argument("--data-seed", type=int, default=0, help="seed of the generated data (the same for every row)")
    _common(p, PLANTED_METRICS)
    p.set_defaults(func=cmd_planted)
    v = ex.add_parser(
        "view-routing",
        help="the view-routing ablation rows on one data set",
        usage="%(prog)s SOURCE [--views DIR] [--fusion-views A,B,...] [options]",
        description="Train FedVLR routing over the views beside the operator experts, the uniform "
        "mixture, the sum expert, every single view and the backbone alone (fedgrad), "
        "each selected on validation, over --seeds seeds, with a content kNN ranker and "
        "paired tests over users against the view-routing row.",
    )
    add_data_arguments(v)
    s = v.add_argument_group("views")
    s.add_argument("--views", metavar="DIR", default=None, help="a view store (default: the data's own features)")
    s.add_argument(
        "--fusion-views",
        metavar="NAMES",
        default=None,
        help="comma-separated views to route between (at least two; default: the raw modalities)",
    )
    _common(v, REAL_METRICS)
    v.set_defaults(func=cmd_view_routing)


def _options(args):
    from dataclasses import fields
    from pathlib import Path

    from ...experiments.view_routing import ViewRoutingOptions
    from ...federation.config import FedConfig
    from ...fedvlr import FedVLROptions
    from ...metric_spec import parse_metrics
    from ..common import continued_folder
    from ..run.args import config_from_args

    args.out = continued_folder(args, "experiment")  # (the report goes beside the runs it continues)
    _, _, keys = parse_metrics(args.metrics)
    cfg = config_from_args(args)
    per_row = {"seed", "seeds", "ks", "metrics", "valid_protocol", "strategy", "jobs"}
    training = {f.name: getattr(cfg, f.name) for f in fields(FedConfig) if f.name not in per_row}
    return ViewRoutingOptions(
        backbone=args.backbone,
        seeds=args.seeds,
        seed=args.seed,
        metrics=tuple(keys),
        rows=args.rows,
        jobs=args.jobs,
        folder=Path(args.out) if args.out else None,
        resume=bool(args.resume),
        training=training,
        progress=not args.no_progress,
        fedvlr=FedVLROptions(temperature=args.router_temperature, progress=False),
    )


def _finish(args, out: dict) -> int:
    from pathlib import Path

    from ...atomic_write import atomic_write_text
    from ...experiments.view_routing_report import render, to_json
    from ...jsonio import json_default
    from ..common import say_written

    text = render(out)
    print(text, file=sys.stderr if args.json else sys.stdout)
    plain = json.dumps(to_json(out), default=json_default)
    if args.out:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / "report.md", text + "\n")
        atomic_write_text(folder / "result.json", plain + "\n")
        for plot in _plots(out, folder):
            say(f"wrote {plot}")
    if args.json:
        print(plain)
    say_written(args, args.out, "report.md, result.json", read="report.md")
    return 0


def _plots(out: dict, folder) -> list:
    """The per-user plot of every setting whose routed row kept its routers' weights."""
    from ...experiments.view_routing_plot import plot_per_user

    written = []
    for name, setting in out.items():
        if setting.get("per_user"):
            path = folder / f"per-user-{name}.png"
            plot_per_user(setting["per_user"], f"{setting['data']}: per-user routing", path)
            written.append(path)
    return written


def cmd_planted(args) -> int:
    from ...experiments.planted import PlantedOptions, run_planted

    planted = PlantedOptions(
        users=args.users,
        items=args.items,
        data_seed=args.data_seed,
        control=None if args.control == "none" else args.control,
        mixed=not args.control_only,
    )
    if args.control_only and planted.control is None:
        from ...errors import ConfigError

        raise ConfigError(
            "--control-only", "there is no control to train with --control none", "name the control's modality"
        )
    print(
        f"planted benchmark: {args.users} users x {args.items} items, {args.seeds} seeds, backbone "
        f"{args.backbone}" + (f"; control: every user by {planted.control}" if planted.control else ""),
        file=sys.stderr,
    )
    return _finish(args, run_planted(planted, _options(args)))


def cmd_view_routing(args) -> int:
    from ...experiments.view_routing import view_routing_setting
    from ...fedvlr.views import load_views
    from ..common import load_for_run

    opts = _options(args)  # (its flags checked before the data is read)
    data, _ = load_for_run(args)
    names = [n.strip() for n in args.fusion_views.split(",")] if args.fusion_views else None
    views = load_views(data, args.views, names, progress=not args.no_progress, purpose="--fusion-views")
    if len(views) < 2:
        from ...errors import ConfigError

        raise ConfigError(
            "--fusion-views",
            f"routing over views needs at least two views; {data.name} gives {len(views)} ({', '.join(views)})",
            "name two or more views of the store",
        )
    return _finish(args, {"rows": view_routing_setting(data, views, opts)})
