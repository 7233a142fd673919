"""Sparse row-wise averaging for item tables: each row is averaged over the clients that touched it.

For an item table, ``θ[r] ← Σ_{u ∋ r} w_u θ_u[r] / Σ_{u ∋ r} w_u`` over the clients whose upload contains row
``r`` (``w_u = n_u / Σ n``); rows nobody touched keep their value. Dense parameters are averaged as in FedAvg.
Unlike dense FedAvg, a row that one client in a thousand trains is not diluted a thousandfold.

References: Niu, Wu, Tang, Hua, Jia, Lv, Wu, Chen, "Billion-scale Federated Learning on Mobile Clients: A
Submodel Design with Tunable Privacy", MobiCom 2020 (clients download and upload only their rows of the embedding
table); Ding, Niu, Tang, Lv, Wu, Chen, "Federated Submodel Optimization for Hot and Cold Data Features",
NeurIPS 2022 (FedSubAvg: average each row over the clients involved with it).
"""
from __future__ import annotations

from .strategy import Strategy


class SparseRowAvg(Strategy):
    name = "sparse-avg"
    upload = "params"
    linear = True

    def from_sums(self, shared, sums, specs):
        out = {}
        for name, g in shared.items():
            if specs[name].item_table:
                num, den = sums.row_sums(name)
                hit = den > 0
                new = g.reshape(g.shape[0], -1).clone()
                new[hit] = num[hit] / den[hit].to(g.dtype).unsqueeze(1)
                out[name] = new.reshape(g.shape)
            else:
                out[name] = sums.dense_sum(name).to(g.dtype)
        return out
