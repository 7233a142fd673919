"""Federated engine: client abstraction, private-state stores, aggregation strategies, simulators, training loop.

- :class:`ClientUpdate` (messages), :class:`RecClient` / :class:`Client` (client), :class:`MemoryStore` /
  :class:`DiskStore` (private state), strategies (:class:`FedAvgStrategy`, :class:`SparseRowAvg`,
  :class:`FedGradStrategy`, :class:`CoordinateMedian`, :class:`TrimmedMean`),
  :class:`BatchedSimulator` / :class:`SequentialSimulator`;
- :class:`FedConfig`, :func:`config_from_options`, :func:`run_federated`, :func:`bench_round`,
  :func:`federated_result`.

Only the configuration is imported eagerly (building the CLI parser must not import torch); everything else
loads on first use.
"""

from importlib import import_module

from .config import FEDERATED_BACKBONES, STRATEGIES, FedConfig, config_from_options  # noqa: F401 (in __all__)

_LAZY = {
    "BatchedSimulator": ".simulation.batched",
    "SequentialSimulator": ".simulation.sequential",
    "Client": ".client",
    "RecClient": ".client",
    "FederatedRun": ".engine",
    "bench_round": ".simulation.round_timing",
    "combine_seeds": ".runs.seeds",
    "format_bench": ".simulation.round_timing",
    "run_federated": ".run_seeds",
    "federated_result": ".runs.result",
    "FedAvgStrategy": ".strategies.fedavg",
    "FedGradStrategy": ".strategies.fedgrad",
    "CoordinateMedian": ".strategies.median",
    "ClientUpdate": ".messages",
    "SparseRowAvg": ".strategies.sparse_avg",
    "TrimmedMean": ".strategies.trimmed_mean",
    "RoundLoop": ".rounds",
    "ServerAdam": ".strategies.server_adam",
    "DiskStore": ".state.store",
    "MemoryStore": ".state.store",
    "make_store": ".state.store",
    "Strategy": ".strategies.base",
    "make_strategy": ".strategies.base",
}


def __getattr__(name):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(["FEDERATED_BACKBONES", "STRATEGIES", "FedConfig", "config_from_options", *_LAZY])
