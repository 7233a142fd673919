"""The data of one run: SOURCE loaded, preprocessed and split as ``run``, ``bench`` and ``experiment`` ask.

``synthetic:USERSxITEMS`` and ``synthetic-planted:USERSxITEMS[:PREFERENCE]`` sources are generated already split
leave-one-out, so the split options cannot change them; asking for another split is refused rather than ignored.
"""

from __future__ import annotations

import sys

from .errors import ConfigError

SPLITS = ("auto", "loo", "ratio", "predefined", "cold-items", "cold-users")


def load_and_split(
    source: str,
    *,
    split: str = "auto",
    k_core: int = 0,
    threshold: float | None = None,
    seed: int = 0,
    warnings_to=None,
):
    """``(data, split used)``: SOURCE loaded and split (``auto``: the data's own split labels when it has them,
    else leave-one-out). Data warnings (duplicates, leaks, users without training rows) go to ``warnings_to``
    (default stderr), one line each."""
    from .phases import phase, start_up_done

    start_up_done()
    with phase("loading"):
        return _load_and_split(
            source, split=split, k_core=k_core, threshold=threshold, seed=seed, warnings_to=warnings_to
        )


def _load_and_split(source: str, *, split: str, k_core: int, threshold: float | None, seed: int, warnings_to):
    from .datasets import load, print_warnings, splits
    from .federation.planted import PLANTED_PREFIX
    from .federation.synthetic import SYNTHETIC_PREFIX

    if source.startswith((SYNTHETIC_PREFIX, PLANTED_PREFIX)):
        return _synthetic(source, split=split, k_core=k_core, threshold=threshold, seed=seed), "loo"
    data = load(source)
    if split == "auto":
        split = "predefined" if data.is_split else "loo"
    if split == "predefined":
        data = splits.predefined(data)
    else:
        data = splits.standard(data, threshold=threshold, k=k_core, split=split, seed=seed)
    data.require_split(need=("train", "valid", "test"))
    print_warnings(data, sys.stderr if warnings_to is None else warnings_to)
    return data, split


def _synthetic(source: str, *, split: str, k_core: int, threshold: float | None, seed: int):
    from .federation.planted import PLANTED_PREFIX, planted_source
    from .federation.synthetic import synthetic_source

    for flag, value, default in (
        ("--split", split, "auto"),
        ("--k-core", k_core, 0),
        ("--implicit-threshold", threshold, None),
    ):
        if value != default and not (flag == "--split" and value == "loo"):
            raise ConfigError(f"{flag} {value}", f"{source} is generated already split leave-one-out", f"drop {flag}")
    if source.startswith(PLANTED_PREFIX):
        return planted_source(source, seed=seed)
    return synthetic_source(source, seed=seed)
