"""The FedVLR layer around a dot-product head in closed form: a local step's gradients for a chunk of clients,
and full-sort scores as one matrix product.

FedVLR (Li et al., AAAI-26, arXiv 2410.08478), Algorithm 1, keeps the broadcast fused views ``F`` fixed during a
round, and the router reads the user's history through those fixed views, so its input ``r_u`` is a constant of
the round. For a backbone whose head is ``<h_u, v> + b_u`` (FedAvg, FCF, PFedRec without the offset) a step of
client ``u`` on its examples ``l`` is

    w = softmax(φ_u(r_u) / T),   s_lj = <h_u, F_lj>,   logit_l = Σ_j w_j s_lj + b_u,
    J_u = Σ_l a_l BCE(logit_l, y_l),   δ_l = ∂J_u/∂logit_l = a_l (σ(logit_l) - y_l)

(``a_l``: the example's weight in the client's mean loss), and every gradient is a short sum:

    ∂J/∂b = Σ_l δ_l,   ∂J/∂h = Σ_j w_j Σ_l δ_l F_lj,   ∂J/∂w_j = Σ_l δ_l s_lj,   ∂J/∂F_lj = δ_l w_j h,

with the router's MLP ``φ_u(r) = W2 relu(W1 r + b1) + b2`` by the chain rule through the softmax. This is the
graph autograd differentiates on the generic path (the sequential reference and the tests keep autograd); here
the whole chunk costs a few batched matrix products per step and no graph.

Scoring every item needs no ``[users, items, d]`` mixture either: ``Σ_j w_j <h, F_ij> = <w ⊗ h, F_i>``, so the
scores of B users are one ``[B, J d] x [J d, N]`` product. Both identities hold because the mixture is linear
in ``F`` and the head is a dot product; the LayerNorms and nonlinearities of the experts run on the server,
before ``F`` is broadcast, so they do not stand in the way.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from ..compiled import LazyKernels
from ..federation.simulation.indexed_rows import IndexedRows
from ..nn import linear
from .router import history_mean
from .router_steps import FirstLayer, router_grads

ROUTER = ("router.w1", "router.b1", "router.w2", "router.b2")
#: a step reads the whole broadcast table when it has at most this many rows per example slot: reading a row in
#: two matrix products costs about 1/30 of gathering it (one thread, J d = 192: equal at 25-30 rows a slot)
ALL_ROWS_RATIO = 24


@dataclass(frozen=True)
class MixtureDotHead:
    """The closed form of one FusionLayer: ``table`` (the broadcast fused views, ``experts`` blocks of ``d``),
    the head's ``weight`` and ``bias`` (None: no bias) and the router's softmax ``temperature``."""

    table: str
    weight: str
    bias: str | None
    experts: int
    d: int
    temperature: float
    #: the private content-preference vector ``θ_u`` (the layer's ``content_preference``; None: off): it scores the
    #: table's last block of ``d``, ``logit += <θ_u, P_l>``, so ``∂J/∂θ = Σ_l δ_l P_l`` and ``∂J/∂P_l = δ_l θ``
    preference: str | None = None

    @property
    def names(self) -> set[str]:
        """Every trained parameter this closed form covers (a step with any other one needs autograd)."""
        return (
            {self.table, self.weight, *ROUTER}
            | ({self.bias} if self.bias else set())
            | ({self.preference} if self.preference else set())
        )

    @property
    def width(self) -> int:
        """The fused table's width: the experts' blocks, and the projected content's with a preference."""
        return (self.experts + int(self.preference is not None)) * self.d

    def _weights(self, pre: torch.Tensor, p: dict):
        """The router's hidden layer and weights ``[C, J]`` from its pre-activation (``router_weights``' ops)."""
        hidden = torch.relu(pre)
        return hidden, torch.softmax(linear(hidden, p["router.w2"], p["router.b2"]) / self.temperature, dim=-1)

    def step_from(
        self,
        rows: IndexedRows | AllRows,
        pre,
        p: dict,
        y,
        a,
        with_table: bool = True,
        content: ContentRows | None = None,
    ):
        """One step of every client of a chunk from its router's pre-activation ``pre [C, H]``.

        ``rows``: the fused views of the step's examples (read by id, or from the whole broadcast table);
        ``p``: the clients' stacked parameters; ``y``/``a [C, L]``: labels and example weights (zero on padding).
        Returns the gradients of the clients' weighted losses with respect to everything after ``pre``
        (``router.pre`` for ``pre`` itself; the table's as ``[C, L, J d]`` rows, or as ``delta [C, L]`` with
        ``with_table=False``), each client's loss ``[C]`` and its router weights ``[C, J]``. ``content``: the
        examples' projected content, with a preference."""
        h = p[self.weight]
        hidden, w = self._weights(pre, p)
        s = rows.dot(h)  # <h, F_lj>  [C, L, J]
        logits = (s * w.unsqueeze(1)).sum(-1)
        if content is not None:
            logits = logits + content.dot(p[self.preference])
        if self.bias is not None:
            logits = logits + p[self.bias].unsqueeze(-1)
        delta = (torch.sigmoid(logits) - y) * a
        per_client = rows.weighted_sum(delta).view(*w.shape, self.d)  # Σ_l δ_l F_lj  [C, J, d]
        g_w = torch.bmm(delta.unsqueeze(1), s).squeeze(1)  # ∂J/∂w_j
        g_pre, router = router_grads(pre, hidden, w, g_w, p["router.w2"], self.temperature)
        grads = {self.weight: (w.unsqueeze(-1) * per_client).sum(1), "router.pre": g_pre, **router}
        if content is not None:
            grads[self.preference] = content.weighted_sum(delta)
        if with_table:
            grads[self.table] = delta.unsqueeze(-1) * self.full_direction(w, p).unsqueeze(1)
        else:
            grads["delta"] = delta
        if self.bias is not None:
            grads[self.bias] = delta.sum(1)
        loss = F.binary_cross_entropy_with_logits(logits, y, weight=a, reduction="none").sum(1)
        return grads, loss, w

    def row_direction(self, w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """``w ⊗ h [..., J d]``: the vector a fused row is scored against (and its gradient's direction)."""
        return (w.unsqueeze(-1) * h.unsqueeze(-2)).reshape(*w.shape[:-1], self.experts * self.d)

    def full_direction(self, w: torch.Tensor, p: dict) -> torch.Tensor:
        """``[w ⊗ h, θ] [..., width]``: the direction of a fused row's gradient, every block of it."""
        direction = self.row_direction(w, p[self.weight])
        if self.preference is None:
            return direction
        theta = p[self.preference].expand(*direction.shape[:-1], self.d)
        return torch.cat([direction, theta], -1)

    def local_steps(self, ctx: dict, p: dict, lr: float, wd: float, defer: tuple[int, int, int] | None):
        """The state of one chunk's local training (:class:`MixtureSteps`). ``ctx`` is the chunk's call context:
        the router's input, each client's mean history view, is read from it here, so the engine needs to know
        nothing of the router."""
        return MixtureSteps(self, history_mean(ctx), p, lr, wd, defer)

    def reads_all_rows(self, n_items: int, slots: int) -> bool:
        """Whether a step of ``slots`` examples per client reads the whole broadcast table (two matrix products
        over all ``n_items`` rows) rather than gathering its examples' rows (memory-bound copies of ``J d``
        floats each): the products win while the catalogue is a small multiple of the examples."""
        return n_items <= ALL_ROWS_RATIO * slots

    @torch.no_grad()
    def scores(self, fused: torch.Tensor, p: dict, ctx: dict) -> torch.Tensor:
        """Logits ``[B, N]`` of every item for the B users of ``ctx`` (``p``: their stacked private parameters,
        ``fused [N, J d]``: the broadcast views)."""
        _, w = self._weights(linear(history_mean(ctx), p["router.w1"], p["router.b1"]), p)
        out = self.row_direction(w, p[self.weight]) @ fused[:, : self.experts * self.d].T
        if self.preference is not None:
            out = out + p[self.preference] @ fused[:, self.experts * self.d : self.width].T
        if self.bias is not None:
            out = out + p[self.bias].unsqueeze(-1)
        return out


class MixtureSteps:
    """One chunk's local steps in closed form, with two costs taken out of the loop.

    The router's first layer: a per-client scale and a running sum over the steps, written once by :meth:`finish`
    (:class:`.router_steps.FirstLayer`), instead of ``[C, J d, H]`` twice a step.

    The uploaded gradient of the fused rows (``defer``: the chunk's clients, touched rows and steps, when the rows
    are not stepped locally): each step's is ``δ_l (w ⊗ h)``, so their sum over steps is the product of the
    per-row sums of ``δ`` of each step ``[C, T, S]`` and the steps' ``w ⊗ h [C, S, J d]``, one batched product
    at the end instead of a ``[C, L, J d]`` scatter every step; for the round's sums, one sparse product with
    the nonzero per-row sums only (:meth:`table_factors`)."""

    def __init__(
        self, head: MixtureDotHead, x: torch.Tensor, p: dict, lr: float, wd: float, defer: tuple[int, int, int] | None
    ):
        self.head, self.first = head, FirstLayer(x, p["router.w1"], lr, wd)
        c_n = x.shape[0]
        self.defer = defer
        if defer is not None:
            _, t_max, s_max = defer
            self.delta_rows = torch.zeros(s_max, c_n * t_max, dtype=x.dtype, device=x.device)
            self.directions = torch.zeros(s_max, c_n, head.width, dtype=x.dtype, device=x.device)
        self.s = 0
        self._experts = None  # (the broadcast table, its experts' columns) when they are not contiguous in it

    def rows(self, fused: torch.Tensor, chunk_rows: torch.Tensor, fidx: torch.Tensor, items: torch.Tensor):
        """The fused rows of a step. While they are fixed in the round, from the broadcast table ``fused [N, blocks
        d]`` by the examples' item ids ``items [C, L]`` (the whole table where it is small beside the step, else the
        examples' rows); else from the chunk's stepped copy of its touched rows ``chunk_rows [C T, blocks d]`` by
        their flat ids ``fidx``. With a content preference, the examples' projected content beside them."""
        head, (c_n, l_n) = self.head, items.shape
        table, ids = (chunk_rows, fidx.view(c_n, l_n)) if self.defer is None else (fused, items)
        if self.defer is not None and head.reads_all_rows(fused.shape[0], l_n):
            rows = AllRows(self._experts_block(fused), items, head.experts)
        else:
            rows = IndexedRows(table, ids, head.experts, head.d)
        return StepRows(rows, ContentRows(table, ids, head) if head.preference is not None else None)

    def _experts_block(self, fused: torch.Tensor) -> torch.Tensor:
        """The experts' columns of the broadcast table, contiguous (copied once per table when a content block
        follows them)."""
        experts = fused[:, : self.head.experts * self.head.d]
        if experts.is_contiguous():
            return experts
        if self._experts is None or self._experts[0] is not fused:
            self._experts = (fused, experts.contiguous())
        return self._experts[1]

    @torch.no_grad()
    def step(self, rows: StepRows, p: dict, y: torch.Tensor, a: torch.Tensor, active: torch.Tensor, fidx: torch.Tensor):
        """The step's gradients (None for what this object applies itself: ``router.w1``, and the fused rows
        when deferred) and each client's loss; ``fidx``: the flat touched-row ids of the examples."""
        pre = self.first.pre(p["router.b1"])
        grads, loss, w = self.head.step_from(
            rows.experts, pre, p, y, a, with_table=self.defer is None, content=rows.content
        )
        g_pre = grads.pop("router.pre")
        grads["router.w1"] = None
        self.first.decay(active)
        self.first.add(g_pre)
        if self.defer is not None:
            self.delta_rows[self.s].index_add_(0, fidx.reshape(-1), grads.pop("delta").reshape(-1))
            self.directions[self.s] = self.head.full_direction(w, p)
            grads[self.head.table] = None
        self.s += 1
        return grads, loss

    @torch.no_grad()
    def finish(self, p: dict, acc: dict | None = None) -> None:
        """Write ``router.w1`` in place (``acc``, the chunk's uploaded gradients: nothing to add here)."""
        self.first.write(p["router.w1"])

    @torch.no_grad()
    def table_grads(self, touched: torch.Tensor) -> torch.Tensor:
        """The deferred, summed gradient of the clients' fused rows ``touched [C, T]`` (global ids): ``[C, T, J d]``."""
        c_n, t_max, s_max = self.defer
        coef = self.delta_rows.view(s_max, c_n, t_max).permute(1, 2, 0)
        return torch.bmm(coef, self.directions.transpose(0, 1))

    @torch.no_grad()
    def table_factors(self, items: torch.Tensor, real: torch.Tensor, n_items: int):
        """The deferred gradient of the fused rows as two factors over the whole table, for the round's sums
        without forming any client's rows: ``coef [n_items, S C] @ directions [S C, J d]`` is the sum over the
        chunk's clients (column ``s C + c``: client ``c``'s step ``s``; weigh the columns by their client,
        ``client [S C]``, to get a weighted sum). ``real``: the flat ids (``c T + t``) of the clients' real
        touched rows, ``items`` their global ids.

        ``coef`` is sparse (CSR): a client's step touches a few of its rows, so most of its ``[S, R]`` per-row
        sums are zero, and a dense ``[n_items, S C]`` product would spend nearly all its work on zeros."""
        c_n, t_max, s_max = self.defer
        coef = step_row_coef(self.delta_rows, c_n, t_max, items, real, n_items)
        columns = torch.arange(c_n, device=real.device).repeat(s_max)
        return coef, self.directions.reshape(s_max * c_n, -1), columns


def step_row_coef(
    delta_rows: torch.Tensor, c_n: int, t_max: int, items: torch.Tensor, real: torch.Tensor, n_items: int
) -> torch.Tensor:
    """The sparse ``[n_items, S C]`` matrix of the steps' per-row sums ``delta_rows [S, C T]`` (column ``s C + c``:
    client ``c``'s step ``s``; an entry per nonzero sum of a real touched row, flat ids ``real``, global ``items``):
    the coefficients of the steps' directions in the chunk's summed row gradient (CSR; the compiled kernel's where
    it repays numba's import)."""
    s_max = delta_rows.shape[0]
    on_cpu = delta_rows.device.type == "cpu"
    kernels = _KERNELS.once_worth_it(s_max * len(real), KERNEL_AFTER_CELLS) if on_cpu else None
    if kernels is not None:
        crow, col, values = (
            torch.from_numpy(a)
            for a in kernels.factor_csr(
                delta_rows.numpy(), real.contiguous().numpy(), items.contiguous().numpy(), c_n, t_max, n_items
            )
        )
    else:
        crow, col, values = _factor_csr(delta_rows, c_n, t_max, items, real, n_items)
    return sparse_csr(crow, col, values, (n_items, s_max * c_n))


def _factor_csr(delta_rows: torch.Tensor, c_n: int, t_max: int, items: torch.Tensor, real: torch.Tensor, n_items: int):
    """``(crow, col, values)`` of :func:`step_row_coef`'s matrix in torch (the compiled kernel's reference)."""
    client = torch.div(real, t_max, rounding_mode="floor")
    values = delta_rows.index_select(1, real)  # [S, R]
    step, entry = values.nonzero(as_tuple=True)  # step-major, then client: columns ascending
    row = items.index_select(0, entry)
    order = torch.sort(row, stable=True).indices  # by item; within an item the columns stay ascending
    crow = torch.zeros(n_items + 1, dtype=torch.long, device=real.device)
    crow[1:] = torch.bincount(row, minlength=n_items).cumsum(0)
    col = (step * c_n + client.index_select(0, entry)).index_select(0, order)
    return crow, col, values[step, entry].index_select(0, order)


#: per-row sums a process turns into factors in torch before it loads the compiled kernel: numba's import (0.4-0.6
#: s CPU once per process) is what torch spends on about 16 M of them: about a dozen rounds at ml-100k's size, a
#: fraction of one at 35,598 clients
KERNEL_AFTER_CELLS = 1 << 24
_KERNELS = LazyKernels("fedvlr_plus.fedvlr.factor_kernels")


def prepare_kernels() -> bool:
    """Compile the factor's kernel, or load it from numba's cache, with one tiny call (float32 sums and int64 ids, as
    a round passes them); False where numba is missing. ``bench suite`` calls this before its cases."""
    ids = np.zeros(1, np.int64)
    return _KERNELS.prepare(lambda kernels: kernels.factor_csr(np.zeros((1, 1), np.float32), ids, ids, 1, 1, 1))


def sparse_csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """A CSR matrix built from sorted indices (no checks: they are sorted by construction), without PyTorch's
    one-time notices that its CSR support is in beta and that invariant checks are off (a user should not read
    them on every run)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
        return torch.sparse_csr_tensor(crow, col, values, size, check_invariants=False)


class StepRows(NamedTuple):
    """A step's fused rows (:meth:`MixtureSteps.rows`): the experts' blocks, and the projected content (None
    without a content preference)."""

    experts: IndexedRows | AllRows
    content: ContentRows | None


class ContentRows:
    """A step's projected content ``P_l [C, L, d]``: the last block of the fused rows ``ids [C, L]`` of ``table``,
    which the content preference ``θ_u`` scores."""

    def __init__(self, table: torch.Tensor, ids: torch.Tensor, head: MixtureDotHead):
        start = head.experts * head.d
        # (the block's columns only: gathering whole rows would copy the experts' blocks too)
        self.rows = table[:, start : start + head.d].index_select(0, ids.reshape(-1)).view(*ids.shape, head.d)

    def dot(self, theta: torch.Tensor) -> torch.Tensor:
        """``<θ_c, P_l>`` -> ``[C, L]``."""
        return (self.rows * theta.to(self.rows.dtype).unsqueeze(1)).sum(-1)

    def weighted_sum(self, delta: torch.Tensor) -> torch.Tensor:
        """``Σ_l delta_cl P_l`` -> ``[C, d]``."""
        return torch.bmm(delta.to(self.rows.dtype).unsqueeze(1), self.rows).squeeze(1)


class AllRows:
    """A step's fused rows read from the whole broadcast table ``fused [N, J d]`` through the examples' item ids
    ``items [C, L]``: the dot products of every row with every client's head, and the weighted sums as a
    ``[C, N]`` scatter and one product (the table is the same for every client while it is not stepped)."""

    def __init__(self, fused: torch.Tensor, items: torch.Tensor, experts: int):
        self.fused, self.experts = fused, experts
        self.n_items = fused.shape[0]
        c_n = items.shape[0]
        self.flat = (items + torch.arange(c_n, device=items.device).unsqueeze(1) * self.n_items).reshape(-1)
        self.shape = items.shape

    def dot(self, h: torch.Tensor) -> torch.Tensor:
        d = self.fused.shape[1] // self.experts
        every = h @ self.fused.view(self.n_items * self.experts, d).T  # [C, N J]
        return every.view(-1, self.experts).index_select(0, self.flat).view(*self.shape, self.experts)

    def weighted_sum(self, delta: torch.Tensor) -> torch.Tensor:
        per_item = torch.zeros(self.shape[0] * self.n_items, dtype=delta.dtype, device=delta.device)
        per_item.index_add_(0, self.flat, delta.reshape(-1))
        return per_item.view(self.shape[0], self.n_items) @ self.fused
