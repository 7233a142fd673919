"""FedNCF's local steps in closed form: a chunk's NeuMF forward and backward written out, with no autograd graph.

Every client trains its own copy of the tower (FedAvg uploads the parameters), so the tower's weights are
``[C, ...]`` stacks and its layers are batched products. For the examples ``l`` of one step, with ``q^G_l``/
``q^M_l`` the rows of the two item tables, ``p^G``/``p^M`` the user's embeddings and ``o^G``, ``o^M``, ``o_b`` the
output layer (:mod:`.fedncf`):

    h_1 = relu(W_i q^M_l + W_u p^M + b_1),   h_2 = relu(W_2 h_1 + b_2),   h_3 = relu(W_3 h_2 + b_3),
    logit_l = <p^G ⊙ q^G_l, o^G> + <h_3, o^M> + o_b,   δ_l = a_l (σ(logit_l) − y_l),

and the backward pass is the chain rule a layer at a time: ``e_3 = δ o^M ⊙ [h_3 > 0]``, ``e_2 = e_3 W_3 ⊙
[h_2 > 0]``, ``e_1 = e_2 W_2 ⊙ [h_1 > 0]``; each weight's gradient is ``Σ_l e_k ⊗ h_{k−1}`` (one batched
product), ``∂J/∂q^M_l = e_1 W_i``, ``∂J/∂q^G_l = δ_l (p^G ⊙ o^G)``, and the user's and output layer's gradients are
sums over ``l``. This is the graph autograd differentiates on the generic path (the sequential reference and the
tests keep it). Written out, no graph is recorded, the examples' rows come contiguous for the tables' scatter, and
the ``[C, L, k]`` intermediates live in the simulator's reused buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .chunk_steps import ChunkSteps, steps_shared

TABLES = ("item_gmf", "item_mlp")
TOWER = ("mlp1_user", "mlp1_item", "mlp1_b", "mlp2_w", "mlp2_b", "mlp3_w", "mlp3_b", "out_gmf", "out_mlp", "out_b")
USER = ("user_gmf", "user_mlp")


@dataclass(frozen=True)
class FedNCFKernel:
    """The closed form of a FedNCF chunk's local steps (the simulator's step-kernel interface)."""

    table = TABLES[0]
    names = frozenset({*TABLES, *TOWER, *USER})

    #: the rounds these steps cover: each client steps its own copy of the shared parts (else autograd trains them)
    covers = staticmethod(steps_shared)

    def local_steps(self, ctx: dict, p: dict, lr: float, wd: float, defer) -> FedNCFSteps:
        return FedNCFSteps(p, ctx.get("scratch"))


class FedNCFSteps(ChunkSteps):
    """One chunk's steps: ``p`` holds the clients' stacked parameters, the tables as their ``[C, T, d]`` touched
    rows (stepped in place by the simulator between steps)."""

    prefix = "fedncf"

    def __init__(self, p: dict, scratch=None):
        super().__init__(scratch)
        self.flat = {name: p[name].view(-1, p[name].shape[-1]) for name in TABLES}

    def _forward(self, p: dict, q_mlp: torch.Tensor, like: torch.Tensor):
        """The tower's activations ``h_1``, ``h_2``, ``h_3`` (``[C, L, h_k]``, in buffers)."""
        user_side = torch.baddbmm(p["mlp1_b"].unsqueeze(1), p["user_mlp"].unsqueeze(1), p["mlp1_user"].transpose(1, 2))
        # each layer relu(W h + b) as one batched product over the clients' own weights; the first layer's bias
        # is the user's side W_u p^M + b_1
        layers = [(p["mlp1_item"], user_side)] + [(p[f"mlp{k}_w"], p[f"mlp{k}_b"].unsqueeze(1)) for k in (2, 3)]
        h, out = q_mlp, []
        for k, (weight, bias) in enumerate(layers, 1):
            buffer = self.buffer(f"h{k}", like, (*like.shape, weight.shape[1]))
            h = torch.baddbmm(bias, h, weight.transpose(1, 2), out=buffer).relu_()
            out.append(h)
        return tuple(out)

    def _tower_back(self, p: dict, delta: torch.Tensor, q_mlp, h1, h2, h3) -> dict:
        """The tower's gradients and the MLP table's rows' ``[C, L, d]``, from ``δ [C, L]``."""
        e3 = _relu_back(
            torch.mul(delta.unsqueeze(-1), p["out_mlp"].unsqueeze(1), out=self.buffer("e3", h3, h3.shape)), h3
        )
        e2 = _relu_back(torch.bmm(e3, p["mlp3_w"], out=self.buffer("e2", h2, h2.shape)), h2)
        e1 = _relu_back(torch.bmm(e2, p["mlp2_w"], out=self.buffer("e1", h1, h1.shape)), h1)
        s1 = e1.sum(1)
        return {
            "out_mlp": torch.bmm(delta.unsqueeze(1), h3).squeeze(1),
            "mlp3_w": torch.bmm(e3.transpose(1, 2), h2),
            "mlp3_b": e3.sum(1),
            "mlp2_w": torch.bmm(e2.transpose(1, 2), h1),
            "mlp2_b": e2.sum(1),
            "mlp1_item": torch.bmm(e1.transpose(1, 2), q_mlp),
            "mlp1_b": s1,
            "mlp1_user": s1.unsqueeze(-1) * p["user_mlp"].unsqueeze(1),
            "user_mlp": torch.bmm(s1.unsqueeze(1), p["mlp1_user"]).squeeze(1),
            "item_mlp": torch.bmm(e1, p["mlp1_item"], out=self.buffer("g_item_mlp", q_mlp, q_mlp.shape)),
        }

    @torch.no_grad()
    def step(self, fidx, p: dict, y: torch.Tensor, a: torch.Tensor, active: torch.Tensor, _fidx=None):
        """Every client's gradients (the tables' as ``[C, L, d]`` rows) and its weighted loss ``[C]``."""
        q_gmf, q_mlp = (self.gather(name, self.flat[name], fidx, y) for name in TABLES)
        h1, h2, h3 = self._forward(p, q_mlp, y)
        gmf_dir = p["user_gmf"] * p["out_gmf"]  # <p^G ⊙ q^G, o^G> = <q^G, p^G ⊙ o^G>
        logits = torch.linalg.vecdot(q_gmf, gmf_dir.unsqueeze(1)) + torch.linalg.vecdot(h3, p["out_mlp"].unsqueeze(1))
        logits += p["out_b"].unsqueeze(-1)
        delta = (torch.sigmoid(logits) - y) * a
        grads = self._tower_back(p, delta, q_mlp, h1, h2, h3)
        gmf_sum = torch.bmm(delta.unsqueeze(1), q_gmf).squeeze(1)  # Σ_l δ_l q^G_l
        grads.update(
            {
                "out_gmf": gmf_sum * p["user_gmf"],
                "out_b": delta.sum(1),
                "user_gmf": gmf_sum * p["out_gmf"],
                "item_gmf": torch.mul(
                    delta.unsqueeze(-1), gmf_dir.unsqueeze(1), out=self.buffer("g_item_gmf", q_gmf, q_gmf.shape)
                ),
            }
        )
        return grads, F.binary_cross_entropy_with_logits(logits, y, weight=a, reduction="none").sum(1)


def _relu_back(grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``grad`` through a ReLU whose output was ``out``, in place (the op autograd's ReLU backward runs)."""
    return torch.ops.aten.threshold_backward.grad_input(grad, out, 0, grad_input=grad)
