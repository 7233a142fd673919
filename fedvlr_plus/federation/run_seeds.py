"""A run of several seeds: :func:`run_federated` trains ``cfg.seeds`` seeds of a :class:`~.engine.FederatedRun`,
one after another or side by side in worker processes (:mod:`.runs.parallel`), in a locked run folder when one is
given (each seed in ``seed-<s>/``, resumed from its checkpoint), and combines their figures."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import ResumeMismatch, RunFolderError, shell_word
from ..jsonio import write_json_atomic
from .config import FedConfig
from .engine import FederatedRun
from .runs.folder import SeedFolder, locked, seed_folders
from .runs.parallel import map_jobs, worker_count
from .runs.seeds import combine_seeds


def run_federated(
    data,
    backbone: str,
    cfg: FedConfig | None = None,
    out_dir=None,
    resume: bool = False,
    progress: bool = True,
    *,
    on_round=None,
    on_upload=None,
    options: dict | None = None,
    test: bool = True,
    keep_selected: bool = False,
    start_from: dict | None = None,
) -> dict:
    """Train ``backbone`` federatedly on split ``data`` for ``cfg.seeds`` seeds; return the JSON-ready result.

    ``out_dir``: checkpoint every round into ``out_dir/seed-<s>/`` and write ``result.json`` files; the folder is
    locked meanwhile, and one that already holds a run is refused unless ``resume``.
    ``resume``: continue the run in ``out_dir``: unfinished seeds from their checkpoint, finished ones read back,
    or trained on if ``cfg.rounds`` (or ``patience``) now asks for more; seeds beyond those of the run are added.
    Refused (:class:`~fedvlr_plus.errors.RunFolderError`): a folder without a run, a file that fails its checksum,
    a changed setting or seed (:class:`~fedvlr_plus.errors.ResumeMismatch`).
    ``on_round(run, record)`` is called after every round, ``on_upload(round, update)`` for every upload.
    ``options``: the backbone's own options when ``backbone`` is a name (see :class:`FederatedRun`).
    ``test``: False for validation only (a tuning candidate, which reads nothing else): no test pass, and a result
    without test figures. ``keep_selected``: checkpoints keep the selected round's model (a tuning candidate).
    ``start_from``: seed -> the seed folder of the tuning candidate the seed goes on from (the same figures;
    :meth:`~.engine.FederatedRun.continue_from`), with ``out_dir`` its per-round logs too.
    """
    cfg = cfg or FedConfig()
    if resume and out_dir is None:
        raise RunFolderError("--resume", "needs the run folder to continue")
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    out = Path(out_dir) if out_dir is not None else None
    if resume and not out.is_dir():
        raise RunFolderError(str(out), "no such run folder to resume", f"start the run with --out {shell_word(out)}")
    jobs = [
        SeedJob(
            data,
            backbone,
            replace(cfg, seed=s, seeds=1),
            out / f"seed-{s}" if out else None,
            resume,
            progress,
            options,
            on_round,
            test,
            keep_selected,
            (start_from or {}).get(s),
        )
        for s in seeds
    ]
    if out is None:
        return combine_seeds(_train_seeds(jobs, on_round, on_upload, cfg.jobs))
    with locked(out):
        _check_folder(out, seeds, resume)
        summary = combine_seeds(_train_seeds(jobs, on_round, on_upload, cfg.jobs))
        write_json_atomic(out / "result.json", summary)
    return summary


@dataclass
class SeedJob:
    """One seed of :func:`run_federated`, as a worker process receives it."""

    data: object
    backbone: object
    cfg: FedConfig
    run_dir: Path | None
    resume: bool
    progress: bool
    options: dict | None
    on_round: object = None
    test: bool = True
    keep_selected: bool = False
    start_from: Path | None = None

    def train(self, on_upload=None) -> dict:
        run = self._new_run(on_upload)
        if self.start_from is not None and run.continue_from(self.start_from):
            _tell(run, f"seed {self.cfg.seed}: goes on from its tuning run at round {run.round}")
            return run.run()
        return _resume_or_run(run) if self.resume else run.run()

    def _new_run(self, on_upload) -> FederatedRun:
        return FederatedRun(
            self.data,
            self.backbone,
            self.cfg,
            self.run_dir,
            progress=self.progress,
            on_round=self.on_round,
            on_upload=on_upload,
            options=self.options,
            test=self.test,
            keep_selected=self.keep_selected,
        )


def _train_seeds(jobs: list[SeedJob], on_round, on_upload, n_jobs: int | None) -> list[dict]:
    """Each seed's result, the seeds side by side in worker processes where that is possible: more than one seed,
    no upload callback, and a per-round callback that can travel to a worker and merge back (``merge``)."""
    travels = on_round is None or callable(getattr(on_round, "merge", None))
    n_jobs = worker_count(n_jobs, len(jobs))
    if n_jobs == 1 or len(jobs) < 2 or on_upload is not None or not travels:
        return [job.train(on_upload) for job in jobs]
    for job in jobs:
        job.progress = False  # bars of several processes would overwrite each other
    names = [f"seed {job.cfg.seed}" for job in jobs]
    done = map_jobs(_train_seed_job, jobs, n_jobs, names=names, what="run")
    if on_round is not None:
        for _, hook in done:
            on_round.merge(hook)
    return [result for result, _ in done]


def _train_seed_job(job: SeedJob) -> tuple[dict, object]:
    """A worker's seed: its result and its per-round callback, which carries what it collected back."""
    return job.train(), job.on_round


def _remove_temp_files(out: Path) -> None:
    """The temporary files a kill during the run's last writes left in the folder itself (the top-level
    ``result.json``, ``per_user_test.csv``): removed at the next start, under the folder's lock. The seed
    folders' are their own (SeedFolder.tidy)."""
    from ..atomic_write import is_temp_file

    for p in out.iterdir() if out.is_dir() else ():
        if p.is_file() and is_temp_file(p):
            p.unlink(missing_ok=True)


def _check_folder(out: Path, seeds: list[int], resume: bool) -> None:
    """Refuse a folder that holds a run unless resuming, and on resume one without a run, a seed the call does
    not ask for, or any seed folder whose files fail their checksums (before anything is trained)."""
    _remove_temp_files(out)
    held = seed_folders(out)
    if not resume:
        if held:
            raise RunFolderError(
                str(out),
                "already holds a run",
                f"continue it with --resume {shell_word(out)}, or choose another folder with --out",
            )
        for folder in out.glob("seed-*"):  # a run killed before its first checkpoint left only leftovers
            SeedFolder(folder).tidy()
        return
    if not held:
        raise RunFolderError(
            str(out), "holds no checkpointed run to resume", f"start the run with --out {shell_word(out)}"
        )
    extra = sorted(set(held) - set(seeds))
    if extra:
        raise ResumeMismatch(
            str(out),
            f"--seed/--seeds: the run has seed(s) {', '.join(map(str, sorted(held)))}, "
            f"this call asks for {', '.join(map(str, seeds))}",
            "pass the run's --seed; --seeds may grow to add seeds, not shrink",
        )
    for folder in held.values():
        SeedFolder(folder).verify()
        SeedFolder(folder).tidy()


def _resume_or_run(run: FederatedRun) -> dict:
    """A seed's result on resume: its saved result when the checkpoint is finished under ``run.cfg``, else the
    training continued from the checkpoint (or started, for a seed the run did not have)."""
    if run.resume_saved():
        saved = run.folder.read_json("result.json") if run.done() else None
        if saved is not None:
            _tell(run, f"seed {run.cfg.seed}: finished at round {run.round}; its result is read back, not retrained")
            return saved
        _tell(run, f"seed {run.cfg.seed}: resumed from its checkpoint at round {run.round} of up to {run.cfg.rounds}")
    return run.run()


def _tell(run: FederatedRun, line: str) -> None:
    """What a resumed seed does, on stderr (stdout stays the table or the JSON line)."""
    if run.progress:
        print(line, file=sys.stderr, flush=True)
