"""Federated engine: client abstraction, private-state stores, aggregation strategies, simulators, training loop.

- :class:`ClientUpdate` (messages), :class:`RecClient` / :class:`Client` (client), :class:`MemoryStore` /
  :class:`DiskStore` (private state), strategies (:class:`FedAvg`, :class:`SparseRowAvg`,
  :class:`GradientAggregation`, :class:`CoordinateMedian`, :class:`TrimmedMean`),
  :class:`BatchedSimulator` / :class:`SequentialSimulator`;
- :class:`FedConfig`, :func:`run_federated`, :func:`bench_round`, :func:`add_run_arguments`,
  :func:`config_from_args`.
"""
from .batched import BatchedSimulator, SequentialSimulator
from .client import Client, RecClient
from .config import FedConfig, add_run_arguments, config_from_args
from .engine import FederatedRun, bench_round, combine_seeds, format_bench, run_federated
from .fedavg import FedAvg
from .grad_agg import GradientAggregation
from .median import CoordinateMedian
from .messages import ClientUpdate
from .sparse_avg import SparseRowAvg
from .store import DiskStore, MemoryStore, make_store
from .strategy import STRATEGIES, Strategy, make_strategy
from .trimmed_mean import TrimmedMean

__all__ = [
    "BatchedSimulator", "Client", "ClientUpdate", "CoordinateMedian", "DiskStore", "FedAvg", "FedConfig",
    "FederatedRun", "GradientAggregation", "MemoryStore", "RecClient", "STRATEGIES", "SequentialSimulator",
    "SparseRowAvg", "Strategy", "TrimmedMean", "add_run_arguments", "bench_round", "combine_seeds",
    "config_from_args", "format_bench", "make_store", "make_strategy", "run_federated",
]
