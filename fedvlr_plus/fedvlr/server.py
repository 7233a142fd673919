"""Server side of the FedVLR layer: hold ``D`` and the fusion parameters, broadcast the fused views, and turn the
clients' averaged view gradients into a server optimizer step.

Li, Long, Jiang, Zhang, Yang, "Federated Vision-Language-Recommendation with Personalized Fusion", AAAI-26
(arXiv 2410.08478), Algorithm 1: ``D ← D − η Σ_u α_u ∇D_u``, ``γ_j ← γ_j − η Σ_u α_u ∇γ_{j,u}``. Clients upload
``∂J_u/∂F`` for the rows of the fused views they touched; with ``α_u = n_u / Σ n`` the server forms
``ḡ_F = Σ_u α_u ∂J_u/∂F`` and one vector-Jacobian product gives ``Σ_u α_u ∇_{D,γ} J_u`` exactly (the VJP is linear
in the cotangent), so a round costs one fusion forward and backward instead of one per client and step. The step
uses the same :class:`~fedvlr_plus.federation.strategies.fedgrad.FedGradStrategy` rule (SGD by default, Adam as an
option) as every other shared parameter; the backbone's remaining shared parameters are aggregated by the inner
strategy. See docs/method.md.
"""

from __future__ import annotations

import torch

from ..federation.messages import ClientUpdate
from ..federation.strategies.base import Strategy
from ..federation.strategies.fedgrad import FedGradStrategy
from .layer import FUSED


class ServerFusion(Strategy):
    name = "fedvlr-server"
    upload = "grads"

    def __init__(self, layer, inner: Strategy, seed: int):
        if inner.upload != "grads":
            raise ValueError(
                f"the FedVLR layer aggregates gradients (Algorithm 1); strategy {inner.name!r} "
                f"aggregates {inner.upload!r}: use --strategy fedgrad"
            )
        self.layer, self.inner = layer, inner
        self.server = layer.init_server(seed)
        self.server_specs = {s.name: s for s in layer.server_specs()}
        self.opt = FedGradStrategy(inner.server_lr, inner.optimizer_name, item_lr_scale=inner.item_lr_scale)
        self._graph = None
        self.seed, self.steps = int(seed), 0  # steps: server steps taken, which key a round's ID dropout

    def _forward(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The server parameters as graph leaves and the fused views of every item computed from them. The graph
        of the views a round broadcasts is kept for that round's aggregation (the server state does not change in
        between), so a round runs the fusion forward once, not twice."""
        if self._graph is None or self._graph[0] is not self.server:
            with torch.enable_grad():
                params = {k: v.detach().requires_grad_(True) for k, v in self.server.items()}
                self._graph = (self.server, params, self.layer.server_forward(params))
        return self._graph[1], self._graph[2]

    def prepare_shared(self, shared: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Replace the placeholder fused views by the server's real ones (round 0 and after a resume)."""
        return {**shared, FUSED: self._forward()[1].detach()}

    linear = True  # the fused views' gradient and the inner strategy's sums: aggregated from running sums

    def from_sums(self, shared, sums, specs):
        """Algorithm 1's server step from the round's example-weighted sums (added chunk by chunk as uploads
        arrive, :mod:`fedvlr_plus.federation.simulation.upload_stream`, or all at once by
        :meth:`Strategy.aggregate`)."""
        g_fused = sums.row_sums(FUSED)[0].reshape(shared[FUSED].shape)
        rest = {k: v for k, v in shared.items() if k != FUSED}
        out = self.inner.from_sums(rest, sums, specs) if rest else {}
        params, fused = self._forward()
        dropped = self.layer.dropout_rows(self.seed, self.steps)
        if dropped is not None:
            # the clients' gradient of the broadcast views taken back through views whose dropped warm items read a
            # content estimate of their ID row: the fusion learns to rank an item from that estimate (DropoutNet,
            # Volkovs et al., NeurIPS 2017), while every client trains and every evaluation scores the real views
            with torch.enable_grad():
                fused = self.layer.server_forward(params, dropped=dropped)
        grads = torch.autograd.grad(_inner_product(fused, g_fused), list(params.values()), allow_unused=True)
        self._graph = None
        self.steps += 1
        grads = {k: torch.zeros_like(v) if g is None else g for (k, v), g in zip(params.items(), grads)}
        # one aggregated "update" with the exact average gradient; the optimizer rule is shared with fedgrad
        step = ClientUpdate(cid=-1, kind="grads", arrays=grads, num_examples=1)
        self.server = self.opt.aggregate(self.server, [step], self.server_specs)
        out[FUSED] = self._forward()[1].detach()
        return out

    def state_dict(self) -> dict:
        return {
            "server": {k: v.clone() for k, v in self.server.items()},
            "server_opt": self.opt.state_dict(),
            "inner": self.inner.state_dict(),
            "steps": self.steps,
        }

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        self.server = {k: v.clone() for k, v in state["server"].items()}
        self.opt.load_state_dict(state["server_opt"])
        self.inner.load_state_dict(state["inner"])
        self.steps = int(state.get("steps", 0))


def _inner_product(fused: torch.Tensor, g_fused: torch.Tensor) -> torch.Tensor:
    """``<fused, g_fused>``: its gradient is the vector-Jacobian product with ``g_fused``, bit for bit (the sum's
    backward is ones, and ones times ``g_fused`` is exact). Taking the gradient of this scalar instead of passing
    ``g_fused`` as ``grad_outputs`` spares a process the import torch makes to check tensor grad_outputs' shapes
    (torch.fx's symbolic shapes and sympy: 1.6 s of CPU, once per process)."""
    with torch.enable_grad():
        return (fused * g_fused).sum()
