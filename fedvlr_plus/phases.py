"""Where a whole command's time goes (start-up, loading, training, evaluation), for ``fedvlr-plus bench runs``.

Off unless ``$FEDVLR_PHASES`` names a file: then every phase appends one JSON line (process id, phase, wall and
CPU seconds) to it. Appends of a few dozen bytes with ``O_APPEND`` do not interleave, so worker processes (seeds
and recipes in parallel) write to the same file. When the variable is unset each call is one dictionary lookup.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager

#: the file the phases are appended to (unset: nothing is recorded)
PHASES_ENV = "FEDVLR_PHASES"
#: the wall-clock time (``time.time()``) at which the measuring process started this one
STARTED_ENV = "FEDVLR_PHASES_STARTED"

_started_up = False


def _record(phase: str, wall: float, cpu: float) -> None:
    path = os.environ.get(PHASES_ENV)
    if not path:
        return
    line = json.dumps({"pid": os.getpid(), "phase": phase, "wall_s": wall, "cpu_s": cpu}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def start_up_done() -> None:
    """The interpreter's start and the imports end here (the first data load): recorded once per process."""
    global _started_up
    if _started_up or not os.environ.get(PHASES_ENV):
        return
    _started_up = True
    started = float(os.environ.get(STARTED_ENV, time.time()))
    _record("start-up", time.time() - started, time.process_time())


@contextmanager
def phase(name: str):
    """Time the block as phase ``name`` (its wall and this process's CPU seconds)."""
    if not os.environ.get(PHASES_ENV):
        yield
        return
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        _record(name, time.perf_counter() - wall, time.process_time() - cpu)
