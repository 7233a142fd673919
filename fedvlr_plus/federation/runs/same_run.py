"""Whether a checkpoint belongs to the run that is about to go on from it (:func:`check_same_run`).

A resume must give the numbers of a run straight through, so a checkpoint made with another backbone, other data or
other settings is refused, naming what differs. Settings that only extend a run (more rounds) or change its speed
(:data:`~..config.RESUMABLE_CHANGES`) may change.
"""

from __future__ import annotations

from ...adapters import option_names
from ...data_identity import describe_difference
from ...errors import ResumeMismatch
from ..config import COMPACT_STORES, RESUMABLE_CHANGES


def check_same_run(run, ck: dict, where: str | None = None) -> None:
    """ResumeMismatch unless ``ck`` (read from ``where``, default the run's folder) is ``run``'s: same backbone,
    data and settings (bar those that only extend it or change its speed), and no fewer rounds than it has
    already trained."""
    where = where or str(run.run_dir)
    hint = "resume with the run's settings, or start a new run in another folder"
    if ck["backbone"] != run.backbone_name:
        raise ResumeMismatch(where, f"the run used backbone {ck['backbone']!r}, not {run.backbone_name!r}", hint)
    # a checkpoint written before the digest existed is compared by its own (older) fields
    ident = {k: v for k, v in run.identity().items() if k in ck["dataset"]}
    if ck["dataset"] != ident:
        differs = describe_difference(ck["dataset"], ident)
        raise ResumeMismatch(where, f"the run was trained on other data ({differs})", hint)
    # a setting left to the backbone (None) and the same value given explicitly are the same run
    mine = run._resolved()
    old, new = _effective(ck["config"], ck["resolved"]), _effective(run.recorded_config(), mine)
    # runs recorded when every config carried FedRAP's penalties list them for other backbones too
    foreign = option_names() - set(new)
    diff = sorted(
        k
        for k in set(old) | set(new)
        if old.get(k) != new.get(k)
        and k not in RESUMABLE_CHANGES
        and k not in foreign
        and not _same_checkpointed_states(k, old.get(k), new.get(k))
    )
    if diff:
        raise ResumeMismatch(
            where,
            "cannot resume with different settings: "
            + "; ".join(f"{_flag(k)}: the run used {old.get(k)!r}, this call {new.get(k)!r}" for k in diff),
            hint,
        )
    if run.cfg.target_epsilon is not None and int(ck["config"]["rounds"]) != run.cfg.rounds:
        raise ResumeMismatch(
            where,
            f"--rounds: with --target-epsilon the noise was set for the run's "
            f"{ck['config']['rounds']} rounds, this call asks for {run.cfg.rounds}",
            f"pass --rounds {ck['config']['rounds']}",
        )
    if run.cfg.rounds < int(ck["round"]):
        raise ResumeMismatch(
            where,
            f"--rounds: the run has already trained {ck['round']} rounds, this call asks for {run.cfg.rounds}",
            f"pass --rounds {ck['round']} or more",
        )


def _same_checkpointed_states(setting: str, old, new) -> bool:
    """Whether a changed setting keeps the checkpoint's meaning: the memory and file stores checkpoint the same
    tables (a run that ran out of memory resumes with ``--private-store file``), and ``auto`` picks one of them;
    a disk store's are its folder."""
    return setting == "private_store" and {old, new} <= {"auto", *COMPACT_STORES}


def _flag(setting: str) -> str:
    """The command-line flag of a config setting (``ks`` and ``metrics`` both come from ``--metrics``)."""
    return {"ks": "--metrics", "metrics": "--metrics"}.get(setting, "--" + setting.replace("_", "-"))


def _effective(config: dict, resolved: dict) -> dict:
    """``config`` with every setting that was left to the backbone (None) replaced by the value it resolved to."""
    return {k: (resolved[k] if v is None and k in resolved else v) for k, v in config.items()}
