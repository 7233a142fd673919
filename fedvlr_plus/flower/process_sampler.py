"""Peak memory and CPU time of a deployment's processes, sampled from ``/proc`` (Linux).

Every ``interval`` seconds the sampler reads each live process whose process group is one of the watched groups
(a SuperLink or SuperNode started in its own session, with Flower's SuperExec and the ServerApp / ClientApp
processes it starts): its peak resident memory (``VmHWM``) and its CPU time (user + system). A process that ends
between two samples loses at most ``interval`` seconds of CPU from the count; the peak memory is the kernel's.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

ROLES = ("flwr-clientapp", "flwr-serverapp", "flower-superexec", "flower-supernode", "flower-superlink")


def _role(cmdline: str) -> str:
    return next((r for r in ROLES if r in cmdline), "other")


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
    """``watch(pgid, name)`` then ``start()``; ``stop()`` returns one row per process seen."""

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
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            got = _read(entry)
            if got is None or got[0] not in self.groups:
                continue
            pgid, cmd, cpu, hwm = got
            row = self.seen.setdefault(
                int(entry), {"pid": int(entry), "group": self.groups[pgid], "role": _role(cmd), "cpu_s": 0.0}
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
        key = (r["group"], r["role"])
        agg = out.setdefault(
            key, {"group": r["group"], "role": r["role"], "processes": 0, "peak_rss_mb": 0.0, "cpu_s": 0.0}
        )
        agg["processes"] += 1
        agg["peak_rss_mb"] = max(agg["peak_rss_mb"], r.get("peak_rss_mb", 0.0))
        agg["cpu_s"] += r["cpu_s"]
    return list(out.values())
