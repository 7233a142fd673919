"""The local training data of a round: which examples each client sees at which local step.

For client ``u`` with training positives ``P_u`` (``n_u`` items), in round ``r`` and local epoch ``e``:

1. the positives are shuffled (a permutation keyed by (seed, r, u, e)) when they fill more than one mini-batch;
2. every positive gets ``k`` negatives drawn uniformly from the whole catalogue minus ``P_u`` (items seen only in
   valid/test, or by nobody, are eligible: the model has to learn to push them down too), re-drawn every epoch;
   negatives are drawn independently (with replacement), so one item can be a negative twice in an epoch;
3. the shuffled positives are cut into mini-batches of ``batch_size`` positives; each mini-batch carries its
   positives' negatives, so it holds up to ``batch_size * (1 + k)`` examples.

A client takes ``epochs * ceil(n_u / batch_size)`` local steps. Within a step, the positive at batch position
``q`` sits at slot ``q * (1 + k)`` and its negatives at the following ``k`` slots.

All draws are counter-based (:mod:`.rng`), so one client's schedule is the same whether it is built alone (the
sequential reference, a Flower client) or together with thousands of others (the batched simulator).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...compiled import LazyKernels
from . import rng


@dataclass
class Schedule:
    clients: np.ndarray  # [C] global user ids
    n_pos: np.ndarray  # [C] training positives per client (the client's num_examples)
    n_steps: np.ndarray  # [C] local steps per client
    ex_client: np.ndarray  # [X] index into ``clients``
    ex_step: np.ndarray  # [X]
    ex_slot: np.ndarray  # [X]
    ex_item: np.ndarray  # [X] global item id
    ex_label: np.ndarray  # [X] 1.0 positive, 0.0 negative
    touched_ptr: np.ndarray  # [C + 1] offsets into ``touched``
    touched: np.ndarray  # sorted global item ids each client touches this round
    ex_local: np.ndarray  # [X] row of ``ex_item`` within its client's touched rows
    slots: int  # slots per step (max over clients)

    @property
    def steps_max(self) -> int:
        return int(self.n_steps.max()) if len(self.n_steps) else 0

    @property
    def rows(self) -> np.ndarray:
        return np.diff(self.touched_ptr)

    def touched_of(self, c: int) -> np.ndarray:
        return self.touched[self.touched_ptr[c] : self.touched_ptr[c + 1]]

    def steps_of(self, c: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """(global items, labels) of every local step of client index ``c``, in slot order."""
        sel = np.flatnonzero(self.ex_client == c)
        order = sel[np.lexsort((self.ex_slot[sel], self.ex_step[sel]))]
        steps = self.ex_step[order]
        cuts = np.flatnonzero(np.diff(steps)) + 1
        return [(self.ex_item[idx], self.ex_label[idx]) for idx in np.split(order, cuts)]


def build_schedule(
    indptr: np.ndarray,
    indices: np.ndarray,
    rows: np.ndarray,
    n_items: int,
    *,
    seed: int,
    round: int,
    epochs: int,
    negatives: int,
    batch_size: int,
    ids: np.ndarray | None = None,
) -> Schedule:
    """Build the round's schedule for the users in CSR ``rows`` (training CSR ``indptr``, ``indices``; each row
    sorted and duplicate-free).

    ``ids`` are the client ids the draws are keyed by (default: ``rows``); a client holding only its own data
    passes a one-row CSR with ``rows=[0]`` and ``ids=[cid]``.
    """
    rows = np.asarray(rows, dtype=np.int64)
    clients = rows if ids is None else np.asarray(ids, dtype=np.int64)
    c_n, k, bsz = len(rows), int(negatives), int(batch_size)
    n = _positive_counts(indptr, rows, clients, n_items, k)
    nb = (n + bsz - 1) // bsz
    pos = _Positives.of(indptr, indices, rows, clients, n, n_items)
    ex, e_pos, q_e = _positive_examples(
        pos, nb, seed=seed, round=round, epochs=int(epochs), batch_size=bsz, negatives=k
    )
    kernels = _KERNELS.once_worth_it(len(e_pos) * (1 + k), KERNEL_AFTER_EXAMPLES) if k and len(e_pos) else None
    if kernels is not None:
        ex = _compiled_negatives(kernels, ex, q_e, pos, clients, n, n_items, seed=seed, round=round, epochs=int(epochs),
                                 negatives=k)  # fmt: skip
    else:
        if k:
            _add_negatives(ex, e_pos, q_e, pos, clients, n, n_items, seed=seed, round=round, negatives=k)
        ex = {name: np.concatenate(v) for name, v in ex.items()}
    ukey, inv = _touched_keys(ex["client"], ex["item"], c_n, n_items)
    counts = np.bincount(ukey // n_items, minlength=c_n)
    ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return Schedule(
        clients=clients,
        n_pos=n,
        n_steps=(epochs * nb).astype(np.int64),
        ex_client=ex["client"],
        ex_step=ex["step"],
        ex_slot=ex["slot"],
        ex_item=ex["item"],
        ex_label=ex["label"].astype(np.float32),
        touched_ptr=ptr,
        touched=(ukey % n_items).astype(np.int64),
        ex_local=(inv.reshape(-1) - ptr[ex["client"]]).astype(np.int64),
        slots=int(np.minimum(n, bsz).max() * (1 + k)) if c_n else 0,
    )


def _positive_counts(indptr, rows, clients, n_items: int, negatives: int) -> np.ndarray:
    """Each client's number of training positives; a client that cannot train (none, or no item left to draw
    a negative from) is refused by id."""
    c_n = len(rows)
    n = (indptr[rows + 1] - indptr[rows]).astype(np.int64)
    if c_n and n.min() <= 0:
        bad = clients[np.argmin(n)]
        raise ValueError(f"client {bad} has no training interactions and cannot train")
    if negatives > 0 and c_n and (n >= n_items).any():
        bad = clients[np.argmax(n)]
        raise ValueError(f"client {bad} has interacted with every item: no negative can be drawn")
    return n


@dataclass
class _Positives:
    """Every client's positives in one flat array: ``cl`` the client index, ``j`` the place within the client,
    ``item`` the global id, ``cid`` the client id, ``offs`` each client's start; ``adj`` holds ``P[i] - i`` made
    globally sorted by a per-client offset (the r-th item of the complement of the sorted positives P is
    ``r + #{i : P[i] - i <= r}``, so negatives need no rejection)."""

    cl: np.ndarray
    j: np.ndarray
    item: np.ndarray
    cid: np.ndarray
    offs: np.ndarray
    adj: np.ndarray

    @classmethod
    def of(cls, indptr, indices, rows, clients, n, n_items: int) -> _Positives:
        total = int(n.sum())
        offs = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64)
        cl = np.repeat(np.arange(len(rows), dtype=np.int64), n)
        j = np.arange(total, dtype=np.int64) - offs[cl]
        pos_item = indices[indptr[rows][cl] + j].astype(np.int64)
        adj = cl * n_items + (pos_item - j)
        if total > 1 and (np.diff(adj) < 0).any():
            raise ValueError("the training CSR rows must be sorted and free of duplicates")
        return cls(cl, j, pos_item, clients[cl], offs, adj)


def _positive_examples(
    pos: _Positives, nb, *, seed: int, round: int, epochs: int, batch_size: int, negatives: int
) -> tuple[dict, np.ndarray, np.ndarray]:
    """The positive examples of every epoch at once (arrays of length epochs * positives), each with its client,
    step and slot (lists, for the negatives to join), and each one's epoch and slot within its client's epoch."""
    cl, j, total, k = pos.cl, pos.j, len(pos.cl), negatives
    e_pos = np.repeat(np.arange(epochs, dtype=np.int64), total)
    cl_e, q_e = np.tile(cl, epochs), np.tile(j, epochs)  # q: the slot a positive takes within its client's epoch
    items_pos = np.tile(pos.item, epochs)
    multi = np.flatnonzero(nb[cl] > 1)  # positives of clients with several mini-batches
    for e in range(epochs if len(multi) else 0):
        # Shuffle the positives of clients whose epoch spans several mini-batches (for one mini-batch the order
        # only changes the summation order of its mean). Sorting (client, key) keeps clients contiguous.
        key = rng.hash64(seed, round, rng.TAG_PERM, e, pos.cid[multi], j[multi]) >> np.uint64(24)
        perm = multi[np.argsort(cl[multi].astype(np.uint64) << np.uint64(40) | key, kind="stable")]
        items_pos[e * total + multi] = pos.item[perm]
    step_pos = e_pos * nb[cl_e] + q_e // batch_size
    slot_pos = (q_e % batch_size) * (1 + k)
    ex = {
        "client": [cl_e],
        "step": [step_pos],
        "slot": [slot_pos],
        "item": [items_pos],
        "label": [np.ones(epochs * total, np.float32)],
    }
    return ex, e_pos, q_e


def _add_negatives(
    ex: dict, e_pos, q_e, pos: _Positives, clients, n, n_items: int, *, seed: int, round: int, negatives: int
) -> None:
    """Append ``negatives`` uniform draws from the complement of each client's positives after every positive
    example of ``ex`` (re-drawn every epoch, keyed by (seed, round, epoch, client id, slot))."""
    k = negatives
    cl_e, step_pos, slot_pos = ex["client"][0], ex["step"][0], ex["slot"][0]
    ncl = np.repeat(cl_e, k)
    t = np.tile(np.arange(k, dtype=np.int64), len(cl_e))
    idx = np.repeat(q_e, k) * k + t  # the t-th negative of slot q, numbered within the epoch
    free = n_items - n[ncl]
    r = np.minimum(
        (rng.uniform(seed, round, rng.TAG_NEG, np.repeat(e_pos, k), clients[ncl], idx) * free).astype(np.int64),
        free - 1,
    )
    ex["client"].append(ncl)
    ex["step"].append(np.repeat(step_pos, k))
    ex["slot"].append(np.repeat(slot_pos, k) + 1 + t)
    ex["item"].append(_free_items(pos, ncl, r, n_items))
    ex["label"].append(np.zeros(len(ncl), np.float32))


def _compiled_negatives(
    kernels, ex: dict, q_e, pos: _Positives, clients, n, n_items: int, *, seed: int, round: int, epochs: int,
    negatives: int,
) -> dict:  # fmt: skip
    """What :func:`_add_negatives` and the concatenation after it give, by the compiled kernel: the same draws,
    items and order (:func:`.schedule_kernels.with_negatives`), in one pass instead of a dozen."""
    prefix = rng._chain((seed, round, rng.TAG_NEG))[0]
    out = kernels.with_negatives(
        prefix, negatives, n_items, epochs, ex["client"][0], ex["step"][0], ex["slot"][0], ex["item"][0], q_e,
        np.asarray(clients, dtype=np.int64), n, pos.item, pos.offs,
    )  # fmt: skip
    return dict(zip(("client", "step", "slot", "item", "label"), out))


def dense_key_space(size: int, lookups: int) -> bool:
    """Whether (client, item) keys are few enough to hold as a bitmap: a pass over ``size`` flags then costs less
    than sorting or searching ``lookups`` keys."""
    return size <= max(1 << 16, 8 * lookups)


def _free_items(pos: _Positives, ncl: np.ndarray, r: np.ndarray, n_items: int) -> np.ndarray:
    """The ``r``-th item (0-based, in id order) outside the positives of client ``ncl``, for each pair.

    On a small key space every client's free items are listed once (a bitmap of the positives, its zeros in
    order) and each draw is one look-up, about 5x faster than a binary search per draw on ml-100k; else the
    binary search over the positives' ``P[i] - i`` (see :class:`_Positives`). Both give the same items."""
    c_n = len(pos.offs)
    if dense_key_space(c_n * n_items, len(r)):
        taken = np.zeros(c_n * n_items, dtype=bool)
        taken[pos.cl * n_items + pos.item] = True
        free = np.flatnonzero(~taken)  # client c's free items start at c * n_items minus the positives before it
        return free[(np.arange(c_n, dtype=np.int64) * n_items - pos.offs)[ncl] + r] - ncl * n_items
    return r + np.searchsorted(pos.adj, ncl * n_items + r, side="right") - pos.offs[ncl]


def _touched_keys(client: np.ndarray, item: np.ndarray, c_n: int, n_items: int) -> tuple[np.ndarray, np.ndarray]:
    """The sorted unique (client * n_items + item) keys of the round's examples and each example's rank."""
    keys = client * n_items + item
    if dense_key_space(c_n * n_items, len(keys)):
        # dense key space: a bitmap gives the sorted unique keys and each key's rank without sorting
        flag = np.zeros(c_n * n_items, dtype=bool)
        flag[keys] = True
        ukey = np.flatnonzero(flag)
        # int32 where it holds every rank: half the memory traffic of the pass
        rank = np.cumsum(flag, dtype=np.int32 if len(flag) < 2**31 else np.int64)
        return ukey, rank[keys].astype(np.int64) - 1
    kernels = _KERNELS.once_worth_it(len(keys), KERNEL_AFTER_KEYS)
    if kernels is not None:
        return kernels.touched_keys(client, item, c_n, n_items)
    return np.unique(keys, return_inverse=True)


#: examples a process ranks with ``numpy.unique`` before it loads the compiled kernel: numba's import (0.4-0.6 s
#: CPU once per process) is what ``numpy.unique`` spends on about 8 M examples, a round of 35,598 clients (a small
#: catalogue takes the bitmap above and never counts)
KERNEL_AFTER_KEYS = 1 << 23
#: examples a process lays out with numpy before the negatives' kernel: numpy spends about 80 ns an example (ml-100k,
#: one negative), so numba's import is repaid after some 6 M examples, about six rounds of ml-100k (the two counts
#: add up: they load one module)
KERNEL_AFTER_EXAMPLES = 1 << 23
_KERNELS = LazyKernels("fedvlr_plus.federation.simulation.schedule_kernels")


def prepare_kernels() -> bool:
    """Compile the schedule's kernels, or load them from numba's cache, with tiny calls (the argument types a
    round passes); False where numba is missing. ``bench suite`` calls this before its cases."""
    one = np.zeros(1, np.int64)

    def tiny(kernels):
        kernels.touched_keys(one, one, 1, 1)
        kernels.with_negatives(np.uint64(0), 1, 2, 1, *([one] * 6), one + 1, one, one)

    return _KERNELS.prepare(tiny)
