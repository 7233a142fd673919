"""What a run was trained on, as run folders record it: the data set's name and sizes, and a digest of the split.

A count and a sum of the training pairs (what checkpoints recorded first) cannot tell two splits apart whose rows
trade items; the digest is a sha256 over everything that decides a run's figures: the sorted (user, item) pairs
of train, valid and test, the raw user and item ids behind the internal ones, and the item feature arrays' bytes.
"""

from __future__ import annotations

import hashlib

import numpy as np

DIGEST_VERSION = b"fedvlr-plus split digest 1\0"


def split_digest(data) -> str:
    """``sha256:<hex>`` of ``data``'s split (see the module's text); row order does not change it."""
    h = hashlib.sha256(DIGEST_VERSION)
    for split in ("train", "valid", "test"):
        part = data.part(split)
        pairs = np.stack([part["user"].to_numpy(np.int64), part["item"].to_numpy(np.int64)], axis=1)
        pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]
        h.update(f"{split}:{len(pairs)}\0".encode())
        h.update(np.ascontiguousarray(pairs).tobytes())
    for kind, ids in (("users", data.user_ids), ("items", data.item_ids)):
        h.update(f"{kind}:{len(ids)}\0".encode())
        h.update("\x1f".join(map(str, ids)).encode("utf-8", "surrogatepass"))
    for name in sorted(data.features):
        arr = np.ascontiguousarray(data.features[name])
        h.update(f"feature {name}:{arr.dtype.str}:{arr.shape}\0".encode())
        h.update(memoryview(arr).cast("B"))
    return "sha256:" + h.hexdigest()


def describe_difference(old: dict, new: dict) -> str:
    """What differs between two recorded identities, in words (for one refusal line)."""
    if old.get("name") != new.get("name"):
        return f"data set {old.get('name')!r} vs {new.get('name')!r}"
    sizes = [k for k in ("users", "items", "train") if old.get(k) != new.get(k)]
    if sizes:
        return "; ".join(f"{k}: {old.get(k)} vs {new.get(k)}" for k in sizes)
    if old.get("digest") and new.get("digest") and old["digest"] != new["digest"]:
        return (
            f"same name and sizes, other interactions, ids or features (split digest "
            f"{old['digest'][7:19]}… vs {new['digest'][7:19]}…)"
        )
    return "same name and sizes, other training pairs"
