"""FedNCF: federated neural collaborative filtering (NeuMF = GMF + MLP towers).

``logit = h · [p_u^G ⊙ q_i^G ; MLP([p_u^M ; q_i^M])] + b``. The two user embeddings ``p_u^G``, ``p_u^M`` are
private; the item embeddings ``q^G``, ``q^M``, the MLP tower (2d → d → d/2 → d/4, ReLU) and the output layer are
shared and averaged by the server (FedAvg).

References: Perifanis, Efraimidis, "Federated Neural Collaborative Filtering", Knowledge-Based Systems 242, 2022;
He, Liao, Zhang, Nie, Hu, Chua, "Neural Collaborative Filtering", WWW 2017 (NeuMF).

The first MLP layer is stored as two blocks (user part, item part); ``W [p; q] = W_u p + W_q q`` is the same
layer, and the split lets evaluation compute the item part once for all users. The output layer is stored as
its GMF and MLP blocks too. Its GMF block starts at 1 (so the model starts as the dot product ``p^G · q^G``
plus a small MLP term) instead of small random values: with three small factors in the GMF path, the private
user embeddings barely moved under plain SGD and the model stalled at popularity-level accuracy on ML-100K
validation. Unlike the FedVLR code release (docs/method.md, "Departures from the original release"), where
the running average was never reset and every client then reloaded its full old state, so nothing was
federated, the client loads the global state and restores only its user embeddings.
"""

from __future__ import annotations

import torch

from .base import Backbone, ParamSpec, rowdot, take_rows
from .chunk_steps import runs_forward_of


class FedNCF(Backbone):
    name = "fedncf"
    default_strategy = "fedavg"
    default_lr = 0.5
    default_item_lr_scale = 300.0

    def layer_sizes(self) -> list[int]:
        d = self.dim
        return [d, max(d // 2, 1), max(d // 4, 1)]

    def specs(self):
        n, d = self.n_items, self.dim
        h1, h2, h3 = self.layer_sizes()
        return [
            ParamSpec("item_gmf", (n, d), shared=True, item_table=True, init="normal", std=0.1),
            ParamSpec("item_mlp", (n, d), shared=True, item_table=True, init="normal", std=0.1),
            ParamSpec("mlp1_user", (h1, d), shared=True, init="xavier"),
            ParamSpec("mlp1_item", (h1, d), shared=True, init="xavier"),
            ParamSpec("mlp1_b", (h1,), shared=True, init="zeros"),
            ParamSpec("mlp2_w", (h2, h1), shared=True, init="xavier"),
            ParamSpec("mlp2_b", (h2,), shared=True, init="zeros"),
            ParamSpec("mlp3_w", (h3, h2), shared=True, init="xavier"),
            ParamSpec("mlp3_b", (h3,), shared=True, init="zeros"),
            # the output layer h on [GMF ; MLP], stored as its two blocks: the GMF block starts at 1, so the
            # model starts as a dot product u·q plus a small MLP term (see the module docstring)
            ParamSpec("out_gmf", (d,), shared=True, init="ones"),
            ParamSpec("out_mlp", (h3,), shared=True, init="normal", std=0.1),
            ParamSpec("out_b", (), shared=True, init="zeros"),
            ParamSpec("user_gmf", (d,), shared=False, init="normal", std=0.1),
            ParamSpec("user_mlp", (d,), shared=False, init="normal", std=0.1),
        ]

    def step_kernel(self):
        """The closed form of a batched chunk's local steps (:mod:`.fedncf_steps`), where this class's own forward
        is the one trained; None for a subclass that changes it (autograd trains it)."""
        forward = ("head", "item_repr", "logits", "regulariser", "specs", "layer_sizes", "_tail", "_mlp_out")
        if self.uses_history or not runs_forward_of(self, FedNCF, forward):
            return None
        from .fedncf_steps import FedNCFKernel

        return FedNCFKernel()

    def item_repr(self, p, items, ctx):
        return torch.cat([take_rows(p["item_gmf"], items), take_rows(p["item_mlp"], items)], dim=-1)

    def logits(self, p, items, ctx=None):
        every_item = items is None and p["item_gmf"].dim() == 2 and p["user_mlp"].dim() <= 2
        if not every_item or torch.is_grad_enabled():  # training: the rows a step touches, or gradients
            return super().logits(p, items, ctx)
        return self._every_item_logits(p, ctx or {})

    #: users x items scored at once when every item is scored: their [users, items, d] activations stay in cache
    SCORE_USERS, SCORE_ITEMS = 32, 256

    def _every_item_logits(self, p, ctx):
        """Logits of every item for each user: :meth:`head`'s operations in the same order, bit for bit, with the
        item side of the first MLP layer computed once and the pairs taken a cache-sized block at a time (all
        pairs at once wrote and re-read a [users, items, d] tensor per layer, 5-8x slower on a large catalogue)."""
        d, one = self.dim, p["user_mlp"].dim() == 1
        user_gmf, user_mlp = (p["user_gmf"][None], p["user_mlp"][None]) if one else (p["user_gmf"], p["user_mlp"])
        vecs = self.item_repr(p, None, ctx)
        q_g, item_part = vecs[:, :d], vecs[:, d:] @ p["mlp1_item"].transpose(-1, -2)
        user_part = user_mlp.unsqueeze(-2) @ p["mlp1_user"].transpose(-1, -2)
        out = torch.empty(user_mlp.shape[0], self.n_items, dtype=vecs.dtype, device=vecs.device)
        for u in range(0, out.shape[0], self.SCORE_USERS):
            us = slice(u, u + self.SCORE_USERS)
            for i in range(0, self.n_items, self.SCORE_ITEMS):
                it = slice(i, i + self.SCORE_ITEMS)
                h = (item_part[it] + user_part[us] + p["mlp1_b"]).relu_()
                out[us, it] = self._tail(p, user_gmf[us].unsqueeze(-2) * q_g[it], h)
        return out[0] if one else out

    def mixture_logits(self, p, w, experts):
        """Logits of every item for users whose item vectors are mixtures ``Σ_j w[u, j] experts[i, j]`` (the FedVLR
        layer's; ``w [B, J]``, ``experts [N, J, 2d]``), without forming the ``[B, N, 2d]`` mixtures: the first MLP
        layer is linear, so its item side is computed once per expert and mixed per user (J numbers a hidden unit
        instead of d); the rest as :meth:`_every_item_logits`, a block of users and items at a time. The same
        values as :meth:`head` on the mixtures up to the order of float summation."""
        d, n, j = self.dim, experts.shape[0], experts.shape[1]
        h1, one = p["mlp1_b"].shape[-1], w.dim() == 1
        user_gmf, user_mlp = (p["user_gmf"][None], p["user_mlp"][None]) if one else (p["user_gmf"], p["user_mlp"])
        w = w[None] if one else w
        # the GMF path is linear in the mixture: <u ⊙ h, Σ_j w_j g_ij> = <w ⊗ (u ⊙ h), g_i>, one product for all
        gmf_direction = (w.unsqueeze(-1) * (user_gmf * p["out_gmf"]).unsqueeze(-2)).reshape(w.shape[0], j * d)
        out = gmf_direction @ experts[..., :d].reshape(n, j * d).T  # [B, N]
        item_part = experts[..., d:] @ p["mlp1_item"].transpose(-1, -2)  # [N, J, h1]
        user_part = user_mlp.unsqueeze(-2) @ p["mlp1_user"].transpose(-1, -2)  # [B, 1, h1]
        for i in range(0, n, self.SCORE_ITEMS):
            it = slice(i, i + self.SCORE_ITEMS)
            size = item_part[it].shape[0]
            mlp_rows = item_part[it].permute(1, 0, 2).reshape(j, size * h1)
            for u in range(0, w.shape[0], self.SCORE_USERS):
                us = slice(u, u + self.SCORE_USERS)
                h = ((w[us] @ mlp_rows).view(-1, size, h1) + user_part[us] + p["mlp1_b"]).relu_()
                out[us, it] += self._mlp_out(p, h)
        out += p["out_b"][..., None]
        return out[0] if one else out

    def scoring_floats_per_item(self, table_width: int) -> int:
        return 2  # the logits (and their copy); the activations are bounded by the blocks above

    @classmethod
    def _tail(cls, p, gmf, h):
        """The MLP tower after its first layer's activation, and the output layer."""
        return rowdot(gmf, p["out_gmf"]) + cls._mlp_out(p, h) + p["out_b"][..., None]

    @staticmethod
    def _mlp_out(p, h):
        """The MLP path's share of the logit from its first layer's activation."""
        h = (h @ p["mlp2_w"].transpose(-1, -2) + p["mlp2_b"]).relu_()
        h = (h @ p["mlp3_w"].transpose(-1, -2) + p["mlp3_b"]).relu_()
        return rowdot(h, p["out_mlp"])

    def head(self, p, vecs, ctx):
        d = self.dim
        q_g, q_m = vecs[..., :d], vecs[..., d:]
        gmf = p["user_gmf"].unsqueeze(-2) * q_g
        h = (
            q_m @ p["mlp1_item"].transpose(-1, -2)
            + p["user_mlp"].unsqueeze(-2) @ p["mlp1_user"].transpose(-1, -2)
            + p["mlp1_b"].unsqueeze(-2)
        )
        h = torch.relu(h)
        h = torch.relu(h @ p["mlp2_w"].transpose(-1, -2) + p["mlp2_b"].unsqueeze(-2))
        h = torch.relu(h @ p["mlp3_w"].transpose(-1, -2) + p["mlp3_b"].unsqueeze(-2))
        return rowdot(gmf, p["out_gmf"]) + rowdot(h, p["out_mlp"]) + p["out_b"][..., None]
