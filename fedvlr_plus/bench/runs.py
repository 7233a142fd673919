"""``fedvlr-plus bench runs``: whole commands as a user runs them, each timed from the outside.

A round's time says little about what a user waits for: imports, loading, evaluation, tuning and seeds are most
of a command. Each case here is one ``fedvlr-plus`` command line run in a fresh process. The suite reads its
wall time, the CPU time of the process and of every worker it started (``RUSAGE_CHILDREN`` before and after),
and the phases the command recorded (:mod:`fedvlr_plus.phases`): start-up (interpreter and imports), loading,
training and evaluation; what is left is "other" (reference rankers, tables, writing).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..atomic_write import atomic_write_text
from ..phases import PHASES_ENV, STARTED_ENV
from .suite import _stderr_lines

#: the phases a command records, in the order of the table
PHASES = ("start-up", "loading", "training", "evaluation")
#: a case's run folder in its argv: a fresh temporary folder, removed after the case
RUN_DIR = "{run_dir}"


def cases(shared_data: Path) -> list[dict]:
    """Every case; ``quick`` ones are what ``--quick`` keeps. ``needs``: a data folder the case reads."""
    lfm = str(shared_data / "lfm2k")
    return [
        dict(
            id="readme-fcf",
            title="the README's main job: run ml-100k --backbone fcf --json",
            quick=True,
            argv=["run", "ml-100k", "--backbone", "fcf", "--json", "--no-progress"],
        ),
        dict(
            id="lfm2k-fedavg-3seeds",
            title="run lfm2k --backbone fedavg --seeds 3",
            needs=lfm,
            argv=["run", lfm, "--backbone", "fedavg", "--seeds", "3", "--json", "--no-progress"],
        ),
        dict(
            id="lfm2k-fedvlr-tuned-3seeds",
            title="run lfm2k --backbone fedavg --fusion fedvlr --seeds 3 (tuned)",
            needs=lfm,
            argv=["run", lfm, "--backbone", "fedavg", "--fusion", "fedvlr", "--seeds", "3", "--json", "--no-progress"],
        ),
        dict(
            id="lfm2k-fedvlr-folder",
            title="run lfm2k --backbone fedavg --fusion fedvlr --no-tune --out RUN_DIR (checkpoints as it trains)",
            needs=lfm,
            argv=[
                "run",
                lfm,
                "--backbone",
                "fedavg",
                "--fusion",
                "fedvlr",
                "--no-tune",
                "--out",
                RUN_DIR,
                "--json",
                "--no-progress",
            ],
        ),
        dict(
            id="ml100k-coldstart-items",
            title="coldstart ml-100k --cold-items 0.2 --backbone fedavg --fusion fedvlr",
            argv=[
                "coldstart",
                "ml-100k",
                "--cold-items",
                "0.2",
                "--backbone",
                "fedavg",
                "--fusion",
                "fedvlr",
                "--no-progress",
            ],
        ),
    ]


def run_case(case: dict, phases_file: Path, timeout: float | None = None) -> dict:
    """``case`` in a fresh process: exit code, wall and CPU seconds, and its phases."""
    phases_file.unlink(missing_ok=True)
    env = dict(os.environ, **{PHASES_ENV: str(phases_file), STARTED_ENV: repr(time.time())})
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedvlr-bench-") as tmp:
        argv = [str(Path(tmp) / "run") if a == RUN_DIR else a for a in case["argv"]]
        cmd = [sys.executable, "-m", "fedvlr_plus.cli", *argv]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"status": "failed", "reason": f"ran past --case-timeout {timeout:g} s"}
        wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        tail = _stderr_lines(proc.stderr)[-5:]
        return {"status": "failed", "reason": f"exit code {proc.returncode}", "stderr_tail": tail}
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"status": "ok", "wall_s": wall, "cpu_s": cpu, "phases": read_phases(phases_file, wall, cpu)}


def read_phases(path: Path, wall: float, cpu: float) -> dict:
    """Each phase's CPU seconds summed over every process, and its wall seconds in the command's own process
    (the first one to record); ``other``: what the phases leave of the whole."""
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    main_pid = lines[0]["pid"] if lines else None
    out = {p: {"wall_s": 0.0, "cpu_s": 0.0} for p in PHASES}
    for entry in lines:
        slot = out.setdefault(entry["phase"], {"wall_s": 0.0, "cpu_s": 0.0})
        slot["cpu_s"] += entry["cpu_s"]
        if entry["pid"] == main_pid:
            slot["wall_s"] += entry["wall_s"]
    out["other"] = {
        "wall_s": max(0.0, wall - sum(v["wall_s"] for v in out.values())),
        "cpu_s": max(0.0, cpu - sum(v["cpu_s"] for v in out.values())),
    }
    return out


def run_all(
    out_dir: Path,
    *,
    shared_data: Path,
    quick: bool = False,
    only=None,
    timeout: float | None = None,
    progress=lambda line: None,
) -> dict:
    """Every selected case, one after another; ``runs.json`` and ``runs.md`` rewritten after each, so a suite
    stopped part-way keeps what it measured."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "cases": []}
    for case in cases(shared_data):
        if only and case["id"] not in only:
            continue
        entry = {"id": case["id"], "title": case["title"], "argv": case["argv"]}
        if quick and not case.get("quick"):
            entry.update(status="skipped", reason="left out by --quick")
        elif case.get("needs") and not Path(case["needs"]).exists():
            entry.update(status="skipped", reason=f"{case['needs']} not found (set $FEDVLR_SHARED_DATA)")
        else:
            progress(f"bench runs: {case['id']}: fedvlr-plus {' '.join(case['argv'])}")
            entry.update(run_case(case, out_dir / f"{case['id']}.phases.jsonl", timeout))
        doc["cases"].append(entry)
        atomic_write_text(out_dir / "runs.json", json.dumps(doc, indent=1) + "\n")
        atomic_write_text(out_dir / "runs.md", markdown(doc))
    return doc


def markdown(doc: dict) -> str:
    """The cases as a table: wall, CPU, and each phase's CPU seconds with its share of the whole."""
    head = "| case | wall | CPU | " + " | ".join(f"{p} CPU" for p in (*PHASES, "other")) + " |"
    lines = [head, "|" + "---|" * (3 + len(PHASES) + 1)]
    for e in doc["cases"]:
        if e["status"] != "ok":
            lines.append(f"| {e['title']} | {e['status']}: {e.get('reason', '')} |" + " |" * (len(PHASES) + 2))
            continue
        cells = [_share(e["phases"][p]["cpu_s"], e["cpu_s"]) for p in (*PHASES, "other")]
        lines.append(f"| {e['title']} | {e['wall_s']:.1f} s | {e['cpu_s']:.1f} s | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Python {doc['python']}, {doc['cpus']} CPUs. CPU time counts every process of the command "
        "(worker processes included); each phase's CPU is summed over those processes.",
    ]
    return "\n".join(lines) + "\n"


def _share(part: float, whole: float) -> str:
    return f"{part:.1f} s ({100 * part / whole:.0f}%)" if whole > 0 else f"{part:.1f} s"
