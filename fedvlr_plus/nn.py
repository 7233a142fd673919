"""Functional layers that broadcast over an optional leading client dimension.

Parameters are either unbatched (``w [in, out]``, ``b [out]``: one client, or the server's shared copy) or
stacked per client (``w [C, in, out]``, ``b [C, out]``: the batched simulator, or private parameters of B users
being scored); the input then starts with the same ``C`` (``[C, in]``, ``[C, L, in]``, ...).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _lead(p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Reshape a stacked ``[C, k]`` parameter so that it broadcasts against ``x [C, ..., k]``."""
    return p.reshape(p.shape[0], *([1] * (x.dim() - 2)), p.shape[-1])


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    if w.dim() == 2:
        y = x @ w
        return y if b is None else y + b
    c = w.shape[0]
    y = torch.bmm(x.reshape(c, -1, x.shape[-1]), w).reshape(*x.shape[:-1], w.shape[-1])
    return y if b is None else y + _lead(b, y)


def layer_norm(x: torch.Tensor, g: torch.Tensor, b: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    y = F.layer_norm(x, (x.shape[-1],), eps=eps)
    if g.dim() == 1:
        return y * g + b
    return y * _lead(g, y) + _lead(b, y)


def gather_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` for an integer ``index`` of any shape, with a backward that is the same on every run.

    The backward of ``table[index]`` adds into the gradient with atomic adds across threads once it has 32,768
    or more elements (PyTorch's CPU ``index_put_``), so two runs of one seed could end in different models.
    ``index_select``'s backward adds in the index's order. A boolean mask picks each row at most once, so it
    indexes as usual."""
    index = torch.as_tensor(index, device=table.device)
    if index.dtype == torch.bool:
        return table[index]
    rows = table.index_select(0, index.reshape(-1).long())
    return rows.view(*index.shape, *table.shape[1:])


def gather_entries(table: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``table[rows, cols]`` (the two broadcast against each other; the entries of a matrix, or the rows of a
    ``[C, T, d]`` stack) as one flat ``index_select``: several times faster than advanced indexing on the CPU,
    with :func:`gather_rows`'s fixed-order backward."""
    rows, cols = torch.broadcast_tensors(rows, cols)
    return gather_rows(table.reshape(-1, *table.shape[2:]), rows * table.shape[1] + cols)


def weighted_bce_sums(logits: torch.Tensor, y: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Each row's weighted binary cross-entropy, ``Σ_j w_j (softplus(x_j) - y_j x_j)``: the loss of
    ``F.binary_cross_entropy_with_logits(x, y, weight=w, reduction="none").sum(-1)`` up to float rounding, in half
    its time on the CPU. For steps whose gradient is formed in closed form, where the loss is only reported."""
    return ((F.softplus(logits) - y * logits) * weight).sum(-1)
