"""The poisoning experiment: an item-promotion attack under every aggregation rule, over attacker fractions.

For each seed a target is chosen from training counts only (a random item among the least popular warm items,
``promotion_attack.choose_target``); for every (strategy, attacker fraction) the federated run trains with
``round(fraction × real clients)`` fake clients added (``poisoned.PoisonedSimulator``), the round is selected on
the real users' validation as in any run, and at that round we measure the target's exposure (its HR@K among
the users who never interacted with it, ``evaluation.exposure``) and the overall test figures. The same seed and
target are used across strategies and fractions, so each attacked row is compared, user by user, with the
unattacked row of its strategy (paired t-test over (seed, user) pairs).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import NamedTuple

import numpy as np
from scipy import stats

from ..evaluation.exposure import exposure
from ..evaluation.stats import bootstrap_ci

#: figures of each row: the target's exposure and the overall test ranking quality
EXPOSURE_KS = (10, 50)
TEST_KEYS = ("ndcg@10", "ndcg@50")


def train_counts(data) -> np.ndarray:
    return np.asarray(data.matrix(["train"]).sum(axis=0)).ravel().astype(np.int64)


def build_attackers(run, data, target: int, fraction: float, *, pool_size: int, boost: float) -> list:
    """The fake clients of one run: ids after the real users', one fake profile each."""
    from ..federation.attacks.poisoned import attacker_count
    from ..federation.attacks.promotion import PromotionAttacker, popular_pool

    counts = train_counts(data)
    pool = popular_pool(counts, pool_size, exclude=target)
    lengths = np.diff(data.matrix(["train"]).tocsr().indptr)
    profile = int(np.median(lengths[lengths > 0]))
    n_fake = attacker_count(fraction, len(run.eligible))
    return [
        PromotionAttacker(run.n_users + j, run.bb, target, pool, profile, seed=run.cfg.seed, boost=boost)
        for j in range(n_fake)
    ]


def run_cell(
    data,
    backbone: str,
    cfg,
    target: int,
    fraction: float,
    *,
    pool_size: int = 100,
    boost: float = 1.0,
    options: dict | None = None,
) -> dict:
    """One run: train with the attackers, select on validation, measure exposure and test at that round."""
    from ..federation.attacks.poisoned import PoisonedSimulator
    from ..federation.engine import FederatedRun

    at_best = {}

    def on_round(run, record):
        if "valid" in record and run.best["round"] == record["round"]:
            at_best["exposure"] = exposure(data, run.scorer(), target, ks=EXPOSURE_KS)

    wall, cpu = time.perf_counter(), time.process_time()
    run = FederatedRun(data, backbone, cfg, progress=False, on_round=on_round, options=options)
    attackers = build_attackers(run, data, target, fraction, pool_size=pool_size, boost=boost)
    run.sim = PoisonedSimulator(run.sim, attackers, len(run.eligible), cfg.seed)
    result = run.run()
    test = run.best["test_full"].frame("all")
    exp = at_best["exposure"]
    return {
        "strategy": cfg.strategy,
        "fraction": float(fraction),
        "seed": int(cfg.seed),
        "target": int(target),
        "attackers": len(attackers),
        "selected_round": int(result["selected_round"]),
        "exposure": {f"hr@{k}": exp[f"hr@{k}"] for k in EXPOSURE_KS},
        "exposure_users": exp["users"],
        "test": {k: float(result["test"][k]) for k in TEST_KEYS},
        "per_user": {
            **{f"exposure_hr@{k}": exp["per_user"][k] for k in EXPOSURE_KS},
            **{f"test_{k}": test[k].to_numpy(np.float64) for k in TEST_KEYS},
        },
        "wall_s": time.perf_counter() - wall,
        "cpu_s": time.process_time() - cpu,
    }


class _Cell(NamedTuple):
    """One cell of the grid: what :func:`run_cell` trains, its file's ``key``, and the ``settings`` a saved cell
    must have been trained under to be read back."""

    key: str
    settings: dict
    backbone: str
    cfg: object
    target: int
    fraction: float
    pool_size: int
    boost: float
    options: dict | None


def run_grid(
    data,
    backbone: str,
    base_cfg,
    strategies,
    fractions,
    seeds: int,
    *,
    target_quantile: float = 0.1,
    pool_size: int = 100,
    boost: float = 1.0,
    log=None,
    folder=None,
    options: dict | None = None,
    jobs: int | None = 1,
) -> list[dict]:
    """Every (seed, strategy, fraction) cell; the seed's target is shared by all its cells. With ``folder`` each
    finished cell is saved there at once and read back instead of trained when the grid is run again.
    ``options``: the backbone's own options (FedRAP's penalties). ``jobs``: worker processes for the cells left
    to train (None: as the cores allow); every cell builds from its arguments, so the figures are the same."""
    from ..federation.attacks.promotion import choose_target
    from ..federation.runs.folder import locked
    from ..federation.runs.parallel import map_jobs, worker_count
    from .finished_cells import load_cell

    counts, plan = train_counts(data), []
    for seed in range(base_cfg.seed, base_cfg.seed + seeds):
        target = choose_target(counts, seed, target_quantile)
        plan += [
            _cell(
                data,
                backbone,
                replace(base_cfg, strategy=strategy, seed=seed, seeds=1),
                target,
                fraction,
                pool_size,
                boost,
                options,
            )
            for strategy in strategies
            for fraction in fractions
        ]
    with locked(folder) if folder is not None else contextlib.nullcontext():
        done = {c.key: load_cell(folder, c.key, c.settings) if folder is not None else None for c in plan}
        todo = [c for c in plan if done[c.key] is None]
        workers = worker_count(jobs, len(todo))
        if workers > 1 and log is not None:
            log(f"{len(todo)} cells side by side in {workers} worker processes")
        names = [f"cell {c.key}" for c in todo]
        trained = iter(map_jobs(_train_cell, [(data, folder, c) for c in todo], workers, names=names, what="poisoning"))
        for c in plan:
            if done[c.key] is None:
                done[c.key] = next(trained)
            elif log is not None:
                log(f"{c.key}: read back from {folder}")
            if log is not None:
                log(_cell_line(done[c.key], counts))
    return [done[c.key] for c in plan]


def _cell(data, backbone, cfg, target, fraction, pool_size, boost, options) -> _Cell:
    settings = {
        "dataset": data.name,
        "backbone": backbone,
        "config": cfg.to_dict(),
        "backbone_options": dict(options or {}),
        "target": int(target),
        "popular_pool": pool_size,
        "boost": boost,
    }
    key = f"seed{cfg.seed}-{cfg.strategy}-{fraction:g}"
    return _Cell(key, settings, backbone, cfg, int(target), fraction, pool_size, boost, options)


def _train_cell(job: tuple) -> dict:
    """One cell trained, and saved in ``folder`` at once where there is one (a worker process saves its own cells,
    so a grid killed midway keeps every cell finished by then)."""
    from .finished_cells import save_cell

    data, folder, c = job
    cell = run_cell(
        data, c.backbone, c.cfg, c.target, c.fraction, pool_size=c.pool_size, boost=c.boost, options=c.options
    )
    if folder is not None:
        save_cell(folder, c.key, c.settings, cell)
    return cell


def _cell_line(cell: dict, counts: np.ndarray) -> str:
    return (
        f"seed {cell['seed']} target {cell['target']} ({counts[cell['target']]} training users) "
        f"{cell['strategy']} {cell['fraction']:.0%} attackers: exposure hr@10 {cell['exposure']['hr@10']:.4f}, "
        f"ndcg@10 {cell['test']['ndcg@10']:.4f}, round {cell['selected_round']}, "
        f"{cell['wall_s']:.0f} s wall, {cell['cpu_s']:.0f} s CPU"
    )


def _paired_p(attacked: list[np.ndarray], clean: list[np.ndarray]) -> float | None:
    """Two-sided paired t-test over (seed, user) pairs; None when every pair is equal."""
    a, b = np.concatenate(attacked), np.concatenate(clean)
    if len(a) != len(b) or len(a) < 2:
        return None
    d = a - b
    if np.all(d == d[0]):
        return None if d[0] == 0 else 0.0
    return float(stats.ttest_rel(a, b).pvalue)


def summarise(cells: list[dict], strategies, fractions, seed: int = 0) -> list[dict]:
    """One row per (strategy, fraction): means and std over seeds, a bootstrap CI over the pooled (seed, user)
    values and the paired p-value against the same strategy without attackers."""
    rows = []
    for strategy in strategies:
        clean = [c for c in cells if c["strategy"] == strategy and c["fraction"] == 0.0]
        for fraction in fractions:
            mine = sorted(
                (c for c in cells if c["strategy"] == strategy and c["fraction"] == fraction), key=lambda c: c["seed"]
            )
            row = {
                "strategy": strategy,
                "fraction": float(fraction),
                "seeds": [c["seed"] for c in mine],
                "targets": [c["target"] for c in mine],
                "attackers": mine[0]["attackers"] if mine else 0,
                "selected_rounds": [c["selected_round"] for c in mine],
                "cpu_s": float(sum(c["cpu_s"] for c in mine)),
                "wall_s": float(sum(c["wall_s"] for c in mine)),
            }
            for key in [f"exposure_hr@{k}" for k in EXPOSURE_KS] + [f"test_{k}" for k in TEST_KEYS]:
                part, metric = key.split("_", 1)
                vals = [c[part][metric] for c in mine]
                row[key] = float(np.mean(vals)) if vals else None
                row[f"{key}_std"] = float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
                pooled = np.concatenate([c["per_user"][key] for c in mine]) if mine else np.zeros(0)
                row[f"{key}_ci"] = bootstrap_ci(pooled, seed=seed)
                paired = sorted(clean, key=lambda c: c["seed"])
                same = [c["seed"] for c in paired] == row["seeds"] and fraction != 0.0
                row[f"{key}_p"] = (
                    _paired_p([c["per_user"][key] for c in mine], [c["per_user"][key] for c in paired])
                    if same
                    else None
                )
            rows.append(row)
    return rows
