"""Alignment modules on the shared client abstraction: MoR, FedVPA-GP (preference alignment), FedDTL and FedMPT
(vision-language adaptation). Shared pieces: :mod:`.grpo`. Each method registers one ``fedvlr-plus align``
sub-command (see :mod:`.cli`)."""
