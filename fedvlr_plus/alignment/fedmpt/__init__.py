"""FedMPT: multi-label item tagging with condition prompts and optimal transport. Entry point:
:mod:`.method`."""
