"""``load``: a data source, read and split, ready for an experiment."""

from __future__ import annotations


def load(source: str, *, split: str = "auto", k_core: int = 0, implicit_threshold: float | None = None, seed: int = 0):
    """Read ``source`` (``"ml-100k"``, a folder or a file; the format is detected) and split it, as ``run`` does.

    ``split="auto"`` keeps the data's own split labels when it has them, else leave-one-out by time (last
    interaction = test, second-to-last = validation); also ``"loo"``, ``"ratio"``, ``"cold-items"``,
    ``"cold-users"``. ``k_core`` filters users and items iteratively first; ``implicit_threshold`` keeps ratings
    at or above it as positives. Data warnings (duplicates, leaks) are printed on stderr.
    """
    from ..run_data import load_and_split

    data, _ = load_and_split(source, split=split, k_core=k_core, threshold=implicit_threshold, seed=seed)
    return data
