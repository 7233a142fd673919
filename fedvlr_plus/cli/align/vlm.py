"""``fedvlr-plus align fedmpt SOURCE`` and ``fedvlr-plus align feddtl SOURCE``: federated VLM-style adaptation.

No torch import at module level (the parser is built lazily by :mod:`fedvlr_plus.cli.align.command`).
"""
from __future__ import annotations

import json
import os
import sys
import time

from ..argtypes import (
    auto_or_non_negative_int,
    non_negative_float,
    non_negative_int,
    open_fraction,
    positive_float,
    positive_int,
)
from .tables import check_out_dir, write_table

#: FedMPT ablation rows (report name -> variant)
MPT_ABLATION = {"prompts_only": "prompts", "prompts+ot": "prompts_ot", "prompts+gate": "prompts_gate",
                "prompts+ot+gate": "fedmpt", "prompts+ot+gate, OT score only": "fedmpt_ot_only"}
MPT_FIGURES = ("mAP", "CF1", "OF1", "spurious_rate")


def _default_cache() -> str:

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fedvlr_plus", "encodings")


def _output_arguments(p) -> None:
    """Encoder device, encoding cache and report output: the same for every method of this module."""
    p.add_argument("--device", default="cpu", help="device of the offline text encoder (default cpu)")
    p.add_argument("--cache-dir", default=_default_cache(),
                   help="keep text encodings here and reuse them (default $XDG_CACHE_HOME/fedvlr_plus/encodings; "
                        "'' disables)")
    p.add_argument("--out", default=None, help="also write the JSON report to this file (atomic)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def register(methods) -> None:
    _register_fedmpt(methods)
    _register_feddtl(methods)


def _register_fedmpt(methods) -> None:
    m = methods.add_parser("fedmpt", help="FedMPT: multi-label item tagging with condition prompts and OT",
                           description="Train FedMPT, its ablations and a single-prompt mean-pooled FedAvg "
                                       "baseline on multi-label item tags (genres / categories) and report "
                                       "mAP, CF1, OF1 and the spurious-activation rate on held-out items.")
    m.add_argument("source", help="a dataset source fedvlr_plus.datasets.load understands (e.g. ml-100k)")
    m.add_argument("--rounds", type=positive_int, default=10, help="federated rounds (default 10)")
    m.add_argument("--clients", type=positive_int, default=5,
                   help="clients, k-means clusters of label vectors (default 5)")
    m.add_argument("--seed", type=non_negative_int, default=0,
                   help="seed for the item split, clustering and initialisation")
    m.add_argument("--seeds", type=non_negative_int, nargs="+", default=None,
                   help="run these seeds instead of --seed (each exactly as --seed S would) and report them "
                        "together: per-seed figures, means and paired t-tests of every row against the baseline")
    m.add_argument("--test-share", type=open_fraction, default=0.2,
                   help="share of labelled items held out (default 0.2)")
    m.add_argument("--proj-dim", type=non_negative_int, default=96,
                   help="fixed projection width of tokens and prompts (0 keeps the encoder's 384)")
    m.add_argument("--raters", type=non_negative_int, default=64,
                   help="rater tokens per item: up to this many of the item's raters, each one token (a label-free "
                        "SVD embedding of the rater and the rating it gave), for every row alike (default 64; "
                        "0 = title and usage-feature tokens only, the previous revision)")
    m.add_argument("--lr", type=positive_float, default=2e-3, help="client Adam learning rate (default 2e-3)")
    m.add_argument("--conditions", default=None,
                   help="JSON condition list (same layout as the shipped, film-worded "
                        "fedvlr_plus/alignment/fedmpt/data/fedmpt_conditions.json)")
    m.add_argument("--threshold", choices=("f1", "fixed"), default="f1",
                   help="decision rule of every row for CP/CR/CF1/OP/OR/OF1 and the spurious rate: per-label "
                        "thresholds maximising F1 on the clients' own training items (f1; default, chosen on "
                        "validation) or probability > 0.5 (fixed); both are in the report under 'rules'")
    m.add_argument("--ot-rho", type=non_negative_float, default=1.0,
                   help="unbalanced OT: KL weight on the label marginal, so labels compete for tokens (default 1.0, "
                        "chosen on validation with rater tokens; 0.1 without them, --raters 0; 0 = balanced OT, every "
                        "label receives 1/C of the token mass)")
    m.add_argument("--no-ablation", action="store_true", help="train only the baseline and full FedMPT")
    m.add_argument("--valid", action="store_true",
                   help="tuning mode: hold out --test-share of the TRAIN items as a validation set and report on "
                        "it; the test items are not used at all")
    m.add_argument("--out-dir", default=None,
                   help="write result.json and table.md (per-seed rows; with --seeds, paired tests) here")
    _output_arguments(m)
    m.set_defaults(func=cli_fedmpt, out_kind="file")


def _register_feddtl(methods) -> None:
    d = methods.add_parser("feddtl", help="FedDTL: decoupled towers, SFT then GRPO, warm and cold items",
                           description="Train FedAvg of both towers, decoupled SFT only and full FedDTL "
                                       "(SFT then GRPO) under a label-skewed client split and report warm- and "
                                       "cold-item HR@10 / NDCG@10 on held-out interactions.")
    d.add_argument("source", help="a dataset source fedvlr_plus.datasets.load understands (e.g. ml-100k)")
    d.add_argument("--rounds", type=positive_int, default=8, help="federated rounds in all (default 8)")
    d.add_argument("--sft-rounds", type=non_negative_int, default=4,
                   help="rounds of SFT before the GRPO stage (default 4)")
    d.add_argument("--clients", type=positive_int, default=5, help="clients (default 5)")
    d.add_argument("--alpha", type=non_negative_float, default=0.1,
                   help="Dirichlet concentration of the label-skewed split (--split; default 0.1: strong skew; 0: "
                        "its limit, each class wholly at one client, the pathological split)")
    d.add_argument("--split", choices=("users", "examples"), default="users",
                   help="what the Dirichlet deals to clients: whole users, by each user's dominant class (users; "
                        "default), or each class's training examples (examples: the paper's label skew over "
                        "samples; a user's examples spread over clients, and every method is judged by its global "
                        "model)")
    d.add_argument("--dominant", choices=("count", "lift"), default="count",
                   help="a user's genre for the split: the most frequent in the history (count; default) or the "
                        "most over-represented against the global genre shares among those >= 10%% of the "
                        "history (lift: spreads the users over many genres; on ml-100k count gives Drama to 623 of 943 "
                        "users)")
    d.add_argument("--user-tower", choices=("fedavg", "private"), default="fedavg",
                   help="decoupled methods: start each round from the FedAvg of the user adapters (fedavg; "
                        "default, as in the paper) or from the client's own, kept in its private store (private)")
    d.add_argument("--cold-share", type=open_fraction, default=0.2,
                   help="share of items held out as cold (default 0.2)")
    d.add_argument("--seeds", type=non_negative_int, nargs="+", default=[0], help="seeds to run (default 0)")
    d.add_argument("--sigma", type=non_negative_float, default=0.1, help="GRPO embedding noise std (default 0.1)")
    d.add_argument("--group", type=positive_int, default=4, help="GRPO group size G (default 4)")
    d.add_argument("--beta", type=non_negative_float, default=0.5, help="GRPO KL weight (default 0.5)")
    d.add_argument("--rank", type=positive_int, default=4, help="adapter rank (default 4)")
    d.add_argument("--epochs", type=positive_int, default=1,
                   help="local passes over each round's examples, the same for every method and stage (default 1)")
    d.add_argument("--per-user", type=positive_int, default=8,
                   help="training examples drawn per user and round (default 8)")
    _add_dtl_server_arguments(d)
    d.add_argument("--rank-among", choices=("own", "all"), default="own",
                   help="rank warm targets among warm items and cold among cold (own, the base-to-novel "
                        "protocol; default) or both among all items (all)")
    _add_dtl_item_arguments(d)
    d.add_argument("--valid", action="store_true",
                   help="tuning mode: each user's test targets are dropped and the next latest are held out and "
                        "reported; the test targets are not used at all")
    d.add_argument("--shots", type=non_negative_int, default=0,
                   help="few-shot regime: at most this many training examples per item over all users (a user's "
                        "whole history stays its input); 0 = every training interaction (default)")
    d.add_argument("--out-dir", default=None,
                   help="write result.json and table.md (the per-seed table, paired tests, split skew) here")
    _output_arguments(d)
    d.set_defaults(func=cli_feddtl, out_kind="file")



def _add_dtl_item_arguments(d) -> None:
    """The item flags of ``align feddtl``: what the item vectors are, the item classes and which are novel."""
    d.add_argument("--content", default="text",
                   help="item vectors: MiniLM of the item texts (text; default; on a data set without item "
                        "texts, its own feature array named text, such as KU's CLIP text features) or the name of a "
                        "feature array the dataset ships (e.g. all-MiniLM-L6-v2 on lfm2k, the tag-text embeddings)")
    d.add_argument("--classes", type=auto_or_non_negative_int, default="auto",
                   help="item classes: K > 0 = a seeded k-means of the item vectors into K classes; 0 = the "
                        "catalogue's categories; auto (default) = the categories where the catalogue has two or "
                        "more and --novel-classes is 0, otherwise a k-means into 10")
    d.add_argument("--novel-classes", type=non_negative_int, default=0,
                   help="this many item classes are novel, every item of theirs cold (never trained); needs "
                        "k-means classes (--classes K or auto); 0 = a random --cold-share of the items (default)")


def _add_dtl_server_arguments(d) -> None:
    """The server alignment flags of ``align feddtl``: its steps, what the clients upload for it, its anchor."""
    d.add_argument("--server-steps", type=non_negative_int, default=10,
                   help="server Adam steps per round on the uploaded prototypes (default 10; 0 = the item tower "
                        "stays as it started)")
    d.add_argument("--anchor-weight", type=non_negative_float, default=0.0,
                   help="decoupled methods: weight of the server's penalty keeping every item's adapted vector "
                        "near its frozen content vector, novel items included (default 0: none)")
    d.add_argument("--prototypes", choices=("item", "example"), default="item",
                   help="what decoupled clients upload for the server's item-tower alignment: per trained item the "
                        "normalised mean of its user embeddings (item; default) or every example's user embedding "
                        "with its item (example: the paper's per-sample uploads, one vector per (user, item) "
                        "example; chosen on validation for the skewed lfm2k split)")


def _emit(report: dict, args) -> int:
    from ...jsonio import json_default, write_json_atomic

    if args.out:
        write_json_atomic(args.out, report)
    if args.json:
        print(json.dumps(report, default=json_default))
    return 0


def _figures(test: dict) -> dict:
    return {k: test[k] for k in MPT_FIGURES} | {k: v for k, v in test.items() if k not in MPT_FIGURES}


def cli_fedmpt(args) -> int:
    import torch

    from ... import datasets
    from ...alignment.fedmpt import method as M

    check_out_dir(args.out_dir)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    log = (lambda s: print(s, file=sys.stderr)) if args.json else print
    t0 = time.time()
    data = datasets.load(args.source)
    embed_tokens, embed_sentences = M.minilm_encoders(args.device)
    if args.cache_dir:
        embed_tokens, embed_sentences = M.cached_encoders(embed_tokens, embed_sentences, args.cache_dir)
    conditions = M.load_conditions(args.conditions)
    task, ids = M.build_task(data, embed_tokens, embed_sentences, conditions, proj_dim=args.proj_dim or None,
                             raters=args.raters)
    from ...alignment.fedmpt.table import markdown, seeds_report

    if args.seeds is None:       # one seed: its report as it always was; --out-dir also gets its table
        report = _fedmpt_seed(args, M, data, task, ids, args.seed, t0, log)
        table = seeds_report([report], [args.seed])
    else:
        report = table = seeds_report([_fedmpt_seed(args, M, data, task, ids, s, time.time(), log)
                                       for s in args.seeds], args.seeds)
        report["seconds"] = round(time.time() - t0, 1)
    if args.out_dir:
        write_table(table, args.out_dir, markdown)
    return _emit(report, args)


def _fedmpt_seed(args, M, data, task, ids, seed: int, t0: float, log) -> dict:
    """Every row of ``align fedmpt`` for one seed (its item split, clients and initialisation)."""
    train, test = M.split_items(ids, args.test_share, seed)
    if args.valid:       # tune on a split of the training items; the test items stay unseen
        train, test = M.split_items(train, args.test_share, seed + 1000)
    log(f"{data.name}: {len(ids)} labelled items ({len(train)} train / {len(test)} "
        f"{'validation (tuning mode)' if args.valid else 'test'}), "
        f"{len(task.label_names)} labels, {len(task.condition_names)} conditions; built in {time.time() - t0:.1f}s")
    variants = ["baseline", *(MPT_ABLATION.values() if not args.no_ablation else ["fedmpt"])]
    results = {}
    for v in variants:
        t = time.time()
        # "fedmpt_ot_only": full FedMPT without the pooled (global) score, the OT score alone
        common = dict(lr=args.lr, threshold=args.threshold, ot_rho=args.ot_rho or None)
        cfg = M.MPTConfig(variant="fedmpt", global_local=False, **common) if v == "fedmpt_ot_only" \
            else M.MPTConfig(variant=v, **common)
        res = M.train_federated(task, train, test, cfg, n_clients=args.clients, rounds=args.rounds, seed=seed)
        results[v] = res
        spurious = (f"{res.test['spurious_rate']:.4f}" if res.test.get("spurious_eligible") else
                    "n/a (no test item carries a label's usual co-label without that label)")
        log(f"{v:>13}: mAP {res.test['mAP']:.4f}  CF1 {res.test['CF1']:.4f}  OF1 {res.test['OF1']:.4f}  "
            f"spurious {spurious}  ({res.n_params} params, {time.time() - t:.1f}s)")
    return {"source": args.source, "n_items": len(ids), "n_train": len(train), "n_test": len(test),
            "labels": task.label_names, "conditions": task.condition_names, "clients": args.clients,
            "rounds": args.rounds, "seed": seed, "evaluated_on": "valid" if args.valid else "test",
            "decision_rule": args.threshold, "ot_rho": args.ot_rho, "raters": args.raters,
            "baseline": _figures(results["baseline"].test), "fedmpt": _figures(results["fedmpt"].test),
            "ablation": {row: _figures(results[v].test) for row, v in MPT_ABLATION.items() if v in results},
            "n_params": {v: r.n_params for v, r in results.items()},
            "seconds": round(time.time() - t0, 1)}


def cli_feddtl(args) -> int:
    from ...alignment.feddtl.method import DTLConfig, run_feddtl
    from ...alignment.feddtl.table import markdown

    check_out_dir(args.out_dir)

    cfg = DTLConfig(rank=args.rank, sigma=args.sigma, group=args.group, beta=args.beta, epochs=args.epochs,
                    per_user=args.per_user, server_steps=args.server_steps, rank_among=args.rank_among,
                    user_tower=args.user_tower, prototypes=args.prototypes, anchor_weight=args.anchor_weight)
    log = (lambda s: print(s, file=sys.stderr)) if args.json else print
    report = run_feddtl(args.source, cfg, seeds=args.seeds, clients=args.clients, alpha=args.alpha,
                        rounds=args.rounds, sft_rounds=args.sft_rounds, cold_share=args.cold_share,
                        dominant=args.dominant, device=args.device, cache_dir=args.cache_dir,
                        content=args.content, classes=args.classes, novel=args.novel_classes, valid=args.valid,
                        shots=args.shots, split=args.split, log=log)
    if args.out_dir:
        write_table(report, args.out_dir, markdown)
    return _emit(report, args)
