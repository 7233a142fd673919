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

from .strategy import Strategy, check_updates, example_weights, weighted_dense, weighted_row_sums


class FedAvgStrategy(Strategy):
    name = "fedavg"
    upload = "params"

    def aggregate(self, shared, updates, specs):
        check_updates(shared, updates, self.upload)
        w = example_weights(updates)
        out = {}
        for name, g in shared.items():
            if specs[name].item_table:
                # θ[r] + Σ_u w_u (θ_u[r] - θ[r]) = θ[r] (1 - W_r) + Σ_u w_u θ_u[r], W_r = Σ_{u ∋ r} w_u
                num, den = weighted_row_sums(updates, name, g.shape, w, g.dtype)
                base = g.reshape(g.shape[0], -1)
                out[name] = (base * (1.0 - den).to(g.dtype).unsqueeze(1) + num).reshape(g.shape)
            else:
                out[name] = weighted_dense(updates, name, w).to(g.dtype)
        return out
