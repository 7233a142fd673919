"""The view-routing ablation: the personal router over the server's views beside every row that could explain
its figure away, on one data set, over several seeds, each selected on validation only.

Rows (one backbone, ``fedavg`` by default):

- ``FedVLR (views)``: the router over the content views (``router_over="views"``);
- ``FedVLR (operators)``: the router over the sum / mlp / gate operators (the original release's form);
- ``uniform (views)``: the views mixed with fixed equal weights (what routing adds over a fixed mixture);
- ``sum``: one expert, the ID row plus every view (``--fusion sum``);
- ``view <name>``: one expert, the ID row plus that view alone (every single view);
- ``<backbone> (fedgrad)``: the backbone alone, aggregated as the layer is (the like-for-like row, no content);
- ``content kNN``: cosine to the mean of the user's training items over the concatenated views (no training).

Every federated row trains with the same settings; the routers' weights at each seed's selected round are kept
for the recovery report (:mod:`.planted`) and the per-user look. See docs/personal-fusion.md.
"""

from __future__ import annotations

import contextlib
import copy
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

VIEWS_ROW, OPERATORS_ROW, UNIFORM_ROW, SUM_ROW, CONTENT_ROW = (
    "FedVLR (views)",
    "FedVLR (operators)",
    "uniform (views)",
    "sum",
    "content kNN",
)
#: the row groups a run can be limited to (``rows``): FedVLR (views) is always trained, as every test compares to it
ROW_GROUPS = ("operators", "uniform", "sum", "single", "fedgrad")


@dataclass
class ViewRoutingOptions:
    """``training``: FedConfig fields for every federated row; ``fedvlr``: the layer's options every fusion row
    starts from (its mode and router_over are set per row)."""

    backbone: str = "fedavg"
    seeds: int = 3
    seed: int = 0
    metrics: tuple = ("ndcg@10", "hr@10", "ndcg@50", "hr@50")
    training: dict = field(default_factory=dict)
    fedvlr: object = None
    progress: bool = False
    #: the row groups trained beside FedVLR (views) (:data:`ROW_GROUPS`)
    rows: tuple = ROW_GROUPS
    #: worker processes for the (row, seed) runs (None: as the cores allow; 1: one after another)
    jobs: int | None = None
    #: where every run checkpoints (``folder/runs/<data>/<row>/seed-<s>/``), and whether runs already there go on
    folder: Path | None = None
    resume: bool = False


@dataclass
class RowRun:
    """One row's seeds: test results at the selected rounds, the routers' weights there (routed rows), the
    experts' names, and the mean training seconds per round."""

    results: list = field(default_factory=list)
    weights: list = field(default_factory=list)
    users: list = field(default_factory=list)
    experts: list = field(default_factory=list)
    seconds_per_round: list = field(default_factory=list)
    selected_round: list = field(default_factory=list)


def fusion_rows(views: dict, backbone: str, base_options, groups=ROW_GROUPS) -> list[tuple[str, object]]:
    """``(label, recipe)`` of every federated row (see the module's docstring)."""
    from ..api import FedVLR, Model
    from ..fedvlr import FedVLROptions

    inner = Model(backbone, backbone)
    base = base_options or FedVLROptions(progress=False)

    def layer(label, view_set, **changes):
        return label, FedVLR(inner, views=view_set, label=label, options=replace(base, **changes))

    rows = [layer(VIEWS_ROW, views, mode="fedvlr", router_over="views")]
    if "operators" in groups:
        rows.append(layer(OPERATORS_ROW, views, mode="fedvlr", router_over="operators"))
    if "uniform" in groups:
        rows.append(layer(UNIFORM_ROW, views, mode="uniform", router_over="views"))
    if "sum" in groups:
        rows.append(layer(SUM_ROW, views, mode="sum"))
    if "single" in groups:
        rows += [layer(f"view {name}", {name: v}, mode="sum") for name, v in views.items()]
    if "fedgrad" in groups:
        rows.append((f"{backbone} (fedgrad)", Model(backbone, f"{backbone} (fedgrad)", {"strategy": "fedgrad"})))
    return rows


def _train_seed(exp, label: str, recipe, seed: int, folder: Path | None = None) -> dict:
    """Train ``recipe`` for ``seed`` (in run folder ``folder``, going on from its checkpoint where it has one): its
    selected round's test result, routers' weights (routed rows) and timing."""
    from ..fedvlr.report import user_weights
    from .selected_extra import load_selected_extra, save_selected_extra

    kept = {}

    def on_round(run, record):
        if "valid" in record and run.best["round"] == record["round"] and getattr(run.bb, "mode", "") == "fedvlr":
            kept["weights"] = user_weights(run, run.eligible).numpy()
            kept["users"] = np.asarray(run.eligible)
            if folder is not None:
                save_selected_extra(run, kept)  # (a resumed run with nothing left to train reads them back)

    started = time.perf_counter()
    run = exp.start(recipe, seed, folder=folder, on_round=on_round)
    if run.resume_saved():
        if getattr(run.bb, "mode", "") == "fedvlr":
            kept.update(load_selected_extra(run) or {})
    run.run()
    if kept:
        kept["experts"] = list(run.bb.experts)
    print(f"{exp.data.name}: {label}, seed {seed}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return {
        "result": exp.selected_test(run),
        "round": int(run.best["round"]),
        "seconds": float(np.mean([r["train_seconds"] for r in run.history])),
        **kept,
    }


def _train_seed_job(job: tuple) -> dict:
    """:func:`_train_seed` of one ``(experiment, label, recipe, seed, folder)`` (module level: a worker process
    calls it)."""
    return _train_seed(*job)


def _run_folders(data, opts: ViewRoutingOptions, runs: list) -> list:
    """Each run's folder (None without ``opts.folder``); runs already there are refused unless ``opts.resume``."""
    if opts.folder is None:
        return [None] * len(runs)
    from ..federation.runs.folder import refuse_started_runs

    root = Path(opts.folder) / "runs" / _safe(data.name)
    folders = [root / _safe(label) / f"seed-{seed}" for label, _, seed in runs]
    refuse_started_runs(opts.folder, folders, opts.resume)
    return folders


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")


def _add_seed(row: RowRun, seed_run: dict) -> None:
    row.results.append(seed_run["result"])
    row.selected_round.append(seed_run["round"])
    row.seconds_per_round.append(seed_run["seconds"])
    if "weights" in seed_run:
        row.weights.append(seed_run["weights"])
        row.users.append(seed_run["users"])
        row.experts = seed_run["experts"]


def train_rows(data, views: dict, opts: ViewRoutingOptions, rows=None) -> dict[str, RowRun]:
    """Every row of :func:`fusion_rows` (or ``rows``) for every seed, and the content kNN ranker. The (row, seed)
    runs train side by side in worker processes where ``opts.jobs`` allows; each builds from its arguments and all
    randomness is keyed by seed and round, so the figures are those of one run after another."""
    from ..api import Experiment
    from ..coldstart.content import ContentRanker
    from ..federation.runs.folder import locked
    from ..federation.runs.parallel import map_jobs, worker_count

    exp = Experiment(
        data,
        [],
        metrics=list(opts.metrics),
        seeds=opts.seeds,
        seed=opts.seed,
        references=False,
        progress=opts.progress,
        **opts.training,
    )
    recipes = rows or fusion_rows(views, opts.backbone, opts.fedvlr, opts.rows)
    runs = [(label, recipe, opts.seed + i) for label, recipe in recipes for i in range(opts.seeds)]
    with locked(opts.folder) if opts.folder is not None else contextlib.nullcontext():
        runs = [(*run, folder) for run, folder in zip(runs, _run_folders(data, opts, runs))]
        workers = worker_count(opts.jobs, len(runs))
        if workers > 1:
            print(f"{data.name}: {len(runs)} runs side by side in {workers} worker processes", file=sys.stderr)
            quiet = copy.copy(exp)  # (several workers' progress bars would write over each other)
            quiet.progress = False
            names = [f"{label} seed {seed}" for label, _, seed, _ in runs]
            done = map_jobs(_train_seed_job, [(quiet, *run) for run in runs], workers, names=names, what=data.name)
        else:
            done = [_train_seed(exp, *run) for run in runs]
    out = {label: RowRun() for label, _ in recipes}
    for (label, *_), seed_run in zip(runs, done):
        _add_seed(out[label], seed_run)
    content = ContentRanker(data, views)
    out[CONTENT_ROW] = RowRun(results=[exp.test(content, opts.seed + i) for i in range(opts.seeds)])
    return out


def as_result(name: str, rows: dict[str, RowRun], metrics):
    """The rows as an :class:`~fedvlr_plus.api.result.ExperimentResult` (table, intervals, paired tests)."""
    from ..api.result import ExperimentResult

    return ExperimentResult(name, list(metrics), {k: r.results for k, r in rows.items()})


def paired_against(result, reference: str, metric: str, which: str = "all") -> dict[str, dict]:
    """Paired t-test and Wilcoxon of ``reference`` against every other row, over users (seed-averaged)."""
    return {label: result.paired(reference, label, metric, which) for label in result.models if label != reference}


def parts(result) -> list[str]:
    """``all``, and ``warm`` where some test targets are cold (KU: a cold-first ranker wins overall, so its
    warm targets are the figure to read; docs/method.md, "Evaluation protocol")."""
    first = next(iter(result.per_seed.values()))[0]
    return ["all", "warm"] if first.n_users("cold") else ["all"]


def row_summary(rows: dict[str, RowRun]) -> dict[str, dict]:
    """Seconds per round and selected rounds of every trained row."""
    return {
        k: {
            "seconds_per_round": float(np.mean(r.seconds_per_round)) if r.seconds_per_round else None,
            "selected_round": r.selected_round,
        }
        for k, r in rows.items()
    }


def by_lean(result, rows: dict[str, RowRun], metric: str, against=(SUM_ROW, UNIFORM_ROW)) -> list[dict]:
    """Where routing differs from a fixed fusion, per user: the users grouped by the view their router leans on
    (argmax of the seed-averaged weights) and by how decided it is (its largest weight), each group's mean
    gain of ``FedVLR (views)`` over the rows ``against`` on ``metric`` (seed-averaged per user)."""
    row = rows.get(VIEWS_ROW)
    against = [a for a in against if a in rows]
    if row is None or not row.weights:
        return []
    users = row.users[0]
    w = seed_mean_weights(row, users)
    mine = result.per_user(VIEWS_ROW).set_index("user")[metric]
    out = []
    lean, top = w.argmax(1), w.max(1)
    for k, expert in enumerate(row.experts):
        for lo, hi in ((0.0, 0.6), (0.6, 0.8), (0.8, 1.01)):
            group = users[(lean == k) & (top >= lo) & (top < hi)]
            group = group[np.isin(group, mine.index)]
            if not len(group):
                continue
            entry = {
                "leans_on": expert,
                "top_weight": f"[{lo:.1f}, {min(hi, 1.0):.1f})",
                "users": int(len(group)),
                VIEWS_ROW: float(mine.loc[group].mean()),
            }
            for other in against:
                theirs = result.per_user(other).set_index("user")[metric]
                entry[f"gain over {other}"] = float((mine.loc[group] - theirs.reindex(group)).mean())
            out.append(entry)
    return out


def per_user(result, rows: dict[str, RowRun], metric: str, group=None) -> dict | None:
    """Each test user's seed-averaged router weights (``FedVLR (views)``) and gain on ``metric`` over
    ``--fusion sum``, for the per-user plot; ``group``: each user's known group (the planted modality), if any."""
    row = rows.get(VIEWS_ROW)
    if row is None or not row.weights or SUM_ROW not in rows:
        return None
    mine = result.per_user(VIEWS_ROW).set_index("user")[metric]
    users = row.users[0][np.isin(row.users[0], mine.index)]
    w = seed_mean_weights(row, users)
    gain = mine.loc[users] - result.per_user(SUM_ROW).set_index("user")[metric].reindex(users)
    out = {
        "experts": list(row.experts),
        "metric": metric,
        "users": users.tolist(),
        "weights": w.round(4).tolist(),
        "gain_over_sum": gain.fillna(0.0).round(5).tolist(),
    }
    if group is not None:
        out["group"] = [str(g) for g in np.asarray(group)[users]]
    return out


def seed_mean_weights(row: RowRun, users: np.ndarray) -> np.ndarray:
    """The routed row's router weights of ``users`` (in that order), averaged over its seeds."""
    return np.mean([_aligned(wt, u, users) for wt, u in zip(row.weights, row.users)], 0)


def _aligned(weights: np.ndarray, users: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``weights`` (rows = ``users``) in the row order of ``order``."""
    where = {int(u): i for i, u in enumerate(users)}
    return weights[[where[int(u)] for u in order]]


def view_routing_setting(data, views: dict, opts: ViewRoutingOptions) -> dict:
    """One data set's ablation: every row, paired tests of FedVLR (views) against each, timing, the per-user look."""
    rows = train_rows(data, views, opts)
    result = as_result(data.name, rows, opts.metrics)
    metric = opts.metrics[0]
    return {
        "data": data.name,
        "users": int(data.n_users),
        "items": int(data.n_items),
        "views": list(views),
        "result": result,
        "paired": paired_against(result, VIEWS_ROW, metric),
        "metric": metric,
        "warm_paired": paired_against(result, VIEWS_ROW, metric, "warm") if "warm" in parts(result) else None,
        "rows": row_summary(rows),
        "by_lean": by_lean(result, rows, metric),
        "per_user": per_user(result, rows, metric),
        "router_weights": {
            k: np.mean([w.mean(0) for w in r.weights], 0).round(4).tolist() for k, r in rows.items() if r.weights
        },
    }
