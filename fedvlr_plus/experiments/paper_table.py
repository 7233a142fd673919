"""The FedVLR paper's Table 2, reproduced honestly (``fedvlr-plus experiment paper-table``).

Every backbone is trained alone with its own aggregation (``none``), alone with the aggregation FedVLR trains
with (``fedgrad``: Algorithm 1's averaged gradients and server step — the like-for-like baseline, since a gain
of FedVLR over ``none`` may come from the aggregation rather than from the content), with one server fusion
expert (``mlp``, the paper's single-MLP baseline) and with the full FedVLR layer (``fedvlr``), each selected on
validation only (the engine's early stopping), over several seeds. Test figures at the selected round are
reported overall and split by warm and cold targets, plus cold targets ranked among cold items only, beside the
reference rankers (pop, random, antipop) and a content-only ranker (cosine between a user's mean training-item
view and every item). FedVLR is compared with its backbone alone (both rows) by a paired test over users
(per-user values averaged over seeds). Where there are cold items and content views, each backbone-alone row
also appears as ``<row> + cold rule``: the same model at the same selected round, with its untrained cold item
rows (shared, and each user's private item tables) replaced by the mean row of their content neighbours (the
layer's rule), so that FedVLR is also compared with backbones that do not profit from ranking untrained rows
(KU's split artifact).

Protocol as the paper's: leave-one-out by time, full ranking over all items with training items masked.
"""
from __future__ import annotations

import csv
import io
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..coldstart.content import ContentRanker, RestrictedScorer
from ..evaluation import EvalResult, evaluate, paired_test, reference_scorer
from ..errors import RunFolderError
from ..evaluation.stats import bootstrap_ci
from ..errors import ConfigError
from ..jsonio import write_json_atomic

from .variants import FUSION_VARIANTS, VARIANTS  # noqa: F401  (FUSION_VARIANTS: part of this module's API)
PARTS = ("all", "warm", "cold", "cold_among_cold")


def row_label(backbone: str, variant: str) -> str:
    """Row name: ``fedavg``, ``fedavg (fedgrad)``, ``fedavg+mlp``, ``fedavg+fedvlr``."""
    return {"none": backbone, "fedgrad": f"{backbone} (fedgrad)"}.get(variant, f"{backbone}+{variant}")


def rule_label(label: str) -> str:
    """Row name of a backbone-alone row scored with the layer's cold-item rule."""
    return f"{label} + cold rule"


def _with_rule(run, rule, data, cold, common) -> tuple[EvalResult, EvalResult] | None:
    """Test results of ``run`` with the cold rows of every item table it scores with filled by ``rule`` (all
    targets, and cold targets among cold items): the shared tables, and per user the private ones (PFedRec's
    fine-tuned copy, FedRAP's ``A_u``), each from the same table's neighbour rows. None when the simulator cannot
    rewrite private tables and the backbone has some."""
    import torch

    from ..coldstart.rules import apply_to_tables

    bb = run.bb
    private_tables = ({s.name for s in bb.all_specs() if s.item_table and not s.shared}
                      | set(bb.personal_copies.values()))
    shared = apply_to_tables(bb, run.shared, rule)

    def per_user(name, stacked):          # [B, n_items, ...]: each user's cold rows from the same user's table
        return torch.stack([rule.apply(t) for t in stacked]) if name in private_tables else stacked

    if private_tables and not getattr(run.sim, "maps_private", False):
        return None
    kw = {"private_map": per_user} if private_tables else {}

    def score(users):
        return run.sim.scores(np.asarray(users, dtype=np.int64), shared, **kw)
    return (evaluate(data, score, split="test", **common),
            evaluate(data, RestrictedScorer(score, cold), split="test", **common))


EXTRA = "selected_extra"


def _save_extra(run, extra: dict) -> None:
    """What the selected round adds (evaluation results, router report), beside the run's checkpoint: plain JSON
    and safetensors, listed in its manifest, tagged with the round it belongs to."""
    run.folder.write_state(EXTRA, {"round": int(run.best["round"]), "extra": dict(extra)})


def _load_extra(run) -> dict:
    """The saved extra of ``run``'s selected round (checksums checked). A process killed after the selected
    round's checkpoint but before its extra was saved left an older one: it is recomputed (the checkpoint is that
    round's model), which the engine's checkpoint rule guarantees is the only way the two can differ."""
    saved = run.folder.read_state(EXTRA)
    if saved is not None and saved["round"] == run.best["round"]:
        return saved["extra"]
    if run.round != run.best["round"] or not run.history:
        raise RunFolderError(str(run.folder.path / f"{EXTRA}.json"), "missing or from another round than the "
                             "selected one", "start a new run in another folder")
    run.on_round(run, run.history[-1])   # recomputes and saves it
    return None


def _frames(res: EvalResult, cold_res: EvalResult | None) -> dict[str, pd.DataFrame]:
    out = {p: res.frame(p) for p in ("all", "warm", "cold")}
    if cold_res is not None:
        out["cold_among_cold"] = cold_res.frame("cold")
    return out


def _combine(per_seed: list[dict[str, pd.DataFrame]], keys: list[str]) -> dict[str, pd.DataFrame]:
    """Per-user values averaged over seeds (users present in every seed)."""
    out = {}
    for part in per_seed[0]:
        frames = [s[part][["user"] + [k for k in keys if k in s[part].columns]] for s in per_seed if part in s]
        if not frames or not len(frames[0]):
            continue
        cat = pd.concat(frames)
        g = cat.groupby("user")
        mean = g.mean()
        mean = mean[g.size() == len(frames)].reset_index()
        out[part] = mean
    return out


def _summarise(name: str, per_seed: list[dict[str, pd.DataFrame]], keys: list[str], seed: int) -> list[dict]:
    rows = []
    avg = _combine(per_seed, keys)
    for part in PARTS:
        if part not in avg or not len(avg[part]):
            continue
        row = {"model": name, "part": part, "n_users": int(len(avg[part])), "seeds": len(per_seed)}
        for k in keys:
            per = [float(s[part][k].mean()) for s in per_seed if part in s and len(s[part])]
            row[k] = float(np.mean(per))
            row[f"{k}_std"] = float(np.std(per, ddof=1)) if len(per) > 1 else 0.0
            lo, hi = bootstrap_ci(avg[part][k].to_numpy(), seed=seed)
            row[f"{k}_ci"] = [lo, hi]
        rows.append(row)
    return rows


def _as_result(frames: dict[str, pd.DataFrame], keys) -> EvalResult:
    empty = pd.DataFrame(columns=["user"] + list(keys))
    return EvalResult(per_user=frames.get("all", empty), per_user_warm=frames.get("warm", empty),
                      per_user_cold=frames.get("cold", empty), metric_names=list(keys))


def _parse_overrides(items: list[str]) -> list[tuple[str, str, str]]:
    """``SELECTOR:field=value`` where SELECTOR is a backbone, a variant or ``backbone+variant``."""
    out = []
    for it in items or []:
        try:
            sel, rest = it.split(":", 1)
            field, value = rest.split("=", 1)
        except ValueError:
            raise ConfigError(f"--override {it}", "expected SELECTOR:field=value",
                              "e.g. fedvlr:server_lr=3") from None
        out.append((sel.strip(), field.strip().replace("-", "_"), value.strip()))
    return out


def _config_for(base_cfg, overrides, backbone: str, variant: str):
    from ..federation.config import FedConfig

    cfg = base_cfg
    types = {f: type(getattr(FedConfig(), f)) for f in vars(FedConfig())}
    for sel, field, value in overrides:
        if sel not in (backbone, variant, f"{backbone}+{variant}"):
            continue
        if field not in types:
            raise ConfigError(f"--override {sel}:{field}", f"unknown training field {field!r}",
                              "fields are FedConfig's, e.g. lr, server_lr, rounds, dim")
        kind = float if field in ("lr", "server_lr", "item_lr_scale") else types[field]
        try:
            cfg = replace(cfg, **{field: None if value.lower() == "none" else kind(value)})
        except ValueError as exc:   # not a number, or out of FedConfig's range
            raise ConfigError(f"--override {sel}:{field}={value}", str(exc)) from None
    return cfg


def run_paper_table(args, data, keys: list[str], ks, names) -> dict:
    """Train every (backbone, variant) over the seeds and build the table (see the module docstring)."""
    from ..federation.config import config_from_options as config_from_args
    from ..federation.engine import FederatedRun
    from ..fedvlr import router_report
    from ..fedvlr.views import load_views
    from ..fusion_cli import base_backbone, build_for_command, options_from_args

    backbones = [b.strip() for b in args.backbones.split(",") if b.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise ConfigError("--variants", f"unknown {', '.join(bad)}", f"choose from {', '.join(VARIANTS)}")
    metric_names = tuple(dict.fromkeys(list(names) + ["hr"]))
    base_cfg = config_from_args(args, ks=tuple(ks), metrics=metric_names, valid_protocol="full", seeds=1)
    overrides = _parse_overrides(args.override)
    cold = data.cold_items()
    common = dict(protocol="full", ks=tuple(ks), metrics=tuple(names), mask_history=base_cfg.mask_history)

    # references: deterministic (random is seeded), evaluated once
    fnames = args.fusion_views.split(",") if args.fusion_views else None
    views = load_views(data, args.views, fnames, progress=not args.no_progress)
    refs = {}
    for name in ("pop", "random", "antipop"):
        sc = reference_scorer(name, data, seed=base_cfg.seed)
        refs[name] = [_frames(evaluate(data, sc, split="test", seed=base_cfg.seed, **common),
                              evaluate(data, RestrictedScorer(sc, cold), split="test", seed=base_cfg.seed, **common)
                              if cold.any() else None)]
    csc = ContentRanker(data, views)   # the same content-only ranker as the cold-start experiments
    refs["content"] = [_frames(evaluate(data, csc, split="test", **common),
                               evaluate(data, RestrictedScorer(csc, cold), split="test", **common) if cold.any() else None)]

    from ..adapters import make_backbone
    from ..coldstart.rules import make_rule
    from ..fedvlr import FusionLayer, wrap_refusal

    # the layer's cold-item rule applied to the backbones alone (reference rows): their untrained cold rows
    # replaced by the mean ID row of each cold item's content neighbours, at the round selected on validation
    rule = (make_rule("neighbours", views, cold, k=args.cold_neighbours, seed=base_cfg.seed)
            if cold.any() and views and args.cold_neighbours > 0 else None)

    skipped = {}
    for bb_name in backbones:
        why = wrap_refusal(make_backbone(bb_name, data.n_items, base_cfg.dim))
        for variant in variants:
            if variant in FUSION_VARIANTS and why:
                skipped[row_label(bb_name, variant)] = why

    models: dict[str, list[dict]] = {}
    selected: dict[str, list[int]] = {}
    row_configs: dict[str, dict] = {}
    routers: dict[str, list[dict]] = {}
    if args.resume and args.out and args.resume != args.out:
        raise RunFolderError("--out", f"--resume {args.resume} continues the table in that folder; do not pass a "
                             f"different --out ({args.out})")
    out_dir = Path(args.resume or args.out) if (args.resume or args.out) else None
    for bb_name in backbones:
        for variant in variants:
            label = row_label(bb_name, variant)
            if label in skipped:
                print(f"paper-table: skipping {label}: {skipped[label]}", file=sys.stderr)
                continue
            start = base_cfg
            if variant == "fedgrad":   # the layer's aggregation and default server lr, unless overridden
                start = replace(base_cfg, strategy="fedgrad",
                                server_lr=base_cfg.server_lr or FusionLayer.default_server_lr)
            cfg0 = _config_for(start, overrides, bb_name, variant)
            row_configs[label] = cfg0.to_dict()
            seeds_out, sel, rtr, ruled = [], [], [], []
            for i in range(args.seeds):
                cfg = replace(cfg0, seed=cfg0.seed + i, seeds=1)
                extra = {}
                if variant not in FUSION_VARIANTS:
                    bb = bb_name
                else:
                    bb = build_for_command(data, base_backbone(args, data.n_items, bb_name, cfg.dim),
                                           options_from_args(args, mode=variant), views, backbone=bb_name)

                def on_round(run, record, extra=extra, variant=variant):
                    if run.best is not None and run.best["round"] == record["round"]:
                        extra["cold"] = (evaluate(data, RestrictedScorer(run.scorer(), cold), split="test", **common)
                                         if cold.any() else None)
                        if variant == "fedvlr":
                            extra["router"] = router_report(run)
                        if rule is not None and variant not in FUSION_VARIANTS:
                            extra["with_rule"] = _with_rule(run, rule, data, cold, common)

                run_dir = out_dir / "runs" / label / f"seed-{cfg.seed}" if out_dir else None

                def on_round_saved(run, record, extra=extra, run_dir=run_dir):
                    on_round(run, record)
                    if run_dir is not None and run.best is not None and run.best["round"] == record["round"]:
                        _save_extra(run, extra)   # what the selected round adds, kept for --resume

                run = FederatedRun(data, bb, cfg, run_dir, progress=not args.no_progress, on_round=on_round_saved)
                if run_dir is not None and run.folder.has_checkpoint():
                    if not args.resume:
                        raise RunFolderError(str(out_dir), "already holds runs",
                                             f"continue them with --resume {out_dir}, or choose another folder")
                    run.load_checkpoint()
                    extra.update(_load_extra(run) or {})
                run.run()
                seeds_out.append(_frames(run.best["test_full"], extra.get("cold")))
                sel.append(int(run.best["round"]))
                if "router" in extra:
                    rtr.append(extra["router"])
                if extra.get("with_rule") is not None:
                    ruled.append(_frames(*extra["with_rule"]))
            models[label], selected[label] = seeds_out, sel
            if ruled and len(ruled) == len(seeds_out):
                models[rule_label(label)], selected[rule_label(label)] = ruled, sel
            if rtr:
                routers[label] = rtr

    rows = []
    for name, per_seed in {**refs, **models}.items():
        for r in _summarise(name, per_seed, keys, base_cfg.seed):
            r["kind"] = "reference" if name in refs else "federated"
            rows.append(r)
    tests = {}
    for bb_name in backbones:
        pairs = [(row_label(bb_name, v), bb_name) for v in FUSION_VARIANTS]
        pairs.append((row_label(bb_name, "fedvlr"), row_label(bb_name, "fedgrad")))
        pairs += [(row_label(bb_name, "fedvlr"), rule_label(row_label(bb_name, v))) for v in ("none", "fedgrad")]
        for label, other in pairs:
            if label not in models or other not in models:
                continue
            a, b = _combine(models[label], keys), _combine(models[other], keys)
            tests[f"{label} vs {other}"] = {
                part: {k: paired_test(_as_result(a, keys), _as_result(b, keys), k, part) for k in keys}
                for part in ("all", "warm", "cold") if part in a and part in b}
        fedvlr = row_label(bb_name, "fedvlr")
        if fedvlr in models and "cold_among_cold" in refs["content"][0]:
            a = _combine(models[fedvlr], keys).get("cold_among_cold")
            c = _combine(refs["content"], keys).get("cold_among_cold")
            if a is not None and c is not None:
                tests[f"{fedvlr} vs content (cold among cold)"] = {"cold": {
                    k: paired_test(_as_result({"cold": a}, keys), _as_result({"cold": c}, keys), k, "cold")
                    for k in keys}}
    result = {"dataset": data.name, "protocol": "full", "mask_history": base_cfg.mask_history,
              "metrics": keys, "seeds": [base_cfg.seed + i for i in range(args.seeds)],
              "backbones": backbones, "variants": variants, "rows": rows, "paired_tests": tests,
              "selected_round": selected, "router": {k: v[0] if len(v) == 1 else v for k, v in routers.items()},
              "config": base_cfg.to_dict(), "row_configs": row_configs, "overrides": [list(o) for o in overrides],
              "n_cold_items": int(cold.sum()), "skipped": skipped}
    result["notes"] = table_notes(result)
    if out_dir is not None:
        write_report(result, out_dir)
    return result


# ---------------------------------------------------------------------------------------------- reports
def table_notes(result: dict) -> list[str]:
    """One sentence per part of the table that no row has (no cold targets in test, say), so that every report
    says why a section is missing instead of leaving it out silently."""
    from ..evaluation.results import empty_part_reason

    present = {r["part"] for r in result["rows"]}
    notes = []
    for part in (p for p in PARTS if p not in present):
        why = empty_part_reason("cold" if part == "cold_among_cold" else part)
        if part == "cold_among_cold" and not result.get("n_cold_items"):
            why = "no cold items to rank among; every item has a training interaction"
        notes.append(f"{part.replace('_', ' ')}: {why}")
    return notes


def _fmt(row: dict, k: str) -> str:
    v = row.get(k)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    lo, hi = row.get(f"{k}_ci", [math.nan, math.nan])
    sd = row.get(f"{k}_std", 0.0)
    s = f"{v:.4f}"
    if row.get("seeds", 1) > 1:
        s += f" ± {sd:.4f}"
    if lo is not None and not math.isnan(lo):
        s += f" [{lo:.4f}, {hi:.4f}]"
    return s


def markdown_table(result: dict) -> str:
    keys = result["metrics"]
    lines = [f"# Table 2 on {result['dataset']} (test, full ranking, training items masked; "
             f"seeds {result['seeds']}; model selection on validation only)", ""]
    titles = {"all": "All test targets", "warm": "Warm targets (item seen in training)",
              "cold": "Cold targets (never in training), ranked among all items",
              "cold_among_cold": "Cold targets ranked among cold items only"}
    for part in PARTS:
        part_rows = [r for r in result["rows"] if r["part"] == part]
        if not part_rows:
            continue
        lines += [f"## {titles[part]} ({part_rows[0]['n_users']} users)", "",
                  "| model | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
        for r in part_rows:
            lines.append(f"| {r['model']} | " + " | ".join(_fmt(r, k) for k in keys) + " |")
        lines.append("")
    for label, why in result.get("skipped", {}).items():
        lines.append(f"Not run: {label} ({why}).")
    for note in result.get("notes", []):
        lines.append(f"Not reported: {note}.")
    lines.append("Mean over seeds ± standard deviation across seeds [95% bootstrap CI over users of the per-user "
                 "values averaged over seeds]. References: pop/random/antipop and the content-only ranker.")
    if result["paired_tests"]:
        lines += ["", "## Paired tests over users (per-user values averaged over seeds)", "",
                  "| comparison | part | metric | mean a | mean b | diff | t-test p | Wilcoxon p |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, parts in result["paired_tests"].items():
            for part, per in parts.items():
                for k, t in per.items():
                    lines.append(f"| {name} | {part} | {k} | {t['mean_a']:.4f} | {t['mean_b']:.4f} | "
                                 f"{t['mean_diff']:+.4f} | {t['t_pvalue']:.3g} | {t['wilcoxon_pvalue']:.3g} |")
    return "\n".join(lines) + "\n"


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_report(result: dict, out: Path) -> None:
    """table.csv, table.md, result.json and table.png (NDCG at the largest K, by part, with CIs)."""
    out.mkdir(parents=True, exist_ok=True)
    keys = result["metrics"]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["model", "kind", "part", "n_users", "seeds"]
               + [c for k in keys for c in (k, f"{k}_std", f"{k}_ci_low", f"{k}_ci_high")])
    for r in result["rows"]:
        w.writerow([r["model"], r["kind"], r["part"], r["n_users"], r["seeds"]]
                   + [c for k in keys for c in (r.get(k), r.get(f"{k}_std"), *r.get(f"{k}_ci", [None, None]))])
    _atomic_text(out / "table.csv", buf.getvalue())
    _atomic_text(out / "table.md", markdown_table(result))
    write_json_atomic(out / "result.json", result)
    plot_table(result, out / "table.png")


def plot_table(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ndcg = [k for k in result["metrics"] if k.startswith("ndcg")]
    key = max(ndcg or result["metrics"], key=lambda k: int(k.split("@")[1]))
    parts = [p for p in PARTS if any(r["part"] == p for r in result["rows"])]
    models = list(dict.fromkeys(r["model"] for r in result["rows"]))
    fig, axes = plt.subplots(1, len(parts), figsize=(4.2 * len(parts), 0.32 * len(models) + 1.6), squeeze=False)
    for ax, part in zip(axes[0], parts):
        by = {r["model"]: r for r in result["rows"] if r["part"] == part}
        ys = np.arange(len(models))
        vals = [by[m][key] if m in by else np.nan for m in models]
        def err(m, side):   # CI half-widths; a degenerate interval (all values equal) draws none
            if m not in by or by[m][f"{key}_ci"][side] is None or math.isnan(by[m][f"{key}_ci"][side]):
                return 0.0
            return max(0.0, (by[m][key] - by[m][f"{key}_ci"][0]) if side == 0 else (by[m][f"{key}_ci"][1] - by[m][key]))

        lo = [err(m, 0) for m in models]
        hi = [err(m, 1) for m in models]
        colors = ["#999999" if m in ("pop", "random", "antipop", "content") else
                  ("#1f77b4" if "+fedvlr" in m else ("#2ca02c" if "+" in m else "#ff7f0e")) for m in models]
        ax.barh(ys, vals, xerr=[lo, hi], color=colors, capsize=2)
        ax.set_yticks(ys, models if ax is axes[0][0] else [""] * len(models))
        ax.invert_yaxis()
        ax.set_title(part.replace("_", " "))
        ax.set_xlabel(key)
    fig.suptitle(f"{result['dataset']}: test {key} (95% CI)")
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def print_table(result: dict, file=None) -> None:
    keys = result["metrics"]
    for part in PARTS:
        part_rows = [r for r in result["rows"] if r["part"] == part]
        if not part_rows:
            continue
        print(f"[{part}] {part_rows[0]['n_users']} users", file=file)
        w = max(22, *(len(r["model"]) for r in part_rows))
        print(f"  {'model':<{w}}" + "".join(f"{k:>12}" for k in keys), file=file)
        for r in part_rows:
            print(f"  {r['model']:<{w}}" + "".join(f"{r[k]:>12.4f}" for k in keys), file=file)
    for note in result.get("notes", []):
        print(f"note: {note}", file=file)
    for name, parts in result["paired_tests"].items():
        for part, per in parts.items():
            k = keys[-1]
            t = per[k]
            print(f"  {name} [{part}] {k}: {t['mean_diff']:+.4f} (t-test p {t['t_pvalue']:.3g}, "
                  f"Wilcoxon p {t['wilcoxon_pvalue']:.3g})", file=file)
