"""Finished steps of a cold-start study, kept in its report folder so that a killed study goes on where it stopped.

A step is one seed of one model (trained and scored) or the tuner's choice of recipe. Each is saved as soon as it
finishes, in ``DIR/finished/<step>/`` as a run folder's state (plain JSON and safetensors under a checksummed
manifest), together with the study's settings. ``coldstart --resume DIR`` reads finished steps back instead of
training them again; a step saved under other settings is refused, naming the first that differs. A second study
started on the same folder without ``--resume`` is refused, so that it never mixes its steps with older ones.

While a seed trains, its run checkpoints into ``DIR/runs/<step>/`` as ``run --out`` does, so a seed killed midway
goes on from its last checkpoint; the folder is removed once the seed's step is saved.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import ResumeMismatch

FINISHED = "finished"
#: the folder of the seeds still training (their run folders, checkpointed)
TRAINING = "runs"
STATE = "step"
#: options that change how a study runs or talks, not its figures
NOT_SETTINGS = ("progress", "command", "jobs", "folder", "resume")


def study_settings(opts, data_digest: str) -> dict:
    """What decides a step's figures: the study's options (bar :data:`NOT_SETTINGS`, and the number of seeds: a
    seed's step does not depend on how many others there are, so a resumed study may add seeds) and its data's
    digest, as JSON."""
    settings = {k: v for k, v in asdict(opts).items() if k not in NOT_SETTINGS}
    settings["training"] = {k: v for k, v in settings["training"].items() if k not in (*NOT_SETTINGS, "seeds")}
    settings["data"] = data_digest
    return json.loads(json.dumps(settings, default=str))


@dataclass(frozen=True)
class FinishedSteps:
    """The finished steps of the study in ``folder`` under ``settings``."""

    folder: Path
    settings: dict

    def path(self, step: str) -> Path:
        return Path(self.folder) / FINISHED / step

    def run_path(self, step: str) -> Path:
        """The run folder of ``step`` while it trains (a seed's checkpoints)."""
        return Path(self.folder) / TRAINING / step

    def refuse_started(self, resume: bool) -> None:
        """Unless ``resume``, a folder that already holds finished steps or seeds in training is refused."""
        from ..federation.runs.folder import refuse_started_runs

        steps = []
        for part in (FINISHED, TRAINING):
            root = Path(self.folder) / part
            steps += list(root.iterdir()) if root.is_dir() else []
        refuse_started_runs(self.folder, steps, resume, held="a study")

    def load(self, step: str):
        """What ``step`` gave when it finished (checksums checked), or None where it has not finished."""
        from ..federation.runs.folder import SeedFolder
        from ..jsonio import first_difference

        folder = SeedFolder(self.path(step))
        saved = folder.read_state(STATE) if folder.has_checkpoint() else None
        if saved is None:
            return None
        diff = first_difference(self.settings, saved["settings"])
        if diff:
            raise ResumeMismatch(
                str(self.path(step)), f"was made under other settings ({diff})", "resume with the same command"
            )
        return saved["outcome"]

    def save(self, step: str, outcome) -> None:
        from ..atomic_write import make_dirs
        from ..federation.runs.folder import SeedFolder

        SeedFolder(make_dirs(self.path(step))).write_state(STATE, {"settings": self.settings, "outcome": outcome})


def finished_step(job: tuple):
    """``fn(arg)``, saved as ``step`` in ``finished`` (a :class:`FinishedSteps`, or None) as soon as it returns.
    Module level: a worker process calls it, and saves its own step, so a study killed midway keeps it."""
    finished, step, fn, arg = job
    outcome = fn(arg)
    if finished is not None:
        finished.save(step, outcome)
        # its checkpoints are not needed once the step is saved (a kill between the two leaves them, unread)
        shutil.rmtree(finished.run_path(step), ignore_errors=True)
    return outcome
