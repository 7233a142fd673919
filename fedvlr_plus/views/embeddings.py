"""Per-modality item embeddings (what an encoder returns) and the documented fallback for missing content.

Fallback for an item that lacks a modality (no image, no text, an unreadable image file, an all-zero
precomputed row), in this order:

1. **Shared space** (OpenCLIP, whose text and image towers embed into one space): the item's other
   modality stands in. A CLIP text embedding is the closest thing to the missing image's embedding that
   exists without the image.
2. **Otherwise** (and when the item has no modality at all): the mean of the rows of that modality that
   are present, re-normalised - MMRec's "mean-imputed" convention. Such items tie with one another,
   which is honest: nothing distinguishes them.
3. A modality that no item has (e.g. Amazon image URLs on an offline machine) is dropped, not imputed.

Every imputed row is flagged in ``Embeddings.imputed[modality]`` and the flags are saved in the
ViewStore manifest, so nobody mistakes an imputed vector for content. A silent zero row never appears.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .errors import ViewStoreError


def l2_normalise(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (float32). Zero rows are an error: callers impute before normalising."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if (norms == 0).any():
        row = int(np.flatnonzero(norms[:, 0] == 0)[0])
        raise ViewStoreError(f"row {row} is an all-zero vector and cannot be normalised (impute it first)")
    return (x / norms).astype(np.float32)


@dataclass
class Embeddings:
    """Modality name -> float32 ``[N, d]`` unit-norm rows, plus the imputed-row flags per modality.

    ``kind`` says how the modalities relate: ``"multimodal"`` (text + image, possibly in one space),
    ``"text-fields"`` (several text fields of a text-only catalogue), ``"precomputed"``.
    """

    modalities: dict[str, np.ndarray]
    imputed: dict[str, np.ndarray] = field(default_factory=dict)
    kind: str = "multimodal"

    @property
    def n(self) -> int:
        return len(next(iter(self.modalities.values()))) if self.modalities else 0

    @property
    def names(self) -> list[str]:
        return list(self.modalities)

    def check(self, where: str = "embeddings") -> Embeddings:
        if not self.modalities:
            raise ViewStoreError(f"{where}: no modality was encoded (the items have no usable text, image or features)")
        n = self.n
        for name, arr in self.modalities.items():
            if arr.ndim != 2 or len(arr) != n:
                raise ViewStoreError(f"{where}: modality '{name}' has shape {tuple(arr.shape)}, expected [{n}, d]")
            if arr.dtype != np.float32:
                raise ViewStoreError(f"{where}: modality '{name}' is {arr.dtype}, expected float32")
            bad = ~np.isfinite(arr).all(axis=1)
            if bad.any():
                raise ViewStoreError(
                    f"{where}: modality '{name}' row {int(np.flatnonzero(bad)[0])} contains NaN or inf"
                )
            flags = self.imputed.setdefault(name, np.zeros(n, bool))
            if flags.shape != (n,):
                raise ViewStoreError(f"{where}: imputed flags for '{name}' have shape {flags.shape}, expected ({n},)")
        return self


def complete(
    raw: dict[str, np.ndarray],
    present: dict[str, np.ndarray],
    *,
    shared_space: bool,
    kind: str,
    where: str = "encoder",
    keep: tuple[str, ...] | list[str] = (),
) -> Embeddings:
    """Apply the fallback above to raw per-modality arrays whose rows are valid only where ``present``.

    ``raw[m]`` is ``[N, d_m]`` (rows outside ``present[m]`` are ignored, whatever they hold). Modalities
    in ``keep`` are kept even when no row has them (e.g. a batch of new items without images added to a
    multimodal store); they must then borrow from a modality of the same space.
    """
    mods: dict[str, np.ndarray] = {}
    flags: dict[str, np.ndarray] = {}
    for m in keep:
        if m not in raw:
            raise ViewStoreError(f"{where}: modality '{m}' was required but the encoder does not produce it")
    kept = [m for m in raw if present[m].any() or m in keep]
    sources = [m for m in kept if present[m].any()]
    if not sources:
        raise ViewStoreError(f"{where}: no item has any content to encode ({', '.join(raw) or 'no modality'})")
    for m in kept:
        arr = np.array(raw[m], dtype=np.float32, copy=True)
        have = present[m].astype(bool)
        bad = have & ~np.isfinite(arr).all(axis=1)
        if bad.any():
            raise ViewStoreError(f"{where}: modality '{m}' row {int(np.flatnonzero(bad)[0])} contains NaN or inf")
        if have.any():
            arr[have] = l2_normalise(arr[have])
        missing = ~have
        if missing.any():
            filled = np.zeros(missing.sum(), bool)
            if shared_space:
                for other in sources:
                    if other == m or raw[other].shape[1] != arr.shape[1]:
                        continue
                    take = missing & present[other]
                    take_rel = take[missing] & ~filled
                    if take_rel.any():
                        rows = np.flatnonzero(missing)[take_rel]
                        arr[rows] = l2_normalise(np.asarray(raw[other][rows], dtype=np.float32))
                        filled |= take_rel
            if not filled.all():
                if not have.any():
                    raise ViewStoreError(
                        f"{where}: no item has modality '{m}' and no other modality of the same space can stand in"
                    )
                rows = np.flatnonzero(missing)[~filled]
                mean = arr[have].mean(axis=0, keepdims=True)
                if not np.linalg.norm(mean) > 0:  # present rows cancel out exactly: fall back to the first one
                    mean = arr[have][:1]
                arr[rows] = l2_normalise(mean)[0]
        mods[m] = arr
        flags[m] = ~have
    return Embeddings(mods, flags, kind).check(where)
