"""Secure aggregation (Flower's SecAgg+) of the Flower path, without processes.

- the secure sum's arithmetic: dense node vectors, their example-weighted mean, and the one upload that stands for
  it give every summable strategy the aggregate of the individual uploads;
- the whole round in-process through Flower's own ``SecAggPlusWorkflow`` and ``secaggplus_mod`` (ClientApps
  called directly): the run ends with the numbers of the run without secure aggregation and the simulator's
  shared state, our strategy is only ever handed the aggregate, and the server only ever receives masked vectors.

The same over real processes, with TLS and node authentication, is in ``tests/test_flower_security.py``.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedvlr-plus[flower]')")

from test_flower import LoopbackGrid, base_config  # noqa: E402

from fedvlr_plus.federation.messages import ClientUpdate  # noqa: E402
from fedvlr_plus.federation.privacy import secure_sum as ss  # noqa: E402
from fedvlr_plus.federation.strategies.base import make_strategy  # noqa: E402
from fedvlr_plus.flower import app as fl  # noqa: E402

N_ITEMS, DIM = 30, 4
SPECS = {
    "items": SimpleNamespace(item_table=True, scaled=True),
    "bias": SimpleNamespace(item_table=False, scaled=False),
}


def _uploads(kind: str, seed: int = 0) -> list[ClientUpdate]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for cid in range(9):
        rows = torch.randperm(N_ITEMS, generator=g)[: 3 + cid].sort().values
        out.append(
            ClientUpdate(
                cid=cid,
                kind=kind,
                num_examples=1 + 2 * cid,
                metrics={"loss": 0.5 + 0.01 * cid},
                arrays={
                    "items": 0.1 * torch.randn(len(rows), DIM, generator=g),
                    "bias": 0.1 * torch.randn(3, generator=g),
                },
                rows={"items": rows},
            )
        )
    return out


def _secure_mean(updates, shared, nodes: int = 3):
    """What SecAgg+ reveals, without its quantisation: the N_i-weighted mean of the node vectors."""
    parts = ss.layout({k: tuple(v.shape) for k, v in shared.items()}, {"items"})
    vecs = [ss.node_vector(list(chunk), parts, 1.0) for chunk in np.array_split(np.array(updates, dtype=object), nodes)]
    n = sum(ni for _, ni in vecs)
    mean = [sum(ni * v[j] for v, ni in vecs) / n for j in range(len(parts))]
    return ss.split_aggregate(mean, parts), n


@pytest.mark.parametrize("name,kind", [("fedavg", "params"), ("sparse-avg", "params"), ("fedgrad", "grads")])
def test_the_aggregate_upload_gives_the_strategy_what_the_individual_uploads_give(name, kind):
    shared = {"items": torch.randn(N_ITEMS, DIM), "bias": torch.zeros(3)}
    updates = _uploads(kind)
    (means, weights, loss), n = _secure_mean(updates, shared)
    direct = make_strategy(name, server_lr=0.5).aggregate(shared, updates, SPECS)
    one = ss.aggregate_as_update(name, shared, means, weights, n, kind)
    assert one.cid == -1 and one.num_examples == 1
    secure = make_strategy(name, server_lr=0.5).aggregate(shared, [one], SPECS)
    for k in shared:
        assert torch.allclose(secure[k], direct[k], atol=1e-6), k
    n_u = np.array([u.num_examples for u in updates], float)
    assert loss == pytest.approx(float(np.dot(n_u, [u.metrics["loss"] for u in updates]) / n_u.sum()))
    untouched = torch.ones(N_ITEMS, dtype=torch.bool)
    untouched[torch.cat([u.rows["items"] for u in updates])] = False
    assert untouched.any() and torch.equal(secure["items"][untouched], direct["items"][untouched])


def test_what_a_secure_sum_cannot_do_is_refused():
    shared = {"items": torch.zeros(N_ITEMS, DIM), "bias": torch.zeros(3)}
    (means, weights, _), n = _secure_mean(_uploads("params"), shared)
    with pytest.raises(ValueError, match="'median' cannot run on a secure sum"):
        ss.aggregate_as_update("median", shared, means, weights, n, "params")
    big = _uploads("params")
    big[0].arrays["bias"][0] = 3.0
    parts = ss.layout({k: tuple(v.shape) for k, v in shared.items()}, {"items"})
    with pytest.raises(ValueError, match="exceeds the clipping range 1; raise secagg-clipping-range"):
        ss.node_vector(big[:1], parts, 1.0)
    with pytest.raises(ValueError, match="min-train-nodes >= 2"):
        fl.Settings.from_run_config({"data": "ml-100k", "secagg": 1, "min-train-nodes": 1})


def test_quantisation_is_the_finest_that_cannot_wrap_around():
    assert [ss.quantization_range(k) for k in (2, 3, 4, 5, 1000)] == [1 << 30, 1 << 30, 1 << 29, 1 << 29, 1 << 22]
    for k in (2, 3, 7, 1000):
        assert k * ss.quantization_range(k) < 1 << 32


class AppGrid(LoopbackGrid):
    """Messages go through the ClientApp itself (its mods included), one copy per node as on a network (SecAgg+'s
    mod consumes its configuration record)."""

    app = fl.make_client_app()

    def send_and_receive(self, messages, *, timeout=None):
        return [self.app(copy.deepcopy(m), self.contexts[m.metadata.dst_node_id]) for m in messages]


def run_app_loopback(cfg: dict, tmp: Path, n_nodes: int = 3, on_aggregate=None) -> dict:
    from flwr.app import Context, RecordDict
    from flwr.serverapp import Grid

    grid = type(
        "AppLoopback",
        (AppGrid, Grid),
        {k: (lambda *a, **k: None) for k in ("set_run", "run", "create_message", "push_messages", "pull_messages")},
    )(cfg, n_nodes, tmp)
    # these grids answer send_and_receive only (no push/pull): Flower's own wait, not reply-poll-interval's
    cfg = {**cfg, "reply-poll-interval": 0}
    return fl.server_main(grid, Context(run_id=7, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))


def simulator_shared_after(cfg: dict, rounds: int) -> dict:
    from fedvlr_plus.federation.engine import FederatedRun

    s = fl.Settings.from_run_config(cfg)
    data = fl.load_data(s.data, s.max_users)
    run = FederatedRun(data, fl.build_backbone(data, s), replace(s.cfg, simulator="sequential"), progress=False)
    for _ in range(rounds):
        run.run_round()
    return run.shared


@pytest.mark.parametrize(
    "extra",
    [
        {},  # FedAvg-MF + the FedVLR layer (gradient aggregation + server fusion)
        {"fusion": "none", "strategy": "sparse-avg", "backbone": "fedncf"},
        {"fusion": "none", "strategy": "fedavg", "backbone": "fedavg"},
    ],
)
def test_secure_rounds_in_process_equal_the_plain_run(tmp_path, monkeypatch, extra):
    from fedvlr_plus.federation.strategies.base import Strategy

    seen = []
    real = Strategy.aggregate

    def spy(self, shared, updates, specs):
        seen.append([u.cid for u in updates])
        return real(self, shared, updates, specs)

    plain_cfg = base_config(tmp_path / "plain", **extra)
    plain = run_app_loopback(plain_cfg, tmp_path / "plain")
    monkeypatch.setattr(Strategy, "aggregate", spy)
    cfg = base_config(tmp_path / "secure", **{"secagg": 1, **extra})
    res = run_app_loopback(cfg, tmp_path / "secure")

    # our strategy only ever gets the round's aggregate (the FedVLR server step adds its own, also cid -1)
    assert len(seen) >= 2 and all(cids == [-1] for cids in seen), seen
    assert res["secure_aggregation"]["rule"] in ("fedgrad", "sparse-avg", "fedavg")
    assert "secure_aggregation" not in plain
    assert res["selected_round"] == plain["selected_round"]
    for part in ("valid", "test", "test_warm", "test_cold"):
        assert res[part] == pytest.approx(plain[part], abs=1e-4), part
    assert [h["loss"] for h in res["history"]] == pytest.approx([h["loss"] for h in plain["history"]], abs=1e-5)
    assert [h["clients"] for h in res["history"]] == [24, 24] and [h["nodes"] for h in res["history"]] == [3, 3]
    audit = Path(cfg["audit-dir"])
    after_one = np.load(audit / "round001-shared.npz")
    sim = simulator_shared_after(plain_cfg, 1)
    for k, v in sim.items():
        assert np.abs(after_one[k] - v.numpy()).max() < 5e-5, k  # SecAgg+ quantises: not bit-exact
    assert_only_masked_vectors(audit, rounds=2, nodes=3)


def assert_only_masked_vectors(audit: Path, rounds: int, nodes: int) -> dict:
    """Every training reply the ServerApp received holds no array; the collect stage's reply holds a masked
    vector: int64 values spread over the whole modulus, not the small quantised values of a plain upload."""
    folders = sorted(audit.glob("round*-train-secagg"))
    assert len(folders) == rounds and not list(audit.glob("round*-train/"))
    sizes = {}
    for folder in folders:
        stages = sorted(p.stem for p in folder.glob("*.json"))
        assert len(stages) == 4 * nodes, stages  # setup, share keys, collect, unmask: one reply per node
        for meta_file in folder.glob("*.json"):
            meta = json.loads(meta_file.read_text())
            assert "error" not in meta, meta
            arrays = np.load(meta_file.with_suffix(".npz"))
            assert all(k.startswith("masked::") for k in arrays.files), arrays.files  # no plain array
            if not meta_file.stem.startswith("collect"):
                assert not arrays.files
                continue
            vec = np.concatenate([arrays[k].ravel() for k in arrays.files])
            assert vec.dtype == np.int64 and vec.min() >= 0 and vec.max() < 1 << 32
            # a plain quantised value is at most T <= 2**30; masks are uniform on [0, 2**32)
            assert (vec > 1 << 30).mean() > 0.6 and abs(vec.mean() / 2**31 - 1) < 0.05
            sizes[meta_file.stem] = meta["masked_bytes"]
    return sizes


def test_a_robust_strategy_is_refused_before_any_round(tmp_path):
    cfg = base_config(
        tmp_path, **{"secagg": 1, "fusion": "none", "backbone": "fedncf", "strategy": "median", "max-users": 6}
    )
    with pytest.raises(ValueError, match="strategy 'median' needs every upload"):
        run_app_loopback(cfg, tmp_path)
    assert not (tmp_path / "audit").exists()  # nothing was sent
    assert "median" in json.loads((tmp_path / "result.error.json").read_text())["error"]


#: what `flwr run --format json` prints for a submitted run
SUBMITTED = '{"success": true, "run-id": 1}\n'


def test_flower_run_secagg_flag_sets_the_run_config(monkeypatch, capsys):
    import subprocess

    import tomllib

    from fedvlr_plus.cli import flower as cli_flower
    from fedvlr_plus.cli import main

    calls = []
    monkeypatch.setattr(
        cli_flower.subprocess,
        "run",
        lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0, stdout=SUBMITTED, stderr=""),
    )
    assert (
        main(
            [
                "flower",
                "run",
                "examples/flower_app",
                "--superlink",
                "127.0.0.1:1",
                "--insecure",
                "--secagg",
                "--config",
                "secagg-num-shares=3",
            ]
        )
        == 0
    )
    assert calls[0][-1] == "secagg-num-shares=3 secagg=1"
    # flwr run only overrides keys the app declares: the example app declares every secagg key
    conf = tomllib.loads(
        (Path(__file__).resolve().parents[1] / "examples" / "flower_app" / "pyproject.toml").read_text()
    )["tool"]["flwr"]["app"]["config"]
    assert {k for k in fl.DEPLOY_KEYS if k.startswith("secagg")} <= set(conf)
    assert fl.Settings.from_run_config({**conf, "secagg": 1}).secagg == 1


def test_a_clientapp_process_imports_neither_torch_nor_the_trainer_before_it_trains():
    """Flower starts a ClientApp process per message, and three of a secure round's four stages never reach the
    training handler: loading the example app must not pay for torch, pandas or the engine (seconds a process)."""
    import subprocess
    import sys

    from _flower_harness import APP_DIR

    heavy = ("torch", "pandas", "scipy", "fedvlr_plus.federation.engine")
    code = (
        f"import sys; sys.path.insert(0, {str(APP_DIR)!r}); import fedvlr_flower.client_app as c; "
        f"assert c.app is not None; print([m for m in {heavy!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
