"""The report's tables, as cells of text: a run's figures with their 95% intervals, the reference rankers, and the
CSV tables of cold-start and paper-table folders laid out one row per model and part, one column per metric.

A cell reads ``mean [low, high]`` (the bootstrap interval over users) and ``mean ± sd [low, high]`` over several
seeds; a part without users reads ``–`` and the table's note says why."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


def number(v) -> float | None:
    """``v`` as a float, or None for a missing, empty or NaN value."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if f != f else f


def cell(mean, ci=None, sd=None) -> str:
    """``mean ± sd [low, high]``, each part shown where it is known."""
    m = number(mean)
    if m is None:
        return "–"
    text = f"{m:.4f}"
    if number(sd):
        text += f" ± {number(sd):.4f}"
    lo, hi = (number(ci[0]), number(ci[1])) if isinstance(ci, (list, tuple)) and len(ci) == 2 else (None, None)
    if lo is not None and hi is not None:
        text += f" [{lo:.4f}, {hi:.4f}]"
    return text


def run_figures(result: dict) -> Table:
    """Valid and test of a run, with test's warm and cold parts: mean [95% interval], ± sd over seeds."""
    keys = list(result.get("metrics") or (result.get("test") or {}).keys())
    rows = [["valid", "", *(cell((result.get("valid") or {}).get(k)) for k in keys)]]
    for part, label in (("", "test"), ("_warm", "test warm"), ("_cold", "test cold")):
        means = result.get(f"test{part}")
        n = result.get("n_users") if part == "" else result.get(f"test{part}_n_users")
        if means is None and n is None:
            continue
        ci, sd = result.get(f"test{part}_ci") or {}, result.get(f"test{part}_std") or {}
        rows.append([label, _users(n), *(cell((means or {}).get(k), ci.get(k), sd.get(k)) for k in keys)])
    seeds = result.get("seeds") or [result.get("seed", 0)]
    how = "mean ± sd over seeds" if len(seeds) > 1 else "mean"
    interval = " [95% bootstrap interval over test users]" if result.get("test_ci") else ""
    notes = [f"{how}{interval} at the selected round (chosen on valid)"]
    notes += list(result.get("notes") or [])
    return Table(
        f"{result.get('backbone', 'model')} on {result.get('dataset', '?')}", ["", "users", *keys], rows, notes
    )


def seed_figures(result: dict) -> Table | None:
    """Each seed's test at its selected round with its own interval; None for a run of one seed."""
    per_seed = [r for r in result.get("per_seed") or [] if isinstance(r, dict)]
    if len(per_seed) < 2:
        return None
    keys = list(result.get("metrics") or [])
    rows = [
        [
            str(r.get("seed", "")),
            str(r.get("selected_round", "")),
            _users(r.get("test_n_users")),
            *(cell((r.get("test") or {}).get(k), (r.get("test_ci") or {}).get(k)) for k in keys),
        ]
        for r in per_seed
    ]
    return Table(
        "test of each seed",
        ["seed", "selected round", "users", *keys],
        rows,
        ["mean [95% bootstrap interval over test users]"],
    )


def reference_rankers(result: dict) -> Table | None:
    """The reference rankers on the run's test users, by part; None where the result has none."""
    baselines = result.get("baselines") or {}
    if not baselines:
        return None
    keys = list(result.get("metrics") or [])
    rows = []
    for name, parts in baselines.items():
        for part, means in parts.items():
            rows.append([name, part, *(cell(means.get(k)) for k in keys)])
    note = "means on the same test users as the model (the run keeps no intervals for the reference rankers)"
    return Table("reference rankers on the same test", ["ranker", "part", *keys], rows, [note])


def tuning_table(result: dict) -> Table | None:
    """The recipes ``--tune`` tried on validation and the one the run kept; None for a run that did not tune."""
    tuning = result.get("tuning")
    if not isinstance(tuning, dict) or not tuning.get("candidates"):
        return None
    rows = []
    for c in tuning["candidates"]:
        settings = ", ".join(k if v is True else f"{k} {v}" for k, v in (c.get("settings") or {}).items() if v)
        kept = "kept" if c.get("name") == tuning.get("selected") else ""
        rows.append([str(c.get("name", "")), settings or "the layer's defaults", cell(c.get("valid")), kept])
    note = f"each recipe trained on seed {tuning.get('seed', 0)}; the best by valid {tuning.get('metric', '')} is kept"
    return Table(
        "recipes tried on validation (--tune)",
        ["recipe", "settings", f"valid {tuning.get('metric', '')}", ""],
        rows,
        [note],
    )


def router_table(routers: dict[int, dict]) -> Table:
    """Per seed and expert: mean weight ± sd across users; the entropy against its maximum (uniform routing)."""
    rows = []
    for seed, r in routers.items():
        for i, expert in enumerate(r["experts"]):
            sd = (r.get("std_across_users") or [None] * len(r["experts"]))[i]
            rows.append([str(seed), expert, cell(r["mean_weights"][i], sd=sd)])
        rows.append(
            [
                str(seed),
                "entropy (mean; min)",
                f"{r['mean_entropy']:.4f}; {r.get('min_entropy', 0):.4f} of at most {r.get('max_entropy', 0):.4f}",
            ]
        )
    note = "over every user's private router at the selected round; entropy at its maximum is uniform routing"
    return Table("router at the selected round", ["seed", "expert", "weight (mean ± sd over users)"], rows, [note])


def long_table(title: str, rows: list[dict], keys: list[str], note: str = "") -> Table | None:
    """A long CSV (one line per ``keys``..., ``metric``: ``mean``, ``ci_low``, ``ci_high``) as one row per
    ``keys`` and one column per metric."""
    if not rows:
        return None
    metrics = list(dict.fromkeys(r["metric"] for r in rows))
    grouped: dict[tuple, dict] = {}
    for r in rows:
        ci = (r.get("ci_low"), r.get("ci_high"))
        grouped.setdefault(tuple(r.get(k, "") for k in keys), {})[r["metric"]] = cell(
            r.get("mean"), ci, r.get("sd_seeds")
        )
    body = [[*key, *(cells.get(m, "–") for m in metrics)] for key, cells in grouped.items()]
    return Table(title, [*keys, *metrics], body, [note] if note else [])


def bucket_gains(title: str, rows: list[dict]) -> Table | None:
    """Per bucket of training interactions, each model's figure and its gain over the popularity ranker of the
    same bucket (the CSV's ``pop`` column, or its ``pop`` rows)."""
    if not rows:
        return None
    pop = {(r["bucket"], r["metric"]): number(r["mean"]) for r in rows if r.get("model") == "pop"}
    metrics = list(dict.fromkeys(r["metric"] for r in rows))
    grouped: dict[tuple, dict] = {}
    for r in rows:
        if r.get("model") in ("pop", "random", "antipop"):
            continue
        ref = number(r.get("pop")) if "pop" in r else pop.get((r["bucket"], r["metric"]))
        mean = number(r.get("mean"))
        gain = f" ({mean - ref:+.4f} over pop)" if mean is not None and ref is not None else ""
        grouped.setdefault((r["model"], r["bucket"], r.get("n_users", "")), {})[r["metric"]] = (
            cell(mean, (r.get("ci_low"), r.get("ci_high"))) + gain
        )
    body = [[*key, *(cells.get(m, "–") for m in metrics)] for key, cells in grouped.items()]
    note = "users grouped by their number of training interactions; gain = model − popularity ranker"
    return Table(title, ["model", "bucket", "users", *metrics], body, [note])


def paper_table(rows: list[dict]) -> Table | None:
    """``table.csv`` of a paper-table folder: one row per model and part, mean ± sd [interval] per metric."""
    if not rows:
        return None
    fixed = [c for c in ("model", "kind", "part", "n_users", "seeds") if c in rows[0]]
    metrics = [c for c in rows[0] if c not in fixed and not c.endswith(("_std", "_ci_low", "_ci_high"))]
    body = [
        [r[c] for c in fixed]
        + [cell(r[m], (r.get(f"{m}_ci_low"), r.get(f"{m}_ci_high")), r.get(f"{m}_std")) for m in metrics]
        for r in rows
    ]
    return Table(
        "every model by part", fixed + metrics, body, ["mean ± sd over seeds [95% bootstrap interval over test users]"]
    )


def _users(n) -> str:
    if isinstance(n, list):  # per seed, where a part is absent from some
        return "/".join(str(v) for v in n)
    return "" if n is None else f"{int(n):,}"
