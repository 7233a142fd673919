"""ViewStore: the item views of one catalogue on disk, one FAISS index per view.

Layout of a store folder::

    manifest.json        what is in the store (below) and the sha256 of every other file
    operators.npz        fitted parameters of the learned operators (arrays), keyed "<view>/<param>"
    views/<view>.npy     the vectors, [n_items, d] float32 (or float16), row = internal item id
    views/<view>.faiss   the FAISS index over those vectors, ids = rows

``manifest.json`` holds: format and version, creation/update time, catalogue name, the encoder
fingerprint (name, model, checkpoint, checkpoint sha256), the embedding kind and modality dims, every
view (name, operator, inputs, options, dim, scalar parameters), the raw item ids (row -> id) and titles,
the row flags (``imputed`` rows per modality and per view), index type and parameters, vector dtype,
library versions and file checksums.

Vectors are L2-normalised and indexed for inner product, so scores are cosines. The default index,
``IndexIDMap2(IndexFlatIP)``, is exact (Johnson, Douze & Jégou, "Billion-scale similarity search with
GPUs", IEEE TBD 2019, for FAISS); ``hnsw`` (Malkov & Yashunin, TPAMI 2018) and ``ivf`` are approximate
options for large catalogues. The index is built from the stored vectors (after any float16 rounding),
so a flat index returns exactly the brute-force cosine neighbours of what ``get`` returns.

Every write goes to a temporary sibling folder that is renamed into place. Every open (``load_store``,
``ViewStore(path)``) checks the manifest's consistency (item ids, view entries, every path inside the
folder; :mod:`.manifest`), reads each file once while hashing it against its checksum, checks shapes,
dims, dtype and finiteness, and last the manifest's own digest; a corrupt or mismatched store is
refused with :class:`CorruptStoreError` naming the file.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic_write import failed_folder_write
from .choices import DTYPES, INDEX_TYPES  # noqa: F401  (re-exported)
from .embeddings import Embeddings
from .encoders import sha256_file
from .errors import CorruptStoreError, ViewStoreError
from .faiss_index import build_index as _build_index  # called through this module: tests replace it
from .faiss_index import faiss_module as _faiss
from .faiss_index import index_config, set_search_params
from .manifest import DIGEST_KEY, FORMAT_VERSION, check_digest, check_inside, manifest_digest, read_manifest
from .operators import OPERATORS, ViewSpec, apply_views, fit_views
from .store_content import grown_manifest, json_id, new_manifest, view_entries
from .store_files import HashingReader, parse_npy, publish

__all__ = ["INDEX_TYPES", "Neighbours", "ViewStore", "index_config", "load_store"]


@dataclass
class Neighbours:
    """Result of one kNN query: raw item ids, rows (internal ids) and cosine scores, best first."""

    ids: list
    rows: np.ndarray
    scores: np.ndarray

    def to_json(self) -> dict:
        return {
            "ids": [json_id(i) for i in self.ids],
            "rows": self.rows.tolist(),
            "scores": [float(s) for s in self.scores],
        }


# ---------------------------------------------------------------------------------------------- the store
class ViewStore:
    """A loaded store. Create one with :meth:`create` (or :func:`fedvlr_plus.views.build_store`)."""

    def __init__(self, path: str | os.PathLike, *, verify: bool = True):
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        try:
            self._specs = [ViewSpec.from_json(v) for v in self.manifest["views"]]
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptStoreError(
                f"{self.path / 'manifest.json'}: a view entry is incomplete ({e!r}); "
                "the manifest was edited or damaged - rebuild the store"
            ) from e
        self._vectors: dict[str, np.ndarray] = {}
        self._indexes: dict = {}
        self._params: dict[str, dict] | None = None
        self._check_sums, self._seen = False, set()
        self._row_of = {str(i): r for r, i in enumerate(self.manifest["item_ids"])}
        if verify:
            self.verify()

    # ------------------------------------------------------------------ reading and checking
    def verify(self) -> ViewStore:
        """Read every file once, hashing it as it is read, then check shapes, dims, dtype, finiteness and
        index sizes, and last the manifest's own digest. Raises :class:`CorruptStoreError` naming the file."""
        files = self.manifest["files"]
        for rel in files:  # a missing file is reported before any large file is read
            if not (self.path / rel).is_file():
                raise CorruptStoreError(
                    f"{self.path / rel}: listed in the manifest but missing; the store is incomplete - rebuild it"
                )
        self._check_sums, self._seen = True, set()
        self._vectors, self._indexes, self._params = {}, {}, None
        for spec in self._specs:
            self.vectors(spec.name)  # checksum, shape, dtype, NaN
            self.index(spec.name)  # checksum, ntotal, dim
        self.params()
        for rel in files:
            if rel not in self._seen:  # listed but not needed by a view: its bytes must still match
                self._read(rel)
        check_digest(self.path, self.manifest)
        return self

    def _open(self, rel: str):
        f = check_inside(self.path, rel)
        try:
            return open(f, "rb")
        except FileNotFoundError:
            raise CorruptStoreError(
                f"{self.path / rel}: listed in the manifest but missing; the store is incomplete - rebuild it"
            ) from None
        except OSError as e:
            raise CorruptStoreError(f"{self.path / rel}: cannot be read ({e})") from e

    def _compare(self, rel: str, got: str) -> None:
        self._seen.add(rel)
        want = self.manifest["files"].get(rel)
        if got != want:
            raise CorruptStoreError(
                f"{self.path / rel}: checksum mismatch (sha256 {got[:12]}... != manifest "
                f"{str(want)[:12]}...); the file was changed or damaged - rebuild the store"
            )

    def _read(self, rel: str, parse=lambda reader: reader.read(), what: str = "file"):
        """``parse`` applied to one store file as it is read once; when verifying, the bytes that went
        by are checked against the manifest's sha256 before any parse error is reported."""
        with self._open(rel) as fh:
            reader = HashingReader(fh)
            try:
                value, error = parse(reader), None
            except Exception as e:  # judged after the checksum: a damaged file should say "checksum"
                value, error = None, e
            try:
                reader.read()  # whatever the parser did not consume is part of the file too
            except OSError as e:
                raise CorruptStoreError(f"{self.path / rel}: cannot be read ({e})") from e
        if self._check_sums:
            self._compare(rel, reader.sha.hexdigest())
        if error is not None:
            raise CorruptStoreError(f"{self.path / rel}: cannot be read as {what} ({error})") from error
        return value

    def _read_index(self, rel: str):
        """A FAISS index parsed while its file streams through sha256 (no whole-file copy)."""
        faiss = _faiss()
        return self._read(rel, lambda r: faiss.read_index(faiss.PyCallbackIOReader(r.read, 1 << 22)), "a FAISS index")

    def _view_entry(self, view: str) -> dict:
        for v in self.manifest["views"]:
            if v["name"] == view:
                return v
        raise ViewStoreError(f"{self.path}: no view '{view}' (views: {', '.join(self.views)})")

    def vectors(self, view: str | None = None) -> np.ndarray:
        """All stored vectors of a view in their stored dtype, ``[n_items, d]`` (read-only)."""
        view = self._view(view)
        if view not in self._vectors:
            entry = self._view_entry(view)
            f = self.path / entry["files"]["vectors"]
            arr = self._read(entry["files"]["vectors"], parse_npy, "a .npy array")
            want = (self.manifest["n_items"], entry["dim"])
            if arr.shape != want:
                raise CorruptStoreError(f"{f}: shape {arr.shape} but the manifest says {want} (wrong dims or rows)")
            if str(arr.dtype) != self.manifest["dtype"]:
                raise CorruptStoreError(f"{f}: dtype {arr.dtype} but the manifest says {self.manifest['dtype']}")
            bad = ~np.isfinite(arr).all(axis=1)
            if bad.any():
                raise CorruptStoreError(f"{f}: row {int(np.flatnonzero(bad)[0])} contains NaN or inf")
            arr.setflags(write=False)
            self._vectors[view] = arr
        return self._vectors[view]

    def index(self, view: str | None = None):
        view = self._view(view)
        if view not in self._indexes:
            entry = self._view_entry(view)
            f = self.path / entry["files"]["index"]
            idx = self._read_index(entry["files"]["index"])
            if idx.d != entry["dim"]:
                raise CorruptStoreError(f"{f}: index dimension {idx.d} but the manifest says {entry['dim']}")
            if idx.ntotal != self.manifest["n_items"]:
                raise CorruptStoreError(f"{f}: index holds {idx.ntotal} vectors for {self.manifest['n_items']} items")
            set_search_params(idx, self.manifest["index"])
            self._indexes[view] = idx
        return self._indexes[view]

    def params(self) -> dict[str, dict]:
        """Fitted operator parameters per view (arrays from operators.npz, scalars from the manifest)."""
        if self._params is None:
            out = {v["name"]: dict(v.get("params", {})) for v in self.manifest["views"]}
            f = self.path / "operators.npz"
            needed = [(v["name"], a) for v in self.manifest["views"] for a in v.get("arrays", [])]
            if needed:
                raw = self._read("operators.npz")
                try:
                    with np.load(io.BytesIO(raw), allow_pickle=False) as z:
                        for view, a in needed:
                            out[view][a] = z[f"{view}/{a}"]
                except (OSError, KeyError, ValueError) as e:
                    raise CorruptStoreError(f"{f}: operator parameters missing or unreadable ({e})") from e
            self._params = out
        return self._params

    # ------------------------------------------------------------------ facts
    @property
    def views(self) -> list[str]:
        return [v["name"] for v in self.manifest["views"]]

    @property
    def specs(self) -> list[ViewSpec]:
        return list(self._specs)

    @property
    def dims(self) -> dict[str, int]:
        return {v["name"]: int(v["dim"]) for v in self.manifest["views"]}

    @property
    def n_items(self) -> int:
        return int(self.manifest["n_items"])

    @property
    def item_ids(self) -> list:
        return list(self.manifest["item_ids"])

    @property
    def default_view(self) -> str:
        return self.manifest.get("default_view") or self.views[0]

    def _view(self, view: str | None) -> str:
        view = view or self.default_view
        if view not in self.views:
            raise ViewStoreError(f"{self.path}: no view '{view}' (views: {', '.join(self.views)})")
        return view

    def title(self, row: int) -> str | None:
        titles = self.manifest.get("titles")
        return titles[row] if titles else None

    def row(self, item: Any) -> int:
        """Row (internal id) of a raw item id (compared as strings, so ``"5"`` finds item ``5``)."""
        r = self._row_of.get(str(json_id(item)))
        if r is None:
            raise ViewStoreError(f"{self.path}: item {item!r} is not in the store ({self.n_items} items)")
        return r

    def find(self, text: str) -> int:
        """Row of an item by raw id, else by exact title, else by unique title prefix (case-insensitive)."""
        if str(text) in self._row_of:
            return self._row_of[str(text)]
        titles = self.manifest.get("titles") or []
        low = str(text).strip().lower()
        exact = [r for r, t in enumerate(titles) if t and t.lower() == low]
        if len(exact) >= 1:
            return exact[0]
        prefix = [r for r, t in enumerate(titles) if t and t.lower().startswith(low)]
        if len(prefix) == 1:
            return prefix[0]
        if len(prefix) > 1:
            raise ViewStoreError(
                f"'{text}' matches {len(prefix)} titles, e.g. "
                + "; ".join(titles[r] for r in prefix[:5])
                + " - be more specific"
            )
        raise ViewStoreError(f"{self.path}: no item with id or title '{text}'")

    def imputed(self, name: str) -> np.ndarray:
        """Boolean mask over rows: True where the modality (or the view's inputs) was imputed."""
        flags = self.manifest.get("row_flags", {})
        for group in ("imputed", "imputed_views"):
            if name in flags.get(group, {}):
                mask = np.zeros(self.n_items, bool)
                mask[np.asarray(flags[group][name], dtype=np.int64)] = True
                return mask
        raise ViewStoreError(f"{self.path}: no modality or view named '{name}'")

    # ------------------------------------------------------------------ queries
    def get(self, rows: Sequence[int] | np.ndarray, view: str | None = None) -> np.ndarray:
        """Vectors of ``rows`` (internal ids) as float32 ``[len(rows), d]`` - what a client downloads."""
        arr = self.vectors(view)
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.n_items):
            bad = rows[(rows < 0) | (rows >= self.n_items)]
            raise ViewStoreError(
                f"{self.path}: rows {bad[:5].tolist()} are outside [0, {self.n_items}) "
                f"(missing rows; {len(bad)} in all)"
            )
        return arr[rows].astype(np.float32)

    def search(self, vectors: np.ndarray, k: int, view: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Batch search: ``[B, d]`` queries -> (rows ``[B, k]`` with -1 padding, scores ``[B, k]``)."""
        view = self._view(view)
        q = np.asarray(vectors, dtype=np.float32)
        if q.ndim == 1:
            q = q[None]
        d = self.dims[view]
        if q.ndim != 2 or q.shape[1] != d:
            raise ViewStoreError(f"query has shape {tuple(np.shape(vectors))} but view '{view}' has dimension {d}")
        if not np.isfinite(q).all():
            raise ViewStoreError("query vector contains NaN or inf")
        if k < 1:
            raise ViewStoreError(f"k must be >= 1, got {k}")
        index = self.index(view)
        faiss = _faiss()
        threads = faiss.omp_get_max_threads()
        # A handful of queries is faster on one thread: OpenMP start-up and barriers cost more than the
        # scan itself (docs/results.md, "Server-side views: neighbours and speed").
        if len(q) < 16 and threads > 1:
            faiss.omp_set_num_threads(1)
        try:
            scores, rows = index.search(np.ascontiguousarray(q), int(min(k, self.n_items)))
        finally:
            faiss.omp_set_num_threads(threads)
        return rows, scores

    def knn(
        self,
        item: Any = None,
        *,
        vector: np.ndarray | None = None,
        k: int = 10,
        view: str | None = None,
        exclude_self: bool = True,
    ) -> Neighbours:
        """The ``k`` nearest items of a stored item (raw id; itself excluded) or of a vector, by cosine."""
        if (item is None) == (vector is None):
            raise ViewStoreError("knn: pass exactly one of item= or vector=")
        view = self._view(view)
        self_row = None
        if item is not None:
            self_row = self.row(item)
            vector = self.get([self_row], view)[0]
        else:
            vector = np.asarray(vector, dtype=np.float32)
            n = np.linalg.norm(vector)
            if not np.isfinite(vector).all() or n == 0:
                raise ViewStoreError("knn: the query vector is zero or contains NaN/inf")
            vector = vector / n
        extra = 1 if (self_row is not None and exclude_self) else 0
        rows, scores = self.search(vector, k + extra, view)
        rows, scores = rows[0], scores[0]
        keep = rows >= 0
        if extra:
            keep &= rows != self_row
        rows, scores = rows[keep][:k], scores[keep][:k]
        ids = [self.manifest["item_ids"][r] for r in rows]
        return Neighbours(ids, rows.astype(np.int64), scores.astype(np.float32))

    def info(self) -> dict:
        m = self.manifest
        size = sum((self.path / f).stat().st_size for f in m["files"]) + (self.path / "manifest.json").stat().st_size
        flags = m.get("row_flags", {}).get("imputed", {})
        return {
            "path": str(self.path),
            "catalogue": m.get("catalogue"),
            "items": self.n_items,
            "encoder": m.get("encoder"),
            "embedding_kind": m.get("embedding_kind"),
            "modalities": m["modalities"],
            "views": [
                {
                    "name": v["name"],
                    "op": v["op"],
                    "inputs": v["inputs"],
                    "dim": v["dim"],
                    "imputed_rows": len(m.get("row_flags", {}).get("imputed_views", {}).get(v["name"], [])),
                }
                for v in m["views"]
            ],
            "default_view": self.default_view,
            "imputed_rows": {k: len(v) for k, v in flags.items()},
            "index": m["index"],
            "dtype": m["dtype"],
            "created": m.get("created"),
            "updated": m.get("updated"),
            "additions": m.get("additions", []),
            "library_versions": m.get("library_versions"),
            "bytes": size,
        }

    # ------------------------------------------------------------------ writing
    @classmethod
    def create(
        cls,
        path: str | os.PathLike,
        embeddings: Embeddings,
        specs: list[ViewSpec],
        *,
        item_ids: Sequence | None = None,
        titles: Sequence[str | None] | None = None,
        encoder: dict | None = None,
        catalogue: str = "",
        dtype: str = "float32",
        index: str | dict = "flat",
        overwrite: bool = False,
    ) -> ViewStore:
        """Fit the operators, compute the views, index them and write the store atomically."""
        embeddings.check("ViewStore.create")
        item_ids = _check_create(embeddings, specs, item_ids, titles, dtype)
        params = fit_views(embeddings, specs)
        views = apply_views(embeddings, specs, params)
        cfg = index if isinstance(index, dict) else index_config(index, embeddings.n)
        manifest = new_manifest(
            embeddings,
            specs,
            views,
            item_ids=item_ids,
            titles=titles,
            encoder=encoder,
            catalogue=catalogue,
            dtype=dtype,
            index=cfg,
        )
        manifest["views"], arrays = view_entries(specs, params, views)
        stored = {name: v.astype(dtype) for name, v in views.items()}
        return cls._write(Path(path), manifest, stored, None, arrays, overwrite=overwrite)

    @classmethod
    def _write(
        cls,
        path: Path,
        manifest: dict,
        stored: dict[str, np.ndarray],
        old_indexes: dict | None,
        arrays: dict[str, np.ndarray] | None,
        *,
        overwrite: bool,
        copy_operators_from: Path | None = None,
        new_rows: np.ndarray | None = None,
    ) -> ViewStore:
        faiss = _faiss()
        path = path.resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
        try:
            (tmp / "views").mkdir()
            files = {}
            if copy_operators_from is not None:
                shutil.copy2(copy_operators_from, tmp / "operators.npz")
            else:
                np.savez(tmp / "operators.npz", **(arrays or {}))
            files["operators.npz"] = None
            for entry in manifest["views"]:
                name = entry["name"]
                vec = stored[name]
                rel_v, rel_i = f"views/{name}.npy", f"views/{name}.faiss"
                np.save(tmp / rel_v, vec, allow_pickle=False)
                if old_indexes is None:
                    idx = _build_index(vec.astype(np.float32), manifest["index"])
                else:  # append only the new rows: the old part of the index stays as it was
                    idx = old_indexes[name]
                    idx.add_with_ids(np.ascontiguousarray(vec[new_rows].astype(np.float32)), new_rows.astype(np.int64))
                faiss.write_index(idx, str(tmp / rel_i))
                entry["files"] = {"vectors": rel_v, "index": rel_i}
                files[rel_v] = files[rel_i] = None
            manifest["files"] = {rel: sha256_file(tmp / rel) for rel in files}
            manifest["format_version"] = FORMAT_VERSION
            manifest.pop(DIGEST_KEY, None)
            manifest = json.loads(json.dumps(manifest))  # digest what a reader will parse (lists, str keys)
            manifest[DIGEST_KEY] = manifest_digest(manifest)
            manifest_tmp = tmp / "manifest.json.tmp"
            manifest_tmp.write_text(json.dumps(manifest, indent=1, ensure_ascii=False), encoding="utf-8")
            os.replace(manifest_tmp, tmp / "manifest.json")
            publish(tmp, path, overwrite)
        except BaseException as exc:
            failed_folder_write(tmp, path, exc)
            raise
        return cls(path)

    def add_items(
        self,
        item_ids: Sequence,
        *,
        embeddings: Embeddings | None = None,
        items=None,
        encoder=None,
        titles: Sequence[str | None] | None = None,
    ) -> ViewStore:
        """Append new items (cold-start arrivals) without touching the old rows; returns the reloaded store.

        Give either ``embeddings`` (already encoded) or ``items`` (a content frame) with the ``encoder``
        the store was built with (compared by fingerprint). The learned operators are applied with their
        stored parameters - never refitted - so old rows stay bit-identical.
        """
        new_ids = self._check_new_ids(item_ids)
        if embeddings is None:
            embeddings, titles = self._encode_new_items(items, encoder, titles)
        self._check_new_embeddings(embeddings, len(new_ids))
        views = apply_views(embeddings, self._specs, self.params())
        n_old, n_new = self.n_items, len(new_ids)
        stored = {}
        for spec in self._specs:
            old = self.vectors(spec.name)
            stored[spec.name] = np.concatenate([old, views[spec.name].astype(old.dtype)], axis=0)
        manifest = grown_manifest(self.manifest, new_ids, titles, embeddings, self._specs)
        old_indexes = {spec.name: _faiss().clone_index(self.index(spec.name)) for spec in self._specs}
        return self._write(
            self.path,
            manifest,
            stored,
            old_indexes,
            None,
            overwrite=True,
            copy_operators_from=self.path / "operators.npz",
            new_rows=np.arange(n_old, n_old + n_new),
        )

    def _check_new_ids(self, item_ids: Sequence) -> list:
        new_ids = [json_id(i) for i in item_ids]
        if not new_ids:
            raise ViewStoreError("add_items: no item ids given")
        dup = [i for i in new_ids if str(i) in self._row_of]
        if dup:
            raise ViewStoreError(f"add_items: items {dup[:5]} are already in the store")
        if len({str(i) for i in new_ids}) != len(new_ids):
            raise ViewStoreError("add_items: item ids must be unique")
        return new_ids

    def _encode_new_items(self, items, encoder, titles):
        """(embeddings, titles) of a content frame, encoded by the store's own encoder (checked by fingerprint)."""
        if items is None or encoder is None:
            raise ViewStoreError("add_items: pass embeddings=, or items= together with encoder=")
        self._check_encoder(encoder.fingerprint())
        embeddings = encoder.encode(items, modalities=list(self.manifest["modalities"]))
        if titles is None and "title" in getattr(items, "columns", []):
            from .text import clean

            titles = [clean(t) for t in items["title"]]
        return embeddings, titles

    def _check_new_embeddings(self, embeddings: Embeddings, n_new: int) -> None:
        """The new rows have every modality of the store, each with the store's dimension."""
        mods = self.manifest["modalities"]
        embeddings.check("add_items")
        if embeddings.n != n_new:
            raise ViewStoreError(f"add_items: {embeddings.n} embedded rows for {n_new} item ids (missing rows)")
        for m, meta in mods.items():
            if m not in embeddings.modalities:
                raise ViewStoreError(f"add_items: modality '{m}' is missing (the store has {', '.join(mods)})")
            got = embeddings.modalities[m].shape[1]
            if got != meta["dim"]:
                raise ViewStoreError(f"add_items: modality '{m}' has dimension {got}, the store expects {meta['dim']}")

    def _check_encoder(self, fp: dict) -> None:
        built = self.manifest.get("encoder", {})
        keys = ("encoder", "model") if fp.get("encoder") == "precomputed" else ("encoder", "model", "checkpoint_sha256")
        diff = {k: (built.get(k), fp.get(k)) for k in keys if built.get(k) != fp.get(k)}
        if diff:
            raise ViewStoreError(
                "add_items: the encoder differs from the one the store was built with "
                + "; ".join(f"{k}: store {a!r} vs given {b!r}" for k, (a, b) in diff.items())
                + " - new rows would live in another space; rebuild the store instead"
            )


def _check_create(
    embeddings: Embeddings, specs: list[ViewSpec], item_ids: Sequence | None, titles: Sequence | None, dtype: str
) -> list:
    """The arguments of :meth:`ViewStore.create` checked; returns the item ids as JSON keeps them."""
    n = embeddings.n
    if dtype not in DTYPES:
        raise ViewStoreError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    item_ids = list(range(n)) if item_ids is None else [json_id(i) for i in item_ids]
    if len(item_ids) != n:
        raise ViewStoreError(f"{len(item_ids)} item ids for {n} embedded items (missing rows)")
    if len({str(i) for i in item_ids}) != n:
        raise ViewStoreError("item ids must be unique (as strings)")
    if titles is not None and len(titles) != n:
        raise ViewStoreError(f"{len(titles)} titles for {n} items")
    for spec in specs:
        if spec.op not in OPERATORS:
            raise ViewStoreError(f"view '{spec.name}': unknown operator '{spec.op}'")
    return item_ids


def load_store(path: str | os.PathLike, *, verify: bool = True) -> ViewStore:
    """Open a store, verified (see the module docstring); ``verify=False`` reads only the manifest up front."""
    return ViewStore(path, verify=verify)
