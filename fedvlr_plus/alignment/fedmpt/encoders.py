"""The offline MiniLM text encoders FedMPT and FedDTL read item texts with, and an on-disk cache keyed by the
texts so a rerun never encodes the same texts twice."""

from __future__ import annotations

import numpy as np


def minilm_encoders(device: str = "cpu"):
    """``(embed_tokens, embed_sentences)`` from the offline all-MiniLM-L6-v2 (token outputs / pooled, unit norm)."""
    from ...views.sentence_encoder import SentenceEncoder

    enc = SentenceEncoder(device=device, progress=False)

    def embed_tokens(texts):
        model = enc._load()  # lazily: a fully cached run never loads the weights
        out = model.encode(list(texts), output_value="token_embeddings", batch_size=128, show_progress_bar=False)
        return [o.detach().cpu().numpy() if hasattr(o, "detach") else np.asarray(o) for o in out]

    return embed_tokens, enc.embed


def cached_encoders(embed_tokens, embed_sentences, cache_dir, tag: str = "minilm"):
    """Wrap ``(embed_tokens, embed_sentences)`` so every call's output is kept in ``cache_dir`` and reused.

    The key is the SHA-256 of the encoder ``tag``, the call kind and the exact texts, so a changed title or
    condition list is encoded afresh. Files are written atomically (temp file, then ``os.replace``). Encoding
    the ml-100k titles and prompts costs 1-2 CPU-minutes; a cached run skips it.
    """
    import hashlib
    import os
    from pathlib import Path

    root = Path(cache_dir)

    def _path(kind, texts):
        h = hashlib.sha256("\x1f".join([tag, kind, *texts]).encode("utf-8")).hexdigest()[:24]
        return root / f"{tag}-{kind}-{h}.npz"

    def _save(path, **arrays):
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)

    def tokens(texts):
        texts = list(texts)
        path = _path("tokens", texts)
        if path.exists():
            z = np.load(path)
            return np.split(z["flat"], np.cumsum(z["lengths"])[:-1])
        out = [np.asarray(t, np.float32) for t in embed_tokens(texts)]
        _save(path, flat=np.concatenate(out), lengths=np.array([len(t) for t in out]))
        return out

    def sentences(texts):
        texts = list(texts)
        path = _path("sentences", texts)
        if path.exists():
            return np.load(path)["emb"]
        out = np.asarray(embed_sentences(texts), np.float32)
        _save(path, emb=out)
        return out

    return tokens, sentences
