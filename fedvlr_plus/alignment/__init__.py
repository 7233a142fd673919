"""Alignment modules on the shared client abstraction, one folder each: :mod:`.mor` and :mod:`.fedvpa_gp`
(preference alignment), :mod:`.feddtl` and :mod:`.fedmpt` (vision-language adaptation). Shared pieces beside them:
:mod:`.grpo`, :mod:`.sinkhorn`, :mod:`.pairs`, :mod:`.paired_seeds`. Each method is one ``fedvlr-plus align``
sub-command (fedvlr_plus/cli/align*.py)."""
