"""Glue between ``fedvlr-plus run ... --fusion`` and the FedVLR layer: where the views come from, which
modalities take part, and the router report (entropy and across-user spread of the expert weights)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from .errors import ConfigError
from .fusion import FusionLayer, cold_rule
from .fusion_args import add_fusion_arguments  # noqa: F401  (kept importable from here)

RAW_OPS = ("identity",)


def _cache_root() -> Path:
    return Path(os.environ.get("FEDVLR_CACHE", Path.home() / ".cache" / "fedvlr_plus"))


def load_views(data, store: str | None = None, names: list[str] | None = None,
               progress: bool = True) -> dict[str, np.ndarray]:
    """Views of every item of ``data`` (name -> [n_items, d]), rows aligned with the data's item ids."""
    if store is None and data.features:
        from .views.encoders import modality_name

        views = {modality_name(k): np.asarray(v, np.float32) for k, v in data.features.items()}
        return {k: views[k] for k in (names or views)}
    from .views import build_store, load_store

    path = Path(store) if store else _cache_root() / "views" / data.name
    if (path / "manifest.json").exists():
        vs = load_store(path)
    else:
        vs, _ = build_store(data, path, progress=progress)
    ids = [str(x) for x in vs.item_ids]
    if len(ids) != data.n_items or ids != [str(x) for x in data.item_ids]:
        raise ValueError(f"view store {path} holds {len(ids)} items that do not match the {data.n_items} items "
                         f"of {data.name} (build the store from the same source)")
    if names is None:
        names = [s.name for s in vs.specs if s.op in RAW_OPS]
    rows = np.arange(vs.n_items)
    return {n: vs.get(rows, n) for n in names}


def selected_views(args, data) -> tuple[dict[str, np.ndarray], set[str]]:
    """The views ``--views/--fusion-views`` name, without those ``--drop-modality`` removes; and the drop set."""
    names = args.fusion_views.split(",") if args.fusion_views else None
    views = load_views(data, args.views, names, progress=not getattr(args, "no_progress", False))
    drop = set(args.drop_modality)
    unknown = drop - {"id"} - set(views)
    if unknown:
        raise ConfigError(f"--drop-modality {','.join(sorted(unknown))}", "no such modality",
                          f"choose from id, {', '.join(views)}")
    return {k: v for k, v in views.items() if k not in drop}, drop


def fusion_backbone(args, data, backbone: str, dim: int) -> FusionLayer:
    from .adapters import make_backbone

    views, drop = selected_views(args, data)
    nbrs = cold_rule(views, data.cold_items(), args.cold_neighbours)
    opts = {"fedrap_lambda": args.fedrap_lambda, "fedrap_mu": args.fedrap_mu} if backbone == "fedrap" else {}
    base = make_backbone(backbone, data.n_items, dim, **opts)
    try:
        return FusionLayer(base, views, mode=args.fusion, temperature=args.router_temperature,
                           use_id="id" not in drop, balance=args.router_balance,
                           cold_neighbours=nbrs if "id" not in drop else None,
                           residual=getattr(args, "fusion_residual", False),
                           personal_offset=getattr(args, "personal_offset", False))
    except ValueError as exc:   # a backbone the layer cannot wrap, bad views: a message, not a traceback
        raise ConfigError(f"--fusion {args.fusion} with --backbone {backbone}", str(exc)) from None


def router_report(run, users: np.ndarray | None = None) -> dict:
    """Expert weights of every user at the run's current state: mean entropy and across-user spread."""
    bb = run.bb
    if getattr(bb, "mode", None) != "fedvlr":
        return {}
    users = np.asarray(users if users is not None else run.eligible, dtype=np.int64)
    states = [run.store.load(int(u)) for u in users]
    fresh = [i for i, s in enumerate(states) if s is None]
    if fresh:
        from .federation.state import init_private_states

        for i, st in zip(fresh, init_private_states(bb, users[fresh], run.cfg.seed)):
            states[i] = st
    from .federation.batched import history_ctx

    names = [s.name for s in bb.private_specs() if s.name.startswith("router.")]
    p = {k: torch.stack([s[k] for s in states]) for k in names}
    with torch.no_grad():
        w = bb.weights(p, history_ctx(run.indptr, run.indices, users)).double()
    ent = -(w * torch.log(w.clamp_min(1e-12))).sum(-1)
    return {"experts": list(bb.experts), "mean_weights": w.mean(0).tolist(), "std_across_users": w.std(0).tolist(),
            "mean_entropy": float(ent.mean()), "max_entropy": float(np.log(w.shape[1])),
            "min_entropy": float(ent.min()), "n_users": int(len(users))}
