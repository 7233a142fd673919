"""``fedvlr-plus align mor SOURCE`` and ``fedvlr-plus align fedvpa-gp SOURCE``: federated preference alignment.

SOURCE is a rating dataset (``ml-100k``, the copy inside the recbole wheel, or any path ``fedvlr_plus.datasets.load``
reads) or an HH-RLHF folder (``../shared/data/hh-rlhf``: helpful-base vs harmless-base clients). No torch import at
module level (the parser is built without it).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ..argtypes import non_negative_float, non_negative_int, positive_float, positive_int


def is_hh_folder(source: str) -> bool:
    p = Path(source)
    return p.is_dir() and any(p.glob("*-base-test.jsonl*"))


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SOURCE",
                   help="ml-100k (embedded), a rating dataset path, or an HH-RLHF folder")
    p.add_argument("--seed", type=non_negative_int, default=0, help="random seed (default 0)")
    p.add_argument("--cache-dir", default=None,
                   help="where text embeddings and backbone scores are cached (default ~/.cache/fedvlr_plus or "
                        "$FEDVLR_CACHE)")
    p.add_argument("--limit", type=positive_int, default=None,
                   help="HH-RLHF: at most this many pairs per split (default all)")
    p.add_argument("--text", choices=("none", "title"), default="none",
                   help="ratings: add MiniLM title embeddings to the genre/year item features (default none)")
    p.add_argument("--out", default=None, help="also write the JSON report to this file (atomic)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object (the last line)")
    p.add_argument("--progress", action="store_true", help="show progress bars")


def register(subparsers) -> None:
    _register_mor(subparsers)
    _register_fedvpa_gp(subparsers)


def _register_mor(subparsers) -> None:
    m = subparsers.add_parser("mor", help="MoR: client reward models, score-only uplink, router, GRPO policy",
                              description="Mixture-of-Rewards federated alignment (docs/alignment.md, MoR).")
    _common(m)
    m.add_argument("--group-by", choices=("taste", "age", "gender", "occupation"), default="taste",
                   help="ratings: how users form the clients (one client per group; default taste)")
    m.add_argument("--groups", type=positive_int, default=4,
                   help="ratings: number of taste / occupation groups (default 4)")
    m.add_argument("--min-gap", type=non_negative_float, default=2.0,
                   help="ratings: minimum rating gap of a pair (default 2)")
    m.add_argument("--reward-signal", choices=("interactions", "rating-gaps"), default="interactions",
                   help="ratings: what each client's reward learns: its users' training interactions over sampled "
                        "non-interacted items (default; the seeds comparison with FedAvg / uniform baselines) or "
                        "pairs of ratings at least --min-gap apart (the earlier single-seed run)")
    m.add_argument("--seeds", type=positive_int, default=5,
                   help="interactions: seeds, from --seed on (default 5)")
    m.add_argument("--held-out-clients", type=non_negative_int, default=1,
                   help="interactions: the last N groups train no reward (cross-client adaptability; default 1)")
    m.add_argument("--negatives", choices=("popular", "uniform"), default="popular",
                   help="interactions: negatives drawn in proportion to training popularity or uniformly "
                        "(default popular)")
    m.add_argument("--fedavg-rounds", type=positive_int, default=10,
                   help="interactions: FedAvg rounds of the one-model reward baseline (default 10)")
    m.add_argument("--fedavg-epochs", type=positive_int, default=3,
                   help="interactions: local epochs per FedAvg round (default 3)")
    m.add_argument("--reward-view", choices=("features", "items"), default="features",
                   help="interactions: what the client rewards and the policy read: item features (genres, year, "
                        "popularity; default, the earlier table) or item ids (each client's own co-occurrence "
                        "counts of its users' latest items; the policy gains an item-to-item term)")
    m.add_argument("--content", default=None, metavar="NAME",
                   help="interactions: a feature array the dataset ships (e.g. all-MiniLM-L6-v2 on lfm2k, its tag-text "
                        "embeddings) as the item features and the source of the taste groups, instead of genres and "
                        "year; needed where the items have no genres")
    m.add_argument("--reference-per-seed", action="store_true",
                   help="interactions: train the reference backbone with each seed (cached per seed) instead of "
                        "once with seed 0, so the reference row has a spread")
    m.add_argument("--routing-headroom", action="store_true",
                   help="interactions: instead of the GRPO comparison, measure how much any router could gain over "
                        "uniform averaging (each client's accuracy per user group; the reference's candidates "
                        "re-ranked by uniform, single-client and oracle weights chosen on validation); writes "
                        "headroom.json / headroom.md to --out")
    m.add_argument("--router-holdout", type=non_negative_float, default=None,
                   help="share of the public pairs that early-stops the router (default 0.2 with --reward-view "
                        "items, 0 otherwise)")
    m.add_argument("--architectures", default=None,
                   help="reward architectures dealt round-robin over clients (bilinear, mlp, linear; default "
                        "bilinear,mlp; with --reward-view items: cooc, next, default cooc,next)")
    _add_mor_grpo_arguments(m)
    m.set_defaults(func=cmd_mor, out_kind="own")  # a file or a folder, by --reward-signal


def _add_mor_grpo_arguments(m) -> None:
    """The reward training, reference backbone and GRPO flags of ``align mor``."""
    m.add_argument("--reward-epochs", type=positive_int, default=30,
                   help="Bradley-Terry epochs per client (default 30)")
    m.add_argument("--backbone", default="fedavg", help="federated backbone of the reference policy (default fedavg)")
    m.add_argument("--backbone-rounds", type=positive_int, default=30,
                   help="federated rounds of the backbone (default 30)")
    m.add_argument("--candidates", type=positive_int, default=100, help="candidate items per user (default 100)")
    m.add_argument("--grpo-rounds", type=positive_int, default=None,
                   help="GRPO rounds (default 60, chosen on validation HR@10; 30 with --reward-signal rating-gaps)")
    m.add_argument("--users-per-round", type=positive_int, default=None,
                   help="users (contexts) per GRPO round (default 256; 1024 with --reward-view items, i.e. every "
                        "participating user of ml-100k)")
    m.add_argument("--group-size", type=positive_int, default=8, help="GRPO group size G (default 8)")
    m.add_argument("--beta", type=non_negative_float, default=None,
                   help="KL weight to the reference (default 1.0 with interactions, chosen on validation HR@10; "
                        "0.1 with rating-gaps)")
    m.add_argument("--kl", choices=("k3", "exact"), default="k3", help="KL estimator (default k3)")
    m.add_argument("--policy-lr", type=positive_float, default=0.02, help="Adam step size of the policy (default 0.02)")
    m.add_argument("--pooled-baseline", action="store_true",
                   help="rating-gaps: also run GRPO with one reward model trained on the pooled pairs")
    m.add_argument("--clients-per-type", type=positive_int, default=2,
                   help="HH-RLHF: clients per split (default 2)")


def _register_fedvpa_gp(subparsers) -> None:
    v = subparsers.add_parser("fedvpa-gp", help="FedVPA-GP vs FedVPL vs a monolithic federated reward",
                              description="Federated variational preference alignment with a Gumbel-Softmax "
                                          "mixture prior (docs/alignment.md, FedVPA-GP).")
    _common(v)
    v.add_argument("--clients-per-type", type=positive_int, default=10, help="clients per client type (default 10)")
    v.add_argument("--pairs-per-client", type=positive_int, default=40,
                   help="ml-100k annotator types: pairs per client (default 40)")
    v.add_argument("--unseen-per-type", type=non_negative_int, default=2,
                   help="clients per type held out of training; their z is inferred from context pairs (default 2)")
    v.add_argument("--context-pairs", type=non_negative_int, default=10,
                   help="pairs an unseen client gives to infer its z (default 10)")
    v.add_argument("--rounds", type=positive_int, default=100, help="federated rounds (default 100)")
    v.add_argument("--local-steps", type=positive_int, default=2, help="local steps per round (default 2)")
    v.add_argument("--latent", type=positive_int, default=8, help="latent size d of z (default 8)")
    v.add_argument("--beta", type=non_negative_float, default=0.05, help="KL weight (default 0.05)")
    v.add_argument("--ortho", type=non_negative_float, default=1.0,
                   help="orthogonal prototype loss weight lambda (default 1)")
    v.add_argument("--tau", type=positive_float, default=1.0, help="Gumbel-Softmax temperature (default 1)")
    v.add_argument("--prior-weights", choices=("gumbel", "samples"), default="gumbel",
                   help="mixture weights: learned Gumbel-Softmax (paper) or sample sizes (released code)")
    # defaults mirror VPAConfig's (a test checks it); no import of fedvpa_gp here, it imports torch
    d = argparse.Namespace(decoder="bilinear", lr=3e-2, server_optimizer="adam", local_lr=0.1, context_size=8,
                           ortho_warmup=10, summary_mean="all_pairs", lr_schedule="constant",
                           prototype_mode="fixed")
    v.add_argument("--decoder", choices=("bilinear", "concat"), default=d.decoder,
                   help=f"reward decoder: bilinear r = e^T (w0 + U z) or VPL's MLP([e; z]) (default {d.decoder})")
    v.add_argument("--lr", type=positive_float, default=d.lr,
                   help=f"Adam step size: the clients' (server optimizer none) or the server's (adam) "
                        f"(default {d.lr})")
    v.add_argument("--server-optimizer", choices=("none", "adam"), default=d.server_optimizer,
                   help=f"none: local Adam + FedAvg; adam: local SGD + server Adam on the averaged update "
                        f"(default {d.server_optimizer})")
    v.add_argument("--lr-schedule", choices=("constant", "cosine"), default=d.lr_schedule,
                   help=f"step size over the rounds (default {d.lr_schedule})")
    v.add_argument("--local-lr", type=positive_float, default=d.local_lr,
                   help=f"local SGD step size with --server-optimizer adam (default {d.local_lr})")
    v.add_argument("--context-size", type=positive_int, default=d.context_size,
                   help=f"context pairs per posterior sample in training (default {d.context_size})")
    v.add_argument("--ortho-warmup", type=non_negative_int, default=d.ortho_warmup,
                   help=f"rounds before prototype labels are broadcast (default {d.ortho_warmup})")
    v.add_argument("--prototype-mode", choices=("fixed", "learnable"), default=d.prototype_mode,
                   help=f"prototypes: fixed scaled identity rows or learnable (QR init, shared, re-orthonormalised "
                        f"after every step) (default {d.prototype_mode})")
    v.add_argument("--summary-mean", choices=("all_pairs", "posterior", "samples"), default=d.summary_mean,
                   help=f"the uploaded mean z: posterior from all pairs under the broadcast encoder, mean of the "
                        f"steps' posterior means, or of the sampled z (paper) (default {d.summary_mean})")
    v.add_argument("--seeds", type=non_negative_int, nargs="+", default=None,
                   help="run these seeds instead of --seed (each exactly as --seed S would) and report them "
                        "together: per-seed accuracies, mean ± sd, and paired t-tests of FedVPA-GP against the "
                        "monolithic reward and FedVPL")
    v.add_argument("--out-dir", default=None,
                   help="write result.json and table.md (per-seed rows; with --seeds, paired tests) here")
    v.set_defaults(func=cmd_fedvpa_gp, out_kind="file")


def _emit(report: dict, args, lines: list[str]) -> int:
    from ...jsonio import json_default, write_json_atomic

    if args.out:
        write_json_atomic(args.out, report)
    if args.json:
        print(json.dumps(report, default=json_default))
    else:
        print("\n".join(lines))
    return 0


def _pct(x) -> str:
    return "  n/a" if x is None or x != x else f"{100 * x:5.1f}"


def _mor_config(args, interactions: bool):
    from ...alignment.grpo import GRPOConfig
    from ...alignment.mor.method import MoRConfig

    default_archs = "bilinear,mlp"
    if interactions and args.reward_view == "items":
        default_archs = "cooc,next"
    archs = tuple(a.strip() for a in (args.architectures or default_archs).split(",") if a.strip())
    beta = args.beta if args.beta is not None else (1.0 if interactions else 0.1)
    items = interactions and args.reward_view == "items"
    holdout = args.router_holdout if args.router_holdout is not None else (0.2 if items else 0.0)
    rounds = args.grpo_rounds if args.grpo_rounds is not None else (60 if interactions else 30)
    users = args.users_per_round if args.users_per_round is not None else (1024 if items else 256)
    return MoRConfig(reward_epochs=args.reward_epochs, architectures=archs, candidates=args.candidates,
                     router_holdout=holdout,
                     grpo_rounds=rounds, users_per_round=users, policy_lr=args.policy_lr,
                     grpo=GRPOConfig(group_size=args.group_size, beta=beta, kl=args.kl), seed=args.seed)


def cmd_mor(args) -> int:
    from ...alignment.mor.method import run_mor_hh, run_mor_ratings

    hh = is_hh_folder(args.source)
    if not hh and args.reward_signal == "interactions":
        return cmd_mor_seeds(args)
    if args.content:
        from ...errors import ConfigError

        raise ConfigError(f"--content {args.content}", "only the interactions comparison reads a feature array",
                          "drop --content, or use --reward-signal interactions on a rating dataset")
    cfg = _mor_config(args, interactions=False)
    if hh:
        rep = run_mor_hh(args.source, cfg=cfg, limit=args.limit, clients_per_type=args.clients_per_type,
                         cache_dir=args.cache_dir, progress=args.progress)
    else:
        from fedvlr_plus.datasets import load

        rep = run_mor_ratings(load(args.source), group_by=args.group_by, n_groups=args.groups, text=args.text,
                              min_gap=args.min_gap, backbone=args.backbone, backbone_rounds=args.backbone_rounds,
                              cfg=cfg, cache_dir=args.cache_dir, progress=args.progress,
                              pooled_baseline=args.pooled_baseline)
    ra = rep["reward_accuracy"]
    lines = [f"MoR on {rep['source']}: {len(rep['clients'])} clients, uplink arrays {rep['uplink']['arrays']} "
             f"({rep['uplink']['floats']} floats in {rep['uplink']['messages']} messages)",
             "client  group            arch       own%  others%"]
    for c in rep["clients"]:
        lines.append(f"{c['cid']:>6}  {c['group'][:15]:<15}  {c['architecture']:<9} {_pct(c['own'])}   "
                     f"{_pct(c['others'])}")
    lines.append(f"reward accuracy on held-out pairs: fused {_pct(ra['fused'])}  uniform {_pct(ra['uniform'])}  "
                 f"best single (client {ra['best_single_client']}, chosen on public pairs) {_pct(ra['best_single'])}")
    if rep.get("grpo"):
        lines.append("GRPO round  mean reward  KL")
        for h in rep["grpo"]:
            lines.append(f"{h['round']:>10}  {h['reward']:+.4f}    {h['kl']:.4f}")
        er = rep["expected_reward"]
        lines.append(f"expected fused reward: policy {er['policy']:+.4f} vs reference {er['reference']:+.4f} "
                     f"(KL {er['kl']:.4f})")
        p = rep["policy"]
        lines.append(f"held-out test HR@10 / NDCG@10: reference {_pct(p['reference']['hr@10'])} / "
                     f"{_pct(p['reference']['ndcg@10'])}  GRPO policy {_pct(p['grpo']['hr@10'])} / "
                     f"{_pct(p['grpo']['ndcg@10'])}")
        pb = rep.get("pooled_baseline")
        if pb:
            lines.append(f"pooled-reward baseline: reward accuracy {_pct(pb['reward_accuracy'])}, expected fused "
                         f"reward {pb['expected_fused_reward']['policy']:+.4f}, test HR@10 / NDCG@10 "
                         f"{_pct(pb['policy']['test']['hr@10'])} / {_pct(pb['policy']['test']['ndcg@10'])}")
    else:
        lines.append("GRPO: not run on this source (text pairs have no item catalogue to recommend from)")
    return _emit(rep, args, lines)


def _check_seeds_flags(args) -> None:
    from ...errors import ConfigError

    if args.pooled_baseline:
        raise ConfigError("--pooled-baseline", "only runs with --reward-signal rating-gaps",
                          "the interactions comparison has its FedAvg-reward baseline built in")
    if args.held_out_clients >= args.groups:
        raise ConfigError("--held-out-clients", f"{args.held_out_clients} of {args.groups} groups leaves no "
                          "client to train a reward", f"use at most {args.groups - 1}")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ConfigError(f"--out {args.out}", "is a file; with --reward-signal interactions it names a folder "
                          "(table.md and result.json are written into it)", "give a folder path")
    if args.router_holdout is not None and args.router_holdout >= 1:
        raise ConfigError(f"--router-holdout {args.router_holdout}", "is the share of public pairs kept out of the "
                          "router's training and must be below 1", "use e.g. 0.2, or 0 for none")
    _check_architectures(args)


def _check_architectures(args) -> None:
    from ...errors import ConfigError

    # the kinds are listed here, not imported: the reward modules import torch
    kinds = ("cooc", "next") if args.reward_view == "items" else ("bilinear", "mlp", "linear")
    given = [a.strip() for a in (args.architectures or "").split(",") if a.strip()]
    wrong = [a for a in given if a not in kinds]
    if wrong:
        raise ConfigError(f"--architectures {args.architectures}",
                          f"{', '.join(wrong)} is not a reward of --reward-view {args.reward_view}",
                          f"use {', '.join(kinds)}")


def cmd_mor_seeds(args) -> int:
    """The implicit-feedback comparison over seeds: MoR vs FedAvg reward vs uniform vs the reference."""
    from fedvlr_plus.datasets import load

    from ...alignment.mor.seeds import run_mor_seeds
    from ...alignment.mor.table import markdown_table
    from ...jsonio import json_default

    _check_seeds_flags(args)
    cfg = _mor_config(args, interactions=True)
    data = load(args.source)
    setting = {"group_by": args.group_by, "n_groups": args.groups, "held_out_clients": args.held_out_clients,
               "backbone": args.backbone, "backbone_rounds": args.backbone_rounds, "text": args.text,
               "content": args.content, "cache_dir": args.cache_dir, "progress": args.progress}
    seed_kw = {"negatives": args.negatives, "fedavg_rounds": args.fedavg_rounds, "fedavg_epochs": args.fedavg_epochs,
               "view": args.reward_view}
    if args.routing_headroom:
        return _mor_headroom(args, cfg, data, setting, seed_kw)
    print(f"align mor: {data.name}, seeds {args.seed}-{args.seed + args.seeds - 1}; the reference backbone "
          f"({args.backbone}, {args.backbone_rounds} rounds) first"
          + (f" (cached under {args.cache_dir})" if args.cache_dir else ""), file=sys.stderr, flush=True)
    res = run_mor_seeds(data, seeds=args.seeds, first_seed=args.seed, cfg=cfg, setting_kw=setting, seed_kw=seed_kw,
                        reference_per_seed=args.reference_per_seed, on_seed=_say_seed)
    from ...errors import shell_word

    # the knobs that shape the table, spelled out so the line reproduces it whatever was left to defaults
    command = (f"fedvlr-plus align mor {shell_word(args.source)} --seeds {args.seeds} --seed {args.seed} "
               f"--beta {cfg.grpo.beta} --negatives {args.negatives} --held-out-clients {args.held_out_clients} "
               f"--grpo-rounds {cfg.grpo_rounds} --architectures {','.join(cfg.architectures)}"
               + (f" --reward-view items --users-per-round {cfg.users_per_round}" if args.reward_view == "items"
                  else "")
               + (f" --router-holdout {cfg.router_holdout}" if cfg.router_holdout else "")
               + (" --reference-per-seed" if args.reference_per_seed else "") + _content_flag(args))
    table = markdown_table(res, command)
    _write_table(args.out, res, table, "result.json", "table.md")
    if args.json:
        print(json.dumps(res, default=json_default))
    else:
        print(table, end="")
    return 0


def _say_seed(run: dict) -> None:
    print(f"align mor: seed {run['seed']} done in {run['seconds']:.0f} s", file=sys.stderr, flush=True)


def _content_flag(args) -> str:
    return f" --content {args.content}" if args.content else ""


def _mor_headroom(args, cfg, data, setting: dict, seed_kw: dict) -> int:
    """``--routing-headroom``: the bound of :mod:`..alignment.mor_headroom` over the seeds."""
    from ...alignment.mor.headroom_table import headroom_markdown, run_headroom_seeds
    from ...jsonio import json_default

    res = run_headroom_seeds(data, seeds=args.seeds, first_seed=args.seed, cfg=cfg, setting_kw=setting,
                             seed_kw=seed_kw)
    command = (f"fedvlr-plus align mor {args.source} --routing-headroom --seeds {args.seeds} --seed {args.seed} "
               f"--reward-view {args.reward_view} --negatives {args.negatives} --groups {args.groups} "
               f"--held-out-clients {args.held_out_clients} --architectures {','.join(cfg.architectures)}"
               + _content_flag(args))
    table = headroom_markdown(res, command)
    _write_table(args.out, res, table, "headroom.json", "headroom.md")
    print(json.dumps(res, default=json_default) if args.json else table, end="" if not args.json else "\n")
    return 0


def cmd_fedvpa_gp(args) -> int:
    from dataclasses import replace

    from ...alignment.fedvpa_gp.method import VPAConfig
    from ...alignment.fedvpa_gp.table import markdown, seeds_report
    from .tables import check_out_dir, command_line, write_table

    check_out_dir(args.out_dir)
    cfg = VPAConfig(rounds=args.rounds, local_steps=args.local_steps, latent=args.latent, beta=args.beta,
                    ortho=args.ortho, tau=args.tau, prior_weights=args.prior_weights, decoder=args.decoder,
                    lr=args.lr, lr_schedule=args.lr_schedule, server_optimizer=args.server_optimizer,
                    local_lr=args.local_lr,
                    context_size=args.context_size, ortho_warmup=args.ortho_warmup,
                    summary_mean=args.summary_mean, prototype_mode=args.prototype_mode, seed=args.seed)
    if args.seeds is None:       # one seed: its report and lines as they always were
        rep = _fedvpa_gp_seed(args, cfg)
        table = seeds_report([rep], [args.seed]) if args.out_dir else None
        lines = _fedvpa_gp_lines(rep)
    else:
        t0, c0 = time.perf_counter(), time.process_time()
        rep = table = seeds_report([_fedvpa_gp_seed(args, replace(cfg, seed=s)) for s in args.seeds], args.seeds)
        rep["seconds"] = {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}
        lines = [markdown(rep, command_line()).rstrip()]
    if args.out_dir:
        write_table(table, args.out_dir, markdown)
    return _emit(rep, args, lines)


def _fedvpa_gp_seed(args, cfg) -> dict:
    """The three methods of ``align fedvpa-gp`` for one seed (its clients, split and initialisation)."""
    from ...alignment.fedvpa_gp.method import run_fedvpa_gp

    return run_fedvpa_gp(args.source, cfg=cfg, hh=is_hh_folder(args.source), limit=args.limit,
                         clients_per_type=args.clients_per_type, pairs_per_client=args.pairs_per_client,
                         unseen_per_type=args.unseen_per_type, context_pairs=args.context_pairs, text=args.text,
                         cache_dir=args.cache_dir, progress=args.progress)


def _fedvpa_gp_lines(rep: dict) -> list[str]:
    """The human-readable summary of one seed's report."""
    lines = [f"FedVPA-GP on {rep['source']}: {rep['clients']['train']} training clients "
             f"({rep['clients']['pairs_per_client']:.0f} pairs each on average), {rep['clients']['unseen']} unseen"]
    types = list(rep["accuracy"]["monolithic"])
    lines.append("method        " + "  ".join(f"{t[:14]:>14}" for t in types) + "   KL      unseen")
    for mth in ("monolithic", "fedvpl", "fedvpa_gp"):
        acc = rep["accuracy"][mth]
        kl = rep["kl"].get(mth)
        lines.append(f"{mth:<12}  " + "  ".join(f"{_pct(acc[t]):>14}" for t in types)
                     + f"   {'  n/a ' if kl is None else f'{kl:6.3f}'}  {_pct(rep['unseen_accuracy'][mth])}")
    lines.append(f"prototype purity {rep['prototype_purity']}  silhouette {rep['silhouette']}")
    ce = rep["ceiling"]
    lines.append("central linear Bradley-Terry (no federation): pooled "
                 + ", ".join(f"{t} {_pct(ce['pooled'][t])}" for t in types) + "; one per type "
                 + ", ".join(f"{t} {_pct(ce['per_type'][t])}" for t in types) + "; other type's "
                 + ", ".join(f"{t} {_pct(ce['cross'].get(t))}" for t in types))
    if "swap" in rep:
        lines.append(f"swapping z between types flips {_pct(rep['swap']['flip_rate'])}% of predictions")
    return lines


def _write_table(folder, res: dict, table: str, json_name: str, md_name: str) -> None:
    """With ``--out``: the result as JSON and the table as Markdown in ``folder``, each written atomically."""
    if not folder:
        return
    from ...atomic_write import atomic_write_text
    from ...jsonio import write_json_atomic

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / json_name, res)
    atomic_write_text(out / md_name, table)
