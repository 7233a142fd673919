"""FedDTL: decoupled item and user towers, supervised then GRPO fine-tuning, warm (base) and cold (novel)
items. Entry point: :mod:`.method`."""
