"""Aggregation strategies: one rule per file (FedAvg, FedGrad with a server optimizer, coordinate
median, trimmed mean, sparse row averaging), and :func:`make_strategy`, which builds one by name."""
