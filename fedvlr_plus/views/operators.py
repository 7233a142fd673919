"""Pre-fusion operators: per-modality embeddings -> K named candidate views per item.

FedVLR (Li et al., "Federated Vision-Language-Recommendation with Personalized Fusion", AAAI 2026)
fuses text and image into several candidate views on the server; each client's private router then
weights the views. Here the server-side views are fixed content views (the learnable ID part and the
per-view projections live on the client).

``OPERATORS`` is an open registry, ``name -> ViewOperator``; add an entry to make a new operator
available to :class:`ViewSpec`. Built in:

==============  ===========================================================================  ========
operator        view                                                                         fitted?
==============  ===========================================================================  ========
``identity``    one modality as it is                                                        no
``mean``        ``normalise(sum_i x_i / m)`` (equal dims)                                    no
``weighted``    ``normalise(sum_i w_i x_i)`` (equal dims; ``options["weights"]``)            no
``concat``      ``[x_1, ..., x_m] / sqrt(m)``: inner product = mean of per-modality cosines  no
``cca``         consensus of a regularised CCA fitted on the catalogue (:mod:`.cca`)         yes
``procrustes``  ``normalise(a + b R)``, R the orthogonal map of b onto a (:mod:`.procrustes`)  yes
==============  ===========================================================================  ========

Every view is L2-normalised, so inner product = cosine. Learned operators are fitted only on rows
where none of their inputs is imputed, and their parameters are stored, so items added later are
projected with the same parameters (old rows stay bit-identical).

Default views (:func:`default_views`), by what the encoder produced:

* **text + image** (OpenCLIP, CLIP features such as KU's): ``text``, ``image``, ``balanced`` (mean; or
  concat when the dims differ) and ``cca`` (text vs image).
* **text fields** (text-only catalogues: MovieLens, many Amazon categories): one view per field that
  exists - ``title``, ``description``, ``metadata`` (categories, year, brand) - plus ``balanced`` (mean of
  the fields) and ``cca`` (title vs metadata, or title vs description). The fields play the role the
  modalities play for multimodal items: a user who picks films by genre and one who picks by title
  words are served by different views. One combined-text view is not added: it would nearly repeat
  ``balanced``.
* a single modality: that one view.

Extra named views for ``--views``: ``text_heavy`` / ``visual_heavy`` (weighted 0.75 / 0.25),
``concat``, ``procrustes``; or a custom ``NAME=OP(IN1,IN2,...)``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .cca import apply_cca, fit_cca
from .embeddings import Embeddings, l2_normalise
from .errors import ViewStoreError
from .procrustes import apply_procrustes, fit_procrustes

Params = dict


@dataclass(frozen=True)
class ViewOperator:
    """``fit(inputs, options) -> params`` (learned operators) and ``apply(inputs, options, params) -> [N, d]``."""

    apply: Callable[[list[np.ndarray], dict, Params], np.ndarray]
    fit: Callable[[list[np.ndarray], dict], Params] | None = None
    doc: str = ""

    @property
    def learned(self) -> bool:
        return self.fit is not None


def _same_dims(xs: list[np.ndarray], op: str) -> None:
    dims = {x.shape[1] for x in xs}
    if len(dims) > 1:
        raise ViewStoreError(f"{op}: inputs have different dimensions {sorted(dims)}; use 'concat' or 'cca'")


def _identity(xs, options, params):
    if len(xs) != 1:
        raise ViewStoreError(f"identity takes one input, got {len(xs)}")
    return xs[0]


def _mean(xs, options, params):
    _same_dims(xs, "mean")
    return np.mean(xs, axis=0)


def _weighted(xs, options, params):
    _same_dims(xs, "weighted")
    w = options.get("weights")
    if w is None or len(w) != len(xs):
        raise ViewStoreError(f"weighted: options['weights'] must give {len(xs)} weights, got {w}")
    return sum(float(wi) * x for wi, x in zip(w, xs))


def _concat(xs, options, params):
    return np.concatenate(xs, axis=1) / np.sqrt(len(xs))


def _two(xs, op):
    if len(xs) != 2:
        raise ViewStoreError(f"{op} takes two inputs, got {len(xs)}")
    return xs


OPERATORS: dict[str, ViewOperator] = {
    "identity": ViewOperator(_identity, doc="one modality unchanged"),
    "mean": ViewOperator(_mean, doc="normalised mean of the inputs"),
    "weighted": ViewOperator(_weighted, doc="normalised weighted sum (options: weights)"),
    "concat": ViewOperator(_concat, doc="concatenation / sqrt(m)"),
    "cca": ViewOperator(
        lambda xs, o, p: apply_cca(*_two(xs, "cca"), p),
        fit=lambda xs, o: fit_cca(*_two(xs, "cca"), dim=int(o.get("dim", 128)), reg=float(o.get("reg", 0.1))),
        doc="regularised CCA consensus (options: dim=128, reg=0.1)",
    ),
    "procrustes": ViewOperator(
        lambda xs, o, p: apply_procrustes(*_two(xs, "procrustes"), p),
        fit=lambda xs, o: fit_procrustes(*_two(xs, "procrustes")),
        doc="first input + second input rotated onto it",
    ),
}


@dataclass
class ViewSpec:
    """One view: its name, the operator, the input modalities and the operator's options."""

    name: str
    op: str
    inputs: tuple[str, ...]
    options: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"name": self.name, "op": self.op, "inputs": list(self.inputs), "options": dict(self.options)}

    @classmethod
    def from_json(cls, d: dict) -> ViewSpec:
        return cls(d["name"], d["op"], tuple(d["inputs"]), dict(d.get("options", {})))


def _pair(emb: Embeddings) -> tuple[str, str] | None:
    names = emb.names
    if {"text", "image"} <= set(names):
        return "text", "image"
    if emb.kind == "text-fields" and "title" in names:
        other = "metadata" if "metadata" in names else "description" if "description" in names else None
        return ("title", other) if other else None
    return (names[0], names[1]) if len(names) >= 2 else None


def named_views(emb: Embeddings) -> dict[str, ViewSpec]:
    """Every predefined view that makes sense for these modalities (the defaults and the extras)."""
    out = {m: ViewSpec(m, "identity", (m,)) for m in emb.names}
    if len(emb.names) >= 2:
        dims = {emb.modalities[m].shape[1] for m in emb.names}
        out["balanced"] = ViewSpec("balanced", "mean" if len(dims) == 1 else "concat", tuple(emb.names))
        out["concat"] = ViewSpec("concat", "concat", tuple(emb.names))
    pair = _pair(emb)
    if pair:
        out["cca"] = ViewSpec("cca", "cca", pair, {"dim": 128, "reg": 0.1})
        a, b = pair
        if emb.modalities[a].shape[1] == emb.modalities[b].shape[1]:
            out["procrustes"] = ViewSpec("procrustes", "procrustes", pair)
            if pair == ("text", "image"):
                out["text_heavy"] = ViewSpec("text_heavy", "weighted", pair, {"weights": [0.75, 0.25]})
                out["visual_heavy"] = ViewSpec("visual_heavy", "weighted", pair, {"weights": [0.25, 0.75]})
    return out


def default_views(emb: Embeddings) -> list[ViewSpec]:
    named = named_views(emb)
    keep = list(emb.names) + [n for n in ("balanced", "cca") if n in named]
    return [named[n] for n in keep]


_CUSTOM = re.compile(r"^\s*([A-Za-z0-9_\-]+)\s*=\s*([A-Za-z0-9_]+)\s*\(([^)]*)\)\s*$")


def parse_views(spec: str | list | None, emb: Embeddings) -> list[ViewSpec]:
    """``None`` -> defaults; ``"text,image,cca"`` or a list of names / ``NAME=OP(A,B)`` / ViewSpec objects."""
    if spec is None:
        return default_views(emb)
    items = [s for s in re.split(r",(?![^()]*\))", spec) if s.strip()] if isinstance(spec, str) else list(spec)
    named = named_views(emb)
    out: list[ViewSpec] = []
    for item in items:
        if isinstance(item, ViewSpec):
            out.append(item)
            continue
        m = _CUSTOM.match(item)
        if m:
            name, op, args = m.groups()
            out.append(ViewSpec(name, op, tuple(a.strip() for a in args.split(",") if a.strip())))
        elif item.strip() in named:
            out.append(named[item.strip()])
        else:
            raise ViewStoreError(
                f"unknown view '{item.strip()}'; available here: {', '.join(named)} "
                "or NAME=OP(INPUT,...) with OP in " + ", ".join(OPERATORS)
            )
    names = [v.name for v in out]
    if len(set(names)) != len(names):
        raise ViewStoreError(f"view names must be unique, got {names}")
    for v in out:
        if v.op not in OPERATORS:
            raise ViewStoreError(f"view '{v.name}': unknown operator '{v.op}' (known: {', '.join(OPERATORS)})")
        for i in v.inputs:
            if i not in emb.modalities:
                raise ViewStoreError(
                    f"view '{v.name}': input '{i}' is not an encoded modality ({', '.join(emb.names)})"
                )
    return out


def view_imputed(emb: Embeddings, spec: ViewSpec) -> np.ndarray:
    """A view row is imputed when any of its inputs is."""
    flags = np.zeros(emb.n, bool)
    for i in spec.inputs:
        flags |= emb.imputed.get(i, np.zeros(emb.n, bool))
    return flags


def fit_views(emb: Embeddings, specs: list[ViewSpec]) -> dict[str, Params]:
    """Fit every learned operator on the rows where none of its inputs is imputed."""
    params: dict[str, Params] = {}
    for spec in specs:
        op = OPERATORS[spec.op]
        if not op.learned:
            params[spec.name] = {}
            continue
        real = ~view_imputed(emb, spec)
        xs = [emb.modalities[i][real] for i in spec.inputs]
        params[spec.name] = op.fit(xs, spec.options)
    return params


def apply_views(emb: Embeddings, specs: list[ViewSpec], params: dict[str, Params]) -> dict[str, np.ndarray]:
    """The views as float32 ``[N, d_view]`` unit rows, with fixed (already fitted) parameters."""
    out = {}
    for spec in specs:
        xs = [emb.modalities[i] for i in spec.inputs]
        v = np.asarray(OPERATORS[spec.op].apply(xs, spec.options, params.get(spec.name, {})), dtype=np.float32)
        norms = np.linalg.norm(v, axis=1)
        if not np.isfinite(v).all() or (norms == 0).any():
            bad = int(np.flatnonzero(~np.isfinite(v).all(axis=1) | (norms == 0))[0])
            raise ViewStoreError(
                f"view '{spec.name}': row {bad} is zero or not finite after '{spec.op}' "
                "(e.g. opposite inputs cancel); choose another operator"
            )
        out[spec.name] = l2_normalise(v)
    return out
