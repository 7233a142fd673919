"""Per-round logs a run writes while it trains (``--log tensorboard,csv``), beside its checkpoints.

Each finished round gives one set of scalars, named as TensorBoard tags: ``train/loss``, ``train/clients``,
``time/train_seconds``, and at evaluated rounds ``time/eval_seconds``, ``valid/<metric>@<K>`` and whatever the
backbone reports about its state (:meth:`~fedvlr_plus.adapters.Backbone.round_scalars`; the FedVLR layer's
``router/weight/<expert>`` and ``router/entropy``). The values are the run's history, as ``result.json`` keeps it.

Where they go, for the seed folder ``RUN_DIR/seed-<s>/``:

- ``tensorboard``: event files under ``RUN_DIR/tensorboard/seed-<s>/`` (``tensorboard --logdir RUN_DIR/tensorboard``
  shows the seeds side by side), written with ``torch.utils.tensorboard``;
- ``csv``: ``RUN_DIR/rounds/seed-<s>.csv``, one row per round, one column per tag, rewritten atomically each round.

A resumed run repeats the rounds after its last checkpoint; the rows and events a killed run had already logged for
those rounds are dropped first (TensorBoard's ``purge_step``), so each round appears once. A run without logs gets
:class:`NoRoundLog`, whose calls do nothing.
"""

from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path

from ...atomic_write import atomic_write, atomic_write_text

TENSORBOARD_DIR = "tensorboard"
CSV_DIR = "rounds"


class NoRoundLog:
    """The log of a run that logs nothing: every call returns at once."""

    def write(self, run, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


def open_round_log(kinds, seed_dir: Path | None, seed: int):
    """The round log for ``kinds`` (``tensorboard``, ``csv``) of the seed whose folder is ``seed_dir``
    (``RUN_DIR/seed-<s>``); :class:`NoRoundLog` when there are no kinds or no folder."""
    if not kinds or seed_dir is None:
        return NoRoundLog()
    root = Path(seed_dir).parent
    sinks = []
    if "tensorboard" in kinds:
        sinks.append(TensorBoardRounds(root / TENSORBOARD_DIR / f"seed-{seed}"))
    if "csv" in kinds:
        sinks.append(CsvRounds(root / CSV_DIR / f"seed-{seed}.csv"))
    return RoundLog(sinks)


def round_scalars(run, record: dict) -> dict[str, float | int]:
    """The scalars of one finished round of ``run`` (its history ``record``), by tag."""
    out = {"train/loss": float(record["loss"]), "train/clients": int(record["clients"])}
    out["time/train_seconds"] = float(record["train_seconds"])
    if "valid" in record:
        out["time/eval_seconds"] = float(record["eval_seconds"])
        out.update({f"valid/{k}": float(v) for k, v in record["valid"].items()})
        # at evaluated rounds only: the backbone's report may cost a pass over the users, as validation does
        out.update({k: float(v) for k, v in run.bb.round_scalars(run).items()})
    return out


def copy_round_logs(source: Path, seed_dir: Path) -> None:
    """The logs of the seed folder ``source`` (a tuning candidate's), beside its run folder, copied to the seed
    whose folder is ``seed_dir``, which goes on from that run: its rounds so far are the candidate's."""
    seed, src_root, dst_root = Path(source).name, Path(source).parent, Path(seed_dir).parent
    table = src_root / CSV_DIR / f"{seed}.csv"
    if table.is_file():  # (atomic_write makes the folder)
        atomic_write(dst_root / CSV_DIR / f"{seed}.csv", lambda tmp: shutil.copyfile(table, tmp))
    events = src_root / TENSORBOARD_DIR / seed
    if events.is_dir():
        shutil.copytree(events, dst_root / TENSORBOARD_DIR / seed, dirs_exist_ok=True)


class RoundLog:
    """Every sink asked for, fed the same scalars after each round."""

    def __init__(self, sinks: list):
        self.sinks = sinks

    def write(self, run, record: dict) -> None:
        scalars = round_scalars(run, record)
        for sink in self.sinks:
            sink.write(int(record["round"]), scalars)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


class TensorBoardRounds:
    """Scalars as TensorBoard event files in ``folder``, flushed after every round (a killed run keeps them)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.writer = None

    def write(self, round_index: int, scalars: dict) -> None:
        if self.writer is None:
            self.writer = self._open(round_index)
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, global_step=round_index)
        self.writer.flush()

    def _open(self, first_round: int):
        from torch.utils.tensorboard import SummaryWriter

        # events an earlier, killed run logged from this round on are hidden: the rounds are trained again
        purge = first_round if self.folder.is_dir() else None
        return SummaryWriter(log_dir=str(self.folder), purge_step=purge)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class CsvRounds:
    """One row per round in ``path``; a column per tag, in the order the tags first appeared."""

    def __init__(self, path: Path):
        self.path = path
        self.rows: list[dict] | None = None

    def write(self, round_index: int, scalars: dict) -> None:
        if self.rows is None:
            self.rows = [r for r in self._read() if int(r["round"]) < round_index]
        self.rows.append({"round": round_index, **scalars})
        columns = list(dict.fromkeys(k for row in self.rows for k in row))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        atomic_write_text(self.path, buf.getvalue())

    def _read(self) -> list[dict]:
        """The rows an earlier (killed, now resumed) run of this seed wrote, or none."""
        if not self.path.is_file():
            return []
        with open(self.path, newline="") as f:
            return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]

    def close(self) -> None:
        pass
