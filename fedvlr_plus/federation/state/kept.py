"""A compact store's private states kept aside in a file, to be put back later (the selected round of a
cold-start study, which trains on past it).

A store whose tables are files (:class:`~.file_store.FileStore`) holds a chunk of clients in memory, not the
population; a copy of its states taken with ``snapshot()`` would hold them all. :class:`KeptStates` writes the
snapshot's tables into a safetensors file a block at a time (:func:`~.streamed_safetensors.save_streamed`) and
restores them the way a resumed run does, a block of rows at a time, so neither the copy nor its restore holds the
population's states in memory.
"""

from __future__ import annotations

from pathlib import Path

from . import streamed_safetensors
from .streamed_safetensors import load_streamed, save_streamed


class KeptStates:
    """The states of ``store`` (a :class:`~.store.CompactStore`) as they are now, in the file ``path``
    (overwritten)."""

    def __init__(self, store, path):
        self.path = Path(path)
        params = store.snapshot(copy=False)["params"]
        self.names = list(params)
        tensors = {}
        for i, name in enumerate(self.names):  # by position: a parameter's name may hold any character
            tensors[f"{i}.clients"], tensors[f"{i}.values"] = params[name]["clients"], params[name]["values"]
        save_streamed(tensors, self.path, with_digest=False)  # (a working copy: nothing lists its checksum)

    def restore_into(self, store) -> None:
        """Put the kept states back into ``store`` (what it held since is dropped)."""
        tensors = load_streamed(self.path, on_disk_from=streamed_safetensors.ROW_BLOCK_BYTES)
        params = {
            name: {"clients": tensors[f"{i}.clients"], "values": tensors[f"{i}.values"]}
            for i, name in enumerate(self.names)
        }
        store.restore({"format": "compact", "params": params})
