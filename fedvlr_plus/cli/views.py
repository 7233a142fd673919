"""``fedvlr-plus views build|info|knn|bench``: a thin layer over :mod:`fedvlr_plus.views`.

The main CLI calls :func:`register` with its subparsers; the ``views`` command runs :func:`run`.
"""
from __future__ import annotations

import argparse
import json
import sys

from ..views.choices import DTYPES, ENCODERS, INDEX_TYPES
from ..views.errors import EncoderUnavailable, ViewStoreError
from .argtypes import positive_int


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``views`` command (build / info / knn / bench) to an argparse subparsers object."""
    p = subparsers.add_parser("views", help="server-side item views: encode, fuse, index (FAISS)",
                              description="Build and query a ViewStore (item views in FAISS).")
    sub = p.add_subparsers(dest="views_command", metavar="{build,info,knn,bench}")
    sub.required = True

    b = sub.add_parser("build", help="encode a catalogue and write a ViewStore")
    b.add_argument("source", help="a dataset name or path, as accepted by fedvlr_plus.datasets.load")
    b.add_argument("--out", required=True, help="store folder to create")
    b.add_argument("--encoder", default="auto", choices=ENCODERS,
                   help="auto (default) picks the best encoder that works offline and says which")
    b.add_argument("--model", help="open_clip model name or config .json (default ViT-B-32); "
                                   "sentence model name/folder (default all-MiniLM-L6-v2)")
    b.add_argument("--pretrained", help="checkpoint file or folder, an open_clip tag (downloads when online), "
                                        "or 'none' (open_clip random weights, plumbing only)")
    b.add_argument("--views", help="comma-separated view names or NAME=OP(IN1,IN2); default: see docs")
    b.add_argument("--index", default="flat", choices=INDEX_TYPES, help="flat (exact, default), hnsw or ivf")
    b.add_argument("--dtype", default="float32", choices=DTYPES, help="stored vector precision")
    b.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    b.add_argument("--batch-size", type=positive_int, default=64, help="items per encoder batch (default 64)")
    b.add_argument("--fetch-images", action="store_true", help="download image URLs (off by default)")
    b.add_argument("--image-root", help="folder that relative image paths are relative to")
    b.add_argument("--overwrite", action="store_true", help="replace an existing store at --out")
    b.add_argument("--no-progress", action="store_true", help="do not show progress bars")
    b.add_argument("--json", action="store_true", help="print the build report as JSON")

    i = sub.add_parser("info", help="describe a ViewStore")
    i.add_argument("store", help="the ViewStore folder")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.add_argument("--no-verify", action="store_true",
                   help="read only the manifest, not the files (to inspect a store that fails verification)")

    k = sub.add_parser("knn", help="nearest items of an item in one view")
    k.add_argument("store", help="the ViewStore folder")
    k.add_argument("--item", required=True, help="raw item id, or an exact/prefix title")
    k.add_argument("--k", type=positive_int, default=10, help="number of neighbours (default 10)")
    k.add_argument("--view", help="view name (default: the store's default view)")
    k.add_argument("--json", action="store_true", help="print neighbour ids and scores as JSON")

    c = sub.add_parser("bench", help="time encode + index of N items and kNN latency")
    c.add_argument("--n", type=positive_int, default=10_000,
                   help="items to encode (ml-100k titles tiled; default 10000)")
    c.add_argument("--encoder", default="sentence", choices=[e for e in ENCODERS if e not in ("auto", "precomputed")],
                   help="encoder to time (default sentence)")
    c.add_argument("--queries", type=positive_int, default=1000, help="kNN queries to time (default 1000)")
    c.add_argument("--k", type=positive_int, default=10, help="neighbours per query (default 10)")
    c.add_argument("--index", default="flat", choices=INDEX_TYPES, help="index type (default flat)")
    c.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    c.add_argument("--batch-size", type=positive_int, default=64, help="items per encoder batch (default 64)")
    c.add_argument("--out", help="keep the store here (default: a temporary folder)")
    c.add_argument("--json", action="store_true", help="print the timings as one JSON object")
    p.set_defaults(func=run)
    return p


def _print_json(obj) -> None:
    print(json.dumps(obj, ensure_ascii=False, default=str))  # one line: the last line is the JSON object


def _say(line: str) -> None:
    print(f"views: {line}", file=sys.stderr, flush=True)


def _require_content(data, source) -> None:
    """Refuse, naming where content comes from, a catalogue with nothing to encode: no feature array, no item
    text and no item image (an Amazon reviews file without its metadata file)."""
    from ..fedvlr.views import content_remedy, has_content

    items = data.items
    images = items is not None and "image" in items.columns and bool(items["image"].notna().any())
    if not (has_content(data) or images):
        raise ViewStoreError(f"views build {source}: {data.name} has no item content to encode (no feature array, "
                             f"item text or image); {content_remedy(data)}")


def _build(args) -> int:
    try:
        from fedvlr_plus.datasets import load
    except ImportError as e:
        raise ViewStoreError(f"fedvlr_plus.datasets.load is not available ({e}); cannot read '{args.source}'") from e
    from ..views.build import build_store

    data = load(args.source)
    _require_content(data, args.source)
    store, report = build_store(
        data, args.out, encoder=args.encoder, model=args.model, pretrained=args.pretrained, views=args.views,
        dtype=args.dtype, index=args.index, device=args.device, batch_size=args.batch_size,
        progress=not args.no_progress, fetch_images=args.fetch_images, image_root=args.image_root,
        overwrite=args.overwrite, announce=_say,
    )
    if args.json:
        _print_json({"store": str(store.path), **report.to_json(), "dims": store.dims})
    else:
        print(f"wrote {store.path}: {report.n_items} items, views "
              + ", ".join(f"{v}[{d}]" for v, d in store.dims.items()))
        imputed = {m: c for m, c in report.imputed.items() if c}
        if imputed:
            print("imputed rows (flagged in the manifest): " + ", ".join(f"{m} {c}" for m, c in imputed.items()))
        print("seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in report.seconds.items()))
    print(_next_after_build(args.source, store.path), file=sys.stderr)
    return 0


def _next_after_build(source: str, store) -> str:
    """Where a built store goes: ``--views`` of the commands that train the layer."""
    from ..errors import shell_word

    return (f"next: pass --views {shell_word(store)} to run, coldstart or experiment paper-table, e.g. fedvlr-plus "
            f"run {shell_word(source)} --backbone fedavg --fusion fedvlr --views {shell_word(store)}")


def _info(args) -> int:
    from ..views.store import load_store

    info = load_store(args.store, verify=not args.no_verify).info()
    if args.json:
        _print_json(info)
        return 0
    enc = info["encoder"] or {}
    print(f"{info['path']}  ({info['catalogue']}, {info['items']} items, {info['dtype']}, "
          f"{info['index']['type']} index, {info['bytes'] / 1e6:.1f} MB)")
    print(f"encoder: {enc.get('encoder')} {enc.get('model')}  checkpoint {enc.get('checkpoint')} "
          f"sha256 {str(enc.get('checkpoint_sha256'))[:12]}")
    print("modalities: " + ", ".join(f"{m}[{v['dim']}] imputed {info['imputed_rows'].get(m, 0)}"
                                     for m, v in info["modalities"].items()))
    for v in info["views"]:
        star = " (default)" if v["name"] == info["default_view"] else ""
        print(f"  view {v['name']}{star}: {v['op']}({', '.join(v['inputs'])}) dim {v['dim']}, "
              f"{v['imputed_rows']} imputed rows")
    print(f"created {info['created']}, updated {info['updated']}, additions {len(info['additions'])}")
    return 0


def _knn(args) -> int:
    from ..views.store import load_store

    store = load_store(args.store)
    row = store.find(args.item)
    view = args.view or store.default_view
    nb = store.knn(item=store.item_ids[row], k=args.k, view=view)
    if args.json:
        _print_json({
            "store": str(store.path), "view": view, "k": args.k,
            "item": {"id": store.item_ids[row], "row": row, "title": store.title(row)},
            "ids": nb.to_json()["ids"], "scores": nb.to_json()["scores"],
            "neighbours": [{"id": i, "row": int(r), "score": float(s), "title": store.title(int(r))}
                           for i, r, s in zip(nb.to_json()["ids"], nb.rows, nb.scores)],
        })
        return 0
    t = store.title(row)
    print(f"neighbours of {store.item_ids[row]}" + (f" ({t})" if t else "") + f" in view '{view}':")
    for i, r, s in zip(nb.ids, nb.rows, nb.scores):
        tt = store.title(int(r))
        print(f"  {s:.4f}  {i}" + (f"  {tt}" if tt else ""))
    return 0


def _bench(args) -> int:
    from ..views.bench import bench_views

    res = bench_views(args.n, encoder=args.encoder, queries=args.queries, k=args.k, out=args.out,
                      index=args.index, device=args.device, batch_size=args.batch_size)
    if args.json:
        _print_json(res)
    else:
        s = res["seconds"]
        print(f"{res['n_items']} items, encoder {res['encoder']} ({res['model']}), views {res['views']}")
        print(f"encode {s['encode']:.1f} s ({res['items_per_second_encode']} items/s), views+index "
              f"{s['views_and_index']:.2f} s, load+verify {s['load_verify']:.2f} s")
        q = res["knn_ms"]
        print(f"knn (k={q['k']}, view {q['view']}): mean {q['mean']:.3f} ms, p50 {q['p50']:.3f} ms, "
              f"p95 {q['p95']:.3f} ms; batch {res['batch_search']['queries_per_second']:.0f} queries/s")
    return 0


def run(args) -> int:
    """Run a parsed ``views`` command; returns the exit status (2 with a one-line error on bad input)."""
    handlers = {"build": _build, "info": _info, "knn": _knn, "bench": _bench}
    try:
        return handlers[args.views_command](args)
    except (ViewStoreError, EncoderUnavailable, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # DataError from the loaders is a ValueError naming the file and row
        if type(e).__name__ == "DataError":
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise

