"""``fedvlr-plus bench suite``: every speed figure of the project measured in one run, each case in its own process.

A case's process trains a few rounds (see :mod:`.case`) and reports CPU and wall time per round and its own
CPU time and peak RSS as the operating system counts them, so the memory figure is the case's alone. Ratios are taken
against the sequential reference measured in the same run. Cases whose real
data folder is missing are skipped with the reason. The results are written as ``suite.json`` and ``suite.md``.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

#: the full-size synthetic population (the size of a large Amazon category)
SCALE_SOURCE = "synthetic:35598x18357"
#: lines of a failed case's stderr kept in ``suite.json`` (its traceback), so a run on a borrowed machine loses nothing
STDERR_TAIL_LINES = 40


def cases(shared_data: Path, scale_source: str = SCALE_SOURCE) -> list[dict]:
    """Every case of the suite; ``big`` ones are left out by ``--quick``."""
    ku, toys = str(shared_data / "ku"), str(shared_data / "amazon2014-toys")
    fvlr, resid = {"residual": False}, {"residual": True}
    return [
        dict(id="ku-fedavg-fedvlr", title="KU round, FedAvg + FedVLR", source=ku, backbone="fedavg", fusion=fvlr,
             rounds=5, sequential_rounds=3),
        dict(id="ku-fedavg", title="KU round, FedAvg alone", source=ku, backbone="fedavg", rounds=5,
             sequential_rounds=3),
        # the router's cost: the same views fused by one fixed sum, and routed over the fusion operators
        dict(id="ku-fedavg-sum", title="KU round, FedAvg + --fusion sum", source=ku, backbone="fedavg",
             fusion={"residual": False, "mode": "sum"}, rounds=5),
        dict(id="ku-fedavg-fedvlr-operators", title="KU round, FedAvg + FedVLR --router-over operators", source=ku,
             backbone="fedavg", fusion={"residual": False, "router_over": "operators"}, rounds=5),
        dict(id="ml100k-fedavg-fedvlr", title="ml-100k round, FedAvg + FedVLR (residual, text store)",
             source="ml-100k", backbone="fedavg", fusion=resid, rounds=5, sequential_rounds=2, big=True),
        dict(id="ml100k-fedavg", title="ml-100k round, FedAvg alone (+ full-sort evaluation)", source="ml-100k",
             backbone="fedavg", rounds=5, sequential_rounds=2, evaluate=True),
        *_backbone_cases(),
        dict(id="ml100k-recbole-bpr", title="ml-100k round, recbole:BPR", source="ml-100k",
             backbone="recbole:BPR", rounds=3, sequential_rounds=2),
        dict(id="scale-fedavg-fedvlr", title=f"{scale_source}, FedAvg + FedVLR (+ full-sort evaluation)",
             source=scale_source, backbone="fedavg", fusion=fvlr, rounds=2, evaluate=True, big=True),
        dict(id="scale-fedavg-fedvlr-memory", title=f"{scale_source}, FedAvg + FedVLR, private states in memory "
             "(+ full-sort evaluation)", source=scale_source, backbone="fedavg", fusion=fvlr, rounds=2,
             evaluate=True, private_store="memory", big=True),
        dict(id="scale-fedavg", title=f"{scale_source}, FedAvg alone", source=scale_source, backbone="fedavg",
             rounds=3, big=True),
        dict(id="toys-fedavg-fedvlr", title="Amazon 2014 Toys (19,412 real clients), FedAvg + FedVLR (+ full-sort "
             "evaluation)", source=toys, backbone="fedavg", fusion=fvlr, rounds=4, evaluate=True, big=True),
    ]


#: the package's own backbones beside FedAvg, each timed alone and with the layer on ml-100k
OTHER_BACKBONES = ("fedncf", "fcf", "pfedrec", "fedrap")


def _backbone_cases() -> list[dict]:
    """Every backbone of the package on ml-100k, alone and with the FedVLR layer (big: the layer encodes the
    catalogue's text once, and a FedNCF round is seconds)."""
    out = []
    for bb in OTHER_BACKBONES:
        out.append(dict(id=f"ml100k-{bb}", title=f"ml-100k round, {bb} alone", source="ml-100k", backbone=bb,
                        rounds=3, big=True))
        out.append(dict(id=f"ml100k-{bb}-fedvlr", title=f"ml-100k round, {bb} + FedVLR", source="ml-100k",
                        backbone=bb, fusion={"residual": False}, rounds=3, big=True))
    return out


def _missing_reason(case: dict) -> str | None:
    src = case["source"]
    if src.startswith("synthetic:") or src == "ml-100k" or Path(src).exists():
        return None
    return f"real data folder {src} not found (set FEDVLR_SHARED_DATA)"


def run_case(case: dict, timeout: float | None = None) -> dict:
    """``case`` measured in a fresh Python process: its JSON plus the process's CPU time and peak RSS."""
    env = dict(os.environ, OMP_NUM_THREADS=str(case.get("threads", 1)), MKL_NUM_THREADS=str(case.get("threads", 1)))
    cmd = [sys.executable, "-m", "fedvlr_plus.bench.case", json.dumps(case)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        tail = _stderr_lines(proc.communicate()[1])[-STDERR_TAIL_LINES:]
        return {"status": "failed", "reason": f"ran past --case-timeout {timeout:g} s", "stderr_tail": tail}
    wall = time.perf_counter() - t0
    return _result(proc.returncode, out, err, wall)


def _stderr_lines(err: str) -> list[str]:
    """A case's stderr without its blank lines."""
    return [ln for ln in err.strip().splitlines() if ln.strip()]


def _result(code: int, out: str, err: str, wall: float) -> dict:
    if code != 0:
        lines = _stderr_lines(err)
        reason = lines[-1][:300] if lines else f"exit code {code}"
        return {"status": "failed", "reason": reason, "stderr_tail": lines[-STDERR_TAIL_LINES:]}
    res = json.loads(out.strip().splitlines()[-1])
    res.update(status="ok", process_wall_s=wall)
    return res


def run_suite(out_dir: Path, *, shared_data: Path, quick: bool = False, only=None, scale_source: str = SCALE_SOURCE,
              device: str | None = None, case_timeout: float | None = None, sequential: bool = True,
              progress=print) -> dict:
    """Measure every (selected) case, write ``suite.json`` and ``suite.md`` under ``out_dir``; return the JSON.

    Both files are rewritten after every case, so a suite stopped part-way keeps the cases it measured; a case
    that runs past ``case_timeout`` seconds is stopped and recorded as failed, and the suite goes on."""
    doc = {"suite": "fedvlr-plus bench suite", "quick": bool(quick), "sequential": bool(sequential),
           "python": sys.version.split()[0], "device": device or "cpu", "accelerator": _accelerator(device),
           "kernels": None, "cases": []}
    _write(Path(out_dir), doc)   # then after every case: a suite stopped part-way keeps what it measured
    for case in cases(shared_data, scale_source):
        if only and case["id"] not in only:
            continue
        if device:
            case["device"] = device
        if not sequential:
            case["sequential_rounds"] = 0
        entry = {"id": case["id"], "title": case["title"], "case": case}
        reason = "left out by --quick" if quick and case.get("big") else _missing_reason(case)
        if reason:
            entry.update(status="skipped", reason=reason)
        else:
            if doc["kernels"] is None and case.get("big") and case.get("fusion"):   # a population's initial draw
                progress("bench suite: preparing the compiled kernels (initial draw, steps) ...")
                doc["kernels"] = prepare_kernels()
            progress(f"bench suite: {case['id']} ...")
            entry.update(run_case(case, timeout=case_timeout))
            if entry["status"] == "failed":
                progress(f"bench suite: {case['id']} failed: {entry['reason']}")
        doc["cases"].append(entry)
        _write(Path(out_dir), doc)
    return doc


def _write(out_dir: Path, doc: dict) -> None:
    from ..atomic_write import atomic_write_text
    from ..jsonio import write_json_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / "suite.json", doc)
    atomic_write_text(out_dir / "suite.md", markdown(doc))


def _accelerator(device: str | None) -> str | None:
    """The GPU's name where the suite runs on one (``cuda``, or ``auto`` on a machine that has one)."""
    if device not in ("cuda", "auto"):
        return None
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def prepare_kernels() -> dict:
    """Compile (once per installation) or load the numba kernels of the initial draw, the steps, the schedule, the
    layer's factor and the evaluation in a process of their own, before the cases: a case's round 1 and evaluation
    then show what every run pays, and the one-time compilation is reported apart."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c",
                           "from fedvlr_plus.federation.simulation.rng import prepare_kernels as p; "
                           "from fedvlr_plus.federation.simulation.indexed_rows import prepare_kernels as q; "
                           "from fedvlr_plus.evaluation.row_ranks import prepare_kernels as r; "
                           "from fedvlr_plus.federation.simulation.schedule import prepare_kernels as s; "
                           "from fedvlr_plus.fedvlr.closed_form import prepare_kernels as t; "
                           "from fedvlr_plus.fedvlr.neumf_steps import prepare_kernels as u; "
                           "print(p() and q() and r() and s() and t() and u())"], capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"available": proc.returncode == 0 and proc.stdout.strip() == "True", "cpu_s": cpu}


def _fmt(x, unit="s") -> str:
    return "—" if x is None else f"{x:.3f} {unit}" if x < 10 else f"{x:.1f} {unit}"


def _cpu(summary: dict, which: str) -> str:
    """CPU time, with its system part where it is large (first touches of fresh memory are the kernel's work)."""
    cpu, sys_s = summary[f"{which}_cpu_s"], summary.get(f"{which}_sys_s")
    return _fmt(cpu) + (f" ({_fmt(sys_s)} sys)" if sys_s is not None and sys_s >= 0.1 * cpu and sys_s >= 0.05 else "")


def _memory(entry: dict) -> str:
    """Peak RSS, and the GPU's peak allocation where the case ran on one."""
    gpu = entry.get("peak_gpu_mb")
    return f"{entry['peak_rss_mb'] / 1024:.2f} GB" + (f" (GPU {gpu / 1024:.2f} GB)" if gpu is not None else "")


def _size(n) -> str:
    """Bytes as B, KB or MB (cases measured before the columns existed show a dash)."""
    if n is None:
        return "—"
    return f"{n:,.0f} B" if n < 2**10 else f"{n / 2**10:.1f} KB" if n < 2**20 else f"{n / 2**20:.1f} MB"


def markdown(doc: dict) -> str:
    """The suite as a Markdown table (CPU time, one thread; round 1 and the median of later rounds)."""
    lines = ["| case | round 1 CPU | later round CPU (median) | wall (later) | sequential CPU | ratio (CPU) "
             "| full-sort eval CPU | peak RSS | private state / client | upload / client |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for e in doc["cases"]:
        if e["status"] != "ok":
            lines.append(f"| {e['title']} | {e['status']}: {e.get('reason', '')} |  |  |  |  |  |  |  |  |")
            continue
        b, q = e["batched"], e.get("sequential")
        ratio = f"{e['speedup_cpu']:.1f}x" if "speedup_cpu" in e else "—"
        lines.append(f"| {e['title']} | {_cpu(b, 'round1')} | {_cpu(b, 'later')} "
                     f"| {_fmt(b['later_wall_s'])} | {_fmt(q['later_cpu_s']) if q else '—'} | {ratio} "
                     f"| {_fmt(e.get('eval_full_cpu_s'))} | {_memory(e)} | {_size(e.get('private_bytes_per_client'))} "
                     f"| {_size(e.get('upload_bytes_per_client'))} |")
    device, gpu = doc.get("device", "cpu"), doc.get("accelerator")
    if device != "cpu":
        lines += ["", f"Every case trained and scored its chunks on the {gpu} (`--device {device}`); CPU time is "
                  "the host's share, so wall time is the figure to read." if gpu else
                  f"`--device {device}` found no CUDA device: every case ran on the CPU."]
    k = doc.get("kernels")
    if k:
        state = ("compiled or loaded from numba's cache" if k["available"]
                 else "not available: numba is missing, so every one of them takes its numpy or torch path")
        lines += ["", "The compiled kernels (the initial draw's, the steps', the schedule's, the factor's and the "
                  f"evaluation's) were prepared before the cases ({state}; {k['cpu_s']:.1f} s CPU in their own "
                  "process, most of it when they are compiled, once per installation)."]
    return "\n".join(lines) + "\n"
