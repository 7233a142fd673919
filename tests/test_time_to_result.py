"""Whole runs cost what their rounds cost: test evaluated once at the end from the selected round's kept model,
the sampled negatives drawn once, seeds and recipes side by side in worker processes. Each gives the figures of
the plain path exactly."""

from __future__ import annotations

import numpy as np
import pytest

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.evaluation import protocols
from fedvlr_plus.federation import FedConfig, run_federated
from fedvlr_plus.federation.engine import FederatedRun
from fedvlr_plus.federation.synthetic import synthetic_data
from fedvlr_plus.fedvlr import FedVLROptions, build_fedvlr


def _data():
    data = synthetic_data(60, 90, 10.0, groups=4, seed=3, name="tiny")
    data.features = {"text": np.random.default_rng(0).standard_normal((data.n_items, 6)).astype(np.float32)}
    return data


def _test_figures(res: dict) -> dict:
    return {k: v for k, v in res.items() if k.startswith("test") and not k.endswith("_ci")}


def _cfg(**kw) -> FedConfig:
    base = dict(rounds=20, dim=8, patience=2, valid_metric="ndcg@10", jobs=1)
    base.update(kw)
    return FedConfig(**base)


@pytest.mark.parametrize("backbone", ["fedavg", "fedncf", "fedvlr"])
@pytest.mark.parametrize("store", ["memory", "file"])
def test_test_once_at_the_end_gives_the_figures_of_test_at_each_improvement(tmp_path, backbone, store):
    data = _data()

    def model():
        if backbone == "fedvlr":
            return build_fedvlr(data, make_backbone("fedavg", data.n_items, 8), FedVLROptions(progress=False))
        return backbone

    cfg = _cfg(private_store=store)
    deferred = FederatedRun(data, model(), cfg, progress=False)
    res_deferred = deferred.run()
    # a run folder makes the engine evaluate test at the round (every checkpoint must hold its figures)
    res_now = run_federated(data, model(), cfg, out_dir=tmp_path / "now", progress=False)
    assert res_deferred["selected_round"] == res_now["selected_round"]
    assert deferred.best["round"] < deferred.round, "the check needs a run that trains past its selected round"
    assert _test_figures(res_deferred) == _test_figures(res_now)
    assert res_deferred["valid"] == res_now["valid"]


def test_the_run_ends_in_its_last_round_after_the_deferred_test():
    data = _data()
    run = FederatedRun(data, "fedavg", _cfg(), progress=False)
    run.run()
    assert run.best["round"] < run.round
    again = FederatedRun(data, "fedavg", _cfg(rounds=run.round, patience=99), progress=False)
    again.run()
    for name, tensor in run.shared.items():
        assert np.array_equal(tensor.numpy(), again.shared[name].numpy()), name


def test_sampled_test_only_where_asked():
    data = synthetic_data(40, 160, 8.0, groups=4, seed=3, name="room for 99 negatives")
    full = run_federated(data, "fedavg", _cfg(rounds=2), progress=False)
    both = run_federated(data, "fedavg", _cfg(rounds=2, test_both_protocols=True), progress=False)
    assert not any(k.startswith("test_sampled") for k in full)
    assert any(k.startswith("test_sampled") for k in both)
    assert {k: v for k, v in _test_figures(both).items() if not k.startswith("test_sampled")} == _test_figures(full)


def test_negatives_are_drawn_once_and_never_stale():
    data = _data()
    users = np.arange(data.n_users)
    first = protocols.sample_negatives(data, users, 20, seed=5)
    assert np.array_equal(
        first, protocols._draw_negatives(data, data.matrix(["train", "valid", "test", "unsplit"]), users, 20, 5)
    )
    first[0, 0] = -1  # a caller may write into its copy
    assert protocols.sample_negatives(data, users, 20, seed=5)[0, 0] != -1
    assert not np.array_equal(protocols.sample_negatives(data, users, 20, seed=6), first)
    edited = synthetic_data(60, 90, 10.0, groups=4, seed=4, name="tiny")
    assert not np.array_equal(
        protocols.sample_negatives(edited, users, 20, seed=5), protocols.sample_negatives(data, users, 20, seed=5)
    )


@pytest.mark.slow
def test_seeds_side_by_side_give_the_sequential_figures():
    data = _data()
    one_by_one = run_federated(data, "fedavg", _cfg(rounds=3, seeds=2, jobs=1), progress=False)
    side_by_side = run_federated(data, "fedavg", _cfg(rounds=3, seeds=2, jobs=2), progress=False)
    for key in ("selected_round", "valid", "per_seed"):
        assert _strip_timing(one_by_one[key]) == _strip_timing(side_by_side[key]), key
    assert _test_figures(one_by_one) == _test_figures(side_by_side)


def _strip_timing(x):
    """Without timings and the worker count, which the config records but which changes no figure."""
    if isinstance(x, dict):
        return {k: _strip_timing(v) for k, v in x.items() if "seconds" not in k and k != "jobs"}
    if isinstance(x, list):
        return [_strip_timing(v) for v in x]
    return x


def test_calls_inside_shared_workers_reuse_one_pool_of_worker_processes():
    """A tuned run's rungs and then its seeds start their workers once (each start imports torch)."""
    from fedvlr_plus.federation.runs import parallel

    with parallel.shared_workers():
        assert parallel.map_jobs(abs, [-1, -2, -3], 2) == [1, 2, 3]
        pool = parallel._SHARED[1]
        workers = set(pool._processes)
        with parallel.shared_workers():  # a nested block keeps the outer pool
            assert parallel.map_jobs(abs, [-4, -5], 2) == [4, 5]
        assert parallel._SHARED[1] is pool and set(pool._processes) == workers and len(workers) == 2
    assert not parallel._SHARED  # closed with the block
    assert parallel.map_jobs(abs, [-6, -7], 2) == [6, 7]  # outside a block: a pool of its own, closed after
    assert not parallel._SHARED


def test_worker_counts_keep_every_core_busy_to_the_last_wave(monkeypatch):
    from fedvlr_plus.federation.runs.parallel import balanced_workers, worker_count

    assert [balanced_workers(n, 2) for n in range(1, 10)] == [1, 2, 3, 2, 3, 2, 4, 2, 3]
    assert balanced_workers(3, 16) == 3 and balanced_workers(17, 16) == 17 and balanced_workers(5, 1) == 1
    for n in range(1, 40):  # never more than twice the cores, and no wave but a full one leaves a core idle
        for cores in (1, 2, 3, 4, 8):
            w = balanced_workers(n, cores)
            assert 1 <= w <= max(n, 1) and w <= 2 * cores
            assert n <= cores or w == cores or n % w == 0 or n % w >= cores
    monkeypatch.delenv("FEDVLR_JOBS", raising=False)
    assert worker_count(2, 5) == 2 and worker_count(9, 3) == 3  # a count the user gave, at most one per job
    monkeypatch.setenv("FEDVLR_JOBS", "2")
    assert worker_count(None, 5) == 2


def test_jobs_in_worker_processes_announce_each_end_on_stderr(capfd):
    """Seeds and recipes trained side by side show their progress: one line as each ends (the workers' own bars
    are off), and a failed job is named before its error is raised."""
    from fedvlr_plus.federation.runs.parallel import map_jobs

    assert map_jobs(abs, [-1, -2, -3], 2, names=["a", "b", "c"], what="demo") == [1, 2, 3]
    lines = capfd.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(ln.startswith("demo: ") for ln in lines)
    assert sorted(ln.split()[1] for ln in lines) == ["a", "b", "c"]
    assert [ln.split("(")[1].split(",")[0] for ln in lines] == ["1/3", "2/3", "3/3"]
    with pytest.raises(ValueError, match="invalid literal"):
        map_jobs(int, ["1", "x"], 2, names=["one", "ex"], what="demo")
    err = capfd.readouterr().err
    assert "demo: ex failed" in err and "demo: one done" in err
    assert map_jobs(abs, [-4], 2, names=["d"], what="demo") == [4]  # one job: in this process, no line
    assert capfd.readouterr().err == ""
