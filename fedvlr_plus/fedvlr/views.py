"""Where the FedVLR layer's content views come from: the data's own features, a view store reused, or a store
built (and cached) from the data's item content.

The layer fuses content views with the ID table (FedVLR, Li et al., AAAI-26, arXiv 2410.08478); this module only
finds them, aligned with the data's item ids, and says on stderr where they came from so that a run's log shows
which views it fused. Errors name the flag that asked for the views (``purpose``), since they reach the command
line as one line. See docs/method.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from ..errors import ConfigError, shell_word

RAW_OPS = ("identity",)


def _cache_root() -> Path:
    return Path(os.environ.get("FEDVLR_CACHE", Path.home() / ".cache" / "fedvlr_plus")).expanduser()


def _say(line: str) -> None:
    print(f"views: {line}", file=sys.stderr, flush=True)


def load_views(
    data,
    store: str | None = None,
    names: list[str] | None = None,
    progress: bool = True,
    purpose: str = "--fusion",
    optional: bool = False,
) -> dict[str, np.ndarray]:
    """Views of every item of ``data`` (name -> [n_items, d]), rows aligned with the data's item ids.

    Says on stderr where they come from: the data's own features, a store reused, or a store built (where,
    from what). ``purpose`` is the flag that asked for views, named in the one-line errors. ``optional``: data
    without any item content, and no store named, gives no views (``{}``) instead of that error.
    """
    from ..views import ViewStoreError, load_store

    if store is None and data.features:
        from ..views.encoders import modality_name

        views = {modality_name(k): np.asarray(v, np.float32) for k, v in data.features.items()}
        _say(
            f"the precomputed features of {data.name}: "
            + ", ".join(f"{k}[{v.shape[0]:,}x{v.shape[1]}]" for k, v in views.items())
            + " (no view store)"
        )
        return {k: _named(views, k, data.name) for k in (names or views)}
    if optional and store is None and not has_content(data):
        return {}
    path, exists = _store_path(data, store, purpose)
    if exists:
        vs = load_store(path)
        enc = vs.manifest.get("encoder") or {}
        made_by = " ".join(str(x) for x in (enc.get("encoder"), enc.get("model")) if x)
        _say(
            f"reusing view store {path} ({vs.n_items:,} items, views {', '.join(vs.views)}; "
            f"encoder {made_by or 'unknown'}, built {vs.manifest.get('created')})"
        )
    else:
        vs = _build_views(data, path, store, progress, purpose)
    ids = [str(x) for x in vs.item_ids]
    if len(ids) != data.n_items or ids != [str(x) for x in data.item_ids]:
        raise ViewStoreError(
            f"--views {path}: the store holds {len(ids)} items that do not match the "
            f"{data.n_items} items of {data.name} (build the store from the same source)"
        )
    if names is None:
        names = [s.name for s in vs.specs if s.op in RAW_OPS]
    rows = np.arange(vs.n_items)
    return {n: vs.get(rows, n) for n in names}


def _named(views: dict, name: str, source: str) -> np.ndarray:
    if name not in views:
        from ..views import ViewStoreError

        raise ViewStoreError(f"--fusion-views {name}: {source} has no view '{name}' (views: {', '.join(views)})")
    return views[name]


def has_content(data) -> bool:
    from ..views.encoders import _has_text

    return bool(data.features) or _has_text(getattr(data, "items", None))


def content_remedy(data) -> str:
    """Where content comes from for ``data``'s format: each loader reads item content from a different place."""
    source = data.source or data.name
    if data.format.startswith("amazon"):
        return (
            f"put the category's metadata file {_meta_name(data)} (titles, descriptions, features; a .json or "
            f".jsonl of the same name is read too) beside {source}"
        )
    if data.format == "recbole-atomic":
        return f"add a {data.name}.item file with a title or description field to its folder"
    if data.format == "interactions-table":
        return (
            f"{source} is a plain interactions table, which holds no item content: put its rows in a feature "
            f"folder's inter.csv beside image_features.npy or text_features.npy"
        )
    return f"add image_features.npy / text_features.npy ([{data.n_items}, d], row = item id) beside its interactions"


def _meta_name(data) -> str:
    """The metadata file name the Amazon loader reads beside ``data``'s reviews file."""
    from ..datasets.amazon import expected_meta

    return expected_meta(data.source, data.format).name if data.source else "meta_<Category>.json.gz"


def _store_path(data, store: str | None, purpose: str) -> tuple[Path, bool]:
    """Where the view store is and whether it exists; a ``--views`` path that cannot be meant is refused."""
    from ..views import ViewStoreError

    if store is None:
        path = _cache_root() / "views" / data.name
        return path, (path / "manifest.json").is_file()
    path = Path(store).expanduser()
    if (path / "manifest.json").is_file():
        return path, True
    if path.is_dir() and any(path.iterdir()):
        raise ViewStoreError(
            f"--views {store}: the folder is not a view store (no manifest.json) and not empty; "
            "pass a store written by 'fedvlr-plus views build', or a new folder to build one in"
        )
    if path.exists() and not path.is_dir():
        raise ViewStoreError(f"--views {store}: is a file, not a view store folder")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise ViewStoreError(
            f"--views {store}: the folder {parent} does not exist (a new view store is built "
            "only inside an existing folder; check the path)"
        )
    if not path.exists():
        near = _similar_stores(path)
        if near:
            raise ViewStoreError(
                f"--views {store}: no such view store; did you mean {near}? (to build a new store "
                f"under this name, run 'fedvlr-plus views build SOURCE --out {shell_word(store)}' first)"
            )
    return path, False


def _similar_stores(path: Path) -> str | None:
    """A sibling view store whose name is close to ``path``'s: the likelier meaning of a missing folder."""
    import difflib

    stores = [p.name for p in path.absolute().parent.iterdir() if (p / "manifest.json").is_file()]
    match = difflib.get_close_matches(path.name, stores, n=1, cutoff=0.8)
    return str(path.with_name(match[0])) if match else None


def _build_views(data, path: Path, store: str | None, progress: bool, purpose: str):
    """Build a store at ``path`` (written to a temporary folder, renamed into place when complete)."""
    from ..views import EncoderUnavailable, ViewStoreError, build_store, load_store

    if not has_content(data):
        flag = f"--views {store}" if store else purpose
        raise ViewStoreError(
            f"{flag}: {data.name} has no item content to make views from (no precomputed features, no item text); "
            f"{content_remedy(data)}, pass --views DIR with a view store of the same items, or use --fusion none"
        )
    where = "" if store else " (the cache: later runs reuse it; $FEDVLR_CACHE moves it)"
    _say(f"building view store in {path} from {data.name}{where}")
    try:
        vs, _ = build_store(
            data, path, progress=progress, announce=_say, overwrite=path.is_dir()
        )  # an existing folder here is empty (checked above)
    except EncoderUnavailable as e:
        raise EncoderUnavailable(
            f"{purpose}: cannot encode the items of {data.name} here ({e}); build a store "
            f"with 'fedvlr-plus views build SOURCE --out DIR' (its --encoder/--model/"
            "--pretrained choose the model) and pass --views DIR"
        ) from e
    except ViewStoreError:
        if not (path / "manifest.json").is_file():
            raise
        # Another run (same cache) finished the same store first; ours was discarded unpublished.
        _say(f"another run built {path} meanwhile; using it")
        return load_store(path)
    _say(f"wrote {path}: " + ", ".join(f"{v}[{d}]" for v, d in vs.dims.items()))
    return vs


def select_views(views: dict[str, np.ndarray], drop) -> tuple[dict[str, np.ndarray], bool]:
    """``views`` without the modalities in ``drop``, and whether the ID modality takes part."""
    drop = set(drop)
    unknown = drop - {"id"} - set(views)
    if unknown:
        raise ConfigError(
            f"--drop-modality {','.join(sorted(unknown))}", "no such modality", f"choose from id, {', '.join(views)}"
        )
    return {k: v for k, v in views.items() if k not in drop}, "id" not in drop
