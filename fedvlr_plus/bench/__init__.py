"""Speed benchmarks: ``fedvlr-plus bench suite`` (:mod:`.suite`) and the one case it runs per process (:mod:`.case`)."""
