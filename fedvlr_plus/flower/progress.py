"""Where a deployment stands, for whoever waits on it: the ServerApp writes ``<result>.progress.json`` (atomically)
when a round's messages go out and when its replies are in; ``fedvlr-plus flower run --wait`` reads it and prints
one line per change. Nothing here imports flwr or torch (the command line reads it)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..jsonio import write_json_atomic


def progress_path(result: str | Path) -> Path:
    return Path(result).with_suffix(".progress.json")


class ProgressFile:
    """The ServerApp's side: ``stage`` (train / evaluate) of round ``round`` of ``rounds``, the nodes asked and
    the nodes that replied, and the seconds since the stage began."""

    def __init__(self, result: str, rounds: int):
        self.path = progress_path(result) if result else None
        self.rounds = int(rounds)
        self.started = time.time()
        self._stage_started = self.started
        self._last: dict | None = None

    def sent(self, round_index: int, stage: str, nodes: int) -> None:
        self._stage_started = time.time()
        self._write({"round": int(round_index), "stage": stage, "nodes": int(nodes), "replied": None})

    def arrived(self, received: int, expected: int) -> None:
        """More replies of the current stage are in (``received`` of ``expected``)."""
        if self.path is None or self._last is None or self._last.get("replied") is not None:
            return
        self._write({**self._last, "arrived": int(received), "nodes": int(expected)})

    def replied(self, round_index: int, stage: str, nodes: int, replied: int, **figures) -> float:
        """Record the stage's replies; return its seconds (sent to aggregated)."""
        seconds = time.time() - self._stage_started
        self._write(
            {
                "round": int(round_index),
                "stage": stage,
                "nodes": int(nodes),
                "replied": int(replied),
                "seconds": seconds,
                **figures,
            }
        )
        return seconds

    def _write(self, entry: dict) -> None:
        self._last = {k: v for k, v in entry.items() if k not in ("rounds", "elapsed")}
        if self.path is None:
            return
        write_json_atomic(self.path, {"rounds": self.rounds, "elapsed": time.time() - self.started, **entry})


def read_progress(result: str | Path) -> dict | None:
    """The latest progress the ServerApp wrote for ``result`` (None: none yet, or being replaced)."""
    try:
        value = json.loads(progress_path(result).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def describe(p: dict) -> str:
    """One line: ``round 2/20 train: 3 nodes replied in 4.1 s (loss 0.6412)`` or ``... waiting for 3 nodes``."""
    head = f"round {p.get('round')}/{p.get('rounds')} {p.get('stage')}"
    if p.get("replied") is None:
        return f"{head}: {p.get('arrived', 0)} of {p.get('nodes')} nodes replied so far"
    line = f"{head}: {p['replied']} of {p.get('nodes')} nodes replied in {float(p.get('seconds', 0.0)):.1f} s"
    extra = [f"loss {p['loss']:.4f}"] if isinstance(p.get("loss"), (int, float)) else []
    extra += [f"{k} {v:.4f}" for k, v in (p.get("valid") or {}).items() if isinstance(v, (int, float))][:1]
    return line + (f" ({', '.join(extra)})" if extra else "")
