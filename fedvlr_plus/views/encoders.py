"""Item encoders: the common contract, precomputed features, a weight-free hashing encoder, and ``auto``.

Every encoder answers ``encode(items) -> Embeddings`` (per-modality unit-norm rows plus imputed flags,
see :mod:`.embeddings`) and ``fingerprint() -> dict`` (what goes into the ViewStore manifest, and what
``add_items`` compares so that new rows come from the same model as the old ones).

Encoders in this package:

* :class:`PrecomputedEncoder` - arrays that already exist (``InteractionData.features``, a feature
  folder of ``.npy`` files). It encodes nothing.
* :class:`~.open_clip_encoder.OpenClipEncoder` - OpenCLIP image and text towers.
* :class:`~.sentence_encoder.SentenceEncoder` - all-MiniLM-L6-v2 (or any sentence-transformers model)
  for text-only catalogues.
* :class:`HashingTextEncoder` - signed feature hashing of words (Weinberger et al., "Feature Hashing for
  Large Scale Multitask Learning", ICML 2009). No weights, deterministic, fast: for tests and smoke runs.
  ``auto`` never picks it.

:func:`make_encoder` turns the CLI's ``--encoder/--model/--pretrained`` into an encoder; with
``encoder="auto"`` it picks the best one that works offline for the catalogue and says why.
"""

from __future__ import annotations

import hashlib
import os
import re
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from .choices import ENCODERS  # noqa: F401  (re-exported)
from .embeddings import Embeddings, complete
from .errors import EncoderUnavailable, ViewStoreError
from .text import DEFAULT_MAX_CHARS, field_texts


class ItemEncoder(Protocol):
    name: str

    def encode(self, items: pd.DataFrame | None, modalities: Sequence[str] | None = None) -> Embeddings:
        """Embed every item. ``modalities`` (e.g. a store's) forces exactly those modalities to exist."""
        ...

    def fingerprint(self) -> dict: ...


# ---------------------------------------------------------------------------------------------- helpers
def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def sha256_weights_dir(path: str | os.PathLike) -> str | None:
    """One digest over the weight files of a model folder (``*.safetensors``, ``*.bin``, ``*.pt``)."""
    files = sorted(p for p in Path(path).rglob("*") if p.suffix in (".safetensors", ".bin", ".pt", ".pth"))
    if not files:
        return None
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(path).as_posix().encode())
        h.update(sha256_file(p).encode())
    return h.hexdigest()


def hub_offline() -> bool:
    """True when Hugging Face Hub access is switched off (read now, not at import time)."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return True
    try:
        import huggingface_hub.constants as c

        return bool(c.HF_HUB_OFFLINE)
    except Exception:  # huggingface_hub missing: nothing can download anyway
        return False


def encode_text_fields(
    items: pd.DataFrame,
    embed: Callable[[list[str]], np.ndarray],
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
    where: str,
    modalities: Sequence[str] | None = None,
) -> Embeddings:
    """Encode each text field (title, description, metadata) separately; fallback for missing fields.

    Identical strings are embedded once (many items share a genre list), which is also deterministic.
    """
    if items is None or len(items) == 0:
        raise ViewStoreError(f"{where}: the catalogue has no item content (title/description/categories)")
    fields = field_texts(items, max_chars, keep_empty=modalities is not None)
    if modalities is not None:
        unknown = [m for m in modalities if m not in fields]
        if unknown:
            raise ViewStoreError(f"{where}: cannot produce modalities {unknown}; text fields are {list(fields)}")
        fields = {m: fields[m] for m in modalities}
    if not any(t is not None for texts in fields.values() for t in texts):
        raise ViewStoreError(
            f"{where}: no item has a title, description or categories; a text encoder has nothing to encode "
            "(use precomputed features instead)"
        )
    raw, present = {}, {}
    for name, texts in fields.items():
        have = np.array([t is not None for t in texts])
        unique = sorted({t for t in texts if t is not None})
        vecs = np.asarray(embed(unique, label=f"{name} ({len(unique):,} texts)"), dtype=np.float32)
        index = {t: i for i, t in enumerate(unique)}
        arr = np.zeros((len(texts), vecs.shape[1]), np.float32)
        rows = np.flatnonzero(have)
        arr[rows] = vecs[[index[texts[r]] for r in rows]]
        raw[name], present[name] = arr, have
    # Fields of one text model share a space, so a missing field borrows the item's other fields first.
    return complete(raw, present, shared_space=True, kind="text-fields", where=where, keep=tuple(modalities or ()))


# ---------------------------------------------------------------------------------------------- precomputed
_SUFFIXES = ("_features", "_feature", "_feats", "_feat", "_embeddings", "_embedding", "_emb")
_ALIASES = {
    "image": "image",
    "img": "image",
    "visual": "image",
    "vision": "image",
    "v": "image",
    "text": "text",
    "txt": "text",
    "textual": "text",
    "t": "text",
}


def modality_name(feature_name: str) -> str:
    """``image_features`` / ``img_feat`` / ``image`` -> ``image``; ``text_feat`` -> ``text``; others unchanged."""
    name = feature_name.lower()
    for s in _SUFFIXES:
        if name.endswith(s):
            name = name[: -len(s)]
            break
    return _ALIASES.get(name, name)


class PrecomputedEncoder:
    """Feature arrays that already exist (row i = item i). Encodes nothing.

    All-zero rows count as missing content and get the documented fallback (flagged); NaN/inf rows are
    an error naming the feature and row. ``shared_space=True`` lets a missing image row borrow the
    item's text row (right for CLIP features such as KU's; wrong for unrelated feature spaces).
    """

    name = "precomputed"

    def __init__(
        self, features: dict[str, np.ndarray], *, source: str = "InteractionData.features", shared_space: bool = False
    ):
        if not features:
            raise EncoderUnavailable(f"{source}: no precomputed features to use (pass --encoder sentence or open_clip)")
        self.source = source
        self.shared_space = shared_space
        self.features: dict[str, np.ndarray] = {}
        # Text first, then image, then the rest: a stable modality order whatever the loader's dict order.
        order = {"text": 0, "image": 1}
        for fname, arr in sorted(features.items(), key=lambda kv: (order.get(modality_name(kv[0]), 2), kv[0])):
            mod = modality_name(fname)
            if mod in self.features:
                raise ViewStoreError(f"{source}: features '{fname}' and another both map to modality '{mod}'")
            arr = np.asarray(arr)
            if arr.ndim != 2:
                raise ViewStoreError(f"{source}: feature '{fname}' has shape {arr.shape}, expected [n_items, d]")
            self.features[mod] = arr
        lengths = {m: len(a) for m, a in self.features.items()}
        if len(set(lengths.values())) != 1:
            raise ViewStoreError(f"{source}: feature arrays have different row counts {lengths}")

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, **kwargs) -> PrecomputedEncoder:
        """Every 2-D ``*.npy`` array in ``folder`` (file stem = feature name)."""
        folder = Path(folder)
        files = sorted(folder.glob("*.npy"))
        if not files:
            raise EncoderUnavailable(f"{folder}: no .npy feature files found")
        feats = {}
        for f in files:
            arr = np.load(f, mmap_mode="r")
            if arr.ndim == 2 and np.issubdtype(arr.dtype, np.floating):
                feats[f.stem] = np.asarray(arr)
        if not feats:
            raise EncoderUnavailable(f"{folder}: no 2-D float .npy arrays found among {[f.name for f in files]}")
        return cls(feats, source=str(folder), **kwargs)

    @property
    def n(self) -> int:
        return len(next(iter(self.features.values())))

    def encode(self, items: pd.DataFrame | None = None, modalities: Sequence[str] | None = None) -> Embeddings:
        if modalities is not None and set(modalities) != set(self.features):
            raise ViewStoreError(
                f"{self.source}: features give modalities {sorted(self.features)}, expected {sorted(modalities)}"
            )
        if items is not None and len(items) and len(items) != self.n:
            raise ViewStoreError(
                f"{self.source}: features have {self.n} rows but the catalogue has {len(items)} items (missing rows)"
            )
        raw, present = {}, {}
        for m, arr in self.features.items():
            arr = np.asarray(arr, dtype=np.float32)
            bad = ~np.isfinite(arr).all(axis=1)
            if bad.any():
                row = int(np.flatnonzero(bad)[0])
                raise ViewStoreError(f"{self.source}: feature '{m}' row {row} (item {row}) contains NaN or inf")
            raw[m], present[m] = arr, np.linalg.norm(arr, axis=1) > 0
        kind = "multimodal" if {"text", "image"} <= set(raw) else "precomputed"
        return complete(
            raw, present, shared_space=self.shared_space, kind=kind, where=self.source, keep=tuple(modalities or ())
        )

    def fingerprint(self) -> dict:
        h = hashlib.sha256()
        for m in sorted(self.features):
            arr = np.ascontiguousarray(self.features[m])
            h.update(f"{m}:{arr.dtype}:{arr.shape}".encode())
            h.update(arr.tobytes())
        return {
            "encoder": self.name,
            "model": ",".join(f"{m}[{self.features[m].shape[1]}]" for m in sorted(self.features)),
            "checkpoint": self.source,
            "checkpoint_sha256": h.hexdigest(),
        }


# ---------------------------------------------------------------------------------------------- hashing
_WORD = re.compile(r"[a-z0-9]+")


class HashingTextEncoder:
    """Bag of words (and word bigrams) hashed into ``dim`` signed buckets, per text field.

    Deterministic across processes (CRC32, not Python's salted ``hash``). Texts sharing words get
    positive cosine, which is all the plumbing tests need. Not a semantic model.
    """

    name = "hashing"

    def __init__(self, dim: int = 256, *, max_chars: int = DEFAULT_MAX_CHARS):
        if dim < 2:
            raise ValueError("HashingTextEncoder: dim must be >= 2")
        self.dim = dim
        self.max_chars = max_chars

    def embed(self, texts: Sequence[str], label: str | None = None) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, text in enumerate(texts):
            words = _WORD.findall(text.lower())
            for tok in words + [a + " " + b for a, b in zip(words, words[1:])]:
                h = zlib.crc32(tok.encode())
                out[i, h % self.dim] += 1.0 if (h >> 31) & 1 else -1.0
            if not out[i].any():  # no word characters at all: one fixed bucket so the row is not zero
                out[i, zlib.crc32(text.encode()) % self.dim] = 1.0
        return out

    def encode(self, items: pd.DataFrame | None, modalities: Sequence[str] | None = None) -> Embeddings:
        return encode_text_fields(
            items, self.embed, max_chars=self.max_chars, where="hashing encoder", modalities=modalities
        )

    def fingerprint(self) -> dict:
        return {
            "encoder": self.name,
            "model": f"crc32-words-bigrams-{self.dim}",
            "checkpoint": None,
            "checkpoint_sha256": None,
        }


# ---------------------------------------------------------------------------------------------- choice
def _looks_like_sentence_dir(path: str) -> bool:
    p = Path(path)
    return p.is_dir() and ((p / "modules.json").exists() or (p / "config_sentence_transformers.json").exists())


def _has_text(items: pd.DataFrame | None) -> bool:
    return items is not None and len(items) > 0 and bool(field_texts(items))


def _auto_kind(
    name: str, items: pd.DataFrame | None, features: dict, model: str | None, pretrained: str | None
) -> tuple[str, str]:
    """The encoder ``auto`` picks for a catalogue, and why (see :func:`make_encoder`)."""
    if pretrained:
        kind = "sentence" if _looks_like_sentence_dir(pretrained) else "open_clip"
        return kind, f"--pretrained {pretrained} was given"
    if features:
        return "precomputed", f"{name} ships precomputed features ({', '.join(sorted(features))})"
    if _has_text(items):
        from .sentence_encoder import resolve_sentence_model

        ref, source = resolve_sentence_model(model)  # raises EncoderUnavailable with what to pass
        why = f"{name} has text but no precomputed features and no CLIP checkpoint; {ref} loads from {source}"
        if items is not None and "image" in items.columns and items["image"].notna().any():
            why += " (item images are ignored: pass --encoder open_clip --pretrained CHECKPOINT to use them)"
        return "sentence", why
    raise EncoderUnavailable(
        f"no encoder works offline for {name}: it has no precomputed features and no item text. "
        "Pass --encoder open_clip --pretrained /path/to/checkpoint.pt for images, or a feature folder."
    )


def make_encoder(
    kind: str = "auto",
    *,
    data=None,
    model: str | None = None,
    pretrained: str | None = None,
    device: str | None = None,
    batch_size: int = 64,
    progress: bool = True,
    fetch_images: bool = False,
    image_root: str | None = None,
) -> tuple[ItemEncoder, str]:
    """Build the encoder named by ``kind`` for ``data`` (an InteractionData); return it and a reason.

    ``auto`` order: a ``pretrained`` path/tag given -> the encoder it belongs to (a sentence-transformers
    folder -> sentence, otherwise OpenCLIP); the catalogue ships features -> precomputed; the items have
    text and a sentence model is available offline -> sentence; otherwise a clear error.
    """
    items = getattr(data, "items", None)
    features = getattr(data, "features", None) or {}
    name = getattr(data, "name", "catalogue")
    if kind not in ENCODERS:
        raise EncoderUnavailable(f"unknown encoder '{kind}'; choose one of {', '.join(ENCODERS)}")

    if kind == "auto":
        kind, why = _auto_kind(name, items, features, model, pretrained)
    else:
        why = f"--encoder {kind}"

    if kind == "precomputed":
        if not features:
            raise EncoderUnavailable(f"{name} has no precomputed features; choose --encoder sentence or open_clip")
        # Mean imputation for missing rows: nothing says two precomputed arrays share one space.
        return PrecomputedEncoder(features, source=f"{name} features"), why
    if kind == "sentence":
        from .sentence_encoder import SentenceEncoder

        return SentenceEncoder(pretrained or model, device=device, batch_size=batch_size, progress=progress), why
    if kind == "open_clip":
        from .open_clip_encoder import OpenClipEncoder

        if pretrained is None:
            raise EncoderUnavailable(
                "--encoder open_clip needs --pretrained: a checkpoint file (e.g. /path/to/ViT-B-32.pt), a tag such "
                "as 'openai' on a connected machine, or 'none' for random weights (plumbing only)"
            )
        enc = OpenClipEncoder(
            model or "ViT-B-32",
            pretrained,
            device=device,
            batch_size=batch_size,
            progress=progress,
            fetch_images=fetch_images,
            image_root=image_root,
        )
        return enc, why
    return HashingTextEncoder(), why
