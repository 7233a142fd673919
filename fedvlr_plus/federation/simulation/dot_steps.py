"""Local SGD of a dot-product head on a small catalogue, with the clients' item rows never formed step by step.

For a head ``logit = <v_i, w> + b`` (FedAvg, FCF, PFedRec) client ``c``'s copy of the item table after ``s``
local steps is the broadcast table plus a sum of rank-one steps, because every step's gradient of row ``i`` is
``δ_i w`` (``δ_i``: the sum of ``∂J/∂logit`` over the step's examples of item ``i``):

    v_i^s = V_i - η Σ_{s' < s} δ^{s'}_i w^{s'}.

So a step needs only the broadcast table ``V`` and the few vectors ``w^{s'}`` of the earlier steps:

    <v_i^s, w^s> = (w^s V^T)_i - η Σ_{s'} δ^{s'}_i <w^{s'}, w^s>,
    ∂J/∂w = Σ_i δ^s_i v_i^s = (δ^s V) - η Σ_{s'} <δ^s, δ^{s'}> w^{s'},

where ``δ^s`` is dense over the catalogue (``[C, N]``): two ``[C, d] x [d, N]`` products a step for the whole
chunk, no ``[examples, d]`` gather, product or scatter. That is cheaper than gathering rows while the catalogue
is a small multiple of a step's examples (:data:`ALL_ROWS_RATIO`). The clients' rows are formed once at the end
(``write_rows``) for their uploads and stored copies, or not at all where the round only needs the uploads'
weighted sum: ``Σ_c a_c v^c_i = (Σ_{c ∋ i} a_c) V_i - η Σ_{c, s} δ^s_{c i} a_c w^s_c``, one product
(``factors``). Same maths as the step-by-step update (float rounding apart);
without weight decay only (a decayed row is not a sum of rank-one steps of the same form).
"""

from __future__ import annotations

import torch

from ...nn import weighted_bce_sums

#: use these steps while the catalogue has at most this many rows per example slot of a step (a GEMM reads a
#: row for about 1/30 of the cost of gathering it, one thread, d = 64)
ALL_ROWS_RATIO = 24


class DotSteps:
    """The local steps of one chunk (``C`` clients, up to ``S`` steps) of a head ``<v_i, w> + b`` over the
    broadcast table ``table [N, d]``; ``stepped``: whether the clients step their copies of the table (else
    only the gradient of the rows is kept, for a gradient upload)."""

    def __init__(self, table: torch.Tensor, c_n: int, s_max: int, item_lr: float, stepped: bool):
        self.table, self.c_n, self.n = table, c_n, table.shape[0]
        self.item_lr, self.stepped = float(item_lr), stepped
        self.delta = torch.zeros(s_max, c_n * self.n, dtype=table.dtype, device=table.device)  # δ^s, flat
        self.heads = torch.zeros(s_max, c_n, table.shape[1], dtype=table.dtype, device=table.device)  # w^s
        self.s = 0

    @staticmethod
    def fits(n_items: int, c_n: int, s_max: int, slots: int, budget: int) -> bool:
        """Whether a chunk is cheaper this way and its ``[S, C, N]`` record fits in ``budget`` floats."""
        return n_items <= ALL_ROWS_RATIO * slots and s_max * c_n * n_items <= budget

    @torch.no_grad()
    def step(self, w: torch.Tensor, b: torch.Tensor | None, items: torch.Tensor, y: torch.Tensor, a: torch.Tensor):
        """One step of every client: its head ``w [C, d]`` (and bias ``b [C]``), the global item ids of its
        examples ``items [C, L]``, labels and weights ``[C, L]``. Returns ``(∂J/∂w, ∂J/∂b or None, loss [C])``."""
        s, c_n, n = self.s, self.c_n, self.n
        flat = (items + torch.arange(c_n, device=items.device).unsqueeze(1) * n).reshape(-1)
        logits = (w @ self.table.T).view(-1).index_select(0, flat).view(items.shape)
        earlier = self.delta[:s].index_select(1, flat).view(s, *items.shape) if self.stepped and s else None
        if earlier is not None:  # the rows' own earlier steps: - η Σ_{s'} δ^{s'}_i <w^{s'}, w>
            gram = torch.bmm(self.heads[:s].transpose(0, 1), w.unsqueeze(-1)).squeeze(-1)  # [C, s]
            logits = logits - self.item_lr * (earlier * gram.T.unsqueeze(-1)).sum(0)
        if b is not None:
            logits = logits + b.unsqueeze(-1)
        dlog = (torch.sigmoid(logits) - y) * a
        self.delta[s].index_add_(0, flat, dlog.reshape(-1))
        self.heads[s] = w
        g_w = self.delta[s].view(c_n, n) @ self.table
        if earlier is not None:
            overlap = (earlier * dlog.unsqueeze(0)).sum(-1)  # [s, C]
            g_w = g_w - self.item_lr * torch.bmm(overlap.T.unsqueeze(1), self.heads[:s].transpose(0, 1)).squeeze(1)
        loss = weighted_bce_sums(logits, y, a)
        self.s += 1
        return g_w, (dlog.sum(1) if b is not None else None), loss

    @torch.no_grad()
    def row_grads(self, touched: torch.Tensor) -> torch.Tensor:
        """``Σ_s δ^s_i w^s`` of each client's rows ``touched [C, T]`` (global ids): ``[C, T, d]``."""
        c_n, t_max = touched.shape
        flat = (touched + torch.arange(c_n, device=touched.device).unsqueeze(1) * self.n).reshape(-1)
        coef = self.delta[: self.s].index_select(1, flat).view(self.s, c_n, t_max).permute(1, 2, 0)
        return torch.bmm(coef, self.heads[: self.s].transpose(0, 1))

    @torch.no_grad()
    def write_rows(self, start: torch.Tensor, grads: torch.Tensor) -> None:
        """Step the clients' copies ``start [C, T, d]`` of their rows (the broadcast rows) in place by their
        :meth:`row_grads`."""
        start.add_(grads, alpha=-self.item_lr)

    @torch.no_grad()
    def factors(self, upload: str):
        """The chunk's uploads of the table as factors of the round's sums: ``(coef [N, S C], factor [S C, d],
        columns [S C] (the client of each), base)``; the sum over clients of their uploads (weighted by the
        weights of ``columns``, and ``base`` by the weights of the clients holding a row) is ``coef @ factor``
        (+ ``base`` per row): the rows themselves (``params``; ``base`` the broadcast table) or their gradient."""
        s, c_n, n = self.s, self.c_n, self.n
        coef = self.delta[:s].view(s, c_n, n).permute(2, 0, 1).reshape(n, s * c_n)  # column s' C + c
        heads = self.heads[:s].reshape(s * c_n, -1)
        columns = torch.arange(c_n, device=coef.device).repeat(s)
        if upload == "params":
            return coef, heads * -self.item_lr, columns, self.table
        return coef, heads, columns, None
