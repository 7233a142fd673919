"""Run folders: checkpoints, locks and manifests (:mod:`.folder`), the result a run reports
(:mod:`.result`) and seeds combined into one figure (:mod:`.seeds`)."""
