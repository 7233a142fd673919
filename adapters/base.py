"""The backbone contract every federated adapter follows.

A backbone is a *functional* model: it owns no tensors. It declares its parameters (:class:`ParamSpec`), each
either **shared** (sent by the server, trained or differentiated locally, uploaded, aggregated) or **private**
(created on the device, restored every round, never uploaded), and it answers three calls:

- ``item_repr(p, items, ctx) -> [..., L, k]``  the item representation (ID embeddings, ...) of ``items``;
- ``head(p, vecs, ctx) -> [..., L]``          user-side scoring of item vectors (logits, higher = better);
- ``regulariser(p, items, mask, config, ctx) -> [...]`` an optional per-client penalty added to the loss.

``logits = head(p, item_repr(p, items, ctx), ctx)``. The FedVLR layer replaces ``item_repr`` by a router-weighted
mixture of fusion experts and keeps ``head``; that is why the two are separate calls.

**Shapes.** The same functions run in three settings, so they must broadcast over optional leading dims:

- one client (the sequential reference, :class:`fedvlr_plus.federation.client.RecClient`): every tensor has its
  declared shape; item tables are full ``[n_items, d]`` and ``items`` are global item ids ``[L]``;
- a batch of C clients in training (the batched simulator): every parameter has a leading ``C``; item tables
  hold the rows of the step's examples ``[C, L, d]`` (already gathered) and ``items`` is ``None``;
- scoring all items for B users: shared parameters are unbatched (the server copy), private ones ``[B, ...]``,
  and ``items`` is ``None`` (meaning "every row of every item table, in item order").

Use :func:`take_rows` for table look-ups and :func:`rowdot` for user-vector dot products; plain ``torch.matmul``
and trailing-dim broadcasting (``x.unsqueeze(-2)``) cover the rest.

``ctx`` carries per-client context: ``ctx["items_global"]`` (global ids of the scored items, ``[..., L]``, for
look-ups in constant tables such as content features) and, when ``uses_history`` is True, ``ctx["hist_global"]``
/ ``ctx["hist_mask"]`` (the user's training positives as global ids, padded, ``[..., H]``). Trainable item tables
are only reachable for the items being scored; a router conditioned on the history uses constant features of
``hist_global``. Backbones here ignore ``ctx``; the FedVLR router uses it.

``ctx`` is the context of one forward: the simulators pass the ``ctx`` of a step's ``logits`` to that step's
``regulariser``, so a layer may record there what its penalty reuses (the FedVLR layer's router weights). The
constants of a round a forward reads besides ``p`` come from :meth:`Backbone.round_context` (the FedVLR router
reads the round's broadcast fused views); the simulators add them to every ``ctx`` they make.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..nn import gather_entries, gather_rows

__all__ = ["ParamSpec", "Backbone", "take_rows", "rowdot", "init_shared"]


@dataclass(frozen=True)
class ParamSpec:
    """One named parameter of a backbone.

    ``item_table``: the first dimension is the item id. Such tables are trained on the rows a client touches and
    uploaded row-wise (values plus row ids); every other parameter is trained and uploaded whole.
    ``init``: ``normal`` (N(0, std²)), ``xavier`` (normal with std sqrt(2 / (fan_in + fan_out)) for ``[out, in]``
    matrices), ``zeros`` or ``ones``. ``row_lr``: an item table learns at ``lr * item_lr_scale`` (default) or,
    when False, at the plain ``lr``. ``per_round`` (private ``zeros``/``ones`` parameters only): restarts from its
    initial value at the start of every round's local training and keeps what that round trained for scoring, as
    PFedRec's personal item table does (a fresh fine-tune of each round's global table).
    """

    name: str
    shape: tuple[int, ...]
    shared: bool
    item_table: bool = False
    init: str = "normal"
    std: float = 0.1
    row_lr: bool = True
    per_round: bool = False

    def __post_init__(self):
        if self.per_round and (self.shared or self.init not in ("zeros", "ones")):
            raise ValueError(
                f"parameter {self.name}: per_round needs a private parameter with a zeros or ones "
                f"init (shared={self.shared}, init={self.init!r})"
            )

    @property
    def scaled(self) -> bool:
        """Whether this parameter learns at ``lr * item_lr_scale``."""
        return self.item_table and self.row_lr

    def init_std(self) -> float:
        if self.init == "xavier":
            fan_out, fan_in = (self.shape[0], self.shape[1]) if len(self.shape) == 2 else (1, self.shape[0])
            return math.sqrt(2.0 / (fan_in + fan_out))
        return self.std


class Backbone:
    """Base class: subclasses set the class attributes and implement ``specs``, ``item_repr`` and ``head``."""

    name: str = ""
    #: strategy used when the run does not name one (see fedvlr_plus.federation.make_strategy)
    default_strategy: str = "fedavg"
    #: client learning rate and the multiplier for item-table rows (PFedRec/FedRAP scale item rows by n_items).
    #: Each backbone's values were chosen on ML-100K *validation* HR@50 (60-round sweeps; never on test).
    #: Item rows need the multiplier because a row appears in few of a client's examples while the loss is a
    #: mean over all of them, and because FedAvg then averages each row with the unchanged copies of every
    #: client that did not touch it.
    default_lr: float = 0.1
    default_item_lr_scale: float = 1.0
    #: fedgrad's server learning rate when the run does not name one. The server steps the *averaged* gradient
    #: (client weights n_u / sum n sum to one), so the step does not grow with the number of clients; 1.0 is the
    #: FedVLR layer's own default, so the like-for-like row (the backbone alone with fedgrad) steps as the layer
    #: does. None: the "sum over clients" rule, client lr x clients per round (FCF's own update); it diverges on
    #: dense shared parameters once thousands of clients take part.
    default_server_lr: float | None = 1.0
    #: fedgrad's server optimizer when the run does not name one (sgd = FedVLR Algorithm 1)
    default_server_optimizer: str = "sgd"
    #: True for an adapter around a whole ``torch.nn.Module`` (RecBole), trained by its own module client
    module_based: bool = False
    #: local epochs per round when the run does not name them
    default_local_epochs: int = 5
    #: shared item table -> private table that keeps the client's locally trained copy and replaces the global
    #: table when this client scores (PFedRec's personalised item embedding)
    personal_copies: dict[str, str] = {}
    #: private item tables whose rows are *added* to the shared item representation (FedRAP's ``A_u``); the
    #: FedVLR layer keeps them on the client and adds them to the fused vector (see ``split_regulariser``)
    additive_item_tables: tuple[str, ...] = ()
    #: (item table, weight, bias or None) when ``logits = <table[item], weight> + bias`` and there is no
    #: regulariser: the batched simulator then computes the gradients in closed form instead of by autograd
    dot_head: tuple[str, str, str | None] | None = None
    #: set True when item_repr/head need ctx["hist"] (the user's training positives)
    uses_history: bool = False
    #: the dataclass of the backbone's own options (FedRAP's penalties), or None: its fields are keyword arguments
    #: of the constructor, and their values are recorded with a run's settings, so that a run resumed with other
    #: values is refused
    options_type: type | None = None

    def fused_item_norm(self) -> float:
        """The norm the FedVLR layer gives its fused item vectors around this backbone: the size of item vector
        the backbone's head and learning rates are made for. 1.0 for the package's own backbones, whose defaults
        were chosen with unit-size fused views (their own rows start at a similar norm, 0.8)."""
        return 1.0

    def wrap_strategy(self, inner, seed: int):
        """The strategy the server runs for this backbone: ``inner`` itself, unless the backbone has a server side
        of its own (the FedVLR layer wraps it to step its fusion)."""
        return inner

    def __init__(self, n_items: int, dim: int = 64, **options):
        if n_items <= 0 or dim <= 0:
            raise ValueError(f"{type(self).__name__}: n_items and dim must be positive (got {n_items}, {dim})")
        self.n_items = int(n_items)
        self.dim = int(dim)
        self.options = dict(options)

    # ------------------------------------------------------------------ declared parameters
    def specs(self) -> list[ParamSpec]:
        raise NotImplementedError

    def all_specs(self) -> list[ParamSpec]:
        """``specs()``, computed once (the trainers ask for it per client)."""
        cached = self.__dict__.get("_specs_cache")
        if cached is None:
            cached = self.__dict__["_specs_cache"] = list(self.specs())
            names = [s.name for s in cached]
            if len(set(names)) != len(names):
                raise ValueError(f"{type(self).__name__}: duplicate parameter names in {names}")
        return cached

    def shared_specs(self) -> list[ParamSpec]:
        return [s for s in self.all_specs() if s.shared]

    def private_specs(self) -> list[ParamSpec]:
        return [s for s in self.all_specs() if not s.shared]

    @property
    def shared_names(self) -> list[str]:
        return [s.name for s in self.shared_specs()]

    @property
    def private_names(self) -> list[str]:
        return [s.name for s in self.private_specs()] + list(self.personal_copies.values())

    # ------------------------------------------------------------------ the model
    def item_repr(self, p: dict, items, ctx: dict) -> torch.Tensor:
        raise NotImplementedError

    def shared_item_repr(self, p: dict, items, ctx: dict) -> torch.Tensor:
        """The part of the item representation built from shared tables only: what the FedVLR layer's server
        fuses as the ID modality. Backbones with ``additive_item_tables`` leave those out."""
        return self.item_repr(p, items, ctx)

    def head(self, p: dict, vecs: torch.Tensor, ctx: dict) -> torch.Tensor:
        raise NotImplementedError

    def scoring_floats_per_item(self, table_width: int) -> int:
        """Floats per item that scoring every item holds for one user (it sizes the users scored at once): by
        default the item vectors broadcast against the user and the head's activations."""
        return max(table_width, 1) + 4 * self.dim

    def round_context(self, shared: dict[str, torch.Tensor]) -> dict:
        """Entries for ``ctx`` from the round's shared state (constants of the round; none by default)."""
        return {}

    def logits(self, p: dict, items, ctx: dict | None = None) -> torch.Tensor:
        ctx = {} if ctx is None else ctx
        return self.head(p, self.item_repr(p, items, ctx), ctx)

    def regulariser(self, p: dict, items, mask: torch.Tensor, config: dict, ctx: dict | None = None):
        """Per-client penalty (shape = the batch dims of ``mask`` without the last one), or 0."""
        return 0.0

    def split_regulariser(self, shared_vecs: torch.Tensor, personal: dict, mask: torch.Tensor, config: dict):
        """The penalty of a backbone with ``additive_item_tables``, from the shared item vectors of the batch
        (``[..., L, k]``) and the rows of each additive table (name -> ``[..., L, k]``). The FedVLR layer calls it
        with its fused vectors as the shared part."""
        return 0.0

    def round_scalars(self, run) -> dict[str, float]:
        """Scalars about the model at ``run``'s current state worth following round by round, by TensorBoard tag
        (a run's per-round log writes them at evaluated rounds); none by default."""
        return {}

    def option_values(self) -> dict:
        """The values of the backbone's own options (the fields of ``options_type``) as this instance uses them."""
        return {}

    def describe(self) -> dict:
        return {
            "backbone": self.name,
            "shared": {s.name: list(s.shape) for s in self.shared_specs()},
            "private": {s.name: list(s.shape) for s in self.private_specs()},
            "personal_copies": dict(self.personal_copies),
        }


def take_rows(table: torch.Tensor, items) -> torch.Tensor:
    """Rows ``items`` of an item table, for the three shape settings of the module docstring.

    ``[T, d]`` with ``[..., L]`` -> ``[..., L, d]``; ``[C, T, d]`` with ``[C, L]`` -> ``[C, L, d]``;
    ``[C, T, d]`` with ``[L]`` -> ``[C, L, d]``; ``items=None`` returns the table itself.
    """
    if items is None:
        return table
    if table.dim() == 2:
        return gather_rows(table, items)  # table[items], with a backward that adds in a fixed order
    if table.dim() == 3 and items.dim() == 1:
        return table[:, items]
    if table.dim() == 3 and items.dim() == 2 and table.shape[0] == items.shape[0]:  # [C, T, d] by [C, L]
        return gather_entries(table, torch.arange(len(table), device=items.device).unsqueeze(1), items)
    raise ValueError(f"take_rows: table {tuple(table.shape)} cannot be indexed by items {tuple(items.shape)}")


def rowdot(vecs: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``<vecs[..., l, :], w[..., :]>`` -> ``[..., L]`` for aligned or broadcast batch dims."""
    if w.dim() == 1:
        return vecs @ w
    if vecs.dim() == w.dim() + 1:
        # aligned batch dims ([C, L, k] with [C, k]); elementwise is faster than bmm with one column
        return (vecs * w.unsqueeze(-2)).sum(-1)
    if vecs.dim() == 2:
        return w @ vecs.transpose(-1, -2)  # shared [L, k] for every user [B, k] -> [B, L]
    raise ValueError(f"rowdot: cannot combine vecs {tuple(vecs.shape)} with w {tuple(w.shape)}")


def init_shared(spec: ParamSpec, generator: torch.Generator, dtype=torch.float32) -> torch.Tensor:
    """Server-side initial value of a shared parameter (seeded by the run's generator)."""
    if spec.init == "zeros":
        return torch.zeros(spec.shape, dtype=dtype)
    if spec.init == "ones":
        return torch.ones(spec.shape, dtype=dtype)
    if spec.init in ("normal", "xavier"):
        return torch.randn(spec.shape, generator=generator, dtype=dtype) * spec.init_std()
    raise ValueError(f"parameter {spec.name}: unknown init {spec.init!r}")
