"""FedDTL's item tower scored in factored form on sparse content: the numbers and gradients of the dense form."""

import numpy as np
import pytest
import torch

from fedvlr_plus.alignment.feddtl import method as T
from fedvlr_plus.alignment.feddtl import towers as dtl_towers
from fedvlr_plus.alignment.feddtl.towers import ItemContent, item_vectors


def _multi_hot(n=60, d=200, per_item=3, seed=0) -> torch.Tensor:
    """Unit-norm rows with a few nonzeros each (category / brand ids), as Amazon item attributes are."""
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(n, d)
    x.scatter_(1, torch.randint(0, d, (n, per_item), generator=g), torch.rand(n, per_item, generator=g) + 0.5)
    return torch.nn.functional.normalize(x, dim=-1)


def _params(d, r=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"item_down": torch.randn(r, d, generator=g) / d**0.5, "item_up": torch.randn(d, r, generator=g) * 0.3}


def test_sparse_content_is_kept_sparse_and_dense_content_dense():
    assert ItemContent(_multi_hot()).sparse is not None
    dense = ItemContent(torch.randn(30, 16))
    assert dense.sparse is None and dense.dense is not None


@pytest.mark.parametrize("shape", [(7,), (5, 3)])
def test_factored_scores_equal_the_dense_product(shape):
    content, p = _multi_hot(), _params(200)
    x = torch.randn(*shape, 200)
    want = x @ item_vectors(p, content).T
    got = ItemContent(content).tower(p).scores(x)
    assert got.shape == want.shape == (*shape, 60)
    assert torch.allclose(got, want, atol=1e-5)


def test_factored_scores_have_the_dense_gradients():
    content = _multi_hot()
    grads = []
    for factored in (True, False):
        p = {k: v.clone().requires_grad_() for k, v in _params(200).items()}
        x = torch.randn(9, 200, generator=torch.Generator().manual_seed(1)).requires_grad_()
        s = ItemContent(content).tower(p).scores(x) if factored else x @ item_vectors(p, content).T
        torch.nn.functional.cross_entropy(s / 0.05, torch.arange(9)).backward()
        grads.append([x.grad, p["item_down"].grad, p["item_up"].grad])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_dense_content_gives_the_dense_product_bit_for_bit():
    content, p = torch.randn(40, 32), _params(32)
    x = torch.randn(6, 32)
    assert torch.equal(ItemContent(content).tower(p).scores(x), x @ item_vectors(p, content).T)


def _sparse_task(n_items=80, n_users=30, d=120):
    rng = np.random.default_rng(0)
    content = _multi_hot(n_items, d, per_item=2).numpy()
    histories = [np.sort(rng.choice(64, size=int(rng.integers(3, 9)), replace=False)) for _ in range(n_users)]
    return T.RecTask(
        content=content,
        histories=histories,
        warm_target=rng.integers(0, 64, n_users),
        cold_target=rng.integers(64, n_items, n_users),
        warm_items=np.arange(64),
        cold_items=np.arange(64, n_items),
        user_genre=rng.integers(0, 3, n_users),
    )


@pytest.mark.parametrize("method", ["fedavg_both", "feddtl"])
def test_a_run_on_sparse_content_matches_the_dense_scoring(method, monkeypatch):
    """The whole loop (client SFT / GRPO, the server's alignment, the evaluation) in factored form gives the
    figures of the dense form: the float sums differ in order only."""
    task = _sparse_task()
    cfg = T.DTLConfig(per_user=4, batch_size=16, rl_candidates=10, sigma=0.3, prototypes="example")
    factored = T.train(task, method, cfg, n_clients=3, alpha=1.0, rounds=4, sft_rounds=2, seed=0)
    monkeypatch.setattr(dtl_towers, "SPARSE_DENSITY", -1.0)  # every content dense
    dense = T.train(task, method, cfg, n_clients=3, alpha=1.0, rounds=4, sft_rounds=2, seed=0)
    # Adam's per-coordinate step turns the last-bit differences of the sums into parameter differences of ~1e-4
    for k in dense.params:
        assert torch.allclose(factored.params[k], dense.params[k], atol=1e-3), k
    for kind in ("warm", "cold"):
        for metric in ("hr@10", "ndcg@10"):
            assert factored.test[kind][metric] == pytest.approx(dense.test[kind][metric], abs=1e-6)
