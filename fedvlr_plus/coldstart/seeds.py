"""One training seed of a cold-start study, as a job that a worker process can run.

A study's seeds are independent: each trains the model on its own seed and scores it. ``--jobs`` trains them side
by side (:func:`~fedvlr_plus.federation.runs.parallel.map_jobs`); each job returns what the study keeps of its seed,
and the study adds the seeds up in seed order. A job builds its run from its arguments alone and all randomness is
keyed by seed and round, so a seed gives the same figures in a worker as in the study's own process (with one torch
thread in both; several threads may sum in another order).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass
class ItemSeed:
    """One seed of an item study: ``make_model(data)`` trained under ``cfg`` (one seed), then scored as trained and
    under each fitted cold rule (``fitted``: rule name -> rule)."""

    data: object
    make_model: object
    cfg: object
    spec: object
    fitted: dict
    select_metric: str
    progress: bool = False
    #: the seed's run folder, checkpointed as it trains and continued where it holds a checkpoint (None: none)
    run_dir: Path | None = None


def item_seed(job: ItemSeed) -> dict:
    """The seed's selected round (``round`` of ``rounds``), its per-user test frames as trained (``trained``: part ->
    frame) and under each rule (``rules``: rule -> part -> frame), and each rule's validation score among cold
    items (``valid``; none where the validation split has no cold target). Module level: a worker calls it."""
    from .experiment import _parts, _scorer, shared_with_rule, train_selected, valid_among_cold, valid_cold_targets

    data, spec = job.data, job.spec
    cold = data.cold_items()
    run = train_selected(data, job.make_model(data), job.cfg, progress=job.progress, folder=job.run_dir)
    out = {"round": int(run.best["round"]), "rounds": int(run.round), "rules": {}, "valid": {}}
    out["trained"] = _parts(spec, data, _scorer(run, run.shared), cold)
    has_valid_cold = valid_cold_targets(data, cold) > 0
    for name, rule in job.fitted.items():
        scorer = _scorer(run, shared_with_rule(run, rule))
        if has_valid_cold:
            out["valid"][name] = valid_among_cold(data, spec, scorer, cold, job.select_metric)
        out["rules"][name] = _parts(spec, data, scorer, cold)
    return out


def seed_jobs(cfg, jobs: int | None, make_model) -> tuple[list, int]:
    """The study's seeds (their configs, one seed each) and the worker processes that train them: ``jobs`` as
    :func:`~fedvlr_plus.federation.runs.parallel.worker_count` reads it, one where the model's recipe cannot be sent
    to a worker (a lambda of the Python API: the seeds then train here, one after another)."""
    from ..federation.runs.parallel import worker_count

    seeds = [replace(cfg, seed=cfg.seed + i, seeds=1) for i in range(cfg.seeds)]
    workers = worker_count(jobs, len(seeds))  # (one for --jobs 1 or a single seed)
    return seeds, workers if workers == 1 or _picklable(make_model) else 1  # (pickled only where it is sent)


def run_seed_jobs(fn, jobs: list, study: str, finished, workers: int, log=None) -> list:
    """``fn`` of every seed job, in seed order: read back where ``finished`` (a :class:`.finished.FinishedSteps`, or
    None) holds the seed's step ``<study>-seed-<s>``, else trained, in ``workers`` worker processes, and saved as
    soon as it finishes. With ``finished``, a seed in training checkpoints into its run folder and goes on from
    it."""
    from ..federation.runs.parallel import map_jobs
    from .finished import finished_step

    steps = [f"{study}-seed-{job.cfg.seed}" for job in jobs]
    done = [finished.load(step) if finished is not None else None for step in steps]
    if log:
        for job, outcome in zip(jobs, done):
            if outcome is not None:
                log(f"seed {job.cfg.seed}: read back from {finished.folder}")
    todo = [i for i, outcome in enumerate(done) if outcome is None]
    if finished is not None:
        jobs = [replace(job, run_dir=finished.run_path(step)) for job, step in zip(jobs, steps)]
    names = [f"{study} seed {jobs[i].cfg.seed}" for i in todo]
    trained = map_jobs(
        finished_step, [(finished, steps[i], fn, jobs[i]) for i in todo], workers, names=names, what="coldstart"
    )
    for i, outcome in zip(todo, trained):
        done[i] = outcome
    return done


def _picklable(obj) -> bool:
    try:
        pickle.dumps(obj)
    except Exception:  # (a lambda, a local function, an open handle: each says so in its own way)
        return False
    return True


def fresh_spec(spec):
    """``spec`` without its evaluator's cache (a worker builds its own; the cache holds a data object)."""
    return replace(spec)


@dataclass
class UserSeed:
    """One seed of a new-user study: the model trained on the ``warm`` users, then the held-out users joining with
    each support size (``joins``: size -> its support/query data), as :func:`.experiment.user_coldstart` says."""

    warm: object
    make_model: object
    cfg: object
    spec: object
    joins: dict
    held_out: object
    joining: dict  # epochs, start, valid_users, select_metric, prior: how a joining user is served and chosen
    report_users: object
    progress: bool = False
    #: as :attr:`ItemSeed.run_dir`
    run_dir: Path | None = None


def user_seed(job: UserSeed) -> dict:
    """The seed's selected round (``round`` of ``rounds``), its trained users' per-user test frame (``sparsity``),
    each support size's reported joining users' frame (``frames``) and the choices made on validation joining users
    (``chosen``: size -> records). Module level: a worker calls it."""
    from .experiment import _joined, train_selected
    from .population import PopulationStarts
    from .support_epochs import only

    j, spec = job.joining, job.spec
    run = train_selected(job.warm, job.make_model(job.warm), job.cfg, progress=job.progress, folder=job.run_dir)
    out = {"round": int(run.best["round"]), "rounds": int(run.round), "frames": {}, "chosen": {}}
    out["sparsity"] = run.best["test_full"].per_user
    starts = PopulationStarts(run)  # the same for every support size
    for n, sq in job.joins.items():
        scorer = _joined(
            run,
            sq,
            job.held_out,
            j["epochs"],
            j["start"],
            spec,
            j["valid_users"],
            j["select_metric"],
            out["chosen"],
            n,
            j["prior"],
            starts,
        )
        out["frames"][n] = only(spec.run(sq, scorer, "test").frame("all"), job.report_users)
    return out
