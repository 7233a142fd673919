"""Where the simulator computes: ``--device cpu|cuda|auto``.

The simulator moves each chunk's tensors to the device, trains and scores there, and hands results back on the
CPU (the store, the strategies and the evaluation's bookkeeping stay on the CPU), so a CUDA machine speeds up the
chunk work without changing anything else. Numbers on a GPU differ from the CPU's in the last bits (other kernels).
"""

from __future__ import annotations

import torch

from ..errors import ConfigError

DEVICES = ("cpu", "cuda", "auto")


def resolve_device(name: str | None) -> torch.device:
    """The torch device ``name`` means here (``auto``: CUDA when it is available, else the CPU); asking for CUDA
    on a machine without it is a :class:`~fedvlr_plus.errors.ConfigError`."""
    name = (name or "cpu").strip().lower()
    if name not in DEVICES:
        raise ConfigError(f"--device {name}", "unknown device", "choose cpu, cuda or auto")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        raise ConfigError(
            "--device cuda",
            f"CUDA is not available on this machine ({why})",
            "use --device cpu, or --device auto to take a GPU only where there is one",
        )
    return torch.device(name)
