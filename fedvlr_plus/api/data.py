"""``load``: a data source, read and split, ready for an experiment."""

from __future__ import annotations

import os


def load(
    source: str | os.PathLike,
    *,
    split: str = "auto",
    k_core: int = 0,
    implicit_threshold: float | None = None,
    seed: int = 0,
):
    """Read ``source`` (``"ml-100k"``, a folder or a file; the format is detected) and split it, as ``run`` does.

    ``split="auto"`` keeps the data's own split labels when it has them, else leave-one-out by time (last
    interaction = test, second-to-last = validation); also ``"loo"``, ``"ratio"``, ``"cold-items"``,
    ``"cold-users"``. ``k_core`` filters users and items iteratively first; ``implicit_threshold`` keeps ratings
    at or above it as positives. Data warnings (duplicates, leaks) are printed on stderr.
    """
    from ..errors import ConfigError
    from ..run_data import SPLITS, load_and_split
    from .checks import ArgumentTypeError

    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str) or not source.strip():
        raise ArgumentTypeError(
            f"load({source!r})", "the source is a data set's name, a folder or a file", "e.g. load('ml-100k')"
        )
    if split not in SPLITS:
        raise ConfigError(f"load(split={split!r})", f"unknown split; one of {', '.join(SPLITS)}")
    if not isinstance(k_core, int) or isinstance(k_core, bool) or k_core < 0:
        raise ConfigError(f"load(k_core={k_core!r})", "must be an integer >= 0 (0: no filter)")
    data, _ = load_and_split(source, split=split, k_core=k_core, threshold=implicit_threshold, seed=seed)
    return data
