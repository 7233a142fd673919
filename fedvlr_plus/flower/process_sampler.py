"""Peak memory and CPU time of a deployment's processes, sampled from ``/proc`` (Linux).

Every ``interval`` seconds the sampler reads each live process below a watched one (a SuperLink or SuperNode, with
Flower's SuperExec and the ServerApp / ClientApp processes it starts): its peak resident memory (``VmHWM``) and its
CPU time (user + system). A process that ends
between two samples loses at most ``interval`` seconds of CPU from the count; the peak memory is the kernel's.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

ROLES = ("flwr-clientapp", "flwr-serverapp", "flower-superexec", "flower-supernode", "flower-superlink")


def _role(cmdline: str) -> str:
    return next((r for r in ROLES if r in cmdline), "other")


def parents() -> dict[int, int]:
    """``{pid: parent pid}`` of every live process (Linux ``/proc``; empty elsewhere)."""
    out = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                out[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return out


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): with the pid, it names one process, never a later one that
    reuses the number."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def descendants(root: int, known: dict[int, int] | None = None) -> dict[int, int]:
    """``{pid: start time}`` of the live processes below ``root`` and below the processes of ``known`` (same
    pid and start time) that are still alive, which may have been orphaned since: Flower starts some of its
    children in sessions of their own, so a process group does not hold them all."""
    tree: dict[int, list[int]] = {}
    for pid, ppid in parents().items():
        tree.setdefault(ppid, []).append(pid)
    alive = [p for p, t in (known or {}).items() if start_time(p) == t]
    found: dict[int, int] = {}
    todo = [int(root), *alive]
    while todo:
        for child in tree.get(todo.pop(), []):
            started = start_time(child)
            if child not in found and started is not None:
                found[child] = started
                todo.append(child)
    return found


def _read(pid: str) -> tuple[int, str, float, int] | None:
    """``(pgid, cmdline, cpu seconds, peak RSS bytes)`` of a live process, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{pid}/status").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    if stat[0] == "Z":
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    hwm = next((int(x.split()[1]) * 1024 for x in status.splitlines() if x.startswith("VmHWM:")), 0)
    return int(stat[2]), cmd, (int(stat[11]) + int(stat[12])) / ticks, hwm


class ProcessSampler:
    """``watch(pid, name)`` then ``start()``; ``stop()`` returns one row per process seen (``pid`` and every
    process below it, also those Flower starts in a session of their own)."""

    def __init__(self, interval: float = 0.2):
        self.interval = float(interval)
        self.groups: dict[int, str] = {}
        self.seen: dict[int, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def watch(self, pgid: int, name: str) -> None:
        self.groups[int(pgid)] = name

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        for root, name in self.groups.items():
            known = {pid: row["start"] for pid, row in self.seen.items() if row["group"] == name}
            for pid in {root, *descendants(root, known)}:
                got = _read(str(pid))
                if got is None:
                    continue
                self._update(pid, name, *got[1:])

    def _update(self, pid: int, name: str, cmd: str, cpu: float, hwm: int) -> None:
        row = self.seen.setdefault(
            pid, {"pid": pid, "group": name, "role": _role(cmd), "cpu_s": 0.0, "start": start_time(pid)}
        )
        row["cpu_s"] = max(row["cpu_s"], cpu)
        row["peak_rss_mb"] = max(row.get("peak_rss_mb", 0.0), hwm / 2**20)

    def stop(self) -> list[dict]:
        self.sample()
        self._stop.set()
        self._thread.join(timeout=5.0)
        return sorted(self.seen.values(), key=lambda r: (r["group"], r["role"], r["pid"]))


def by_role(rows: list[dict]) -> list[dict]:
    """Per group and role: how many processes, their largest peak RSS and their summed CPU seconds."""
    out: dict[tuple, dict] = {}
    for r in rows:
        if not r.get("peak_rss_mb"):  # seen only as it started (no memory yet): a moment's helper process
            continue
        key = (r["group"], r["role"])
        agg = out.setdefault(
            key, {"group": r["group"], "role": r["role"], "processes": 0, "peak_rss_mb": 0.0, "cpu_s": 0.0}
        )
        agg["processes"] += 1
        agg["peak_rss_mb"] = max(agg["peak_rss_mb"], r.get("peak_rss_mb", 0.0))
        agg["cpu_s"] += r["cpu_s"]
    return list(out.values())
