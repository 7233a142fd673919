"""What every aggregation strategy shares: checks on uploads, normalised weights, row-wise helpers, a registry.

A strategy turns the current shared state and the round's :class:`ClientUpdate` list into the next shared state.
``upload`` says what it asks clients for: ``"params"`` (new local values) or ``"grads"`` (gradients accumulated over
all local steps). Item tables arrive row-wise (values + row ids). Every strategy sees the parameter specs so it
knows which arrays are item tables.
"""

from __future__ import annotations

import torch

from ..messages import ClientUpdate
from ..simulation.running_sum import BLOCK_FLOATS, DenseSum, RowSums, RunningSums, rows_of  # noqa: F401  (rows_of: re-export)


class Strategy:
    name = ""
    upload = "params"
    #: True where the next state depends on the uploads only through their weighted sums (:mod:`.running_sum`):
    #: ``aggregate`` is then ``from_sums`` of :func:`summed`, and the engine may add a chunk's uploads to the
    #: sums as the simulator hands them over, and drop them
    linear = False

    def aggregate(
        self, shared: dict[str, torch.Tensor], updates: list[ClientUpdate], specs: dict
    ) -> dict[str, torch.Tensor]:
        if self.linear:
            return self.from_sums(shared, summed(shared, updates, specs, self.upload), specs)
        raise NotImplementedError

    def from_sums(self, shared: dict[str, torch.Tensor], sums: RunningSums, specs: dict) -> dict[str, torch.Tensor]:
        """The next shared state from the round's weighted sums (linear strategies only)."""
        raise NotImplementedError

    def prepare_shared(self, shared: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The shared state clients receive, from the initial one (a strategy with a server side adds to it)."""
        return shared

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def check_updates(shared: dict[str, torch.Tensor], updates: list[ClientUpdate], kind: str) -> None:
    """Every upload must be of the expected kind and carry exactly the shared arrays, with matching shapes."""
    if not updates:
        raise ValueError("no client updates to aggregate")
    names = set(shared)
    want = {k: tuple(v.shape) for k, v in shared.items()}
    for u in updates:
        if u.kind != kind:
            raise ValueError(f"client {u.cid} uploaded {u.kind!r} but this strategy aggregates {kind!r}")
        if u.arrays.keys() != names:
            extra, missing = set(u.arrays) - names, names - set(u.arrays)
            if extra:
                raise ValueError(f"client {u.cid} uploaded arrays that are not shared parameters: {sorted(extra)}")
            raise ValueError(f"client {u.cid} did not upload {sorted(missing)}")
        if not u.rows.keys() <= names:
            raise ValueError(f"client {u.cid} sent row ids for arrays it did not upload: {sorted(set(u.rows) - names)}")
        for name, a in u.arrays.items():
            shape = tuple(a.shape)
            if name in u.rows:
                r = u.rows[name]
                if r.shape[0] != shape[0] or shape[1:] != want[name][1:]:
                    u.validate()  # names the mismatch
                    raise ValueError(f"client {u.cid}: {name!r} rows of shape {shape[1:]}, expected {want[name][1:]}")
            elif shape != want[name]:
                raise ValueError(f"client {u.cid}: {name!r} has shape {shape}, expected {want[name]}")
        if u.num_examples <= 0:
            raise ValueError(f"client {u.cid} reports {u.num_examples} examples; weights need a positive count")


def example_weights(updates: list[ClientUpdate]) -> torch.Tensor:
    """``n_u / sum_v n_v`` (float64): the weights sum to 1, so an aggregate keeps the scale of one client's update
    however many clients take part."""
    n = torch.tensor([float(u.num_examples) for u in updates], dtype=torch.float64)
    return n / n.sum()


def gather_rows(updates: list[ClientUpdate], name: str, n_rows: int, weights: torch.Tensor | None = None):
    """Concatenate the row ids, values and (optionally) per-row weights of every upload of ``name``."""
    rows = [rows_of(u, name, n_rows) for u in updates]
    vals = torch.cat([u.arrays[name] for u in updates])
    vals = vals.reshape(vals.shape[0], -1)
    ws = None
    if weights is not None:
        ws = torch.repeat_interleave(weights, torch.tensor([r.shape[0] for r in rows]))
    return torch.cat(rows), vals, ws


def weighted_row_sums(
    updates: list[ClientUpdate], name: str, shape, weights: torch.Tensor, dtype, block_floats: int = BLOCK_FLOATS
):
    """``Σ_u w_u x_u[r]`` per row and ``Σ_{u ∋ r} w_u`` per row. Uploads are concatenated in blocks of at most
    ``block_floats`` values, so memory stays bounded and small uploads do not cost one call each."""
    acc = RowSums(shape, dtype, block_floats)
    for u, w in zip(updates, weights.tolist()):
        acc.add(rows_of(u, name, shape[0]), u.arrays[name], w)
    return acc.result()


def weighted_dense(updates: list[ClientUpdate], name: str, weights: torch.Tensor) -> torch.Tensor:
    acc = DenseSum()
    acc.add([u.arrays[name] for u in updates], weights)
    return acc.result()


def summed(shared: dict[str, torch.Tensor], updates: list[ClientUpdate], specs: dict, kind: str) -> RunningSums:
    """The round's weighted sums of all ``updates`` at once (checked, example-weighted): what a linear strategy
    aggregates from, and what the engine builds chunk by chunk instead when the simulator streams its uploads."""
    check_updates(shared, updates, kind)
    sums = RunningSums(shared, [k for k in shared if specs[k].item_table])
    sums.add(updates, example_weights(updates))
    return sums


from ..config import STRATEGIES  # noqa: E402  (names live in config so the CLI can list them cheaply)


def make_strategy(
    name: str,
    *,
    server_lr: float | None = None,
    server_optimizer: str = "sgd",
    trim_fraction: float = 0.1,
    chunk_floats: int = 1 << 24,
    item_lr_scale: float = 1.0,
) -> Strategy:
    from .fedavg import FedAvgStrategy
    from .fedgrad import FedGradStrategy
    from .median import CoordinateMedian
    from .sparse_avg import SparseRowAvg
    from .trimmed_mean import TrimmedMean

    if name == "fedavg":
        return FedAvgStrategy()
    if name == "sparse-avg":
        return SparseRowAvg()
    if name == "fedgrad":
        if server_lr is None:
            raise ValueError("fedgrad needs a server learning rate")
        return FedGradStrategy(server_lr, optimizer=server_optimizer, item_lr_scale=item_lr_scale)
    if name == "median":
        return CoordinateMedian(chunk_floats=chunk_floats)
    if name == "trimmed-mean":
        return TrimmedMean(trim_fraction, chunk_floats=chunk_floats)
    raise ValueError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")
