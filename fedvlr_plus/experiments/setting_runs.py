"""The runs of a table whose rows are training settings (``experiment privacy-table``: one row per noise level),
every seed of every row, side by side in worker processes and, with a folder, each in a run folder of its own.

A row's seed trains in ``FOLDER/runs/<row>/seed-<s>/``, checkpointed as ``run --out`` does, so a killed table
loses at most the rounds since each run's last checkpoint: ``--resume FOLDER`` reads finished runs back and
continues the others (a longer ``--rounds`` extends them; a changed setting is refused by the run folder). Each
run builds from its arguments and all randomness is keyed by seed and round, so the figures are those of one run
after another without a folder.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass
class SeedRun:
    """What a table reads of one trained seed: its selected round's ``best`` (``test_full``, ``valid``,
    ``round``) and its ``result_json`` (the accounted privacy). Small, so that a worker process can send it back."""

    best: dict
    result_json: dict
    #: what the run's observer reports of it (:func:`train_settings`), or None
    observed: dict | None = None

    @classmethod
    def of(cls, run, observer=None) -> SeedRun:
        best = {k: run.best[k] for k in ("test_full", "valid", "round")}
        return cls(best, {"privacy": run.result_json.get("privacy")}, observer.report(run) if observer else None)


@dataclass
class _Job:
    data: object
    backbone: object  # a name, or a picklable callable that builds a fresh backbone
    cfg: object
    folder: Path | None
    observer: object = None


def _train(job: _Job) -> SeedRun:
    """One seed trained, or continued from its folder's checkpoint (module level: a worker process calls it)."""
    from ..federation.engine import FederatedRun

    bb = job.backbone() if callable(job.backbone) else job.backbone
    run = FederatedRun(job.data, bb, job.cfg, job.folder, progress=False)
    if job.observer is not None:
        run.on_upload = job.observer(run)
    if job.folder is not None and run.folder.has_checkpoint():
        run.load_checkpoint()
    run.result_json = run.run()
    return SeedRun.of(run, job.observer)


def train_settings(
    data, backbone, rows: dict, *, jobs: int | None = 1, folder=None, resume: bool = False, observer=None
) -> dict:
    """Every seed of every row of ``rows`` (row name -> FedConfig), as ``{row name: [SeedRun, ...]}``; side by side
    in ``jobs`` worker processes (None: as the cores allow), ``backbone`` then picklable. ``folder``: each run in
    ``folder/runs/<row>/seed-<s>/``, the folder locked meanwhile; runs already there are refused unless
    ``resume``. ``observer``: a picklable object whose ``observer(run)`` gives the run's upload hook and whose
    ``report(run)`` what it saw, kept as ``SeedRun.observed``; with a ``folder`` it must set the run's
    ``checkpointed_observer``, so that what it saw before a checkpoint comes back on resume."""
    from ..federation.runs.folder import locked, refuse_started_runs
    from ..federation.runs.parallel import map_jobs, worker_count

    root = Path(folder) if folder is not None else None
    plan = []
    for name, cfg in rows.items():
        for seed in range(cfg.seed, cfg.seed + cfg.seeds):
            run_dir = root / "runs" / name / f"seed-{seed}" if root is not None else None
            plan.append((name, _Job(data, backbone, replace(cfg, seed=seed, seeds=1), run_dir, observer)))
    with locked(root) if root is not None else contextlib.nullcontext():
        refuse_started_runs(root, [job.folder for _, job in plan], resume)
        workers = worker_count(jobs, len(plan))
        if workers > 1:
            print(f"{len(plan)} runs side by side in {workers} worker processes", file=sys.stderr, flush=True)
        names = [f"{name} seed {job.cfg.seed}" for name, job in plan]
        done = map_jobs(_train, [job for _, job in plan], workers, names=names, what="runs")
    out = {name: [] for name in rows}
    for (name, _), seed_run in zip(plan, done):
        out[name].append(seed_run)
    return out
