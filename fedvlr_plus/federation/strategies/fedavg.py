"""FedAvg: the server's new parameters are the example-weighted mean of the clients' local parameters.

``θ ← Σ_u w_u θ_u`` with ``w_u = n_u / Σ_v n_v`` over the round's clients. An item table uploaded row-wise counts
as unchanged (= the current global value) on the rows a client did not touch, which is what a client holding the
whole table would have sent: ``θ[r] ← θ[r] + Σ_u w_u (θ_u[r] − θ[r])`` over the clients that touched row ``r``.
Rows few clients touch therefore move little; :mod:`.sparse_avg` is the variant that averages over the
contributors of each row only.

Reference: McMahan, Moore, Ramage, Hampson, Agüera y Arcas, "Communication-Efficient Learning of Deep Networks
from Decentralized Data", AISTATS 2017.
"""

from __future__ import annotations

import torch

from .base import Strategy


class FedAvgStrategy(Strategy):
    name = "fedavg"
    upload = "params"
    linear = True

    def from_sums(self, shared, sums, specs):
        out = {}
        for name, g in shared.items():
            if specs[name].item_table:
                num, den = sums.row_sums(name)
                out[name] = self.table_from_row_sums(g.reshape(g.shape[0], -1), num, den).reshape(g.shape)
            else:
                out[name] = sums.dense_sum(name).to(g.dtype)
        return out

    def table_from_row_sums(self, table: torch.Tensor, num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
        """An item table ``[rows, width]`` from its weighted row sums ``num = Σ_u w_u θ_u[r]`` and the weight
        ``den = W_r = Σ_{u ∋ r} w_u`` of the clients that touched each row: ``θ[r] (1 - W_r) + num[r]``, that is
        ``θ[r] + Σ_u w_u (θ_u[r] - θ[r])``."""
        return table * (1.0 - den).to(table.dtype).unsqueeze(1) + num
