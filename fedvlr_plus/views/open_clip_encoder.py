"""OpenCLIP item encoder: image and text towers of a CLIP model.

CLIP: Radford et al., "Learning Transferable Visual Models From Natural Language Supervision", ICML
2021; OpenCLIP: Cherti et al., "Reproducible scaling laws for contrastive language-image learning",
CVPR 2023. FedVLR (Li et al., AAAI 2026) uses ViT-B-32 with the ``openai`` weights.

``model`` is an open_clip model name (``open_clip.list_models()``), a path to a model-config JSON
file (registered with ``open_clip.add_model_config``; the file stem becomes the name) or an open_clip
``local-dir:/folder`` spec. ``pretrained`` is a checkpoint file (a state dict saved from open_clip), a
pretrained tag (downloads on a connected machine; with ``HF_HUB_OFFLINE=1`` it must already be in the
cache, otherwise this fails at once saying to pass a checkpoint path), or ``None``/``"none"`` for random
weights (plumbing only; logged).

Texts follow the combined template of :mod:`.text`. Images: ``items["image"]`` holds a local path (or a
list whose first entry is used); relative paths resolve against ``image_root``. URLs are fetched only
with ``fetch_images=True`` (one try, ``timeout`` seconds, cached under ``image_cache``); otherwise an item
with only a URL has no image. Missing content gets the fallback of :mod:`.embeddings` (the item's other
modality, since CLIP embeds both into one space) and is flagged. When no item has a readable image the
encoder encodes the text fields (title, description, metadata) separately with the text tower, as for a
text-only catalogue.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import os
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .embeddings import Embeddings, complete
from .encoders import encode_text_fields, hub_offline, sha256_file
from .errors import EncoderUnavailable
from .text import DEFAULT_MAX_CHARS, combined_texts

log = logging.getLogger(__name__)

_CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")
_HOW_TO_FIX = "pass --pretrained /path/to/checkpoint.pt (a state dict saved from an open_clip model)"


def _is_random(pretrained: Any) -> bool:
    return pretrained is None or str(pretrained).lower() in ("none", "random", "")


def _cached_tag_file(model_name: str, tag: str, cache_dir: str | None) -> str | None:
    """Path of the tag's weights in the local caches, or None (never touches the network)."""
    import open_clip

    cfg = open_clip.get_pretrained_cfg(model_name, tag) or {}
    hub = cfg.get("hf_hub", "")
    if hub:
        from huggingface_hub import try_to_load_from_cache

        # "org/repo/file.bin" names a file; "org/repo/" means open_clip's default file name.
        repo, filename = os.path.split(hub)
        names = [filename or "open_clip_pytorch_model.bin"]
        # open_clip prefers a .safetensors twin of any .bin file, so look for that first.
        names = [n[:-4] + ".safetensors" for n in names if n.endswith(".bin")] + names
        for name in names:
            found = try_to_load_from_cache(repo, name, cache_dir=cache_dir)
            if isinstance(found, str):
                return found
    url = cfg.get("url", "")
    if url:
        target = Path(cache_dir or Path.home() / ".cache" / "clip") / os.path.basename(url)
        if target.exists():
            return str(target)
    return None


def fetch_image(url: str, cache_dir: str | os.PathLike, timeout: float = 10.0) -> Path:
    """Download ``url`` once into ``cache_dir`` (atomic write). One try: a dead host must not stall a build."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / (hashlib.sha1(url.encode()).hexdigest() + (Path(url.split("?")[0]).suffix or ".img"))
    if not target.exists():
        with urllib.request.urlopen(url, timeout=timeout) as r:
            data = r.read()
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, target)
    return target


def _architecture(open_clip, model: str, pretrained: str | None) -> str:
    """The open_clip model name of ``model``: a registered name, a config ``.json`` (registered here) or a
    ``local-dir:`` model that brings its own weights."""
    if model.endswith(".json"):
        cfg_path = Path(model)
        if not cfg_path.is_file():
            raise EncoderUnavailable(f"open_clip model config not found: {model}")
        open_clip.add_model_config(cfg_path)
        return cfg_path.stem
    if model.startswith("local-dir:"):
        if not _is_random(pretrained):
            raise EncoderUnavailable("a 'local-dir:' model brings its own weights; do not pass --pretrained with it")
        return model
    model_name = model.replace("/", "-")
    if model_name not in open_clip.list_models():
        close = difflib.get_close_matches(model_name, open_clip.list_models(), n=5)
        raise EncoderUnavailable(f"unknown open_clip model '{model}'" + (f"; did you mean {close}?" if close else ""))
    return model_name


def _weights(open_clip, model_name: str, pretrained: str | None, cache_dir: str | None):
    """(what to pass open_clip as ``pretrained``, the checkpoint for the fingerprint, its sha256 or None):
    a file, a tag (from the cache; offline, never a download), or random weights."""
    if model_name.startswith("local-dir:"):
        return pretrained, model_name, None
    if _is_random(pretrained):
        log.warning("open_clip %s with RANDOM weights (pretrained=None): embeddings carry no meaning", model_name)
        return None, None, None
    if Path(pretrained).expanduser().is_file():
        checkpoint = str(Path(pretrained).expanduser().resolve())
        return checkpoint, checkpoint, sha256_file(checkpoint)
    if pretrained.endswith(_CHECKPOINT_SUFFIXES) or os.sep in pretrained:
        raise EncoderUnavailable(f"open_clip checkpoint file not found: {pretrained}; {_HOW_TO_FIX}")
    tags = open_clip.list_pretrained_tags_by_model(model_name)
    if pretrained not in tags:
        raise EncoderUnavailable(
            f"'{pretrained}' is neither a file nor a pretrained tag of {model_name} (tags: {tags or 'none'}); "
            f"{_HOW_TO_FIX}"
        )
    cached = _cached_tag_file(model_name, pretrained, cache_dir)
    if cached is None and hub_offline():
        # open_clip would try the network; offline that is either an instant error or ~1 min of retries.
        raise EncoderUnavailable(
            f"HF_HUB_OFFLINE=1 and the weights of {model_name}/{pretrained} are not in the local cache; {_HOW_TO_FIX}"
        )
    return pretrained, f"tag:{pretrained}", sha256_file(cached) if cached else None


class OpenClipEncoder:
    """OpenCLIP image + text towers, batched, CPU or GPU, with a tqdm progress bar."""

    name = "open_clip"

    def __init__(
        self,
        model: str = "ViT-B-32",
        pretrained: str | None = None,
        *,
        device: str | None = None,
        batch_size: int = 64,
        progress: bool = True,
        image_root: str | os.PathLike | None = None,
        fetch_images: bool = False,
        image_cache: str | os.PathLike | None = None,
        fetch_timeout: float = 10.0,
        max_chars: int = DEFAULT_MAX_CHARS,
        cache_dir: str | None = None,
    ):
        from .torch_pair import check_torch_pair

        check_torch_pair()  # open_clip imports torchvision: a mismatched pair is one line, not its traceback
        try:
            import open_clip
            import torch
        except ImportError as e:  # pragma: no cover - a core dependency
            raise EncoderUnavailable("open_clip_torch is not installed: pip install open_clip_torch") from e
        self.batch_size = batch_size
        self.progress = progress
        self.image_root = Path(image_root) if image_root else None
        self.fetch_images = fetch_images
        self.image_cache = Path(image_cache) if image_cache else Path.home() / ".cache" / "fedvlr_plus" / "images"
        self.fetch_timeout = fetch_timeout
        self.max_chars = max_chars
        self.report: dict[str, int] = {}

        self.model_name = model_name = _architecture(open_clip, model, pretrained)
        self.pretrained, self.checkpoint, self._sha = _weights(open_clip, model_name, pretrained, cache_dir)
        pretrained = self.pretrained

        dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dev.startswith("cuda") and not torch.cuda.is_available():
            raise EncoderUnavailable(f"device '{dev}' requested but CUDA is not available; pass --device cpu")
        self.device = dev
        try:
            self.model, _, self.preprocess = open_clip.create_model_and_transforms(
                model_name, pretrained=pretrained, device=dev, cache_dir=cache_dir
            )
        except Exception as e:
            raise EncoderUnavailable(
                f"could not build open_clip {model_name} with pretrained={pretrained!r}: {e}; {_HOW_TO_FIX}"
            ) from e
        self.model.eval()
        self.tokenizer = open_clip.get_tokenizer(model_name)
        if self._sha is None and self.checkpoint and self.checkpoint.startswith("tag:"):
            found = _cached_tag_file(model_name, self.checkpoint[4:], cache_dir)
            self._sha = sha256_file(found) if found else None

    # ------------------------------------------------------------------ towers
    def _batches(self, n: int, desc: str):
        from tqdm.auto import tqdm

        starts = range(0, n, self.batch_size)
        return tqdm(
            starts, desc=f"{desc}, batches of {self.batch_size}", unit="batch", disable=not self.progress or n == 0
        )

    def embed_texts(self, texts: list[str], label: str | None = None) -> np.ndarray:
        """Unit-norm float32 ``[len(texts), d]`` from the text tower (77-token truncation is open_clip's)."""
        import torch

        out = []
        with torch.inference_mode():
            for s in self._batches(len(texts), label or f"text ({len(texts):,} texts)"):
                tokens = self.tokenizer(texts[s : s + self.batch_size]).to(self.device)
                out.append(self.model.encode_text(tokens, normalize=True).float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)

    @property
    def dim(self) -> int:
        return int(self.embed_texts(["x"]).shape[1])

    def _resolve_image(self, value: Any) -> tuple[Path | None, str]:
        if isinstance(value, (list, tuple, np.ndarray)):
            value = value[0] if len(value) else None
        if value is None or (isinstance(value, float) and np.isnan(value)) or str(value).strip() == "":
            return None, "no image"
        ref = str(value).strip()
        if "://" in ref:
            if not self.fetch_images:
                return None, "url not fetched (fetch_images=False)"
            try:
                return fetch_image(ref, self.image_cache, self.fetch_timeout), "ok"
            except Exception:
                return None, "url fetch failed"
        path = Path(ref).expanduser()
        if not path.is_absolute() and self.image_root is not None:
            path = self.image_root / path
        return (path, "ok") if path.is_file() else (None, "file not found")

    def embed_images(self, refs: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        """Image-tower rows (unit norm) and a mask of the items whose image could be read."""
        import torch
        from PIL import Image

        resolved = [self._resolve_image(v) for v in refs]
        for _, why in resolved:
            if why != "ok":
                self.report[f"image: {why}"] = self.report.get(f"image: {why}", 0) + 1
        have = np.array([p is not None for p, _ in resolved])
        rows = np.flatnonzero(have)
        out = np.zeros((len(refs), 0), np.float32)
        if len(rows) == 0:
            return out, have
        vecs: list[np.ndarray] = []
        with torch.inference_mode():
            for s in self._batches(len(rows), f"image ({len(rows):,} images)"):
                tensors, ok = [], []
                for r in rows[s : s + self.batch_size]:
                    try:
                        with Image.open(resolved[r][0]) as im:
                            tensors.append(self.preprocess(im.convert("RGB")))
                        ok.append(r)
                    except Exception:  # unreadable or truncated file: no image for that item
                        have[r] = False
                        self.report["image: unreadable"] = self.report.get("image: unreadable", 0) + 1
                if tensors:
                    x = torch.stack(tensors).to(self.device)
                    v = self.model.encode_image(x, normalize=True).float().cpu().numpy()
                    vecs.append((np.asarray(ok), v))
        if not vecs:
            return out, have
        d = vecs[0][1].shape[1]
        out = np.zeros((len(refs), d), np.float32)
        for idx, v in vecs:
            out[idx] = v
        return out, have

    # ------------------------------------------------------------------ items
    def encode(self, items: pd.DataFrame | None, modalities: Sequence[str] | None = None) -> Embeddings:
        """Text + image; text fields when no image is readable (or when ``modalities`` asks for fields)."""
        if items is None or len(items) == 0:
            raise EncoderUnavailable("open_clip encoder: the catalogue has no item content (title/description/image)")
        self.report = {}
        multimodal = modalities is None or set(modalities) == {"text", "image"}
        if multimodal:
            img, have_img = (
                self.embed_images(list(items["image"]))
                if "image" in items.columns
                else (np.zeros((len(items), 0), np.float32), np.zeros(len(items), bool))
            )
        if not multimodal or (modalities is None and not have_img.any()):
            if multimodal:
                self.report["text fields instead of image+text"] = len(items)
                log.warning(
                    "open_clip: no item has a readable image (%s); encoding text fields instead",
                    ", ".join(f"{k}: {v}" for k, v in self.report.items()),
                )
            return encode_text_fields(
                items, self.embed_texts, max_chars=self.max_chars, where="open_clip encoder", modalities=modalities
            )
        texts = combined_texts(items, self.max_chars)
        have_txt = np.array([t is not None for t in texts])
        d = self.dim if img.shape[1] == 0 else img.shape[1]
        if img.shape[1] == 0:
            img = np.zeros((len(items), d), np.float32)
        txt = np.zeros((len(items), d), np.float32)
        if have_txt.any():
            txt[have_txt] = self.embed_texts([t for t in texts if t is not None])
        self.report["text: none"] = int((~have_txt).sum())
        missing = {k: v for k, v in self.report.items() if v}
        if missing:
            log.warning("open_clip: items without content get the fallback and are flagged: %s", missing)
        return complete(
            {"text": txt, "image": img},
            {"text": have_txt, "image": have_img},
            shared_space=True,
            kind="multimodal",
            where="open_clip encoder",
            keep=("text", "image") if modalities is not None else (),
        )

    def fingerprint(self) -> dict:
        return {
            "encoder": self.name,
            "model": self.model_name,
            "checkpoint": self.checkpoint or "random-init",
            "checkpoint_sha256": self._sha,
        }
