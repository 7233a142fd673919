"""What a folder holds that the report can show, read without training or scoring anything.

Three kinds of folder are recognised by their ``result.json``: a ``run`` folder (``fedvlr-plus run --out``; a
federated run adds its seeds' histories and, with the FedVLR layer, the router report), a ``coldstart`` report
folder and an ``experiment paper-table`` folder. Beside the result the report takes the CSV tables and PNG plots
those commands write, and a run's per-round logs (``rounds/seed-<s>.csv``, ``--log csv``).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import RunFolderError

_WHICH = "pass the --out folder of fedvlr-plus run, coldstart or experiment paper-table"
#: the tables coldstart and paper-table write (per_user_test.csv, which can hold every user, is not shown)
TABLE_FILES = ("cold_items.csv", "user_coldstart.csv", "sparsity.csv", "table.csv")


@dataclass
class FolderContents:
    """A run or report folder as the report sees it."""

    folder: Path
    kind: str  # run | coldstart | paper-table
    result: dict
    #: seed -> the seed's per-round history (federated runs)
    histories: dict[int, list[dict]] = field(default_factory=dict)
    #: seed -> the router report at the seed's selected round (runs with the FedVLR layer)
    routers: dict[int, dict] = field(default_factory=dict)
    #: seed -> the rows of ``rounds/seed-<s>.csv`` (``--log csv``), values as floats
    round_logs: dict[int, list[dict]] = field(default_factory=dict)
    #: file name -> rows (dicts of strings) of the folder's TABLE_FILES
    tables: dict[str, list[dict]] = field(default_factory=dict)
    #: file name -> bytes of the PNG plots the folder holds
    images: dict[str, bytes] = field(default_factory=dict)


def gather(folder) -> FolderContents:
    """Everything the report shows from ``folder``; a folder that holds no finished run or report is refused as
    one line naming it."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RunFolderError(str(folder), "no such folder", _WHICH)
    result = _read_result(folder)
    kind = folder_kind(result)
    if kind is None:
        raise RunFolderError(
            str(folder / "result.json"), "is not the result of a run, a coldstart or a paper-table", _WHICH
        )
    contents = FolderContents(folder, kind, result)
    contents.tables = {name: _read_csv(folder / name) for name in TABLE_FILES if (folder / name).is_file()}
    contents.images = {p.name: p.read_bytes() for p in sorted(folder.glob("*.png"))}
    if kind == "run":
        contents.histories = seed_histories(folder, result)
        contents.routers = seed_routers(result)
        contents.round_logs = {
            int(p.stem.split("-", 1)[1]): _float_rows(_read_csv(p)) for p in sorted(folder.glob("rounds/seed-*.csv"))
        }
    return contents


def folder_kind(result: dict) -> str | None:
    """``run``, ``coldstart`` or ``paper-table`` from the keys of a folder's ``result.json``; None for another."""
    if "rows" in result and "paired_tests" in result:
        return "paper-table"
    if any(key in result for key in ("cold_among_cold", "user_coldstart", "cold_rule")):
        return "coldstart"
    if "backbone" in result and ("test" in result or "baselines" in result):
        return "run"
    return None


def _read_result(folder: Path) -> dict:
    path = folder / "result.json"
    if not path.is_file():
        unfinished = any(folder.glob("seed-*/checkpoint-*.json"))
        why = "holds no result.json: the run has not finished" if unfinished else "holds no result.json"
        raise RunFolderError(str(folder), why, "resume it with --resume" if unfinished else _WHICH)
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise RunFolderError(str(path), f"is not valid JSON ({exc})", _WHICH) from None
    if not isinstance(result, dict):
        raise RunFolderError(str(path), "is not a JSON object", _WHICH)
    return result


def seed_histories(folder: Path, result: dict) -> dict[int, list[dict]]:
    """Each seed's history: from its own ``seed-<s>/result.json`` (the engine's record), else from the summary's
    ``per_seed`` or ``history``."""
    out = {}
    for path in sorted(folder.glob("seed-*/result.json")):
        try:
            seed_result = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue  # the summary's copy below is used instead
        if isinstance(seed_result.get("history"), list):
            out[int(seed_result.get("seed", path.parent.name.split("-", 1)[1]))] = seed_result["history"]
    for seed_result in result.get("per_seed") or []:
        if isinstance(seed_result, dict) and isinstance(seed_result.get("history"), list):
            out.setdefault(int(seed_result.get("seed", 0)), seed_result["history"])
    if not out and isinstance(result.get("history"), list):
        out[int(result.get("seed", 0))] = result["history"]
    return dict(sorted(out.items()))


def seed_routers(result: dict) -> dict[int, dict]:
    """Seed -> router report, from the result's ``router`` (one seed's report, or ``per_seed`` for several)."""
    router = result.get("router")
    if not isinstance(router, dict) or not (router.get("experts") or router.get("per_seed")):
        return {}
    if isinstance(router.get("per_seed"), dict):
        return {int(s): r for s, r in sorted(router["per_seed"].items(), key=lambda kv: int(kv[0])) if r}
    return {int(result.get("seed", 0)): router}


def _read_csv(path: Path) -> list[dict]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise RunFolderError(str(path), f"cannot be read as CSV ({exc})") from None


def _float_rows(rows: list[dict]) -> list[dict]:
    """Rows of a per-round log with their numbers as floats (empty cells left out)."""
    out = []
    for row in rows:
        try:
            out.append({k: float(v) for k, v in row.items() if v not in ("", None)})
        except ValueError:
            continue  # a row that is not numbers is not a round
    return out
