"""The cold-start report folder: ``result.json`` (written by the CLI), CSV tables, ``report.md`` and PNG plots.

Tables: ``cold_items.csv`` (every model variant and reference ranker x {cold among cold, cold among all, warm}),
``sparsity.csv`` (per bucket of training interactions), ``user_coldstart.csv`` (per support size). Plots:
``cold_items.png`` (cold targets among cold items and among all items, 95% CIs), ``sparsity.png`` and
``user_coldstart.png``. Every write is atomic (temporary file, then rename).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..atomic_write import atomic_write, atomic_write_text

PARTS = (("cold_among_cold", "cold targets among cold items"), ("cold_among_all", "cold targets among all items"),
         ("warm", "warm targets among all items"))


def _atomic_csv(path: Path, frame: pd.DataFrame) -> None:
    atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def _fmt(cell) -> str:
    if not cell or cell.get("mean") is None:
        return "–"
    lo, hi = cell["ci"]
    return f"{cell['mean']:.4f} [{lo:.4f}, {hi:.4f}]" if lo is not None else f"{cell['mean']:.4f}"


def _num(v) -> str:
    return "–" if v is None else f"{v:.4f}"


def _empty(result: dict, part: str) -> str | None:
    """Why the headline ``part`` has no users (from the result's notes), or None when it has some."""
    if next(iter((result.get(part) or {}).values()), {}).get("n_users"):
        return None
    label = part.replace("_", " ") + ": "
    return next((n[len(label):] for n in result.get("notes", []) if n.startswith(label)), "no users")


# ---------------------------------------------------------------------- rows of the item table
def item_rows(result: dict) -> list[tuple[str, dict]]:
    """(label, {part: summary}) for the reference rankers, then each model's variants."""
    rows = []
    for name, block in result.get("baselines", {}).items():
        rows.append((name + (" (content only)" if name == "content" else ""), block))

    def model_rows(res, label):
        if "variants" not in res:
            return
        for rule, block in res["variants"].items():
            if rule == "trained" and len(res["variants"]) > 1:
                continue   # the same model as rule "none"; shown alone only where there is no rule to apply
            mark = " *" if rule == res.get("cold_rule") else ""
            how = "as trained" if rule == "trained" else f"cold rule {rule}"
            rows.append((f"{label}, {how}{mark}", block))

    if "backbone_alone" in result:
        model_rows(result["backbone_alone"], result["backbone_alone"]["model"])
    model_rows(result, result["model"])
    return rows


def item_frame(result: dict) -> pd.DataFrame:
    recs = []
    for label, block in item_rows(result):
        for part, _ in PARTS:
            for metric, cell in block.get(part, {}).items():
                recs.append({"model": label.replace(" *", ""), "headline": label.endswith(" *"), "part": part,
                             "metric": metric, "mean": cell["mean"], "ci_low": cell["ci"][0],
                             "ci_high": cell["ci"][1], "sd_seeds": cell.get("sd_seeds"),
                             "n_users": cell["n_users"]})
    return pd.DataFrame(recs)


def sparsity_frame(result: dict) -> pd.DataFrame:
    recs = []
    for label, res in _models(result):
        for row in res.get("sparsity", []):
            for metric, cell in row["model"].items():
                recs.append({"model": label, "bucket": row["bucket"], "n_users": row["n_users"], "metric": metric,
                             "mean": cell["mean"], "ci_low": cell["ci"][0], "ci_high": cell["ci"][1],
                             "pop": row.get("pop", {}).get(metric)})
    return pd.DataFrame(recs)


def user_frame(result: dict) -> pd.DataFrame:
    recs = []
    for label, res in _models(result):
        uc = res.get("user_coldstart")
        if not uc:
            continue
        for name, curve in uc["curves"].items():
            if name != "model" and label != result["model"]:
                continue   # reference rankers once
            for n, summ in curve.items():
                for metric, cell in summ.items():
                    recs.append({"model": label if name == "model" else name, "support": int(n), "metric": metric,
                                 "mean": cell["mean"], "ci_low": cell["ci"][0], "ci_high": cell["ci"][1],
                                 "n_users": cell["n_users"]})
    return pd.DataFrame(recs)


def _models(result: dict) -> list[tuple[str, dict]]:
    out = [(result["model"], result)]
    if "backbone_alone" in result:
        out.insert(0, (result["backbone_alone"]["model"], result["backbone_alone"]))
    return out


# ---------------------------------------------------------------------- text
def format_summary(result: dict, metric: str | None = None) -> str:
    keys = result["metrics"]
    lines = [f"{result['dataset']} | {result['model']} | seeds {result['seeds']}"]
    if "cold_among_cold" in result:
        lines.append(f"item cold-start ({result.get('split')}): {result['n_cold_items']} cold items, "
                     f"{result['test_cold_targets']} of {result['test_targets']} test targets cold; headline cold "
                     f"rule: {result['cold_rule']} ({result['cold_rule_selected_on']})")
        for part, title in PARTS:
            if _empty(result, part):
                lines.append(f"  {title}: ({_empty(result, part)})")
                continue
            lines.append(f"  {title}:")
            rows = item_rows(result)
            width = max(len(label) for label, _ in rows) + 2   # the longest label still leaves a gap before its figures
            for label, block in rows:
                cell = block.get(part, {})
                lines.append(f"    {label:<{width}}" + "  ".join(f"{k} {_fmt(cell.get(k))}" for k in keys[:2]))
    for label, res in _models(result):
        uc = res.get("user_coldstart")
        if uc:
            lines.append(f"user cold-start ({label}, {_joining(uc)}):")
            for name, curve in uc["curves"].items():
                lines.append(f"    {name:<10}" + "  ".join(f"N={n}: {keys[1]} {_fmt(s.get(keys[1]))}"
                                                      for n, s in curve.items()))
    for label, res in _models(result):
        if res.get("sparsity"):
            lines.append(f"by training interactions ({label}, {keys[1]}; pop: the popularity ranker, same users):")
            for row in res["sparsity"]:
                lines.append(f"    {row['bucket']:>8} ({row['n_users']:>4} users)  {_fmt(row['model'].get(keys[1]))}"
                             + f"   pop {_num((row.get('pop') or {}).get(keys[1]))}")
    lines += [f"note: {n}" for n in result.get("notes", [])]
    return "\n".join(lines)


def markdown(result: dict) -> str:
    keys = result["metrics"]
    out = [f"# Cold-start report: {result['model']} on {result['dataset']}", ""]
    if result.get("command"):
        out += ["```", result["command"], "```", ""]
    out += [f"Seeds {result['seeds']}; values are means over users (each user averaged over seeds) with 95% "
            f"bootstrap intervals over users.", ""]
    if "cold_among_cold" in result:
        out += [f"## Item cold-start ({result.get('split')})", "",
                f"{result['n_cold_items']} cold items of {result['n_items']}; {result['test_cold_targets']} of "
                f"{result['test_targets']} test targets are cold. Headline rule (*): **{result['cold_rule']}** "
                f"({result['cold_rule_selected_on']}).", "", "![cold items](cold_items.png)", ""]
        for part, title in PARTS:
            if _empty(result, part):
                out += [f"### {title}", "", f"Not reported: {_empty(result, part)}.", ""]
                continue
            out += [f"### {title}", "", "| model | " + " | ".join(keys) + " | users |",
                    "|---|" + "---|" * (len(keys) + 1)]
            for label, block in item_rows(result):
                cell = block.get(part, {})
                n = next((c["n_users"] for c in cell.values()), 0)
                out.append(f"| {label} | " + " | ".join(_fmt(cell.get(k)) for k in keys) + f" | {n} |")
            out.append("")
        out += _paired_item_lines(result, keys)
    for label, res in _models(result):
        uc = res.get("user_coldstart")
        if uc:
            out += [f"## User cold-start: {label}", "",
                    f"Held-out users join after training with N support interactions and train only their private "
                    f"parts ({_joining(uc)}); query = the rest of their history, support masked.", "",
                    "| ranker | N | " + " | ".join(keys) + " |",
                    "|---|---|" + "---|" * len(keys)]
            for name, curve in uc["curves"].items():
                for n, s in curve.items():
                    out.append(f"| {label if name == 'model' else name} | {n} | "
                               + " | ".join(_fmt(s.get(k)) for k in keys) + " |")
            out += ["", *_paired_lines(uc, keys), "![user cold-start](user_coldstart.png)", ""]
    if any(res.get("sparsity") for _, res in _models(result)):
        out += ["## By the user's number of training interactions", "", "![sparsity](sparsity.png)", "",
                "| model | bucket | users | " + " | ".join(keys) + " | pop " + keys[1] + " |",
                "|---|---|---|" + "---|" * (len(keys) + 1)]
        for label, res in _models(result):
            for row in res.get("sparsity", []):
                out.append(f"| {label} | {row['bucket']} | {row['n_users']} | "
                           + " | ".join(_fmt(row["model"].get(k)) for k in keys)
                           + f" | {_num((row.get('pop') or {}).get(keys[1]))} |")
        out.append("")
    if result.get("notes"):
        out += ["## Not reported", ""] + [f"- {n}" for n in result["notes"]] + [""]
    return "\n".join(out)


# ---------------------------------------------------------------------- plots
def _plot_items(result: dict, path: Path, metric: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = item_rows(result)
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.42 * len(rows) + 1.6), sharey=True)
    for ax, (part, title) in zip(axes, PARTS[:2]):
        labels, means, err = [], [], [[], []]
        for label, block in rows:
            cell = block.get(part, {}).get(metric)
            if not cell or cell["mean"] is None:
                continue
            labels.append(label)
            means.append(cell["mean"])
            err[0].append(max(cell["mean"] - (cell["ci"][0] or cell["mean"]), 0))
            err[1].append(max((cell["ci"][1] or cell["mean"]) - cell["mean"], 0))
        colors = ["#999999" if not (result["model"] in l or result.get("backbone_alone", {}).get("model", "\0") in l)
                  else ("#d62728" if l.endswith("*") else "#1f77b4") for l in labels]
        if not labels:   # an empty part says why instead of drawing an empty axis
            ax.text(0.5, 0.5, _empty(result, part) or "no users", ha="center", va="center", wrap=True,
                    fontsize=9, transform=ax.transAxes)
        ax.barh(range(len(labels)), means, xerr=err, color=colors, capsize=3)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{title}: {metric}", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"{result['dataset']}: cold-item test ({result.get('split')}); grey = reference rankers, "
                 f"red = headline", fontsize=10)
    fig.tight_layout()
    _savefig(fig, path)


def _plot_sparsity(result: dict, path: Path, metric: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    models = [(l, r) for l, r in _models(result) if r.get("sparsity")]
    width = 0.8 / (len(models) + 1)
    buckets = []
    for _, r in models:
        for row in r["sparsity"]:
            if row["bucket"] not in buckets:
                buckets.append(row["bucket"])
    x = {b: i for i, b in enumerate(buckets)}
    for j, (label, res) in enumerate(models):
        rows = res["sparsity"]
        xs = [x[r["bucket"]] + j * width for r in rows]
        rows = [r for r in rows if r["model"][metric]["mean"] is not None]
        xs = [x[r["bucket"]] + j * width for r in rows]
        m = [r["model"][metric]["mean"] for r in rows]
        lo = [max(mm - (r["model"][metric]["ci"][0] or mm), 0) for mm, r in zip(m, rows)]
        hi = [max((r["model"][metric]["ci"][1] or mm) - mm, 0) for mm, r in zip(m, rows)]
        ax.bar(xs, m, width, yerr=[lo, hi], capsize=2, label=label)
        pop = [(x[r["bucket"]] + (j + 1) * width, r["pop"][metric]) for r in rows
               if r.get("pop") and r["pop"].get(metric) is not None]
        if j == len(models) - 1 and pop:
            ax.bar([p[0] for p in pop], [p[1] for p in pop], width, color="#999999", label="pop")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(buckets))],
                  [f"{b}\n({next(r['n_users'] for _, rr in models for r in rr['sparsity'] if r['bucket'] == b)})"
                   for b in buckets], fontsize=8)
    ax.set_xlabel("training interactions of the user (users)")
    ax.set_ylabel(metric)
    which = {"warm": "warm test targets", "all": "all test targets"}.get(result.get("sparsity_targets"), "test targets")
    ax.set_title(f"{result['dataset']}: {metric} on {which} by the user's training interactions", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    _savefig(fig, path)


def _plot_users(result: dict, path: Path, metric: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame = user_frame(result)
    frame = frame[frame["metric"] == metric]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, g in frame.groupby("model", sort=False):
        g = g.sort_values("support")
        style = "--" if name in ("pop", "random", "content") else "-"
        ax.errorbar(g["support"], g["mean"], yerr=[(g["mean"] - g["ci_low"]).clip(lower=0),
                                                   (g["ci_high"] - g["mean"]).clip(lower=0)],
                    fmt=style + "o", capsize=3, label=name)
    ax.set_xlabel("support interactions of the joining user (N)")
    ax.set_ylabel(metric)
    ax.set_xticks(sorted(frame["support"].unique()))
    ax.set_title(f"{result['dataset']}: users joining after training", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    _savefig(fig, path)


def _savefig(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


def write_joining_per_user(frames: dict, out: Path) -> list[Path]:
    """Each model's and support size's joining users, one row per reported user with their metrics averaged over
    the seeds, as ``out/joining/<model>-N<support>/per_user_test.csv``: the layout ``fedvlr-plus experiment
    paired`` reads, so two studies' joining users pair over the same users."""
    return [_per_user_csv(Path(out) / "joining" / f"{model}-N{n}", frame)
            for model, per_support in frames.items() for n, frame in per_support.items()]


def write_cold_item_per_user(frames: dict, out: Path) -> list[Path]:
    """Each model's cold-item variants (the headline rule, every rule, as trained, the content-only ranker), one
    row per test user averaged over the seeds, per part of the targets, as
    ``out/cold_items/<model>-<variant>/<part>/per_user_test.csv``: the layout ``fedvlr-plus experiment paired``
    reads (``--also`` pools studies on other draws of the cold items)."""
    return [_per_user_csv(Path(out) / "cold_items" / f"{model}-{variant}".replace(" ", "-") / part, frame)
            for model, variants in frames.items() for variant, parts in variants.items()
            for part, frame in parts.items()]


def _per_user_csv(folder: Path, frame: pd.DataFrame) -> Path:
    """``frame`` as ``folder/per_user_test.csv``, the file ``experiment paired`` reads; returns its path."""
    path = folder / "per_user_test.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_csv(path, frame)
    return path


def write_report(result: dict, out: Path) -> list[Path]:
    """Write the CSV tables, ``report.md`` and the plots into ``out``; returns the files written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    metric = result["metrics"][1] if len(result["metrics"]) > 1 else result["metrics"][0]
    written = []
    if "cold_among_cold" in result:
        _atomic_csv(out / "cold_items.csv", item_frame(result))
        _plot_items(result, out / "cold_items.png", metric)
        written += [out / "cold_items.csv", out / "cold_items.png"]
    if any(res.get("sparsity") for _, res in _models(result)):
        _atomic_csv(out / "sparsity.csv", sparsity_frame(result))
        _plot_sparsity(result, out / "sparsity.png", metric)
        written += [out / "sparsity.csv", out / "sparsity.png"]
    if any(res.get("user_coldstart") for _, res in _models(result)):
        _atomic_csv(out / "user_coldstart.csv", user_frame(result))
        _plot_users(result, out / "user_coldstart.png", metric)
        written += [out / "user_coldstart.csv", out / "user_coldstart.png"]
    atomic_write_text(out / "report.md", markdown(result))
    written.append(out / "report.md")
    return written


def _joining(uc: dict) -> str:
    """Who joined and how long they trained, in words (with ``auto``, the counts chosen on validation users)."""
    se = uc.get("support_epochs")
    if not se:
        return (f"{uc.get('reported_users', uc['held_out_users'])} of {uc['held_out_users']} joining users reported, "
                f"{uc['local_epochs']} local epochs, state started from {uc.get('new_user_start', 'population')}")
    picks = "; ".join(f"N={n}: " + ", ".join(_pick(c, uc) for c in per) for n, per in se["chosen"].items())
    return (f"{se['reported_users']} joining users reported, local epochs chosen per seed on {se['valid_users']} "
            f"others by valid {se['metric']} ({picks})")


def _pick(choice: dict, uc: dict) -> str:
    """One seed's choice: its epoch count, and with ``--new-user-start auto`` the start it kept."""
    return f"{choice['epochs']} from {choice['start']}" if uc.get("new_user_start") == "auto" else str(choice["epochs"])


def _paired_lines(uc: dict, keys) -> list[str]:
    """The layer against the backbone alone on the same joining users (paired t-test over users), if both ran."""
    paired = uc.get("paired_vs_backbone")
    if not paired:
        return []
    out = ["Paired over the same joining users, layer − backbone alone (t-test p):", ""]
    for n, by_metric in paired.items():
        out.append(f"- N = {n}: " + _paired_cells(by_metric, keys))
    return out + [""]


def _paired_item_lines(result: dict, keys) -> list[str]:
    """The layer's cold-item headline against the backbone alone and content only (paired over users), if run."""
    paired = result.get("paired_cold_items")
    if not paired:
        return []
    out = [f"### Paired over the same users, layer ({result['cold_rule']}) − other (t-test p)", ""]
    for other, by_part in paired.items():
        for part, by_metric in by_part.items():
            out.append(f"- {other}, {part.replace('_', ' ')}: " + _paired_cells(by_metric, keys))
    return out + [""]


def _paired_cells(by_metric: dict, keys) -> str:
    """``metric +diff (p = ...)`` for each metric of ``keys`` in one comparison's paired tests."""
    return ", ".join(f"{k} {t['mean_diff']:+.4f} (p = {t['t_pvalue']:.2g})" for k, t in by_metric.items() if k in keys)
