"""``fedvlr-plus flower drill``: a deployment on this machine's loopback, measured beside the in-process run.

It starts a SuperLink and K SuperNodes (partition i of K each), submits the Flower App with the given settings,
waits for the result, and runs the same settings in-process (``FederatedRun``, in a process of its own). It writes
``drill.json`` in the output folder: per round the seconds of training and evaluation (sent to aggregated, as the
ServerApp measured them), the bytes each node sent and received, where a node's time went (process start and
Flower's set-up, building the node's run, restoring its states, training, saving), peak RSS and CPU seconds per
process, the wall and CPU time of both runs and both runs' figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import tomllib

from ..atomic_write import make_dirs
from ..errors import UserError
from ..jsonio import write_json_atomic
from .deploy import run_command, submitted_run, superlink_command, supernode_command, wait_for_result, write_connection
from .process_sampler import ProcessSampler, by_role


def app_config(app_dir: str, overrides: dict) -> dict:
    """The run config a deployment of ``app_dir`` with ``overrides`` runs with (the app's defaults first)."""
    from .deploy import _toml_value

    conf = tomllib.loads((Path(app_dir) / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    # values as Flower reads them from --run-config: TOML, so "16" is a number and "fedvlr" a string
    typed = {k: tomllib.loads(f"v = {_toml_value(str(v))}")["v"] for k, v in overrides.items()}
    return {**conf, **typed}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout: float = 60.0) -> None:
    import socket

    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the SuperLink did not listen on 127.0.0.1:{port} within {timeout:.0f} s")


class LoopbackFederation:
    """A SuperLink and K SuperNodes on 127.0.0.1, each in its own session, logs and homes under ``root``."""

    def __init__(self, root: Path, nodes: int, env: dict):
        self.root, self.nodes, self.env = root, int(nodes), env
        self.procs: dict[str, subprocess.Popen] = {}
        self.sampler = ProcessSampler()
        self.port = _free_port()

    def _start(self, name: str, cmd: list[str], env: dict) -> None:
        home = make_dirs(self.root / f"home-{name}")
        with open(self.root / f"{name}.log", "ab") as log:
            p = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=home,
                start_new_session=True,
                env={**env, "FLWR_HOME": str(home)},
            )
        self.procs[name] = p
        self.sampler.watch(p.pid, name)

    def start(self, node_threads: int) -> None:
        self._start("superlink", superlink_command(port=self.port, insecure=True), self.env)
        _wait_port(self.port)
        node_env = {**self.env, "OMP_NUM_THREADS": str(node_threads), "MKL_NUM_THREADS": str(node_threads)}
        for i in range(self.nodes):
            cmd = supernode_command(
                superlink=f"127.0.0.1:{self.port}",
                partition=(i, self.nodes),
                runtime_port=_free_port(),
                insecure=True,
                state_dir=str(self.root / f"state-{i}"),
            )
            self._start(f"supernode-{i}", cmd, node_env)
        self.sampler.start()

    def submit(self, app_dir: str, config: dict) -> int:
        home = self.root / "home-cli"
        write_connection(home, f"127.0.0.1:{self.port}", insecure=True)
        proc = subprocess.run(
            run_command(app_dir, config=config),
            env={**self.env, "FLWR_HOME": str(home)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        return int(submitted_run(proc.stdout, proc.stderr, proc.returncode, app_dir).get("run-id", 0))

    def close(self) -> list[dict]:
        rows = self.sampler.stop()
        for p in self.procs.values():
            for sig in (15, 9):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                time.sleep(1.0 if sig == 15 else 0.0)
            p.wait(timeout=30)
        return rows


def node_times(root: Path, run_id: int, nodes: int) -> list[dict]:
    """Per node and training round, from the node's journal: seconds from the ClientApp process start to the
    handler (interpreter, imports, Flower's set-up), building the node's run, restore, training, saving."""
    out = []
    for i in range(nodes):
        journal = root / f"state-{i}" / f"journal-run{run_id}-part{i}of{nodes}.jsonl"
        if not journal.exists():
            continue
        for line in journal.read_text().splitlines():
            e = json.loads(line)
            if e["event"] != "fit-done":
                continue
            start = e["handler_started"] - e["process_started"] if e.get("process_started") else None
            out.append(
                {
                    "node": i,
                    "round": e["round"],
                    "process_start_s": start,
                    **{k: e[k] for k in ("build_s", "restore_s", "train_s", "save_s")},
                }
            )
    return out


def in_process(config: dict) -> dict:
    """The same settings through ``FederatedRun`` in a fresh process: its result, wall and CPU seconds, peak RSS."""
    code = (
        "import json,sys,time;from fedvlr_plus.flower.drill import _in_process_main;"
        "print(json.dumps(_in_process_main(json.loads(sys.argv[1]))))"
    )
    started = time.time()
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(config)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError("flower drill", f"the in-process run failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_s"] = time.time() - started
    return out


def _in_process_main(config: dict) -> dict:
    import resource

    from ..federation.engine import FederatedRun
    from .settings import Settings, build_backbone, load_data

    s = Settings.from_run_config(config)
    data = load_data(s.data, s.max_users)
    run = FederatedRun(data, build_backbone(data, s), s.cfg, progress=False)
    res = run.run()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "result": {k: res.get(k) for k in ("selected_round", "valid", "test", "test_warm", "test_cold")},
        "history": [{k: h.get(k) for k in ("round", "loss", "train_seconds", "eval_seconds")} for h in res["history"]],
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mb": usage.ru_maxrss / 1024,
    }


def run_drill(
    source: str,
    nodes: int,
    rounds: int,
    out: Path,
    *,
    app_dir: str,
    overrides: dict,
    timeout: float,
    task_poll: float,
    progress=print,
) -> dict:
    """Deploy, wait, measure, then the in-process run of the same settings; ``drill.json`` in ``out``."""
    out = make_dirs(out)
    config = {
        "data": source,
        "rounds": rounds,
        "eval-every": rounds,
        "min-train-nodes": nodes,
        "min-evaluate-nodes": nodes,
        "min-available-nodes": nodes,
        "result": str(out / "result.json"),
        **overrides,
    }
    env = {
        **os.environ,
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": str(task_poll),
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    }
    fed = LoopbackFederation(out, nodes, env)
    threads = max(1, (os.cpu_count() or 1) // nodes)
    try:
        fed.start(threads)
        started = time.time()
        run_id = fed.submit(app_dir, config)
        result = wait_for_result(
            config["result"], timeout, procs=list(fed.procs.values()), progress=progress, every=30.0
        )
        wall = time.time() - started
    finally:
        rows = fed.close()
    progress("deployment done; now the same settings in-process")
    local = in_process(app_config(app_dir, config))
    report = _report(source, nodes, rounds, threads, task_poll, config, wall, result, rows, out, run_id, local)
    report["largest_metric_difference"] = largest_difference(report["deployment"]["result"], local["result"])
    write_json_atomic(out / "drill.json", report)
    return report


def _report(source, nodes, rounds, threads, task_poll, config, wall, result, rows, out, run_id, local) -> dict:
    return {
        "source": source,
        "nodes": nodes,
        "rounds": rounds,
        "threads_per_node": threads,
        "superexec_task_poll_s": task_poll,
        "config": config,
        "deployment": {
            "wall_s": wall,
            "cpu_s": sum(r["cpu_s"] for r in rows),
            "result": {k: result.get(k) for k in ("selected_round", "valid", "test", "test_warm", "test_cold")},
            "history": result.get("history"),
            "node_times": node_times(out, run_id, nodes),
            "processes": by_role(rows),
        },
        "in_process": local,
    }


def largest_difference(a: dict, b: dict) -> float | None:
    """The largest absolute difference between two results' figures (valid, test, test warm / cold)."""
    diffs = [
        abs(float(v) - float(b[p][k]))
        for p in ("valid", "test", "test_warm", "test_cold")
        for k, v in (a.get(p) or {}).items()
        if isinstance(v, (int, float)) and isinstance((b.get(p) or {}).get(k), (int, float))
    ]
    return max(diffs) if diffs else None


def render(report: dict) -> str:
    """The drill as a few lines: per round, then per process role, then wall/CPU and the figures side by side."""
    d, local = report["deployment"], report["in_process"]
    lines = [
        f"{report['source']}: {report['nodes']} SuperNodes, {report['rounds']} rounds "
        f"({report['threads_per_node']} threads per node)",
        f"{'round':>5} {'train s':>8} {'eval s':>7} {'in-proc train s':>16} {'MB up per node':>15} {'MB down':>8}",
    ]
    local_rounds = {h["round"]: h for h in local["history"]}
    for h in d["history"] or []:
        up = "/".join(f"{b / 2**20:.1f}" for b in (h.get("bytes_up") or {}).values())
        lr = local_rounds.get(h["round"], {})
        lines.append(
            f"{h['round']:>5} {h.get('train_seconds', 0):>8.2f} {h.get('eval_seconds') or 0:>7.2f} "
            f"{lr.get('train_seconds') or 0:>16.2f} {up:>15} {(h.get('bytes_down') or 0) / 2**20:>8.1f}"
        )
    lines.append(
        "node time per training message, median over rounds (s): process start + Flower set-up / build /"
        " restore / train / save"
    )
    stages = ("process_start_s", "build_s", "restore_s", "train_s", "save_s")
    for node in sorted({t["node"] for t in d["node_times"]}):
        mine = [t for t in d["node_times"] if t["node"] == node]
        med = [float(np.median([t[k] or 0.0 for t in mine])) for k in stages]
        lines.append(f"  node {node}: " + " / ".join(f"{v:.2f}" for v in med) + f"  ({len(mine)} rounds)")
    for p in d["processes"]:
        lines.append(
            f"  {p['group']:<12} {p['role']:<17} x{p['processes']:<3} peak RSS {p['peak_rss_mb']:>7.0f} MB"
            f"  CPU {p['cpu_s']:>7.1f} s"
        )
    lines.append(
        f"deployment: wall {d['wall_s']:.1f} s, CPU {d['cpu_s']:.1f} s (all processes) | in-process: wall "
        f"{local['wall_s']:.1f} s, CPU {local['cpu_s']:.1f} s, peak RSS {local['peak_rss_mb']:.0f} MB"
    )
    for part in ("valid", "test"):
        dep, loc = d["result"].get(part) or {}, local["result"].get(part) or {}
        lines.append(
            f"{part:<6} "
            + "  ".join(f"{k} {dep.get(k, float('nan')):.4f}/{loc.get(k, float('nan')):.4f}" for k in sorted(dep))
            + "  (deployment/in-process)"
        )
    lines.append(f"largest difference of a figure: {report['largest_metric_difference']}")
    return "\n".join(lines)
