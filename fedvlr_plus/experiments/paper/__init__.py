"""The paper table: every backbone with and without the layer over seeds (:mod:`.table`), its recipes tuned on
validation (:mod:`.tuning`), the sparsity buckets (:mod:`.sparsity`) and the report it writes (:mod:`.report`)."""
