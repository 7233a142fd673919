"""``load``: a data source, read and split, ready for an experiment."""
from __future__ import annotations


def load(source: str, *, split: str = "auto", k_core: int = 0, implicit_threshold: float | None = None,
         seed: int = 0):
    """Read ``source`` (``"ml-100k"``, a folder or a file; the format is detected) and split it.

    ``split="auto"`` keeps the data's own split labels when it has them, else leave-one-out by time (last
    interaction = test, second-to-last = validation); also ``"loo"``, ``"ratio"``, ``"cold-items"``,
    ``"cold-users"``. ``k_core`` filters users and items iteratively first; ``implicit_threshold`` keeps ratings
    at or above it as positives.
    """
    from ..datasets import load as read
    from ..datasets import splits

    data = read(source)
    if split == "auto":
        split = "predefined" if data.is_split else "loo"
    if split == "predefined":
        data = splits.predefined(data)
    else:
        data = splits.standard(data, threshold=implicit_threshold, k=k_core, split=split, seed=seed)
    data.require_split(need=("train", "valid", "test"))
    return data
