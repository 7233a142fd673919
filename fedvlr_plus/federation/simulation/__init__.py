"""The in-process simulators: the batched engine that trains a round's clients together (closed forms,
chunks, counter-based draws) and the sequential reference it must match."""
