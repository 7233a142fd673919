"""Large populations: the vectorised initial draw, the compact private-state store, --device and bench suite."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _bad_input import assert_user_error, run_cli

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.compiled import LazyKernels
from fedvlr_plus.federation import FedConfig, FederatedRun
from fedvlr_plus.federation.simulation import rng
from fedvlr_plus.federation.state.initial import init_private_block, init_private_states
from fedvlr_plus.federation.state.store import CompactStore, MemoryStore, load_block
from fedvlr_plus.federation.synthetic import synthetic_data


def _one_client_draw(bb, cid: int, seed: int) -> dict:
    """A client's initial private state drawn alone, element by element from the documented key chain
    (seed, TAG_INIT, parameter index, client, element), Box-Muller on ``uniform(..., 0)``/``uniform(..., 1)``."""
    out = {}
    for index, spec in enumerate(bb.all_specs()):
        if spec.shared:
            continue
        if spec.init in ("zeros", "ones"):
            out[spec.name] = torch.full(tuple(spec.shape), 0.0 if spec.init == "zeros" else 1.0)
            continue
        e = np.arange(int(np.prod(spec.shape)))
        u1 = rng.uniform(seed, rng.TAG_INIT, index, cid, e, 0)
        u2 = rng.uniform(seed, rng.TAG_INIT, index, cid, e, 1)
        z = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2) * spec.init_std()
        out[spec.name] = torch.from_numpy(z).to(torch.float32).reshape(tuple(spec.shape))
    return out


@pytest.mark.parametrize(
    "keys",
    [
        (3,),
        (0, 3, 1, np.arange(7)),
        (5, np.arange(4)[:, None], np.arange(40000)[None, :]),
        (np.arange(3)[:, None, None], np.arange(2)[None, :, None], np.arange(9)[None, None]),
    ],
)
def test_fast_normal_is_bitwise_the_two_uniform_box_muller(keys):
    u1, u2 = rng.uniform(*keys, 0), rng.uniform(*keys, 1)
    ref = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)
    got = rng.normal(*keys)
    assert got.shape == ref.shape and np.array_equal(got.view(np.uint64), ref.view(np.uint64))


@pytest.fixture
def numpy_path(monkeypatch):
    """normal_float32's numpy path, whatever this process has drawn before (a population's draw switches to the
    compiled kernels once the process has drawn enough)."""
    monkeypatch.setattr(rng._KERNELS, "module", False)


@pytest.mark.parametrize(
    "keys,scale",
    [
        ((11, 3, 1, np.array([0, 7, 35597, 123456])[:, None], np.arange(12288)[None, :]), 0.01),
        ((0, 3, 0, np.arange(5)[:, None], np.arange(64)[None, :]), 0.3535533905932738),
        ((2, np.arange(3000)), 1.0),
    ],
)
def test_float32_normal_is_bitwise_the_rounded_float64_draw(keys, scale, numpy_path):
    ref = (rng.normal(*keys) * scale).astype(np.float32)
    got = rng.normal_float32(*keys, scale=scale)
    assert got.dtype == np.float32 and np.array_equal(got.view(np.int32), ref.view(np.int32))


def _perturbed_cos(relative: float):
    """torch's cosine off by ``relative`` (in place of its last-place differences from numpy's)."""
    real = torch.cos

    def cos(x, out=None):
        return real(x, out=out).mul_(1.0 + relative)

    return cos


def test_float32_normal_recomputes_the_draws_near_a_rounding_boundary(monkeypatch, numpy_path):
    keys = (4, 3, 1, np.arange(40)[:, None], np.arange(4096)[None, :])
    ref = (rng.normal(*keys) * 0.05).astype(np.float32)
    # a wider window (2^22 units in the last place) and a cosine off by 2^-32 (2^20-2^21 units): hundreds of the
    # 164k draws cross a float32 boundary, and all must be caught and recomputed
    monkeypatch.setattr(rng, "_SLACK_ULPS", 1 << 22)
    monkeypatch.setattr(torch, "cos", _perturbed_cos(2.0**-32))
    assert np.array_equal(rng.normal_float32(*keys, scale=0.05).view(np.int32), ref.view(np.int32))
    monkeypatch.setattr(torch, "cos", _perturbed_cos(2.0**-28))  # outside it: the check cannot see it
    assert not np.array_equal(rng.normal_float32(*keys, scale=0.05).view(np.int32), ref.view(np.int32))


def _compiled_kernels_or_skip(monkeypatch):
    pytest.importorskip("numba", reason="numba is not installed here: normal_float32 uses its numpy path")
    monkeypatch.setattr(rng, "COMPILED_AFTER_DRAWS", 0)
    kernels = rng._compiled_kernels()
    assert kernels is not None
    return kernels


@pytest.mark.parametrize(
    "keys,scale",
    [
        ((11, 3, 1, np.array([0, 7, 35597, 123456])[:, None], np.arange(12288)[None, :]), 0.01),
        ((0, 3, 0, np.arange(5)[:, None], np.arange(64)[None, :]), 0.3535533905932738),
        ((np.arange(3)[:, None], np.array([[2]]), np.arange(40000)[None, :]), 1.0),
        ((7, np.arange(9)[:, None], np.array([[5, 0, 99999]])), 2.5),
    ],
)
def test_compiled_float32_normal_is_bitwise_the_rounded_float64_draw(keys, scale, monkeypatch):
    _compiled_kernels_or_skip(monkeypatch)
    ref = (rng.normal(*keys) * scale).astype(np.float32)
    assert rng._row_layout(keys) is not None
    got = rng.normal_float32(*keys, scale=scale)
    assert got.dtype == np.float32 and np.array_equal(got.view(np.int32), ref.view(np.int32))


def test_compiled_cosine_is_within_a_few_units_in_the_last_place_of_numpys(monkeypatch):
    kernels = _compiled_kernels_or_skip(monkeypatch)
    angles = np.random.default_rng(0).random(200_000) * 2.0 * np.pi
    # the hardest angles: the float64 neighbours of every multiple of π/2 in [0, 2π), where the cosine is nearest 0
    near_zeros = [np.nextafter(k * np.pi / 2, side) for k in range(1, 5) for side in (0.0, 10.0)]
    angles = np.concatenate([angles, near_zeros, [k * np.pi / 2 for k in range(4)]])
    fast = np.empty_like(angles)
    kernels.cos_times(angles, np.full_like(angles, -0.5), 1.0, fast)  # log_y = -1/2: a radius of exactly 1
    exact = np.cos(angles)
    ulps = np.abs(fast - exact) / np.spacing(np.abs(exact))
    assert ulps.max() <= 4, ulps.max()


def test_compiled_float32_normal_recomputes_the_draws_near_a_rounding_boundary(monkeypatch):
    kernels = _compiled_kernels_or_skip(monkeypatch)
    keys = (4, 3, 1, np.arange(40)[:, None], np.arange(4096)[None, :])
    ref = (rng.normal(*keys) * 0.05).astype(np.float32)
    real = kernels.cos_times

    def perturbed(relative):
        def cos_times(angle, radius, scale, out):
            real(angle, radius, scale, out)
            out *= 1.0 + relative

        return cos_times

    # as for the torch cosine: a 2^22-unit window and an error of 2^20-2^21 units are all caught; 2^24 units are not
    monkeypatch.setattr(rng, "_SLACK_ULPS", 1 << 22)
    monkeypatch.setattr(kernels, "cos_times", perturbed(2.0**-32))
    assert np.array_equal(rng.normal_float32(*keys, scale=0.05).view(np.int32), ref.view(np.int32))
    monkeypatch.setattr(kernels, "cos_times", perturbed(2.0**-28))
    assert not np.array_equal(rng.normal_float32(*keys, scale=0.05).view(np.int32), ref.view(np.int32))


def test_float32_normal_switches_to_the_kernels_after_enough_draws(monkeypatch):
    _compiled_kernels_or_skip(monkeypatch)
    monkeypatch.setattr(rng, "COMPILED_AFTER_DRAWS", 500)
    monkeypatch.setattr(rng._KERNELS, "work_done", 0)
    monkeypatch.setattr(LazyKernels, "numba_started", False)  # as in a process that has loaded no kernel yet
    compiled = []
    real = rng._normal_float32_compiled
    monkeypatch.setattr(rng, "_normal_float32_compiled", lambda *a: compiled.append(a[1].size) or real(*a))
    keys = (0, 3, 0, np.arange(5)[:, None], np.arange(64)[None, :])  # 320 draws a call
    first, second = rng.normal_float32(*keys), rng.normal_float32(*keys)
    assert compiled == [5] and np.array_equal(first.view(np.int32), second.view(np.int32))


def test_float32_normal_without_numba_uses_the_numpy_path(monkeypatch):
    monkeypatch.setattr(rng, "COMPILED_AFTER_DRAWS", 0)
    monkeypatch.setattr(rng._KERNELS, "module", False)  # as where numba does not import
    keys = (0, 3, 0, np.arange(5)[:, None], np.arange(64)[None, :])
    assert np.array_equal(
        rng.normal_float32(*keys, scale=0.2).view(np.int32), (rng.normal(*keys) * 0.2).astype(np.float32).view(np.int32)
    )


def test_preparing_the_kernels_draws_nothing_that_counts_and_says_whether_they_exist(monkeypatch):
    _compiled_kernels_or_skip(monkeypatch)
    monkeypatch.setattr(rng._KERNELS, "work_done", 0)
    assert rng.prepare_kernels() is True and rng._KERNELS.work_done == 0  # the switch to kernels is unchanged
    monkeypatch.setattr(rng._KERNELS, "module", False)  # as where numba does not import
    assert rng.prepare_kernels() is False


@pytest.mark.parametrize("backbone", ["fedavg", "fcf", "pfedrec"])
def test_batched_initial_draw_equals_each_client_alone_bitwise(backbone):
    bb = make_backbone(backbone, 30, 8)
    cids = np.array([9, 0, 123456, 4, 9])  # any order, repeats, large ids
    block = init_private_block(bb, cids, seed=11)
    per = init_private_states(bb, cids, seed=11)
    for c, cid in enumerate(cids):
        alone = _one_client_draw(bb, int(cid), 11)
        assert set(alone) == set(block)
        for name, v in alone.items():
            assert torch.equal(block[name][c], v) and torch.equal(per[c][name], v)
    other_seed = init_private_block(bb, cids[:1], seed=12)
    assert any(not torch.equal(other_seed[n][0], block[n][0]) for n in block if block[n].abs().sum() > 0)


def test_compact_store_round_trip_block_and_snapshot():
    store = CompactStore()
    state = {"w": torch.randn(4, 3), "b": torch.tensor([0.5])}
    store.begin_round(1)
    store.save(7, state)
    store.save_block(np.array([2, 3]), {"w": torch.ones(2, 4, 3), "b": torch.zeros(2, 1)})
    store.commit()
    assert len(store) == 3 and 7 in store and 5 not in store and store.load(5) is None
    back = store.load(7)
    assert all(torch.equal(back[k], state[k]) for k in state)
    back["w"] += 1  # load hands out copies
    assert torch.equal(store.load(7)["w"], state["w"])
    got = load_block(store, np.array([3, 5, 7]), ["w"])["w"]
    assert got[1].tolist() == [True, False, True] and torch.equal(got[0][2], state["w"])
    assert not got[0][1].any()
    # the snapshot is compact (one tensor per parameter) and restores exactly, also into a fresh store
    snap = store.snapshot()
    assert snap["format"] == "compact" and snap["params"]["w"]["values"].shape == (3, 4, 3)
    again = CompactStore()
    again.restore(snap)
    assert all(torch.equal(again.load(c)["w"], store.load(c)["w"]) for c in (2, 3, 7))
    # a MemoryStore's {cid: state} snapshot (older checkpoints) restores too
    legacy = MemoryStore()
    legacy.save(1, state)
    again.restore(legacy.snapshot())
    assert len(again) == 1 and torch.equal(again.load(1)["w"], state["w"])


def test_compact_store_hands_out_a_chunk_in_row_order_to_train_in_place():
    """Clients get rows in the order first written, so a chunk written together reads back as the store's own
    rows; training them in place and saving them back copies nothing and stores the trained values."""
    store = CompactStore(capacity=8)
    chunk = np.array([6, 1, 4])
    store.begin_round(1)
    store.save_block(chunk, {"w": torch.arange(6.0).view(3, 2)})
    store.save_block(np.array([0, 2]), {"w": torch.zeros(2, 2)})
    store.commit()
    assert store.view_block(np.array([1, 6, 4]), ["w"]) is None  # not in row order
    assert store.view_block(np.array([6, 1]), ["w", "missing"]) is None  # a parameter it does not hold
    store.begin_round(2)
    view = store.view_block(chunk, ["w"])["w"]
    assert view.data_ptr() == store._cols["w"].data_ptr()  # the table's own rows 0..2
    view += 10.0
    store.save_block(chunk, {"w": view})
    store.commit()
    assert store.load(1)["w"].tolist() == [12.0, 13.0] and store.load(0)["w"].tolist() == [0.0, 0.0]
    # a round that was handed rows to change in place cannot be undone in memory
    store.begin_round(3)
    store.view_block(chunk, ["w"])
    with pytest.raises(RuntimeError, match="checkpoint"):
        store.begin_round(3)
    # the snapshot lists clients in row order, so a restore keeps the layout (and the in-place path)
    snap = store.snapshot()
    assert snap["params"]["w"]["clients"].tolist() == [6, 1, 4, 0, 2]
    again = CompactStore()
    again.restore(snap)
    assert again.view_block(chunk, ["w"]) is not None and torch.equal(again.load(4)["w"], store.load(4)["w"])


def test_compact_store_undoes_new_clients_and_refuses_a_half_overwritten_round():
    store = CompactStore()
    store.begin_round(1)
    store.save(0, {"w": torch.ones(2)})
    store.begin_round(1)  # round 1 never finished: the client it created is gone
    assert 0 not in store
    store.save(0, {"w": torch.ones(2)})
    store.commit()
    store.begin_round(2)
    store.save(0, {"w": torch.zeros(2)})
    with pytest.raises(RuntimeError, match="checkpoint"):
        store.begin_round(2)


@pytest.mark.parametrize("backbone", ["fcf", "fedncf", "fedrap"])
def test_engine_uses_the_compact_store_and_gives_the_numbers_of_a_dict_store(backbone):
    """The compact store hands later rounds' chunks out as its own rows (trained in place, no copy each way);
    the numbers are those of a dict store, whose clients train on copies."""
    data = synthetic_data(40, 150, 10, seed=0)
    cfg = FedConfig(
        rounds=3, local_epochs=2, batch_size=8, negatives=2, dim=8, ks=(5, 10), valid_metric="hr@10", chunk_floats=4096
    )
    a = FederatedRun(data, backbone, cfg, progress=False)
    b = FederatedRun(data, backbone, cfg, progress=False)
    assert isinstance(a.store, CompactStore)
    b.store = b.sim.store = MemoryStore()
    in_place, view_block = [], a.store.view_block

    def counted(cids, names, dtype=None):
        out = view_block(cids, names, dtype)
        in_place.append(out is not None)
        return out

    a.store.view_block = counted
    ra, rb = a.run(), b.run()
    assert sum(in_place) >= 4  # several chunks, in rounds 2 and 3
    assert [h["loss"] for h in ra["history"]] == [h["loss"] for h in rb["history"]]
    assert ra["test"] == rb["test"]
    for cid in a.eligible[:5]:
        sa, sb = a.store.load(int(cid)), b.store.load(int(cid))
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_device_cpu_and_auto_run_and_cuda_without_cuda_is_one_line(tmp_path, monkeypatch):
    data = synthetic_data(30, 60, 8, seed=1)
    cfg = dict(rounds=1, local_epochs=1, batch_size=8, dim=8, ks=(5, 10), valid_metric="hr@10")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = FederatedRun(data, "fedavg", FedConfig(**cfg, device="cpu"), progress=False).run()
    auto = FederatedRun(data, "fedavg", FedConfig(**cfg, device="auto"), progress=False).run()
    assert cpu["test"] == auto["test"]
    res = run_cli(
        "run",
        "synthetic:30x60",
        "--backbone",
        "fedavg",
        "--rounds",
        "1",
        "--device",
        "cuda",
        "--no-progress",
        "--out",
        str(tmp_path / "run"),
    )
    line = assert_user_error(res, "--device cuda", "CUDA is not available")
    assert "--device cpu" in line
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").rglob("*.safetensors"))


def test_bench_suite_quick_writes_json_and_markdown(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDVLR_SHARED_DATA", str(tmp_path / "no-shared-data"))
    out = tmp_path / "suite"
    res = run_cli(
        "bench",
        "suite",
        "--quick",
        "--out",
        str(out),
        "--scale-source",
        "synthetic:40x30",
        "--cases",
        "ku-fedavg,scale-fedavg,scale-fedavg-fedvlr",
    )
    assert res.code == 0, res.err
    doc = json.loads((out / "suite.json").read_text())
    by_id = {c["id"]: c for c in doc["cases"]}
    assert set(by_id) == {"ku-fedavg", "scale-fedavg", "scale-fedavg-fedvlr"}
    assert by_id["ku-fedavg"]["status"] == "skipped" and "not found" in by_id["ku-fedavg"]["reason"]
    assert by_id["scale-fedavg"]["status"] == "skipped" and "--quick" in by_id["scale-fedavg"]["reason"]
    md = (out / "suite.md").read_text()
    assert "KU round, FedAvg alone" in md and "skipped" in md
    assert doc["kernels"] is None and "kernels" not in md  # no case ran a population's draw


def test_bench_suite_measures_tiny_cases_each_in_its_own_process(tmp_path):
    out = tmp_path / "suite"
    res = run_cli(
        "bench",
        "suite",
        "--out",
        str(out),
        "--scale-source",
        "synthetic:40x30",
        "--cases",
        "scale-fedavg,scale-fedavg-fedvlr-memory",
    )
    assert res.code == 0, res.err
    doc = json.loads((out / "suite.json").read_text())
    by_id = {c["id"]: c for c in doc["cases"]}
    case, layer = by_id["scale-fedavg"], by_id["scale-fedavg-fedvlr-memory"]
    # the population's draw kernels are prepared (compiled once per installation) before the FedVLR case
    assert doc["kernels"]["available"] is True and doc["kernels"]["cpu_s"] > 0
    assert case["status"] == "ok" and case["clients"] == 40 and len(case["batched"]["rounds"]) == 3
    # the system part of each round's CPU time (the kernel's share: first touches of fresh memory, file writes)
    assert all(0 <= r["sys_s"] <= r["cpu_s"] + 0.01 for r in case["batched"]["rounds"])
    assert case["batched"]["round1_sys_s"] == case["batched"]["rounds"][0]["sys_s"]
    assert case["peak_rss_mb"] > 0 and case["process_cpu_s"] > 0
    # the large FedVLR case beside the default store: its states forced into memory, and its store recorded
    assert layer["status"] == "ok" and layer["private_store"] == "memory" and len(layer["batched"]["rounds"]) == 2
    md = (out / "suite.md").read_text()
    assert "synthetic:40x30, FedAvg alone" in md and "private states in memory" in md
    assert "were prepared before the cases (compiled or loaded" in md


def test_bench_suite_keeps_each_case_as_it_goes_and_stops_a_case_past_its_timeout(tmp_path, monkeypatch):
    from fedvlr_plus.bench import suite

    # a case past --case-timeout is stopped and recorded with the end of its stderr, and the suite goes on
    slow = suite.run_case({"source": "synthetic:40x30", "backbone": "fedavg", "rounds": 1}, timeout=0.01)
    assert slow["status"] == "failed" and "--case-timeout 0.01 s" in slow["reason"]
    assert isinstance(slow["stderr_tail"], list)
    # suite.json is rewritten after every case: a suite stopped during its second case keeps the first
    calls = []

    def fake_run_case(case, timeout=None):
        calls.append((case["id"], case["sequential_rounds"], case.get("device"), timeout))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return {"status": "failed", "reason": "boom", "stderr_tail": ["Traceback", "boom"]}

    monkeypatch.setattr(suite, "run_case", fake_run_case)
    with pytest.raises(KeyboardInterrupt):
        suite.run_suite(
            tmp_path,
            shared_data=tmp_path / "none",
            only={"scale-fedavg", "ml100k-fedavg"},
            scale_source="synthetic:40x30",
            case_timeout=7,
            sequential=False,
            device="cpu",
        )
    assert calls == [("ml100k-fedavg", 0, "cpu", 7), ("scale-fedavg", 0, "cpu", 7)]
    doc = json.loads((tmp_path / "suite.json").read_text())
    assert [c["id"] for c in doc["cases"]] == ["ml100k-fedavg"] and doc["sequential"] is False
    assert doc["cases"][0]["stderr_tail"] == ["Traceback", "boom"]
    assert "failed: boom" in (tmp_path / "suite.md").read_text()


def test_bench_suite_markdown_names_the_gpu_and_its_memory():
    from fedvlr_plus.bench.suite import markdown

    row = {
        "id": "x",
        "title": "KU round",
        "status": "ok",
        "peak_rss_mb": 1024.0,
        "peak_gpu_mb": 512.0,
        "batched": {"round1_cpu_s": 0.5, "later_cpu_s": 0.1, "later_wall_s": 0.1},
    }
    md = markdown({"device": "cuda", "accelerator": "NVIDIA H200", "cases": [row]})
    assert "1.00 GB (GPU 0.50 GB)" in md and "on the NVIDIA H200 (`--device cuda`)" in md
    md = markdown({"device": "auto", "accelerator": None, "cases": []})
    assert "`--device auto` found no CUDA device: every case ran on the CPU." in md


def test_the_gpu_check_example_refuses_in_one_line_without_cuda(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the script would run the whole check")
    script = Path(__file__).resolve().parents[1] / "examples" / "gpu_check.sh"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    res = subprocess.run(["bash", str(script), str(tmp_path / "out")], capture_output=True, text=True, env=env)
    assert res.returncode == 1 and not (tmp_path / "out").exists()
    assert res.stderr.strip().splitlines() == [
        f"gpu_check.sh: no CUDA device is visible to torch {torch.__version__}; nothing to check here"
    ]


def test_bench_suite_times_the_real_toys_population_where_its_folder_is(tmp_path):
    from fedvlr_plus.bench import suite

    doc = suite.run_suite(tmp_path, shared_data=tmp_path / "none", only={"toys-fedavg-fedvlr"}, progress=lambda s: 0)
    (case,) = doc["cases"]
    assert case["status"] == "skipped" and "amazon2014-toys not found" in case["reason"]
    spec = {c["id"]: c for c in suite.cases(tmp_path)}["toys-fedavg-fedvlr"]
    assert spec["fusion"] and spec["evaluate"] and spec["big"] and spec["source"].endswith("amazon2014-toys")


def test_a_store_asked_for_page_locked_tables_falls_back_to_pageable_ones_where_they_are_refused():
    # on a machine without a CUDA driver torch refuses page-locked memory: the store keeps working, unpinned
    if torch.cuda.is_available():
        pytest.skip("page-locked memory is granted here")
    store = CompactStore(capacity=4, pin_memory=True)
    store.save_block(np.array([2, 0]), {"w": torch.arange(6.0).reshape(2, 3)})
    assert not store._cols["w"].is_pinned()
    assert torch.equal(store.load(0)["w"], torch.tensor([3.0, 4.0, 5.0]))


def test_bench_case_reports_what_the_router_costs_a_device():
    """The router's cost in the bench suite: its private state matches the MLP's size, and it adds no byte to
    the upload (the fixed uniform mixture of the same views uploads exactly as much)."""
    from fedvlr_plus.bench.case import measure

    def sizes(fusion):
        case = {
            "source": "synthetic:40x30",
            "backbone": "fedavg",
            "rounds": 1,
            **({"fusion": fusion} if fusion else {}),
        }
        out = measure(case)
        return out["private_bytes_per_client"], out["upload_bytes_per_client"]

    alone, summed = sizes(None), sizes({"mode": "sum"})
    routed, uniform = sizes({"mode": "fedvlr", "router_over": "views"}), sizes({"mode": "uniform"})
    j, d, hidden = 2, 64, 64  # two synthetic views (text, image), the router's input J*d, its hidden layer
    router_bytes = (j * d * hidden + hidden + hidden * j + j) * 4
    assert summed[0] == alone[0] == uniform[0]
    assert routed[0] - summed[0] == router_bytes
    assert routed[1] == uniform[1] > summed[1] > 0
