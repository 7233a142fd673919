"""The ViewStore manifest: reading it, its own digest, and the consistency checks made on every open.

The manifest lists the sha256 of every data file, but nothing protected the manifest itself: an edited
item id or view path was served as if it were part of the build. Since format version 2 the manifest
also carries ``manifest_sha256``, the sha256 of its own content (canonical JSON without that field), so
a hand edit is refused like a damaged file. Version 1 stores (no digest) are still read; every other
check applies to them too.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .errors import CorruptStoreError, ViewStoreError

FORMAT = "fedvlr-plus-viewstore"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
DIGEST_KEY = "manifest_sha256"
REQUIRED = ("views", "item_ids", "n_items", "files", "index", "dtype", "modalities")


def manifest_digest(manifest: dict) -> str:
    """sha256 of the manifest's content: key order and whitespace do not matter, values do."""
    body = {k: v for k, v in manifest.items() if k != DIGEST_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_manifest(store: Path) -> dict:
    """The parsed ``manifest.json`` of ``store`` after the structural checks (no data file is read)."""
    f = store / "manifest.json"
    if not store.is_dir():
        raise ViewStoreError(f"{store}: no such ViewStore folder")
    if not f.is_file():
        raise CorruptStoreError(f"{f}: missing - {store} is not a ViewStore (or was not written completely)")
    try:
        m = json.loads(f.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptStoreError(f"{f}: not valid JSON ({e}); the store is corrupt, rebuild it") from e
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise CorruptStoreError(f"{f}: not a {FORMAT} manifest")
    if m.get("format_version") not in READABLE_VERSIONS:
        raise CorruptStoreError(
            f"{f}: format_version {m.get('format_version')} is not supported "
            f"(this version reads {', '.join(map(str, READABLE_VERSIONS))})"
        )
    for key in REQUIRED:
        if key not in m:
            raise CorruptStoreError(f"{f}: required field '{key}' is missing")
    check_manifest(store, m)
    return m


def _fail(store: Path, why: str) -> CorruptStoreError:
    return CorruptStoreError(
        f"{store / 'manifest.json'}: {why}; the manifest was edited or damaged - rebuild the store"
    )


def check_manifest(store: Path, m: dict) -> None:
    """Item ids, view entries and file paths agree with each other and stay inside ``store``."""
    ids, n = m["item_ids"], m["n_items"]
    if not isinstance(ids, list) or not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise _fail(store, "item_ids must be a list and n_items a non-negative integer")
    if len(ids) != n:
        raise _fail(store, f"{len(ids)} item ids for n_items={n}")
    if not all(isinstance(i, (str, int)) and not isinstance(i, bool) for i in ids):
        raise _fail(store, "item ids must be strings or integers")
    if len({str(i) for i in ids}) != n:
        raise _fail(store, "item_ids contain duplicates")
    titles = m.get("titles")
    if titles is not None and (not isinstance(titles, list) or len(titles) != n):
        raise _fail(store, f"titles must be a list of {n} entries")
    files = m["files"]
    if not isinstance(files, dict) or not all(isinstance(d, str) for d in files.values()):
        raise _fail(store, "files must map each relative path to its sha256")
    for rel in files:
        check_inside(store, rel)
    _check_views(store, m, files)


def _check_views(store: Path, m: dict, files: dict) -> None:
    views = m["views"]
    if not isinstance(views, list) or not views:
        raise _fail(store, "views must be a non-empty list")
    names, used = set(), {}
    for v in views:
        if not isinstance(v, dict) or not isinstance(v.get("name"), str):
            raise _fail(store, "every view needs a name")
        name = v["name"]
        if name in names:
            raise _fail(store, f"view '{name}' is listed twice")
        names.add(name)
        dim = v.get("dim")
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            raise _fail(store, f"view '{name}': dim must be a positive integer, got {dim!r}")
        paths = v.get("files")
        if not isinstance(paths, dict) or set(paths) != {"vectors", "index"}:
            raise _fail(store, f"view '{name}': files must name its 'vectors' and 'index'")
        for role, rel in paths.items():
            if not isinstance(rel, str) or rel not in files:
                raise _fail(store, f"view '{name}': {role} file {rel!r} has no checksum in 'files'")
            if rel in used:
                raise _fail(store, f"view '{name}': {role} file {rel} is also {used[rel]}")
            used[rel] = f"the {role} of view '{name}'"
    if any(v.get("arrays") for v in views) and "operators.npz" not in files:
        raise _fail(store, "operators.npz holds fitted parameters but has no checksum in 'files'")
    default = m.get("default_view")
    if default is not None and default not in names:
        raise _fail(store, f"default_view '{default}' is not one of the views")


def check_inside(store: Path, rel: str) -> Path:
    """``store / rel`` resolved (links followed); refused when it leaves the store folder."""
    if not isinstance(rel, str) or not rel or Path(rel).is_absolute():
        raise CorruptStoreError(
            f"{store / 'manifest.json'}: file path {rel!r} is not relative to the store "
            "folder; the manifest was edited - rebuild the store"
        )
    root = store.resolve()
    target = (root / rel).resolve()
    if target != root and root not in target.parents:
        raise CorruptStoreError(
            f"{store / 'manifest.json'}: file path {rel!r} points outside the store "
            f"({target}); the manifest was edited - rebuild the store"
        )
    return target


def check_digest(store: Path, m: dict) -> None:
    """Refuse a version-2 manifest whose content no longer matches its own digest."""
    if m.get("format_version", 1) < 2:
        return
    want = m.get(DIGEST_KEY)
    if not isinstance(want, str):
        raise _fail(store, f"'{DIGEST_KEY}' is missing")
    got = manifest_digest(m)
    if got != want:
        raise _fail(store, f"content does not match its {DIGEST_KEY} ({got[:12]}... != {want[:12]}...)")
