"""What an experiment keeps of a run's selected round beside the run's own checkpoint, so that a resumed run that
has nothing left to train still has it: evaluation results, a router report, the routers' weights.

The experiment computes it in its ``on_round`` hook when a round becomes the selected one and saves it at once
(plain JSON and safetensors, listed in the run folder's manifest, tagged with its round).
"""

from __future__ import annotations

from ..errors import RunFolderError

STEM = "selected_extra"


def save_selected_extra(run, extra: dict) -> None:
    """Keep ``extra``, what ``run``'s selected round adds, in its run folder."""
    run.folder.write_state(STEM, {"round": int(run.best["round"]), "extra": dict(extra)})


def load_selected_extra(run) -> dict | None:
    """The saved extra of ``run``'s selected round (checksums checked). A process killed after the selected
    round's checkpoint but before its extra was saved left an older one: it is recomputed through the run's
    ``on_round`` hook, which saves it again, and None is returned (the checkpoint is that round's model, which the
    engine's checkpoint rule guarantees is the only way the two can differ)."""
    saved = run.folder.read_state(STEM)
    if saved is not None and saved["round"] == run.best["round"]:
        return saved["extra"]
    if run.round != run.best["round"] or not run.history:
        raise RunFolderError(
            str(run.folder.path / f"{STEM}.json"),
            "missing or from another round than the selected one",
            "start a new run in another folder",
        )
    run.on_round(run, run.history[-1])
    return None
