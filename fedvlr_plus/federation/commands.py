"""Glue between the ``fedvlr-plus`` CLI and the engine: ``run SOURCE --backbone <federated>`` and
``bench round SOURCE --backbone B``."""
from __future__ import annotations

import argparse
import json
import sys

from ..errors import ConfigError


def cli_run(args, data, *, split_used: str, metrics, ks, keys, protocol: str) -> dict:
    """Train ``args.backbone`` federatedly on ``data`` and return the CLI's result dict (valid/test/test_ci/
    test_warm/test_cold/baselines as for the reference rankers, plus selected_round, per_seed and history)."""
    from ..cli import backbone_names, reference_table
    from ..errors import RunFolderError
    from .config import FEDERATED_BACKBONES, config_from_args
    from .engine import run_federated

    is_recbole = args.backbone.startswith("recbole:")
    if args.backbone not in FEDERATED_BACKBONES and not is_recbole:
        raise ConfigError(f"--backbone {args.backbone}", "unknown backbone", f"choose from {backbone_names()}")
    if getattr(args, "recbole_config", None) and not is_recbole:
        raise ConfigError("--recbole-config", f"configures a recbole:<Model> backbone only, not {args.backbone}")
    names = tuple(dict.fromkeys(list(metrics) + ["hr"]))
    cfg = config_from_args(args, ks=tuple(ks), metrics=names, valid_protocol=protocol,
                           mask_history=getattr(args, "mask_history", "train"))
    run_dir = args.resume or args.out
    if args.resume and args.out and args.resume != args.out:
        raise RunFolderError("--out", f"--resume {args.resume} continues the run in that folder; do not pass a "
                             f"different --out ({args.out})")
    backbone, router = args.backbone, {}
    on_round = None
    fusion = getattr(args, "fusion", "none") != "none"
    if is_recbole:
        from ..adapters.recbole import cli_backbone

        backbone = cli_backbone(args, data)
    elif fusion:
        from ..fusion_cli import fusion_backbone

        backbone = fusion_backbone(args, data, args.backbone, cfg.dim)
    rb_eval = {}
    if fusion or getattr(args, "evaluator", "ours") == "recbole":
        from ..fusion_cli import router_report

        def on_round(run, record):  # figures at the selected (best-validation) round of each seed
            if run.best is not None and run.best["round"] == record["round"]:
                if fusion:
                    router[run.cfg.seed] = router_report(run)
                if getattr(args, "evaluator", "ours") == "recbole":
                    from ..adapters.recbole import recbole_evaluate

                    rb_eval[run.cfg.seed] = recbole_evaluate(data, run.scorer(), split="test", ks=tuple(ks),
                                                             metrics=tuple(metrics), mask_history=cfg.mask_history)

    res = run_federated(data, backbone, cfg, out_dir=run_dir, resume=bool(args.resume),
                        progress=not getattr(args, "no_progress", False), on_round=on_round)
    prefix = "test" if protocol == "full" else "test_sampled"
    pick = lambda d: {k: d[k] for k in keys if k in d} if isinstance(d, dict) else d  # noqa: E731
    result = {"dataset": data.name, "backbone": args.backbone, "protocol": args.protocol, "split": split_used,
              "mask_history": cfg.mask_history, "seed": cfg.seed, "metrics": keys,
              "valid": pick(res["valid"]), "selected_round": res["selected_round"]}
    for part in ("", "_warm", "_cold"):
        if f"{prefix}{part}" in res:
            result[f"test{part}"] = pick(res[f"{prefix}{part}"])
        if f"{prefix}{part}_std" in res:
            result[f"test{part}_std"] = pick(res[f"{prefix}{part}_std"])
        if f"{prefix}{part}_ci" in res:
            result[f"test{part}_ci"] = pick(res[f"{prefix}{part}_ci"])
        if f"{prefix}{part}_n_users" in res:
            result[f"test{part}_n_users"] = res[f"{prefix}{part}_n_users"]
    result["n_users"] = res.get(f"{prefix}_n_users", res.get("n_users"))
    if rb_eval:
        # RecBole's own Collector + metric classes on the same masked scores at the selected round(s)
        per = [rb_eval[k] for k in sorted(rb_eval)]
        result["test_recbole"] = pick({k: float(sum(d[k] for d in per) / len(per)) for k in per[0]})
        result["evaluator"] = "recbole"
    if router:
        result["router"] = router[max(router)] if len(router) == 1 else {"per_seed": router, **router[min(router)]}
    if getattr(args, "fusion", "none") != "none":
        result["fusion"] = args.fusion
        result["backbone"] = f"{args.backbone}+{args.fusion}"
    other = "test_sampled" if protocol == "full" else "test"
    result[f"other_protocol_{'sampled' if protocol == 'full' else 'full'}"] = pick(res.get(other))
    result["baselines"] = reference_table(data, keys, protocol=protocol, ks=tuple(ks), metrics=tuple(metrics),
                                          mask_history=cfg.mask_history, seed=cfg.seed)
    result["data_warnings"] = data.sanity()
    for key in ("strategy", "simulator", "rounds_run", "stopped_early", "resolved", "model", "config", "history",
                "per_seed", "seeds", "notes"):
        if key in res:
            result[key] = res[key]
    return result


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``bench round``: time one federated round, batched against sequential."""
    from ..argtypes import positive_int
    from ..cli import add_data_arguments
    from .config import FEDERATED_BACKBONES, add_run_arguments

    p = subparsers.add_parser("bench", help="speed benchmarks of the federated engine")
    sub = p.add_subparsers(dest="bench_command", metavar="{round}", required=True)
    r = sub.add_parser("round", help="time one full round (all clients, local epochs, no evaluation), batched "
                                     "and sequential",
                       usage="%(prog)s SOURCE --backbone NAME [options]",
                       description="Time one full federated round for the batched simulator and the sequential "
                                   "reference in one process and print both and their ratio. SOURCE may also "
                                   "be synthetic:USERSxITEMS (e.g. synthetic:35000x18000).")
    add_data_arguments(r)
    r.add_argument("--backbone", required=True, choices=FEDERATED_BACKBONES, help="federated backbone to time")
    r.add_argument("--repeats", type=positive_int, default=3, help="time each simulator this many times, keep the best")
    r.add_argument("--no-sequential", action="store_true", help="time the batched simulator only")
    r.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_run_arguments(r, command="bench")
    r.set_defaults(func=cmd_bench_round)
    return p


def _bench_data(args):
    from ..cli import load_for_run

    return load_for_run(args)[0]


def cmd_bench_round(args) -> int:
    from .config import config_from_args
    from .engine import bench_round, format_bench

    data = _bench_data(args)
    cfg = config_from_args(args)
    res = bench_round(data, args.backbone, cfg, sequential=not args.no_sequential, repeats=args.repeats)
    print(format_bench(res), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(res))
    return 0
