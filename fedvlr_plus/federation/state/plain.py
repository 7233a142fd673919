"""A checkpoint's state as plain JSON plus a flat table of tensors, and back, exactly.

Reading a checkpoint must never run code, so nothing is pickled: :func:`split_tensors` turns a state tree (dicts,
lists, tuples, numbers, strings, tensors, numpy arrays, evaluation results with their per-user tables) into a JSON
skeleton in which every tensor or array is a reference into a ``{name: tensor}`` table (stored with safetensors),
and :func:`join_tensors` rebuilds the tree from the two. Every value comes back bit for bit: floats are written
with ``repr`` (shortest exact form), arrays as their raw bytes.

Markers are one-key objects whose key starts with ``$``; a dict whose keys are not all plain strings is written
as ``{"$dict": [[key, value], ...]}`` so that integer keys (client ids) survive.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from .streamed_safetensors import StreamedTensor, loaded

# safetensors has no unsigned types wider than a byte for torch: such arrays are stored as their signed twin
# (same bytes) and viewed back
_SIGNED_TWIN = {"uint16": "int16", "uint32": "int32", "uint64": "int64"}


class _Writer:
    def __init__(self):
        self.tensors: dict[str, torch.Tensor] = {}

    def tensor(self, t) -> str:
        """The name of ``t`` in the table (a tensor, or a :class:`StreamedTensor` written from its source)."""
        name = f"t{len(self.tensors)}"
        # no copy for a CPU tensor (the common case)
        self.tensors[name] = t if isinstance(t, StreamedTensor) else t.detach().cpu().contiguous()
        return name

    def encode(self, obj):
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, (int, np.integer)) and not isinstance(obj, np.bool_):
            return int(obj)
        if isinstance(obj, np.bool_):
            return bool(obj)
        if isinstance(obj, (float, np.floating)):
            return float(obj) if math.isfinite(obj) else {"$float": repr(float(obj))}
        if isinstance(obj, (torch.Tensor, StreamedTensor)):  # a streamed one is read back as a tensor
            return {"$tensor": self.tensor(obj)}
        if isinstance(obj, np.ndarray):
            return self._array(obj)
        if isinstance(obj, tuple):
            return {"$tuple": [self.encode(v) for v in obj]}
        if isinstance(obj, list):
            return [self.encode(v) for v in obj]
        if isinstance(obj, dict):
            return self._dict(obj)
        if isinstance(obj, pd.DataFrame):
            return {"$frame": self._frame(obj)}
        from ...evaluation.results import EvalResult

        if isinstance(obj, EvalResult):
            return {
                "$eval": {
                    "per_user": self._frame(obj.per_user),
                    "per_user_warm": self._frame(obj.per_user_warm),
                    "per_user_cold": self._frame(obj.per_user_cold),
                    "metric_names": list(obj.metric_names),
                    "meta": self._dict(obj.meta),
                }
            }
        raise TypeError(f"cannot store a {type(obj).__name__} in a checkpoint")

    def _array(self, a: np.ndarray) -> dict:
        if a.dtype == object and a.size == 0:  # an empty table's columns (pandas gives them no type)
            return {"$ndarray": self.tensor(torch.zeros(a.shape)), "dtype": "object"}
        if a.dtype == object or a.dtype.kind in "USV":
            raise TypeError(f"cannot store a numpy array of {a.dtype} in a checkpoint")
        dtype = str(a.dtype)
        raw = np.ascontiguousarray(a).view(_SIGNED_TWIN[dtype]) if dtype in _SIGNED_TWIN else a
        return {"$ndarray": self.tensor(torch.from_numpy(np.ascontiguousarray(raw))), "dtype": dtype}

    def _dict(self, d: dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in d):
            return {k: self.encode(v) for k, v in d.items()}
        for k in d:
            if not isinstance(k, (str, int, np.integer)):
                raise TypeError(f"cannot store a dict key of type {type(k).__name__} in a checkpoint")
        return {"$dict": [[self.encode(k), self.encode(v)] for k, v in d.items()]}

    def _frame(self, f: pd.DataFrame) -> dict:
        return {
            "columns": [str(c) for c in f.columns],
            "data": [self._array(f[c].to_numpy()) for c in f.columns],
            "index": self._array(f.index.to_numpy()),
        }


def split_tensors(state) -> tuple[object, dict[str, torch.Tensor]]:
    """``state`` as (a JSON-ready skeleton, the tensors it refers to by name)."""
    w = _Writer()
    skeleton = w.encode(state)
    return skeleton, w.tensors


def join_tensors(skeleton, tensors: dict[str, torch.Tensor]):
    """The state that :func:`split_tensors` split (``KeyError`` when the skeleton names a tensor not in ``tensors``;
    ``ValueError`` on a marker it does not know)."""
    return _Reader(tensors).decode(skeleton)


class _Reader:
    def __init__(self, tensors):
        self.tensors = tensors

    def decode(self, obj):
        if isinstance(obj, list):
            return [self.decode(v) for v in obj]
        if not isinstance(obj, dict):
            return obj
        if not any(k.startswith("$") for k in obj):
            return {k: self.decode(v) for k, v in obj.items()}
        ((tag, value),) = [(k, v) for k, v in obj.items() if k != "dtype"]
        if tag == "$tensor":
            return self.tensors[value]
        if tag == "$ndarray":
            return self._array(obj)
        if tag == "$float":
            return float(value)
        if tag == "$tuple":
            return tuple(self.decode(v) for v in value)
        if tag == "$dict":
            return {self.decode(k): self.decode(v) for k, v in value}
        if tag == "$frame":
            return self._frame(value)
        if tag == "$eval":
            from ...evaluation.results import EvalResult

            return EvalResult(
                per_user=self._frame(value["per_user"]),
                per_user_warm=self._frame(value["per_user_warm"]),
                per_user_cold=self._frame(value["per_user_cold"]),
                metric_names=list(value["metric_names"]),
                meta=self.decode(value["meta"]),
            )
        raise ValueError(f"unknown marker {tag!r}")

    def _array(self, obj: dict) -> np.ndarray:
        a = loaded(self.tensors[obj["$ndarray"]]).numpy()  # (a tensor may have been left in its file)
        dtype = obj["dtype"]
        return a.view(dtype) if dtype in _SIGNED_TWIN else a.astype(dtype, copy=False)

    def _frame(self, value: dict) -> pd.DataFrame:
        columns = {c: self._array(d) for c, d in zip(value["columns"], value["data"])}
        return pd.DataFrame(columns, index=pd.Index(self._array(value["index"])), columns=value["columns"])
