"""MoR (Mixture-of-Rewards): client reward models that share scores, not parameters; a server router over
them and a GRPO policy. Entry point: :mod:`.method`."""
