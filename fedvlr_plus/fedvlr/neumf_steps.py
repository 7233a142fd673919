"""FedNCF's NeuMF head behind the FedVLR layer: a chunk's local steps with hand-written gradients and no
per-client copies of the tower.

Under the layer's default rule (fedgrad: clients upload gradients and do not step the shared parts locally) the
tower (``mlp1_*``, ``mlp2_*``, ``mlp3_*``, ``out_*``) and the broadcast fused views ``F`` are the same for every
client of a round and fixed during it; only the private user embeddings and the router move. So a step of the
whole chunk is

    w = softmax(φ_u(r_u) / T),   v_l = Σ_j w_j F_lj = [g_l ; m_l],
    logit_l = <u^G ⊙ o^G, g_l> + o^M · MLP(W_i m_l + W_u u^M + b_1) + b,

and three things autograd cannot see make it cheap:

- the first layer's item side is linear in the mixture, ``W_i m_l = Σ_j w_j (W_i F^M_lj)``: the products
  ``W_i F^M_ij`` are taken once per chunk for every item and expert, and a step gathers its examples' (``[J, C,
  L h1]``, the size of ``h_1`` per expert) and mixes them with the router weights, and the same rows give
  ``∂J/∂w_j`` as one dot product a client; the MF blocks are only scored against
  ``u^G ⊙ o^G``, read in place (:class:`.closed_form.AllRows` or :class:`IndexedRows`);
- the tower's weights are one matrix for all clients, so its layers are flat products over the chunk's examples
  (the generic path runs small per-client batched products on copies of them);
- the uploaded gradients of ``F`` and of ``W_i`` are formed at the end: the MF blocks' from the steps' per-row
  sums of ``δ`` and one direction a step (rank one, as :class:`.closed_form.MixtureSteps`), the MLP blocks' and
  ``W_i``'s from one per-row sum ``A_cij = Σ_steps w_j Σ_{l: item i} (∂J/∂h_1)_l`` (``W_i^T A`` for the rows,
  ``Σ A ⊗ F^M`` for ``W_i``; for the round's sums, ``A`` weighted per item and mapped back once a round).

The gradients are autograd's, in another order of float summation; the tests compare the round with the
generic path and the sequential reference. The router is stepped as in :class:`.closed_form.MixtureSteps` (its
first layer as a scale and a running sum, written once at the end).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..adapters.chunk_steps import keeps_shared_fixed
from ..compiled import LazyKernels
from ..federation.simulation.indexed_rows import IndexedRows
from ..federation.simulation.scratch import Scratch
from .closed_form import ALL_ROWS_RATIO, ROUTER, AllRows, step_row_coef
from .router import history_mean
from .router_steps import FirstLayer, router_grads

#: the FedNCF tower's shared parameters (their names in the backbone)
TOWER = ("mlp1_user", "mlp1_item", "mlp1_b", "mlp2_w", "mlp2_b", "mlp3_w", "mlp3_b", "out_gmf", "out_mlp", "out_b")
USER = ("user_gmf", "user_mlp")


@dataclass(frozen=True)
class MixtureNeuMF:
    """The layer's local steps in front of FedNCF: ``table`` (the broadcast fused views, ``experts`` blocks of
    ``2 dim``), the backbone's ``dim`` and the router's softmax ``temperature``."""

    table: str
    experts: int
    dim: int
    temperature: float

    @property
    def names(self) -> set[str]:
        """Every trained parameter these steps cover."""
        return {self.table, *TOWER, *USER, *ROUTER}

    #: the fused rows' gradient is always formed at the end (never stepped per example)
    defers_rows = True

    #: the rounds these steps cover: the shared parts stay fixed on the client (else autograd trains the chunk)
    covers = staticmethod(keeps_shared_fixed)

    def local_steps(self, ctx: dict, p: dict, lr: float, wd: float, defer: tuple[int, int, int] | None):
        """The state of one chunk's local training (:class:`NeuMFSteps`)."""
        if defer is None:
            raise ValueError("the NeuMF steps keep the fused rows fixed: the chunk must defer their gradient")
        return NeuMFSteps(self, history_mean(ctx), p, lr, wd, defer, ctx.get("scratch"))


class NeuMFSteps:
    """One chunk's local steps (see the module docstring). ``x``: the router's input ``[C, J 2d]``; ``p``: the
    chunk's stacked parameters (the tower's copies are equal: it is not stepped); ``defer``: clients, touched
    rows and steps of the chunk."""

    def __init__(self, head: MixtureNeuMF, x: torch.Tensor, p: dict, lr: float, wd: float, defer: tuple, scratch=None):
        self.head = head
        self.first = FirstLayer(x, p["router.w1"], lr, wd)
        c_n, t_max, s_max = defer
        self.tower = {name: p[name][0] for name in TOWER}  # one copy: the same for every client
        self.c_n, self.t_max = c_n, t_max
        j_n, d, h1 = head.experts, head.dim, self.tower["mlp1_b"].shape[-1]
        opts = dict(dtype=x.dtype, device=x.device)
        # the MF blocks' row gradients are δ_l w_j (u ⊙ o) (rank one per client and step): the steps' per-row
        # sums of δ [S, C T] and their directions [S, C, J d] give them at the end (as MixtureSteps does)
        self.delta_rows = torch.zeros(s_max, c_n * t_max, **opts)
        self.directions = torch.zeros(s_max, c_n, j_n * d, **opts)
        # the MLP blocks': A [C T, J h1], per touched row and expert the sums of w_j ∂J/∂h_1 over the steps
        self.acc = torch.zeros(c_n * t_max, j_n * h1, **opts)
        self.row_item = torch.zeros(c_n * t_max, dtype=torch.long, device=x.device)
        # the tower's per-client gradients (the steps add them in place: no fresh [C, h, h'] and sum a step)
        self.tower_sums = {name: torch.zeros(c_n, *self.tower[name].shape, **opts) for name in ("mlp2_w", "mlp3_w")}
        self.s1_steps = torch.zeros(s_max, c_n, h1, **opts)
        self.u_mlp_steps = torch.zeros(s_max, c_n, self.tower["mlp1_user"].shape[1], **opts)
        self.s = 0
        self._scratch = Scratch() if scratch is None else scratch  # the steps' intermediates (:meth:`_buffers`)
        self._tables = None  # (the broadcast table, F^G [N, J d], W_i F^M [N J, h1], F^M [N, J, d])
        self._kernels = _compiled(self.acc)  # the first layer's compiled kernels, or None: the torch path

    def rows(self, fused: torch.Tensor, chunk_rows, fidx: torch.Tensor, items: torch.Tensor):
        """The step's examples: the MF blocks of their fused rows (read in place: from the whole broadcast table
        where it is small beside the step, else by id), their global item ids ``items [C, L]`` and flat
        touched-row ids ``fidx``. The tables are split once per chunk."""
        head, d = self.head, self.head.dim
        if self._tables is None or self._tables[0] is not fused:
            experts = fused[:, : head.experts * 2 * d].reshape(fused.shape[0], head.experts, 2 * d)
            item_side = experts[..., d:] @ self.tower["mlp1_item"].T  # W_i F^M_ij  [N, J, h1]
            mf = experts[..., :d].reshape(fused.shape[0], head.experts * d)
            self._tables = (fused, mf, item_side.reshape(-1, item_side.shape[-1]), experts[..., d:])
        mf = self._tables[1]
        if mf.shape[0] <= ALL_ROWS_RATIO * items.shape[1]:
            return AllRows(mf, items, head.experts), items, fidx
        return IndexedRows(mf, items, head.experts, d), items, fidx

    def _buffers(self, name: str, *shape: int) -> torch.Tensor:
        """A buffer for a step's intermediate ``name`` (:class:`Scratch`: fresh tensors of these sizes cost their
        page faults again every step)."""
        return self._scratch.get(name, shape, self.acc.dtype, self.acc.device)

    def _item_side_rows(self, items: torch.Tensor) -> torch.Tensor:
        """``W_i F^M_lj`` of the step's examples ``items [C, L]``, expert after expert: ``[J, C, L h1]``, gathered
        into one buffer for the chunk's steps (the gather is cheap; a fresh tensor of this size is not)."""
        j_n, (c_n, l_n), table = self.head.experts, items.shape, self._tables[2]
        out = self._buffers("item_side", j_n, c_n, l_n * table.shape[1])
        ids = items.reshape(1, -1) * j_n + torch.arange(j_n, device=items.device).view(j_n, 1)
        torch.index_select(table, 0, ids.view(-1), out=out.view(-1, table.shape[1]))
        return out

    @torch.no_grad()
    def step(self, rows, p: dict, y: torch.Tensor, a: torch.Tensor, active: torch.Tensor, fidx: torch.Tensor):
        """One step of every client: the gradients (None for what this object applies or sums itself:
        ``router.w1``, ``mlp1_item``, ``mlp1_user``, ``mlp2_w``, ``mlp3_w``) and each client's weighted loss ``[C]``."""
        mf_rows, items, _ = rows
        tw, c_n, l_n, j_n = self.tower, *items.shape, self.head.experts
        pre, hidden, w = self.first.forward(p, self.head.temperature)
        u_gmf, u_mlp = p["user_gmf"], p["user_mlp"]
        gmf_dir = u_gmf * tw["out_gmf"]  # [C, d]
        s_mf = mf_rows.dot(gmf_dir)  # <u ⊙ o, F^G_lj>  [C, L, J]
        user_side = u_mlp @ tw["mlp1_user"].T + tw["mlp1_b"]  # [C, h1]
        kernels, buf = self._kernels, self._buffers
        x_mlp, h1 = self._first_layer(kernels, items, w, user_side)
        h2 = torch.addmm(tw["mlp2_b"], h1, tw["mlp2_w"].T, out=buf("h2", c_n * l_n, tw["mlp2_b"].shape[0])).relu_()
        h3 = torch.addmm(tw["mlp3_b"], h2, tw["mlp3_w"].T, out=buf("h3", c_n * l_n, tw["mlp3_b"].shape[0])).relu_()
        logits = torch.baddbmm((h3 @ tw["out_mlp"]).view(c_n, l_n, 1).add_(tw["out_b"]), s_mf, w.unsqueeze(-1)).squeeze(
            -1
        )
        delta = (torch.sigmoid(logits) - y) * a  # ∂J/∂logit  [C, L]
        # backward through the tower, flat over the chunk's examples; per-client sums as batched products
        d3 = _relu_back(torch.mul(delta.reshape(-1, 1), tw["out_mlp"], out=buf("d3", *h3.shape)), h3)
        d2 = _relu_back(torch.mm(d3, tw["mlp3_w"], out=buf("d2", *h2.shape)), h2)
        d1 = _relu_back(torch.mm(d2, tw["mlp2_w"], out=buf("d1", *h1.shape)), h1)
        by_client = _ClientSums(c_n, l_n)
        s1 = d1.view(c_n, l_n, -1).sum(1)
        g_mf = (w.unsqueeze(-1) * mf_rows.weighted_sum(delta).view(c_n, j_n, -1)).sum(1)  # Σ_l δ_l g_l  [C, d]
        # the tower's matrices: summed here over the steps (uploaded, never stepped), added to the upload at the end
        by_client.outer_into(self.tower_sums["mlp3_w"], d3, h2)
        by_client.outer_into(self.tower_sums["mlp2_w"], d2, h1)
        self.s1_steps[self.s], self.u_mlp_steps[self.s] = s1, u_mlp  # mlp1_user's Σ_s s1 ⊗ u_mlp
        grads = {
            "out_b": delta.sum(1),
            "out_mlp": by_client.weighted(delta, h3),
            "mlp3_w": None,
            "mlp3_b": d3.view(c_n, l_n, -1).sum(1),
            "mlp2_w": None,
            "mlp2_b": d2.view(c_n, l_n, -1).sum(1),
            "mlp1_user": None,
            "mlp1_item": None,
            "mlp1_b": s1,
            "out_gmf": g_mf * u_gmf,
            "user_gmf": g_mf * tw["out_gmf"],
            "user_mlp": s1 @ tw["mlp1_user"],
        }
        # ∂J/∂w_j: the MF blocks' Σ_l δ_l s_lj, and the MLP blocks' Σ_l <∂J/∂h_1, W_i F^M_lj>; each example's
        # w_j ∂J/∂h_1 added to its row's sums on the way
        g_mix = self._first_layer_back(kernels, x_mlp, items, w, d1, fidx)
        g_w = torch.bmm(delta.unsqueeze(1), s_mf).squeeze(1) + g_mix
        self.first.decay(active)
        g_pre, router = router_grads(pre, hidden, w, g_w, p["router.w2"], self.head.temperature)
        self.first.add(g_pre)
        grads.update(router, **{"router.w1": None})
        self._record_rows(fidx, items, delta, w, gmf_dir)
        loss = F.binary_cross_entropy_with_logits(logits, y, weight=a, reduction="none").sum(1)
        return grads, loss

    def _first_layer(self, kernels, items: torch.Tensor, w: torch.Tensor, user_side: torch.Tensor):
        """The first layer's output ``h_1 [C L, h1]``: ``relu(Σ_j w_j W_i F^M_lj + user side)`` from the per-chunk
        table, read in place by the compiled kernel, else gathered expert after expert (``[J, C, L h1]``, returned
        for the way back; None with the kernel)."""
        c_n, l_n = items.shape
        if kernels is not None:
            h1 = self._buffers("h1", c_n * l_n, user_side.shape[1])
            kernels.mix_item_side(*_arrays(self._tables[2], items, w, user_side), h1.numpy())
            return None, h1
        x_mlp = self._item_side_rows(items)
        h1 = torch.mul(x_mlp[0], w[:, :1], out=self._buffers("h1", c_n, x_mlp.shape[-1]))
        for j in range(1, w.shape[1]):
            h1.addcmul_(x_mlp[j], w[:, j : j + 1])
        return x_mlp, h1.view(c_n, l_n, -1).add_(user_side.unsqueeze(1)).relu_().view(c_n * l_n, -1)

    def _first_layer_back(self, kernels, x_mlp, items: torch.Tensor, w: torch.Tensor, d1: torch.Tensor, fidx):
        """``∂J/∂w_j`` of the first layer's item side, ``Σ_l <∂J/∂h_1, W_i F^M_lj>`` ``[C, J]``, and each example's
        ``w_j ∂J/∂h_1`` added to its touched row's sums ``A``."""
        (c_n, l_n), (j_n, h1) = items.shape, (w.shape[1], d1.shape[1])
        if kernels is not None:
            g_mix = torch.empty(c_n, j_n, dtype=d1.dtype)
            kernels.back_item_side(*_arrays(self._tables[2], items, w, d1, fidx), g_mix.numpy(), self.acc.numpy())
            return g_mix
        g_mix = torch.stack([torch.linalg.vecdot(x_mlp[j], d1.view(c_n, -1)) for j in range(j_n)], 1)
        mixed = self._buffers("mixed", c_n, l_n, j_n, h1)
        torch.mul(d1.view(c_n, l_n, 1, h1), w.view(c_n, 1, j_n, 1), out=mixed)
        self.acc.index_add_(0, fidx, mixed.view(-1, j_n * h1))
        return g_mix

    def _record_rows(self, fidx, items, delta, w, gmf_dir) -> None:
        """What the MF blocks' rows' gradient needs of this step: the per-row sums of δ and the MF direction
        ``w ⊗ (u ⊙ o)``; and each touched row's item."""
        c_n = w.shape[0]
        self.delta_rows[self.s].index_add_(0, fidx, delta.reshape(-1))
        self.directions[self.s] = (w.unsqueeze(-1) * gmf_dir.unsqueeze(1)).view(c_n, -1)
        self.row_item[fidx] = items.reshape(-1)
        self.s += 1

    @torch.no_grad()
    def finish(self, p: dict, acc: dict | None = None) -> None:
        """Write ``router.w1`` in place and add the tower's matrices' gradients summed over the steps to their
        uploads ``acc`` (the uploads these steps defer further are formed by :meth:`table_grads` and
        :meth:`dense_grads`, or handed to the round's sums by :meth:`table_factors` and :meth:`hidden_sums`)."""
        self.first.write(p["router.w1"])
        if acc is None:
            return
        for name, total in self.tower_sums.items():
            acc[name] += total
        acc["mlp1_user"].baddbmm_(self.s1_steps.permute(1, 2, 0), self.u_mlp_steps.transpose(0, 1))

    @torch.no_grad()
    def dense_grads(self, acc: dict) -> None:
        """Add the round's gradient of ``mlp1_item`` to each client's upload ``acc``: ``Σ_{t,j} A_tj ⊗ F^M_tj``
        over its touched rows (one batched product)."""
        if "mlp1_item" not in acc or self._tables is None:  # (None: a chunk without steps)
            return
        c_n, t_max, j_n = self.c_n, self.t_max, self.head.experts
        f_mlp = self._tables[3].index_select(0, self.row_item).reshape(c_n, t_max * j_n, -1)
        a_mlp = self.acc.view(c_n, t_max * j_n, -1)
        acc["mlp1_item"] += torch.bmm(a_mlp.transpose(1, 2), f_mlp)

    @torch.no_grad()
    def table_grads(self, touched: torch.Tensor) -> torch.Tensor:
        """The clients' summed gradient of their touched fused rows: ``[C, T, J 2d]``, each expert's block the MF
        part ``Σ_s (Σ_l δ_l) w_j (u ⊙ o)`` and the MLP part ``W_i^T A_tj``."""
        d, j_n, c_n, t_max = self.head.dim, self.head.experts, self.c_n, self.t_max
        out = torch.empty(c_n, t_max, j_n, 2 * d, dtype=self.acc.dtype, device=self.acc.device)
        coef = self.delta_rows.view(-1, c_n, t_max).permute(1, 2, 0)  # [C, T, S]
        out[..., :d] = torch.bmm(coef, self.directions.transpose(0, 1)).view(c_n, t_max, j_n, d)
        out[..., d:] = self.acc.view(c_n, t_max, j_n, -1) @ self.tower["mlp1_item"]
        return out.view(c_n, t_max, j_n * 2 * d)

    @torch.no_grad()
    def table_factors(self, items: torch.Tensor, real: torch.Tensor, n_items: int):
        """The MF blocks of the fused rows' gradient as factors of the round's sums (as
        :meth:`.closed_form.MixtureSteps.table_factors`; the factor's MLP columns are zero: :meth:`hidden_sums`
        carries that part)."""
        d, j_n, c_n, t_max = self.head.dim, self.head.experts, self.c_n, self.t_max
        s_n = self.delta_rows.shape[0]
        coef = step_row_coef(self.delta_rows, c_n, t_max, items, real, n_items)
        factor = torch.zeros(s_n * c_n, j_n, 2 * d, dtype=self.acc.dtype, device=self.acc.device)
        factor[..., :d] = self.directions.view(s_n * c_n, j_n, d)
        return coef, factor.view(s_n * c_n, -1), torch.arange(c_n, device=real.device).repeat(s_n)

    @torch.no_grad()
    def hidden_sums(self, n_items: int) -> dict:
        """The MLP blocks' part of the fused rows' gradient and ``mlp1_item``'s, for the round's sums: both are
        linear in the per-row sums ``A [C T, J h1]`` and their maps back (``W_i``, the MLP blocks ``F^M``) are
        the same for every client of the round, so the sums add ``A`` weighted per item (``[N, J h1]``) and map
        it back once a round, instead of ``[C, T, J d]`` rows and a ``[C, h1, T J] x [C, T J, d]`` product a
        chunk (:class:`~..federation.simulation.summed_chunk.SummedChunk`'s ``hidden``). A padded slot's ``A``
        is zero (no real example reads it). Empty for a chunk without steps."""
        if self._tables is None:
            return {}
        d, j_n, c_n, t_max = self.head.dim, self.head.experts, self.c_n, self.t_max
        h1 = self.acc.shape[1] // j_n
        w_i = self.tower["mlp1_item"]
        proj = torch.zeros(j_n, h1, j_n, 2 * d, dtype=w_i.dtype, device=w_i.device)
        for j in range(j_n):  # expert j's hidden block maps to its MLP columns only
            proj[j, :, j, d:] = w_i
        client = torch.arange(c_n, device=self.acc.device).repeat_interleave(t_max)
        readouts = {
            self.head.table: ("rows", proj.view(j_n * h1, -1)),
            "mlp1_item": ("outer", self._tables[3].reshape(n_items * j_n, d)),
        }
        return {"neumf.mlp1_item": (self.row_item, self.acc, client, n_items, readouts)}


_KERNELS = LazyKernels("fedvlr_plus.fedvlr.neumf_kernels")


def _compiled(like: torch.Tensor):
    """The compiled kernels for steps on the CPU (None on another device, or where numba does not import: the
    torch path then runs). Whether they run depends on the machine only, never on what the process did before, so
    a resumed run takes the path the uninterrupted one took."""
    return _KERNELS.get() if like.device.type == "cpu" else None


def _arrays(*tensors: torch.Tensor) -> list:
    """The tensors as contiguous numpy arrays (the kernels compile once per dtype and layout)."""
    return [t.detach().contiguous().numpy() for t in tensors]


def prepare_kernels() -> bool:
    """Compile the steps' kernels, or load them from numba's cache, with tiny calls (float32 and int64, as a step
    passes them); False where numba is missing. ``bench suite`` calls this before its cases."""

    def tiny(kernels):
        f, i = np.zeros((2, 1), np.float32), np.zeros((1, 1), np.int64)
        kernels.mix_item_side(f, i, np.ones((1, 1), np.float32), f[:1], f[:1])
        kernels.back_item_side(f, i, np.ones((1, 1), np.float32), f[:1], i[0], f[:1], f[:1])

    return _KERNELS.prepare(tiny)


def _relu_back(grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``grad`` through a ReLU whose output was ``out``, in place: the op autograd's ReLU backward runs (one pass,
    where a mask and a product take two and a boolean tensor)."""
    return torch.ops.aten.threshold_backward.grad_input(grad, out, 0, grad_input=grad)


class _ClientSums:
    """Per-client sums over a step's ``L`` examples of flat ``[C L, k]`` tensors, as batched products."""

    def __init__(self, c_n: int, l_n: int):
        self.c_n, self.l_n = c_n, l_n

    def weighted(self, delta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``Σ_l δ_cl x_cl`` -> ``[C, k]``."""
        return torch.bmm(delta.view(self.c_n, 1, self.l_n), x.reshape(self.c_n, self.l_n, -1)).squeeze(1)

    def outer_into(self, out: torch.Tensor, g: torch.Tensor, x: torch.Tensor) -> None:
        """``out += Σ_l g_cl ⊗ x_cl`` (``out [C, k_g, k_x]``)."""
        c_n, l_n = self.c_n, self.l_n
        out.baddbmm_(g.view(c_n, l_n, -1).transpose(1, 2), x.view(c_n, l_n, -1))
