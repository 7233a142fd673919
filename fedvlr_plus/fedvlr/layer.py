"""The FedVLR layer: personalised multimodal fusion wrapped around any backbone adapter.

Li, Long, Jiang, Zhang, Yang, "Federated Vision-Language-Recommendation with Personalized Fusion", AAAI-26
(arXiv 2410.08478), Eqs. 1-5 and Algorithm 1. The layer exists so that any backbone (FedAvg, FedNCF, PFedRec,
FedRAP, a RecBole model) gains content views without changing the backbone: it replaces the backbone's item
representation and keeps its head. See docs/method.md for the method as implemented here.

- **Server** (Eq. 2, :mod:`.experts`): the backbone's item tables are the ID table ``D``; ``D`` and the content
  views are projected and fused by the experts, and the fused views ``F_j`` of every item are computed once per
  round and broadcast (the client receives ``F`` like an item table; it never sees ``D`` or the fusion weights).
- **Client** (Eqs. 3-5, :mod:`.router`): a private router turns the user's history into weights ``w_u`` over the
  experts; the item representation is ``Σ_j w_{u,j} F_j`` and the backbone's head scores it.
- **Aggregation** (Algorithm 1, :mod:`.server`): clients upload the gradients of their loss with respect to the
  rows of ``F`` they touched; the server back-propagates their weighted average through the fusion.

Backbones with personal item parts keep them on the client, added to the fused vector: FedRAP's private table
(declared in ``Backbone.additive_item_tables``; its penalties read the fused vector as the shared part) and, with
``personal_offset=True``, PFedRec's personalised item embedding as a private offset, zero at the start of every
round (Algorithm 1 keeps ``F`` fixed during a round, so there is no locally fine-tuned copy of it to keep).

Everything one forward computes for the regulariser (router weights, the fused part) is recorded in that call's
``ctx``; the layer keeps no per-call state, so ``item_repr`` and ``regulariser`` work in any order.
"""
from __future__ import annotations

import numpy as np
import torch

from ..adapters.base import Backbone, ParamSpec, init_shared, take_rows
from ..federation.simulation import rng
from ..nn import gather_rows
from . import preference, view_experts
from .closed_form import MixtureDotHead
from .cold import NO_COLD_RULE, ColdItemRule, warm_neighbours
from .experts import EXPERTS, expert_outputs, fusion_specs, mix, project
from .options import VIEW_SCALES
from .router import VIEWS, entropy, history_input, history_mean, router_specs, router_weights

#: ``uniform``: the three experts mixed with fixed equal weights (no router): the router ablation
MODES = ("sum", "mlp", "gate", "fedvlr", "uniform")
FUSED = "fusion.F"
#: the residual gate (server): one scale per expert and item table on the fused part, ``[J, tables]``, zero at start
GATE = "fusion.residual_gate"
OFFSET = "personal.offset"
#: ctx key where ``item_repr`` records ``(fused part, router weights)`` for the regulariser of the same forward
_FORWARD = "fusion.forward"


def wrap_refusal(base: Backbone) -> str | None:
    """Why the layer cannot wrap ``base`` (None when it can)."""
    private_tables = [s.name for s in base.all_specs() if s.item_table and not s.shared
                      and s.name not in base.additive_item_tables]
    if private_tables:
        return (f"backbone {base.name!r} adds private item tables ({', '.join(private_tables)}) to its item "
                f"representation in a way it does not declare (Backbone.additive_item_tables); the FedVLR layer "
                f"replaces the shared representation by the server's fused views and cannot wrap it")
    return None


def _checked_views(views: dict[str, np.ndarray], n_items: int) -> dict[str, torch.Tensor]:
    out = {}
    for name, v in views.items():
        v = np.asarray(v, dtype=np.float32)
        if v.ndim != 2 or v.shape[0] != n_items:
            raise ValueError(f"view {name!r}: expected [{n_items}, d], got {tuple(v.shape)}")
        if not np.isfinite(v).all():
            raise ValueError(f"view {name!r}: contains NaN or inf")
        out[name] = torch.from_numpy(v)
    return out


def _check_options(base: Backbone, views: dict, *, mode: str, view_scale: str, use_id: bool, residual: bool,
                   id_dropout: float, residual_gate: bool, content_preference: bool, router_over: str) -> None:
    """A ``ValueError`` naming the first option of :class:`FusionLayer` that cannot hold around ``base``."""
    if mode not in MODES:
        raise ValueError(f"fusion mode must be one of {', '.join(MODES)}, got {mode!r}")
    refusal = view_experts.refusal(router_over, mode, len(views))
    if refusal:
        raise ValueError(refusal)
    if view_scale not in VIEW_SCALES:
        raise ValueError(f"view scale must be one of {', '.join(VIEW_SCALES)}, got {view_scale!r}")
    if not views and not use_id:
        raise ValueError("the fusion layer needs at least one modality (content views or the ID embedding)")
    refusal = wrap_refusal(base)
    if refusal:
        raise ValueError(refusal)
    if residual and not use_id:
        raise ValueError("a residual ID path needs the ID modality (do not drop 'id')")
    if id_dropout and not (use_id and views):
        raise ValueError("ID dropout needs the ID modality and at least one content view to estimate it from")
    if residual_gate and not residual:
        raise ValueError("the residual gate scales the fused part of the residual path: it needs residual=True "
                         "(--fusion-residual)")
    if content_preference and not views:
        raise ValueError("a content preference needs at least one content view")
    if content_preference and hasattr(base, "module_params"):
        raise ValueError(f"backbone {base.name!r} scores through its own module; the content preference "
                         "term is for adapter backbones")


class FusionLayer(Backbone):
    """Wrap ``base``: its item representation becomes a (router-weighted) mixture of server-fused views.

    Build it with :func:`fedvlr_plus.fedvlr.build_fedvlr` (the options the command line uses); the constructor's
    own defaults are the layer's, not the command line's (no cold-item rule unless ``cold_items`` is given; the
    router over the operators unless ``router_over`` says otherwise, where the options' default is ``auto``)."""

    default_strategy = "fedgrad"
    #: False: scoring every item forms each user's mixtures and runs the backbone's head on them, even where the
    #: backbone scores mixtures without forming them (the reference path ``fedvlr-plus bench eval --check`` times)
    score_mixtures = True
    # the server averages view gradients with weights summing to 1; 1.0 was stable on KU and ml-100k
    # (the FCF "sum" rule, lr x clients, diverges once hundreds of clients touch the dense fusion weights)
    default_server_lr = 1.0

    def __init__(self, base: Backbone, views: dict[str, np.ndarray], *, mode: str = "fedvlr",
                 router_over: str = "operators", temperature: float = 1.0, router_hidden: int = 64, use_id: bool = True,
                 balance: float = 0.0, cold_items: ColdItemRule | None = None,
                 residual: bool = False, personal_offset: bool = False, content_preference: bool = False,
                 view_scale: str = "model", id_dropout: float = 0.0, residual_gate: bool = False):
        _check_options(base, views, mode=mode, view_scale=view_scale, use_id=use_id, residual=residual,
                       id_dropout=id_dropout, residual_gate=residual_gate, content_preference=content_preference,
                       router_over=router_over)
        super().__init__(base.n_items, base.dim)
        self.base, self.mode = base, mode
        self.temperature, self.router_hidden = float(temperature), int(router_hidden)
        self.use_id, self.balance, self.residual = bool(use_id), float(balance), bool(residual)
        self.name = f"{base.name}+{mode}"
        self.default_lr = base.default_lr
        self.default_local_epochs = base.default_local_epochs
        self.default_item_lr_scale = base.default_item_lr_scale
        if getattr(base, "module_based", False):
            # a RecBole model steps its item side with its own server recipe (Adam at 0.05); the layer's SGD at 1.0
            # was chosen for the package's functional backbones. In the layer, not in one builder, so the command
            # line and the Python API wrap a RecBole model alike
            self.default_server_optimizer = base.default_server_optimizer
            self.default_server_lr = base.default_server_lr
        self.uses_history = base.uses_history or mode == "fedvlr"
        self.view_names = list(views)
        self.views = _checked_views(views, base.n_items)
        # the backbone's item tables are the ID table D: they live on the server, behind the fusion
        self.id_specs = [s for s in base.all_specs() if s.shared and s.item_table]
        self.d = self._probe_dim()
        self.keys = (["proj.id"] if use_id else []) + [f"proj.v{i}" for i in range(len(self.view_names))]
        self.in_dims = ([self.d] if use_id else []) + [v.shape[1] for v in self.views.values()]
        # the single-expert modes are operators; the router (and its uniform ablation) mixes the operators or,
        # with router_over="views", one expert per content view (:mod:`.view_experts`)
        self.router_over = view_experts.resolve(router_over, mode, len(self.view_names))
        if self.router_over == "views":
            self.experts = view_experts.view_expert_names(self.view_names)
        else:
            self.experts = list(EXPERTS) if mode in ("fedvlr", "uniform") else [mode]
        # the rule only has an ID row to fill when the ID modality takes part
        self.cold_items = cold_items.fit(views, base.n_items) if cold_items is not None and use_id else None
        self._init_id_dropout(float(id_dropout), views, cold_items)
        # PFedRec's personalised item embedding cannot be a copy of ``F`` (Algorithm 1 keeps the shared parts fixed
        # during the round): it becomes a private offset on the fused vector, restarted every round. Off by
        # default: the score function and router stay personal without it, and it did worse on validation
        self.offset = bool(base.personal_copies) and bool(personal_offset)
        self.additive = tuple(base.additive_item_tables)
        self.view_scale = view_scale
        size = float(base.fused_item_norm()) if view_scale == "model" else 1.0
        self.out_scale = size / float(np.sqrt(self.d))
        # VBPR-style θ_u · P_i beside the fusion: P is broadcast as one more block of d columns after the experts
        self.content_preference = bool(content_preference)
        self.blocks = len(self.experts) + int(self.content_preference)
        # the residual gate: the fused part scaled per expert and per item table of the backbone (NeuMF: its MF and
        # MLP tables), each scale starting at zero, so the item vectors start as the backbone's own rows
        self.residual_gate = bool(residual_gate)
        self.table_widths = self._table_widths()

    def _table_widths(self) -> list[int]:
        """Column widths of the backbone's item tables inside the ID row (one block of ``d`` when it has one
        table or does not say)."""
        split = getattr(self.base, "split_item_repr", None)
        if split is None or not self.use_id:
            return [self.d]
        try:
            widths = [int(v.shape[-1]) for v in split(torch.zeros(1, self.d)).values()]
        except (NotImplementedError, AttributeError):
            return [self.d]
        return widths if widths and sum(widths) == self.d else [self.d]

    def gate_columns(self, sp: dict[str, torch.Tensor]) -> torch.Tensor:
        """``[J * d]``: the residual gate's scale of every column of the broadcast experts' blocks."""
        widths = torch.tensor(self.table_widths)
        return torch.repeat_interleave(sp[GATE], widths, dim=1).reshape(-1)

    def _init_id_dropout(self, share: float, views: dict[str, np.ndarray], cold_items: ColdItemRule | None) -> None:
        """The warm items a round may drop and the content neighbours each is then read through (:meth:`dropout_rows`),
        searched as the cold-item rule searches."""
        self.id_dropout = share
        if share:
            cold = cold_items.cold if cold_items is not None else np.zeros(self.n_items, dtype=bool)
            k = cold_items.neighbours if cold_items is not None and cold_items.neighbours > 0 else 10
            ids, nbrs = warm_neighbours(views, cold, k)
            self.dropout_pool, self.dropout_fill = torch.as_tensor(ids), torch.as_tensor(nbrs)

    def _probe_dim(self) -> int:
        g = torch.Generator().manual_seed(0)
        p = {s.name: init_shared(s, g) for s in self.base.all_specs()}
        items = torch.zeros(1, dtype=torch.long)
        ctx = {"items_global": items, "hist": items, "hist_global": items, "hist_mask": torch.ones(1, dtype=torch.bool)}
        return int(self.base.shared_item_repr(p, items, ctx).shape[-1])

    # ------------------------------------------------------------------ what the client sees
    def specs(self) -> list[ParamSpec]:
        out = [s for s in self.base.all_specs() if s not in self.id_specs]
        out.append(ParamSpec(FUSED, (self.n_items, self.blocks * self.d), shared=True, item_table=True,
                             init="zeros"))
        if self.content_preference:
            out += preference.client_specs(self.d)
        if self.offset:
            # PFedRec's rule: each round a fresh fine-tune (zero offset) at the item-row learning rate
            out.append(ParamSpec(OFFSET, (self.n_items, self.d), shared=False, item_table=True, init="zeros",
                                 per_round=True))
        if self.mode == "fedvlr":
            out += router_specs(len(self.experts) * self.d, self.router_hidden, len(self.experts))
        return out

    def round_context(self, shared: dict[str, torch.Tensor]) -> dict:
        """The router's input for the round: the broadcast fused views in ``shared``."""
        if self.mode != "fedvlr" or FUSED not in shared:
            return {}
        # the router reads the experts' views only (not the content-preference block)
        return {VIEWS: shared[FUSED][:, :len(self.experts) * self.d]}

    # ------------------------------------------------------------------ what the server holds
    def server_specs(self) -> list[ParamSpec]:
        out = list(self.id_specs) + fusion_specs(self.keys, self.in_dims, self.d, self.experts)
        if self.content_preference:
            out += preference.server_specs([v.shape[1] for v in self.views.values()], self.d)
        if self.residual_gate:   # last and zero-initialised: the other parameters draw the same values either way
            out.append(ParamSpec(GATE, (len(self.experts), len(self.table_widths)), shared=True, init="zeros"))
        return out

    def init_server(self, seed: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(int(seed) + 7919)
        return {s.name: init_shared(s, g) for s in self.server_specs()}

    def server_forward(self, sp: dict[str, torch.Tensor], cold_rule=None, dropped=None) -> torch.Tensor:
        """Fused views of every item, ``[N, J * d]`` (differentiable in the server parameters ``sp``).

        ``cold_rule`` (``[N, d] -> [N, d]``, cold rows replaced) stands in for the layer's own cold-item rule;
        ``dropped`` (rows of ``dropout_pool``) are warm items read through their content neighbours' mean ID row
        (:meth:`dropout_rows`)."""
        inputs, x = [], None
        if self.use_id:
            x = self.base.shared_item_repr(sp, None, {"items_global": torch.arange(self.n_items)})
            fill = self.cold_items if cold_rule is None else cold_rule
            if fill is not None:
                x = fill(x)
            if dropped is not None and len(dropped):
                x = x.index_copy(0, self.dropout_pool[dropped], gather_rows(x, self.dropout_fill[dropped]).mean(1))
            inputs.append(x)
        inputs += [self.views[name] for name in self.view_names]
        zs = project(inputs, self.keys, sp)
        outs = (view_experts.view_expert_outputs(zs, self.use_id) if self.router_over == "views"
                else expert_outputs(zs, self.keys, self.experts, sp))
        # LayerNorm outputs have norm ~sqrt(d); scale the views to the size of item vector the backbone's head and
        # learning rates are made for (Backbone.fused_item_norm; without it FedNCF's MLP tower diverges, and a
        # RecBole NeuMF, whose rows start at norm 0.11, learns far slower behind unit-size views)
        fused = torch.cat(outs, -1) * self.out_scale
        if self.residual_gate:
            # ReZero-style (Bachlechner et al., 2020): the fused part enters the item vector only as far as the
            # server learns it should, per item table; at zero the client scores the backbone's own item rows
            fused = fused * self.gate_columns(sp)
        if self.residual:
            # the raw ID row added to every expert's output: since the router's weights sum to one, the item the
            # client scores is ``D_i + Σ_j w_uj F_ij`` — the backbone's own item vector (norm and all, which is
            # where a dot-product head keeps popularity) plus a personalised content correction
            fused = fused + x.repeat(1, len(self.experts))
        if self.content_preference:
            content = preference.projected_content(preference.unit_rows(self.views), sp)
            fused = torch.cat([fused, content], -1)
        return fused

    def dropout_rows(self, seed: int, round_index: int) -> torch.Tensor | None:
        """The warm items (rows of ``dropout_pool``) whose ID input a round's server backward estimates from content:
        a share ``id_dropout`` drawn by (seed, round), so a resumed run draws the same; None when off."""
        if not self.id_dropout or not self.dropout_fill.shape[1]:
            return None
        u = rng.uniform(int(seed), rng.TAG_DROP, int(round_index), np.arange(len(self.dropout_pool)))
        return torch.as_tensor(np.flatnonzero(u < self.id_dropout))

    def fused_views(self, sp: dict[str, torch.Tensor], cold_rule=None) -> torch.Tensor:
        """What the server broadcasts: :meth:`server_forward` without a graph."""
        with torch.no_grad():
            return self.server_forward(sp, cold_rule)

    def initial_shared(self, seed: int) -> dict[str, torch.Tensor]:
        """Client-visible shared state at round 0 (the backbone's other shared parts; the fused views are added by
        the server strategy)."""
        g = torch.Generator().manual_seed(int(seed))
        return {s.name: init_shared(s, g) for s in self.base.all_specs() if s.shared and s not in self.id_specs}

    def wrap_strategy(self, inner, seed: int):
        from .server import ServerFusion

        return ServerFusion(self, inner, seed)

    def closed_form(self) -> MixtureDotHead | None:
        """The closed form of a local step and of full-sort scoring (:mod:`.closed_form`), where the layer is a
        router over the experts in front of a plain dot-product head and adds nothing else to the item vector or
        the loss; None where autograd is needed (other heads, penalties, personal item parts)."""
        base = self.base
        plain = (self.mode == "fedvlr" and base.dot_head is not None and not base.uses_history
                 and type(base).regulariser is Backbone.regulariser and not self.additive and not self.offset
                 and not self.balance)
        if not plain:
            return None
        _, weight, bias = base.dot_head
        return MixtureDotHead(FUSED, weight, bias, len(self.experts), self.d, self.temperature,
                              preference.THETA if self.content_preference else None)

    def step_kernel(self):
        """The closed form of a batched chunk's local steps (training only; scoring asks :meth:`closed_form`): the
        dot-product head's, the NeuMF steps of :mod:`.neumf_steps` in front of FedNCF's own head (the same
        options as the dot-product head's closed form, without a content preference), or the additive steps of
        :mod:`.additive_steps` in front of FedRAP's; None where autograd is needed. The simulator also asks these
        steps whether a round's rule keeps the shared parts fixed."""
        kernel = self.closed_form()
        if kernel is not None:
            return kernel
        from ..adapters.chunk_steps import runs_forward_of
        from ..adapters.fedncf import FedNCF
        from .additive_steps import additive_kernel
        from .neumf_steps import MixtureNeuMF

        base = self.base
        routed = (self.mode == "fedvlr" and not self.offset and not self.balance and not self.content_preference
                  and len(self.experts) > 1 and not base.uses_history)
        if not routed:
            return None
        neumf_forward = ("head", "item_repr", "shared_item_repr", "regulariser", "specs")
        if not self.additive and self.d == 2 * base.dim and runs_forward_of(base, FedNCF, neumf_forward):
            return MixtureNeuMF(FUSED, len(self.experts), base.dim, self.temperature)
        return additive_kernel(self)   # (FedRAP's personal table added to the mixture, or None)

    def chunk_refusal(self) -> str | None:
        """Why the clients of this layer around a torch-module backbone cannot be trained as one batched chunk
        (:mod:`.batched_modules`); None when they can. The module engine asks the layer, so that it needs to know
        nothing of the router."""
        from .batched_modules import layer_refusal

        return layer_refusal(self)

    def start_chunk(self, sched, c0: int, c1: int, shared: dict, states: dict, config: dict, dtype, positives):
        """One batched chunk of this layer's clients around a torch-module backbone
        (:class:`~.batched_modules.FusedChunk`)."""
        from .batched_modules import FusedChunk

        return FusedChunk.start(self, sched, c0, c1, shared, states, config, dtype, positives)

    # ------------------------------------------------------------------ the client's forward
    def weights(self, p: dict, ctx: dict) -> torch.Tensor:
        """Router weights ``[..., J]`` of the user(s) in ``ctx``. Scoring (no gradient) reads the mean of the real
        history entries (:func:`.router.history_mean`, the same mean summed in another order): it takes many
        users at once, and padding each to the longest history would hold ``[users, longest, J d]`` floats."""
        scoring = not torch.is_grad_enabled() and ctx.get(VIEWS) is not None
        return router_weights(history_mean(ctx) if scoring else history_input(ctx), p, self.temperature)

    def _fused_part(self, p: dict, items, ctx: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The client's fused item vectors and the router weights that mixed them (None with one expert)."""
        f = take_rows(p[FUSED], items)
        f = f.reshape(*f.shape[:-1], self.blocks, self.d)[..., :len(self.experts), :]
        if len(self.experts) == 1:
            return f.squeeze(-2), None
        if self.mode == "uniform":   # the same fixed mixture for every user
            return f.mean(-2), None
        w = self.weights(p, ctx)
        return mix(w, f), w

    def logits(self, p, items, ctx=None):
        ctx = {} if ctx is None else ctx
        if not self._scores_by_mixture(p, items):
            return super().logits(p, items, ctx)
        f = p[FUSED]
        experts = f.reshape(f.shape[0], self.blocks, self.d)[:, :len(self.experts)]
        return self.base.mixture_logits(p, self.weights(p, ctx), experts)

    def _scores_by_mixture(self, p, items) -> bool:
        """Whether this forward scores every item of the broadcast views for a batch of users, each item vector
        the router's mixture alone, in front of a backbone that scores such mixtures without forming them
        (``mixture_logits``: FedNCF computes its first layer's item side per expert)."""
        return self._mixture_head and items is None and not torch.is_grad_enabled() and p[FUSED].dim() == 2

    @property
    def _mixture_head(self) -> bool:
        """The options under which an item's vector is the router's mixture alone, and the backbone scores
        mixtures."""
        scores_mixtures = callable(getattr(self.base, "mixture_logits", None))
        return (self.score_mixtures and scores_mixtures and self.mode == "fedvlr" and len(self.experts) > 1
                and not self.additive and not self.offset and not self.content_preference)

    def scoring_floats_per_item(self, table_width: int) -> int:
        if self._mixture_head:   # no [users, items, d] mixtures are formed
            return self.base.scoring_floats_per_item(table_width)
        return super().scoring_floats_per_item(table_width)

    def item_repr(self, p, items, ctx):
        v, w = self._fused_part(p, items, ctx)
        ctx[_FORWARD] = (v, w)
        # the backbone's private item parts stay on the client, added to the (personal) fused vector
        for name in self.additive:
            v = v + take_rows(p[name], items)
        if self.offset:
            v = v + take_rows(p[OFFSET], items)
        if self.content_preference:   # the projected content rides beside the item vector to the head
            content = take_rows(p[FUSED], items)[..., -self.d:]
            v = torch.cat([v, content.expand(*v.shape[:-1], self.d)], -1)
        return v

    def head(self, p, vecs, ctx):
        if not self.content_preference:
            return self.base.head(p, vecs, ctx)
        return (self.base.head(p, vecs[..., :self.d], ctx)
                + preference.preference_logit(p, vecs[..., self.d:]))

    def regulariser(self, p, items, mask, config, ctx=None):
        """The backbone's penalty (FedRAP's reads the fused vector as its shared part) plus the router balance.

        Reads the fused part and router weights this ``ctx``'s forward recorded, or computes them."""
        ctx = {} if ctx is None else ctx
        recorded = ctx.pop(_FORWARD, None)
        needs_forward = self.additive or (self.balance and len(self.experts) > 1)
        shared, w = recorded if recorded is not None else (
            self._fused_part(p, items, ctx) if needs_forward else (None, None))
        if self.additive:
            reg = self.base.split_regulariser(shared, {n: take_rows(p[n], items) for n in self.additive},
                                              mask, config)
        else:
            reg = self.base.regulariser(p, items, mask, config)
        if self.balance and w is not None:
            # keep each user's routing from collapsing onto one expert: λ (log J − H(w_u))
            reg = reg + self.balance * (float(np.log(w.shape[-1])) - entropy(w))
        return reg

    def round_scalars(self, run) -> dict[str, float]:
        """The router's mean weight per expert and mean entropy over the users (``--log``), as in the router
        report: whether the routing personalises, round by round."""
        from .report import router_report

        report = router_report(run)
        if not report:
            return {}
        out = {f"router/weight/{e}": w for e, w in zip(report["experts"], report["mean_weights"])}
        out["router/entropy"] = report["mean_entropy"]
        return out

    def option_values(self) -> dict:
        """The wrapped backbone's own options (FedRAP's penalties): they still shape the penalty it adds."""
        return self.base.option_values()

    def describe(self) -> dict:
        out = self.base.describe()
        out.update(backbone=self.name, fusion=self.mode, views=self.view_names, experts=self.experts,
                   router_over=self.router_over,
                   use_id=self.use_id, residual=self.residual, residual_gate=self.residual_gate,
                   temperature=self.temperature,
                   view_scale=self.view_scale, view_norm=round(self.out_scale * float(np.sqrt(self.d)), 6),
                   id_dropout=self.id_dropout,
                   personal_offset=self.offset, content_preference=self.content_preference,
                   client_item_parts=list(self.additive) + ([OFFSET] if self.offset else []),
                   server={s.name: list(s.shape) for s in self.server_specs()},
                   **(self.cold_items.counts() if self.cold_items is not None else NO_COLD_RULE))
        out["shared"] = {s.name: list(s.shape) for s in self.shared_specs()}
        out["private"] = {s.name: list(s.shape) for s in self.private_specs()}
        return out
