"""One seed, one model: gathers whose backward adds with atomic adds across threads are kept out of training.

PyTorch's CPU backward of ``table[index]`` adds a gradient of 32,768 elements or more with atomic adds across
threads, in whatever order the threads reach them. The FedVLR layer's cold-item rule gathered that way, so a
cold-start study of one seed ended in a different model on every run.
"""

import contextlib

import numpy as np
import pytest
import torch

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.adapters.base import take_rows
from fedvlr_plus.alignment.mor.policy import ItemResidualPolicy
from fedvlr_plus.federation.synthetic import synthetic_data
from fedvlr_plus.fedvlr import ColdItemRule, FusionLayer
from fedvlr_plus.nn import gather_entries, gather_rows


@contextlib.contextmanager
def two_threads():
    """The atomic adds only run side by side with more than one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def distinct_grads(make_loss, param: torch.Tensor, runs: int = 12) -> int:
    """How many different gradients of ``make_loss`` at ``param`` twelve runs give."""
    seen = set()
    for _ in range(runs):
        p = param.detach().clone().requires_grad_()
        (grad,) = torch.autograd.grad(make_loss(p), [p])
        seen.add(grad.numpy().tobytes())
    return len(seen)


def test_gather_rows_and_entries_equal_indexing_forward():
    g = torch.Generator().manual_seed(0)
    table, index = torch.randn(50, 3, generator=g), torch.randint(0, 50, (7, 4), generator=g)
    assert torch.equal(gather_rows(table, index), table[index])
    rows, cols = torch.randint(0, 50, (5, 6, 1), generator=g), torch.randint(0, 3, (5, 1, 2), generator=g)
    assert torch.equal(gather_entries(table, rows, cols), table[rows, cols])
    stack, clients = torch.randn(4, 9, 3, generator=g), torch.arange(4).unsqueeze(1)  # each client's own rows
    items = torch.randint(0, 9, (4, 5), generator=g)
    assert torch.equal(gather_entries(stack, clients, items), stack[clients, items])


def test_gather_rows_backward_is_the_same_on_every_run():
    g = torch.Generator().manual_seed(0)
    table, index = torch.randn(400, 64, generator=g), torch.randint(0, 400, (120, 10), generator=g)
    cotangent = torch.randn(120, 64, generator=g)
    with two_threads():
        assert distinct_grads(lambda t: (gather_rows(t, index).mean(1) * cotangent).sum(), table) == 1


def test_a_backbones_item_rows_give_one_gradient():
    """A sequential client or a Flower node gathers a step's item rows from the full table; a step of 2,048
    positives with one negative each is past the size where the atomic adds start."""
    g = torch.Generator().manual_seed(0)
    table, items = torch.randn(1682, 64, generator=g), torch.randint(0, 1682, (4096,), generator=g)
    cotangent = torch.randn(4096, 64, generator=g)
    with two_threads():
        assert distinct_grads(lambda t: (take_rows(t, items) * cotangent).sum(), table) == 1


def test_fedvlr_layer_with_cold_items_gives_one_server_gradient():
    data = synthetic_data(40, 150, 12.0, groups=4, seed=0)
    g = np.random.default_rng(0)
    views = {"text": g.standard_normal((150, 16)), "image": g.standard_normal((150, 12))}
    cold = np.zeros(150, bool)
    cold[:60] = True  # 60 cold items x 10 neighbours x 64 dims: the size where the atomic adds start
    layer = FusionLayer(make_backbone("fedavg", data.n_items, 64), views, cold_items=ColdItemRule(cold, 10))
    server = layer.init_server(0)
    cotangent = torch.randn(layer.server_forward(server).shape, generator=torch.Generator().manual_seed(1))

    def loss(item_emb):
        return (layer.server_forward({**server, "item_emb": item_emb}) * cotangent).sum()

    with two_threads():
        assert distinct_grads(loss, server["item_emb"]) == 1


def test_mor_item_policy_gradient_is_the_same_on_every_run():
    g = torch.Generator().manual_seed(0)
    policy = ItemResidualPolicy(4, 3, n_items=200)
    hist, cand = torch.randint(0, 200, (64, 20), generator=g), torch.randint(0, 200, (64, 40), generator=g)
    weight, ref = torch.rand(64, 20, generator=g), torch.zeros(64, 40)
    x, feats = torch.randn(64, 4, generator=g), torch.randn(64, 40, 3, generator=g)
    cotangent = torch.randn(64, 40, generator=g)

    def loss(a):
        logits = torch.func.functional_call(policy, {"A": a}, (ref, x, feats), {"ids": (hist, weight, cand)})
        return (logits * cotangent).sum()

    with two_threads():
        assert distinct_grads(loss, policy.A.detach()) == 1


class _IndexedGathers(torch.overrides.TorchFunctionMode):
    """Records where the package gathers rows of a tensor that needs a gradient by integer tensor indexing."""

    def __init__(self):
        super().__init__()
        self.sites = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__getitem__ and torch.is_grad_enabled() and args[0].requires_grad:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            if any(torch.is_tensor(i) and i.dim() and i.dtype != torch.bool for i in index):
                self.sites.add(_package_frame())
        return func(*args, **(kwargs or {}))


def _package_frame() -> str:
    import traceback

    frames = [f for f in traceback.extract_stack() if "/fedvlr_plus/" in f.filename or "/adapters/" in f.filename]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "outside the package"


@pytest.mark.parametrize("backbone", ["fedavg", "fedncf", "pfedrec", "fedrap", "fcf"])
@pytest.mark.parametrize("simulator", ["batched", "sequential"])
@pytest.mark.parametrize("wrapped", [True, False], ids=["layer", "alone"])
def test_a_round_with_every_option_gathers_no_rows_by_indexing(backbone, simulator, wrapped):
    """The backbone alone, and under the layer with every option that gathers rows in training (cold items, ID
    dropout, the residual path, content preference): a round trains through ``index_select`` gathers only, in the
    batched simulator and in a client alone."""
    from fedvlr_plus.federation.config import FedConfig
    from fedvlr_plus.federation.engine import FederatedRun

    data = synthetic_data(30, 80, 10.0, groups=4, seed=0)
    g = np.random.default_rng(0)
    views = {"text": g.standard_normal((80, 6)), "image": g.standard_normal((80, 5))}
    cold = np.zeros(80, bool)
    cold[:10] = True
    model = make_backbone(backbone, data.n_items, 8)
    if wrapped:
        model = FusionLayer(
            model,
            views,
            router_hidden=8,
            cold_items=ColdItemRule(cold, 3),
            residual=True,
            id_dropout=0.3,
            content_preference=True,
        )
    cfg = FedConfig(rounds=1, local_epochs=1, batch_size=8, dim=8, lr=0.1, server_lr=0.5, seed=0, simulator=simulator)
    run = FederatedRun(data, model, cfg, progress=False)
    with _IndexedGathers() as seen:
        run.run_round()
    assert not seen.sites, sorted(seen.sites)
