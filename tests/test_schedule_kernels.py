"""A round's schedule with its compiled kernels against numpy: the touched rows (a counting sort against
numpy.unique) and the negatives (drawn, placed and looked up in one pass)."""

from __future__ import annotations

import numpy as np
import pytest
from _kernels import compiled_or_skip
from test_simulator import tiny_csr

from fedvlr_plus.compiled import LOADED_DISCOUNT, LazyKernels
from fedvlr_plus.federation.simulation import schedule
from fedvlr_plus.federation.simulation.schedule import build_schedule


@pytest.fixture
def kernels():
    return compiled_or_skip(schedule._KERNELS)


@pytest.mark.parametrize("c_n,n_items,n", [(1, 7, 30), (13, 5000, 2000), (300, 20000, 40000), (4, 9, 0)])
def test_counting_sort_gives_numpy_uniques_arrays(kernels, c_n, n_items, n):
    g = np.random.default_rng(c_n)
    client = g.integers(0, c_n, n).astype(np.int64)
    item = np.minimum(g.zipf(1.3, n), n_items) - 1  # many repeats of a few items, as positives over epochs
    want_keys, want_rank = np.unique(client * n_items + item, return_inverse=True)
    keys, rank = kernels.touched_keys(client, item, c_n, n_items)
    assert np.array_equal(keys, want_keys) and np.array_equal(rank, want_rank.reshape(-1))


def _schedule(n_items: int):
    indptr, indices = tiny_csr(n_users=25, n_items=n_items)
    return build_schedule(indptr, indices, np.arange(25), n_items, seed=3, round=2, epochs=3, negatives=4, batch_size=4)


FIELDS = ("n_steps", "ex_client", "ex_step", "ex_slot", "ex_item", "ex_label", "touched_ptr", "touched", "ex_local")


@pytest.mark.parametrize(
    "n_items,negatives,batch_size,epochs",
    [
        (40, 4, 4, 3),  # a small catalogue: each client's free items are listed once
        (5000, 4, 4, 3),  # few draws against a large catalogue: a binary search a draw
        (5000, 300, 3, 2),  # many draws of one client: listed
        (60, 1, 2048, 5),  # one mini-batch a client, as ml-100k's defaults
        (40, 0, 4, 2),  # no negatives: the kernel is not asked
    ],
)
def test_negatives_are_the_same_with_the_kernel(monkeypatch, kernels, n_items, negatives, batch_size, epochs):
    indptr, indices = tiny_csr(n_users=25, n_items=min(n_items, 400))
    args = dict(seed=3, round=2, epochs=epochs, negatives=negatives, batch_size=batch_size)
    rows = np.arange(25)[::-1].copy()  # (not in id order: the kernel must follow the chunk's order)
    monkeypatch.setattr(schedule._KERNELS, "module", False)
    plain = build_schedule(indptr, indices, rows, n_items, **args)
    monkeypatch.setattr(schedule._KERNELS, "module", kernels)
    monkeypatch.setattr(schedule, "KERNEL_AFTER_EXAMPLES", 0)
    compiled = build_schedule(indptr, indices, rows, n_items, **args)
    for name in FIELDS:
        assert np.array_equal(getattr(plain, name), getattr(compiled, name)), name
        assert getattr(plain, name).dtype == getattr(compiled, name).dtype, name


def test_schedule_is_the_same_with_the_kernel(monkeypatch, kernels):
    n_items = 5000  # a sparse key space: the bitmap is not used
    monkeypatch.setattr(schedule, "KERNEL_AFTER_KEYS", 1 << 60)
    monkeypatch.setattr(schedule, "KERNEL_AFTER_EXAMPLES", 1 << 60)
    plain = _schedule(n_items)
    calls = []
    real_get = schedule._KERNELS.get
    monkeypatch.setattr(schedule, "KERNEL_AFTER_KEYS", 0)
    monkeypatch.setattr(schedule._KERNELS, "get", lambda: calls.append(1) or real_get())
    compiled = _schedule(n_items)
    assert calls
    for name in ("touched_ptr", "touched", "ex_local", "ex_item", "ex_client"):
        assert np.array_equal(getattr(plain, name), getattr(compiled, name)), name


def test_the_kernel_waits_until_enough_examples_are_ranked(monkeypatch):
    monkeypatch.setattr(LazyKernels, "numba_started", False)  # as in a process that has loaded no kernel yet
    monkeypatch.setattr(schedule._KERNELS, "work_done", 0)
    monkeypatch.setattr(schedule._KERNELS, "module", None)
    assert schedule._KERNELS.once_worth_it(60, 100) is None
    assert schedule._KERNELS.module is None  # not even imported
    monkeypatch.setattr(schedule._KERNELS, "module", False)  # as where numba does not import
    assert schedule._KERNELS.once_worth_it(60, 100) is None


def test_the_kernel_waits_for_far_less_work_once_numba_has_started(monkeypatch):
    """Another module's kernels have paid numba's start-up: this one's own cached code is cheap to load."""
    compiled_or_skip(schedule._KERNELS)
    monkeypatch.setattr(schedule._KERNELS, "work_done", 0)
    monkeypatch.setattr(LazyKernels, "numba_started", False)
    assert schedule._KERNELS.once_worth_it(LOADED_DISCOUNT, 100 * LOADED_DISCOUNT) is None
    monkeypatch.setattr(LazyKernels, "numba_started", True)
    assert schedule._KERNELS.once_worth_it(0, 100 * LOADED_DISCOUNT) is None  # 64 of 100
    assert schedule._KERNELS.once_worth_it(LOADED_DISCOUNT, 100 * LOADED_DISCOUNT) is not None  # 128 of 100


def test_a_loaded_module_marks_numba_as_started(monkeypatch):
    compiled_or_skip(schedule._KERNELS)
    monkeypatch.setattr(LazyKernels, "numba_started", False)
    monkeypatch.setattr(schedule._KERNELS, "module", None)
    assert schedule._KERNELS.get() is not None and LazyKernels.numba_started
    failing = LazyKernels("fedvlr_plus.no_such_kernels")
    monkeypatch.setattr(LazyKernels, "numba_started", False)
    assert failing.get() is None and not LazyKernels.numba_started
