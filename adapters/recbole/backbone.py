"""Any RecBole 1.2.1 ``GeneralRecommender`` (built-in or a user's own subclass) as a federated backbone.

RecBole: Zhao et al., "RecBole: Towards a Unified, Comprehensive and Efficient Framework for Recommendation
Algorithms", CIKM 2021. The FedVLR layer that can wrap it: Li, Long, Jiang, Zhang, Yang, "Federated
Vision-Language-Recommendation with Personalized Fusion", AAAI-26 (see :mod:`fedvlr_plus.fedvlr`).

What the adapter does with the wrapped ``torch.nn.Module``:

- **Parameters are split by what they are indexed by.** A parameter whose first dimension is RecBole's
  ``n_users`` is *user-indexed*: each client keeps only its own row, privately (restored from the private store
  every round, never uploaded). A parameter whose first dimension is ``n_items`` is a shared *item table*,
  trained on the rows a client touches and uploaded row-wise. Everything else (MLP towers, biases) is shared
  and uploaded whole. ``private=[...]`` / ``shared=[...]`` (names or regular expressions) override the rule for
  models whose split is not obvious (or where ``n_users == n_items``, which is refused without an override).
- **The model's own code trains and scores.** A local step builds a RecBole ``Interaction`` from the client's
  schedule (pairwise models: ``user_id``/``item_id``/``neg_item_id``; pointwise: ``user_id``/``item_id``/
  ``label``) and calls the model's ``calculate_loss``; scoring calls ``full_sort_predict`` (falling back to
  ``predict`` over all items, as RecBole's trainer does). The module runs with a client's parameters put in
  place of its own for the call (as :func:`torch.func.functional_call` does, see :class:`_ParamSwap`), so they
  are plain tensors (shared + its private rows) and the module itself is never mutated by training.
- **Ids.** RecBole's internal id 0 is ``[PAD]``; real ids are 1..n. ``item_map[i]`` / ``user_map[u]`` give the
  RecBole id of our item ``i`` / user ``u`` (through ``dataset.token2id`` when the RecBole dataset was written
  from our data, ``i + 1`` when our data was read from a RecBole dataset). Item tables are exposed in *our* item
  order without the padding row, which is how content views (``ViewStore``) line up with them.
- **Graph models** (LightGCN, NGCF: a model with ``interaction_matrix``, ``get_norm_adj_mat`` and
  ``norm_adj_matrix``) never see other users' interactions: each client's normalised adjacency is rebuilt from
  its own training positives only (its own user node and its items), in training and when it scores.
  Any other model that keeps data derived from the global interaction matrix (a scipy sparse matrix, or a
  tensor with one row per user, e.g. MultiVAE's ``history_item_id``) is refused with the attribute named.
- Sequential, context-aware, knowledge-graph and non-trainable ("traditional") models are refused with the
  reason.

RecBole writes ``./log`` and ``./log_tensorboard`` into the current directory; everything here that may write
(``Trainer``) runs inside :func:`recbole_workdir`, a temporary folder, unless the caller passes a folder.
"""

from __future__ import annotations

import re
import tempfile

import numpy as np
import torch

from ..base import Backbone, ParamSpec, take_rows

# the model lookup, the data bridge and the evaluation have files of their own; their names stay importable here
from .data import _dataset_name, build_from_data, data_from_recbole  # noqa: F401
from .evaluation import CACHE_ATTRIBUTES, RB_METRIC, central_scorer, recbole_evaluate, train_central  # noqa: F401
from .models import (  # noqa: F401
    MODEL_FAMILIES,
    RefusedModel,
    _family_models,
    _model_by_name,
    _refusal_for_type,
    recbole_workdir,
    resolve_model,
)
from .neumf import neumf_scores

__all__ = [
    "RecBoleBackbone",
    "RefusedModel",
    "resolve_model",
    "recbole_workdir",
    "build_from_data",
    "data_from_recbole",
    "federate",
    "align_views",
    "recbole_evaluate",
    "train_central",
    "central_scorer",
]

GRAPH_ATTRIBUTES = ("interaction_matrix", "norm_adj_matrix", "eye_matrix")


class _ParamSwap:
    """Run a method of ``module`` with some of its parameters replaced by given tensors (differentiable), as
    :func:`torch.func.functional_call` does, without its per-call walk over the module tree.

    The (submodule, attribute) slot of every parameter name is found once; a call puts the tensors into the
    submodules' ``_parameters`` and restores the originals afterwards, also on error. Tied parameters (one
    ``Parameter`` under several names) are replaced under every name, as ``functional_call`` does by default.
    """

    def __init__(self, module: torch.nn.Module):
        self.module = module
        canonical = {id(p): n for n, p in module.named_parameters()}
        self.slots: dict[str, list[tuple[torch.nn.Module, str]]] = {n: [] for n in canonical.values()}
        for name, prm in module.named_parameters(remove_duplicate=False):
            owner, _, leaf = name.rpartition(".")
            self.slots[canonical[id(prm)]].append((module.get_submodule(owner), leaf))

    def __call__(self, params: dict, method: str, *args):
        saved = []
        try:
            for name, value in params.items():
                slots = self.slots.get(name)
                if slots is None:
                    raise KeyError(f"{type(self.module).__name__} has no parameter {name!r}")
                for owner, leaf in slots:
                    saved.append((owner, leaf, owner._parameters[leaf]))
                    owner._parameters[leaf] = value
            return getattr(self.module, method)(*args)
        finally:
            for owner, leaf, old in reversed(saved):
                owner._parameters[leaf] = old


def _matches(patterns, name: str) -> bool:
    return any(name == p or re.fullmatch(p, name) for p in (patterns or ()))


class RecBoleBackbone(Backbone):
    """A RecBole ``GeneralRecommender`` as a module-based federated backbone (see the module docstring).

    ``model``: a class or a built-in name; ``config``/``dataset``: RecBole's ``Config`` and the (training)
    ``Dataset`` the model is built from; ``item_map``/``user_map``: RecBole id of each of our items/users
    (default ``i + 1``); ``private``/``shared``: names or regular expressions that override the split.
    """

    module_based = True
    # Chosen on ML-100K *validation* NDCG@10 of recbole:BPR, seed 0 (docs/recbole.md, "The recipe"): fedgrad (the
    # item tables and towers fixed during the round, their averaged gradients uploaded) with Adam on the server
    # at 0.05; clients step their own user rows by SGD at 2.0, one local epoch (one full-batch step) per round.
    # Plain FedAvg + SGD barely moved BPR's small initial embeddings; a server lr of 0.1 plateaued lower, and two
    # local epochs at lr 1.0 cost twice as much per round for a lower figure.
    # With fedgrad item rows step at server_lr * item_lr_scale.
    default_strategy = "fedgrad"
    default_local_epochs = 1
    default_server_optimizer = "adam"
    default_lr = 2.0
    default_item_lr_scale = 1.0
    default_server_lr = 0.05
    #: score every item of NeuMF with its first tower layer split into user and item halves
    #: (:mod:`.recbole_neumf`); False runs ``predict`` on every pair (the reference ``bench eval --check`` times)
    score_decomposed = True

    def __init__(
        self,
        model,
        config,
        dataset,
        *,
        item_map=None,
        user_map=None,
        private=None,
        shared=None,
        seed: int | None = None,
    ):
        self.model_class = resolve_model(model)
        self.config, self.dataset = config, dataset
        self.seed = int(config["seed"] if seed is None else seed)
        self._modules = {}
        self.template = self.build_module(self.seed)
        m = self.template
        self.nu, self.ni = int(m.n_users), int(m.n_items)
        self.item_map = torch.as_tensor(np.arange(1, self.ni) if item_map is None else item_map, dtype=torch.long)
        self.user_map = torch.as_tensor(np.arange(1, self.nu) if user_map is None else user_map, dtype=torch.long)
        for what, ids, n in (("item", self.item_map, self.ni), ("user", self.user_map, self.nu)):
            if len(ids) and (int(ids.min()) < 1 or int(ids.max()) >= n):
                raise ValueError(f"{what}_map must hold RecBole ids in [1, {n}) (0 is padding)")
        self.name = f"recbole:{self.model_class.__name__}"
        self.graph = self._check_global_state()
        from recbole.utils import InputType

        self.input_type = getattr(m, "input_type", None)
        if self.input_type not in (InputType.PAIRWISE, InputType.POINTWISE):
            raise RefusedModel(
                f"cannot federate {self.model_class.__name__}: input type {self.input_type} "
                f"(only pairwise and pointwise training batches are built)"
            )
        self.kinds = self._classify(private, shared)
        widths = [int(np.prod(p.shape[1:])) for n, p in m.named_parameters() if self.kinds[n] == "item"]
        super().__init__(len(self.item_map), max(1, sum(widths)))
        self._graph_cache: dict[int, tuple] = {}
        self._swap = _ParamSwap(m)

    # ------------------------------------------------------------------ building and checking
    def build_module(self, seed: int):
        """The wrapped model initialised under ``seed`` (RecBole initialises from torch's global RNG; the
        caller's RNG state is restored afterwards)."""
        mod = self._modules.get(int(seed))
        if mod is None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(seed))
                with recbole_workdir():
                    mod = self.model_class(self.config, self.dataset)
            mod = mod.to("cpu").eval()
            if len(self._modules) >= 2:
                self._modules.pop(next(iter(self._modules)))
            self._modules[int(seed)] = mod
        return mod

    def _check_global_state(self) -> bool:
        import scipy.sparse as sp

        m, name = self.template, self.model_class.__name__
        graph = all(hasattr(m, a) for a in ("interaction_matrix", "get_norm_adj_mat", "norm_adj_matrix"))
        for attr, value in vars(m).items():
            if attr.startswith("_") or (graph and attr in GRAPH_ATTRIBUTES):
                continue
            leak = sp.issparse(value) or (torch.is_tensor(value) and value.is_sparse)
            if not leak and isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim >= 1:
                leak = value.shape[0] in (self.nu, self.nu + self.ni)
            if leak:
                raise RefusedModel(
                    f"cannot federate {name}: attribute {attr!r} holds data derived from every "
                    f"user's interactions (built from the global dataset at construction); a "
                    f"client must not see other users' interactions"
                )
        for bname, buf in m.named_buffers():
            if buf.ndim >= 1 and buf.shape[0] in (self.nu, self.nu + self.ni):
                raise RefusedModel(f"cannot federate {name}: buffer {bname!r} has one row per user")
        if not any(True for _ in m.parameters()):
            raise RefusedModel(f"cannot federate {name}: it has no trainable parameters")
        return graph

    def _classify(self, private, shared) -> dict[str, str]:
        """name -> 'user' (private row), 'private' (private whole), 'item' (shared row-wise), 'dense'."""
        kinds = {}
        for name, prm in self.template.named_parameters():
            rows = prm.shape[0] if prm.dim() else None
            if _matches(private, name):
                kinds[name] = "user" if rows == self.nu else "private"
            elif _matches(shared, name):
                kinds[name] = "item" if rows == self.ni else "dense"
            elif rows == self.nu and rows == self.ni:
                low = name.lower()
                if "user" in low and "item" not in low:
                    kinds[name] = "user"
                elif "item" in low and "user" not in low:
                    kinds[name] = "item"
                else:
                    raise ValueError(
                        f"{self.name}: parameter {name!r} has {rows} rows and n_users == n_items; "
                        f"say whether it is private (private=[{name!r}]) or shared "
                        f"(shared=[{name!r}])"
                    )
            elif rows == self.nu:
                kinds[name] = "user"
            elif rows == self.ni:
                kinds[name] = "item"
            else:
                kinds[name] = "dense"
        return kinds

    # ------------------------------------------------------------------ the Backbone contract
    def specs(self) -> list[ParamSpec]:
        out = []
        for name, prm in self.template.named_parameters():
            kind = self.kinds[name]
            std = float(prm.detach().std()) if prm.numel() > 1 else 0.1
            if kind == "user":
                out.append(ParamSpec(name, tuple(prm.shape[1:]), shared=False, std=std))
            elif kind == "private":
                out.append(ParamSpec(name, tuple(prm.shape), shared=False, std=std))
            elif kind == "item":
                out.append(
                    ParamSpec(name, (self.n_items,) + tuple(prm.shape[1:]), shared=True, item_table=True, std=std)
                )
            else:
                out.append(ParamSpec(name, tuple(prm.shape), shared=True, std=std))
        return out

    def fused_item_norm(self) -> float:
        """The expected norm of the model's initial item vector (the rows of its item tables side by side): a
        wrapped model's towers and learning rates are made for its own initialisation, and NeuMF's N(0, 0.01)
        rows have norm 0.11, a ninth of a unit vector."""
        tables = [s for s in self.specs() if s.item_table]
        return float(np.sqrt(sum(np.prod(s.shape[1:]) * s.init_std() ** 2 for s in tables)))

    @property
    def item_table_names(self) -> list[str]:
        return [n for n, k in self.kinds.items() if k == "item"]

    def item_repr(self, p, items, ctx):
        """The model's item embedding tables side by side (our item order, no padding row): the ID
        representation the FedVLR layer fuses with the content views."""
        names = self.item_table_names
        if not names:
            raise RefusedModel(
                f"{self.name} has no item embedding table (no parameter with one row per item); "
                f"the FedVLR layer has no item representation to wrap"
            )
        parts = [take_rows(p[n], items) for n in names]
        return torch.cat(parts, -1)

    def split_item_repr(self, rep: torch.Tensor) -> dict[str, torch.Tensor]:
        """Inverse of :meth:`item_repr` for a full table ``[..., n_items, dim]``: one tensor per item table."""
        out, c = {}, 0
        for n in self.item_table_names:
            w = int(self.template.get_parameter(n).shape[1])
            out[n] = rep[..., c : c + w]
            c += w
        return out

    def head(self, p, vecs, ctx):
        raise NotImplementedError(f"{self.name} scores through the RecBole model (module-based simulator)")

    def initial_values(self, seed: int) -> dict[str, torch.Tensor]:
        """Shared parameters as the model initialises them under ``seed`` (item tables in our order)."""
        m = self.build_module(seed)
        out = {}
        for name, prm in m.named_parameters():
            kind = self.kinds[name]
            if kind == "item":
                out[name] = prm.detach()[self.item_map].clone()
            elif kind == "dense":
                out[name] = prm.detach().clone()
        return out

    def initial_private(self, cids, seed: int) -> dict[str, torch.Tensor]:
        """The private parameters of clients ``cids`` as the model initialises them under ``seed``, one tensor per
        parameter, ``[len(cids), *shape]``: each client's user rows, and a copy of every private tensor."""
        m = self.build_module(seed)
        rb_users = self.user_map[torch.as_tensor(np.asarray(cids, dtype=np.int64))]
        out = {}
        for name, prm in m.named_parameters():
            kind = self.kinds[name]
            if kind == "user":
                out[name] = prm.detach().index_select(0, rb_users)
            elif kind == "private":
                out[name] = prm.detach().expand(len(rb_users), *prm.shape).clone()
        return out

    def describe(self) -> dict:
        out = super().describe()
        out.update(
            recbole_model=self.model_class.__name__,
            graph_local=self.graph,
            input_type=str(self.input_type),
            kinds=dict(self.kinds),
        )
        return out

    # ------------------------------------------------------------------ running the module
    def module_params(self, p: dict, users: torch.Tensor, leave_out=()) -> dict[str, torch.Tensor]:
        """Full module parameters from spec-shaped ones: user rows placed at the RecBole ids of ``users``
        (``p[name]`` is ``[len(users), ...]``), item tables placed through ``item_map`` (row 0 = padding
        keeps the model's initial value). Differentiable in ``p``. Names in ``leave_out`` are left out (item
        tables a caller places per user with :meth:`item_table`; a user's call reads its own user row only)."""
        out = {}
        rb_users = self.user_map[users]
        for name, prm in self.template.named_parameters():
            kind, base = self.kinds[name], prm.detach()
            if name in leave_out:
                continue
            if kind == "user":
                out[name] = base.index_copy(0, rb_users, p[name].reshape(len(users), *base.shape[1:]))
            elif kind == "item":
                out[name] = base.index_copy(0, self.item_map, p[name])
            else:
                out[name] = p[name]
        return out

    def item_table(self, name: str, table: torch.Tensor) -> torch.Tensor:
        """The model's item table ``name`` from ours (``[n_items, w]``, our order; the padding row the model's)."""
        base = self.template.get_parameter(name).detach()
        return base.index_copy(0, self.item_map, table.to(base.dtype))

    def _local_graph(self, cid: int, positives: np.ndarray) -> None:
        """Give a graph model the adjacency of this client only: its user node and its own positives."""
        import scipy.sparse as sp

        m = self.template
        cached = self._graph_cache.get(int(cid))
        if cached is None:
            rows = np.full(len(positives), int(self.user_map[cid]))
            cols = self.item_map[torch.as_tensor(positives, dtype=torch.long)].numpy()
            m.interaction_matrix = sp.coo_matrix(
                (np.ones(len(rows), np.float32), (rows, cols)), shape=(self.nu, self.ni)
            )
            cached = (m.interaction_matrix, m.get_norm_adj_mat())
            self._graph_cache[int(cid)] = cached
        m.interaction_matrix, m.norm_adj_matrix = cached

    def call(self, params: dict, method: str, interaction, *, cid: int | None = None, positives=None):
        m = self.template
        for attr in CACHE_ATTRIBUTES:  # LightGCN/NGCF cache propagated embeddings between calls
            if hasattr(m, attr):
                setattr(m, attr, None)
        if self.graph:
            if cid is None:
                raise RuntimeError(f"{self.name}: a graph model runs one client at a time (its own graph)")
            self._local_graph(cid, positives)
        return self._swap(params, method, interaction)

    def batch(self, cid: int, items: np.ndarray, labels: np.ndarray, negatives: int):
        """A RecBole training ``Interaction`` from one local step of the schedule (positive at slot
        ``q * (1 + k)``, its ``k`` negatives after it)."""
        from recbole.data.interaction import Interaction
        from recbole.utils import InputType

        m, uid = self.template, int(self.user_map[cid])
        rb_items = self.item_map[torch.as_tensor(items, dtype=torch.long)]
        if self.input_type == InputType.POINTWISE:
            return Interaction(
                {
                    m.USER_ID: torch.full((len(items),), uid, dtype=torch.long),
                    m.ITEM_ID: rb_items,
                    m.LABEL: torch.as_tensor(labels, dtype=torch.float32),
                }
            )
        k = int(negatives)
        if k < 1:
            raise ValueError(f"{self.name} is pairwise: it needs at least one negative per positive")
        grid = rb_items.view(-1, 1 + k)
        lab = np.asarray(labels).reshape(-1, 1 + k)
        if not ((lab[:, 0] == 1).all() and (lab[:, 1:] == 0).all()):
            raise RuntimeError("schedule layout changed: expected each positive followed by its negatives")
        pos = grid[:, :1].expand(-1, k).reshape(-1)
        return Interaction(
            {
                m.USER_ID: torch.full((len(pos),), uid, dtype=torch.long),
                m.ITEM_ID: pos,
                m.NEG_ITEM_ID: grid[:, 1:].reshape(-1),
            }
        )

    def loss(self, params: dict, interaction, *, cid: int, positives=None) -> torch.Tensor:
        out = self.call(params, "calculate_loss", interaction, cid=cid, positives=positives)
        if isinstance(out, (tuple, list)):  # some RecBole models return loss parts (the trainer sums them)
            out = sum(out)
        return out

    @property
    def predicts_pairs_only(self) -> bool:
        """Whether the model has no ``full_sort_predict`` of its own (NeuMF, NNCF, ConvNCF, ...): scoring every
        item then runs ``predict`` on every (user, item) pair, and a few chosen items cost a few pairs."""
        from recbole.model.abstract_recommender import AbstractRecommender

        return type(self.template).full_sort_predict is AbstractRecommender.full_sort_predict

    def score_items(self, params: dict, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Scores ``[B, C]`` of our items ``items [B, C]`` for ``users [B]`` (our ids) through ``predict``: the
        values :meth:`scores` gives them when the model has no ``full_sort_predict``."""
        from recbole.data.interaction import Interaction

        m = self.template
        inter = Interaction(
            {
                m.USER_ID: self.user_map[users].repeat_interleave(items.shape[1]),
                m.ITEM_ID: self.item_map[items.reshape(-1)],
            }
        )
        return self.call(params, "predict", inter).view(items.shape)

    def scores(
        self, params: dict, users: torch.Tensor, *, cid: int | None = None, positives=None, max_pairs: int = 1 << 18
    ) -> torch.Tensor:
        """Scores ``[B, n_items]`` in our item order for ``users`` (our ids), from full module ``params``."""
        from recbole.data.interaction import Interaction

        m = self.template
        rb = self.user_map[users]
        try:
            s = self.call(params, "full_sort_predict", Interaction({m.USER_ID: rb}), cid=cid, positives=positives)
            return s.view(len(rb), -1)[:, self.item_map]
        except NotImplementedError:
            pass
        fast = neumf_scores(m, params, rb, self.item_map) if self.score_decomposed else None
        if fast is not None:
            return fast
        rows = []  # RecBole's trainer does the same: predict over every (user, item) pair
        step = max(1, max_pairs // max(1, self.n_items))
        for b0 in range(0, len(rb), step):
            ub = rb[b0 : b0 + step]
            inter = Interaction(
                {m.USER_ID: ub.repeat_interleave(self.n_items), m.ITEM_ID: self.item_map.repeat(len(ub))}
            )
            rows.append(self.call(params, "predict", inter, cid=cid, positives=positives).view(len(ub), -1))
        return torch.cat(rows)


def federate(
    model,
    config=None,
    dataset=None,
    *,
    data=None,
    workdir=None,
    config_file=None,
    config_dict=None,
    private=None,
    shared=None,
    seed: int = 0,
):
    """One call from a RecBole model to a federated backbone plus the data it runs on.

    - From our data (``data``, a split InteractionData): the RecBole dataset is written from it (into
      ``workdir``, a temporary folder by default) and ``config_file``/``config_dict`` configure the model.
    - From a user's RecBole ``config`` (and optionally its ``dataset``): the dataset is created by RecBole,
      converted to our data and split leave-one-out by time (RecBole id ``i + 1`` is our id ``i``).

    Returns ``(backbone, data)``; pass both to :func:`fedvlr_plus.federation.run_federated`.
    """
    from fedvlr_plus._compat import patch_recbole

    patch_recbole()
    if data is not None:
        if workdir is None:
            tmp = tempfile.TemporaryDirectory(prefix="fedvlr-recbole-data-")
            workdir = tmp.name
        else:
            tmp = None
        cfg, train_ds, item_map, user_map = build_from_data(
            model, data, workdir, config_file=config_file, config_dict=config_dict, seed=seed
        )
        bb = RecBoleBackbone(
            model, cfg, train_ds, item_map=item_map, user_map=user_map, private=private, shared=shared, seed=seed
        )
        bb._workdir = tmp  # keep the atomic files alive as long as the backbone
        return bb, data
    if config is None:
        raise ValueError("federate: pass our split data (data=...) or a RecBole Config")
    if dataset is None:
        from recbole.data import create_dataset

        with recbole_workdir():
            dataset = create_dataset(config)
    ours = data_from_recbole(dataset)
    bb = RecBoleBackbone(model, config, dataset, private=private, shared=shared, seed=seed)
    return bb, ours


def align_views(views: dict[str, np.ndarray], view_item_ids, data) -> dict[str, np.ndarray]:
    """Reorder content views (rows keyed by ``view_item_ids``, e.g. a ViewStore's) into ``data``'s item order,
    which for data read from RecBole is RecBole's id order minus the padding row. Items without a view row
    are an error (the fusion needs every item)."""
    pos = {str(t): r for r, t in enumerate(view_item_ids)}
    missing = [str(t) for t in data.item_ids if str(t) not in pos]
    if missing:
        raise ValueError(f"{len(missing)} items of {data.name} have no view row (first: {missing[:3]})")
    rows = np.array([pos[str(t)] for t in data.item_ids], dtype=np.int64)
    return {k: np.asarray(v, np.float32)[rows] for k, v in views.items()}
