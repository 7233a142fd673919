"""Which store keeps the clients' private states when the run leaves the choice to the package
(``--private-store auto``, the default).

The in-memory compact store is the fastest, and its tables are the states' own bytes; but they grow with the
population (35,598 FedVLR routers are 1.75 GB, more than the libraries, the data and a chunk's work together).
The file store keeps the same tables in files under ``$TMPDIR`` and holds one chunk of clients in memory, for the
same numbers. ``auto`` takes the file store once the population's states reach :data:`FILE_STORE_FROM_BYTES`,
where they would be the larger part of the process, and only where files help: the folder is on a disk (not a
tmpfs, whose files are memory) with room for the tables, and the platform has positioned reads.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import numpy as np

from .file_store import memory_file_system

#: population state size from which ``auto`` keeps the states in files (torch's import alone is about 0.5 GB, so
#: below this the states are not what sets a run's peak memory, and the memory store's faster first round wins)
FILE_STORE_FROM_BYTES = 1 << 30
#: disk room ``auto`` wants beyond the tables themselves before it puts them in files
DISK_HEADROOM = 1.1
#: the lines :func:`say_once` has printed in this process
_SAID: set[str] = set()


def private_state_bytes(bb, n_clients: int, dtype_bytes: int = 4) -> int:
    """The bytes of ``n_clients`` clients' private states (float32 by default), from the backbone's specs."""
    per_client = sum(int(np.prod(s.shape)) if s.shape else 1 for s in bb.all_specs() if not s.shared)
    return int(per_client) * int(n_clients) * int(dtype_bytes)


def choose_private_store(setting: str, state_bytes: int, folder: str | None = None) -> tuple[str, str | None]:
    """The store a run uses and, where ``auto`` decided on a population of :data:`FILE_STORE_FROM_BYTES` or more,
    one line saying where its states go and why (None otherwise). ``setting`` itself unless it is ``auto``; then
    ``file`` where the states reach the threshold and ``folder`` (default: the temporary folder) can hold them on
    disk, else ``memory``."""
    if setting != "auto" or state_bytes < FILE_STORE_FROM_BYTES:
        return ("memory" if setting == "auto" else setting), None
    folder = folder or tempfile.gettempdir()
    size = f"{state_bytes / 2**30:.2f} GiB"
    memory = f"private states: {size} kept in memory (--private-store auto), as"
    if not hasattr(os, "preadv"):
        return "memory", f"{memory} this platform has no positioned file reads"
    kind = memory_file_system(folder)
    if kind is not None:
        return "memory", (
            f"{memory} {folder} is a {kind} (memory); set TMPDIR to a folder on a disk to keep them in files"
        )
    try:
        free = shutil.disk_usage(folder).free
    except OSError as exc:
        return "memory", f"{memory} {folder} cannot be read ({exc.strerror})"
    if free < DISK_HEADROOM * state_bytes:
        return "memory", (
            f"{memory} {folder} has {free / 2**30:.2f} GiB free; set TMPDIR to a folder with more "
            "room to keep them in files"
        )
    return "file", (
        f"private states: {size} in files under {folder} (--private-store auto; --private-store memory "
        "keeps them in memory)"
    )


def say_once(line: str) -> None:
    """Print ``line`` on stderr unless this process already has (a run of several seeds, or a tuning grid,
    makes the same choice for every run)."""
    if line not in _SAID:
        _SAID.add(line)
        print(line, file=sys.stderr)
