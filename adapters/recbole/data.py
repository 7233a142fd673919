"""Our data as a RecBole dataset (written as atomic files, read back by RecBole, with the id maps between the two)
and a RecBole dataset as our data."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import torch

from .models import recbole_workdir, resolve_model


def _dataset_name(name: str) -> str:
    # never 'ml-100k' itself: RecBole would read its bundled copy and its property file instead of our split
    return "fedvlr_" + re.sub(r"[^A-Za-z0-9_]+", "_", name or "data").strip("_")


def build_from_data(model, data, workdir: str | os.PathLike, *, config_file=None, config_dict=None, seed: int = 0):
    """RecBole ``Config`` and training ``Dataset`` holding exactly our split of ``data``.

    The split is written as atomic benchmark files (``.train/.valid/.test.inter``) plus ``.item``/``.user``
    id lists (every item and user keeps a RecBole id, even without training interactions), and only the id,
    rating and timestamp columns are loaded. Returns ``(config, train_dataset, item_map, user_map)``.
    """
    from fedvlr_plus._compat import patch_recbole
    from fedvlr_plus.datasets.recbole_atomic import _token, write_atomic

    patch_recbole()
    from recbole.config import Config
    from recbole.data import create_dataset

    cls = resolve_model(model)
    data.require_split(need=("train", "valid", "test"))
    name = _dataset_name(data.name)
    workdir = Path(workdir)
    write_atomic(data, workdir / name, name)
    cd = {
        "data_path": str(workdir),
        "benchmark_filename": ["train", "valid", "test"],
        "load_col": {"inter": ["user_id", "item_id", "rating", "timestamp"], "item": ["item_id"], "user": ["user_id"]},
        "USER_ID_FIELD": "user_id",
        "ITEM_ID_FIELD": "item_id",
        "RATING_FIELD": "rating",
        "TIME_FIELD": "timestamp",
        "val_interval": None,
        "user_inter_num_interval": "[0,inf)",
        "item_inter_num_interval": "[0,inf)",
        "filter_inter_by_user_or_item": False,
        "checkpoint_dir": str(workdir / "saved"),
        "show_progress": False,
        "use_gpu": False,
        "save_dataset": False,
        "save_dataloaders": False,
        "seed": int(seed),
        "reproducibility": True,
        "eval_args": {"split": {"LS": "valid_and_test"}, "order": "TO", "group_by": "user", "mode": "full"},
    }
    cd.update(config_dict or {})
    files = [str(f) for f in ([config_file] if isinstance(config_file, (str, os.PathLike)) else config_file or [])]
    with recbole_workdir(workdir):
        config = Config(model=cls, dataset=name, config_file_list=files or None, config_dict=cd)
        dataset = create_dataset(config)
        train_ds = dataset.build()[0]
    tok = {str(t): i for i, t in enumerate(dataset.field2id_token["item_id"])}
    utok = {str(t): i for i, t in enumerate(dataset.field2id_token["user_id"])}
    try:
        item_map = np.array([tok[_token(x, "item id")] for x in data.item_ids], dtype=np.int64)
        user_map = np.array([utok[_token(x, "user id")] for x in data.user_ids], dtype=np.int64)
    except KeyError as exc:
        raise RuntimeError(
            f"RecBole dropped id {exc} while loading {name}; check the filters of the RecBole config"
        ) from None
    return config, train_ds, item_map, user_map


def data_from_recbole(dataset, name: str | None = None, split: str = "loo"):
    """Our :class:`~fedvlr_plus.datasets.InteractionData` from a RecBole ``Dataset`` (ids shifted by one:
    our ``i`` is RecBole's ``i + 1``; raw ids are RecBole's tokens), split leave-one-out by time."""
    from fedvlr_plus.datasets import InteractionData, splits

    uf, itf = dataset.uid_field, dataset.iid_field
    inter = dataset.inter_feat
    cols = list(inter.columns)  # a pandas frame before Dataset.build(), an Interaction after

    def col(name):
        v = inter[name]
        return v.numpy() if torch.is_tensor(v) else np.asarray(v)

    u = col(uf).astype(np.int64) - 1
    i = col(itf).astype(np.int64) - 1
    rf, tf = dataset.config["RATING_FIELD"], dataset.time_field
    rating = col(rf) if rf in cols else None
    ts = col(tf) if tf and tf in cols else None

    from fedvlr_plus.datasets.core import _inter_frame

    data = InteractionData(
        name=name or dataset.dataset_name,
        user_ids=np.asarray(dataset.field2id_token[uf][1:], dtype=object),
        item_ids=np.asarray(dataset.field2id_token[itf][1:], dtype=object),
        inter=_inter_frame(u, i, rating, ts),
        source=f"recbole:{dataset.dataset_name}",
        format="recbole",
    )
    data = splits.dedup(data)
    return splits.standard(data, split=split) if split else data
