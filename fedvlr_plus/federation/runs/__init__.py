"""Whole runs: run folders with checkpoints, locks and manifests (:mod:`.folder`), the result a run reports
(:mod:`.result`), seeds combined into one figure (:mod:`.seeds`), the selected round's model kept aside for its
test (:mod:`.kept_round`) and seeds or recipes trained side by side in worker processes (:mod:`.parallel`)."""
