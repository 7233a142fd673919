"""Compare models on one data set in a few lines: ``Experiment(data, models, metrics, seeds).run()``.

Every federated model is trained once per seed, selected on validation only, and scored once on test; the
reference rankers (pop, random, antipop) run on the same test unless ``references=False``. The result keeps
each model's per-user figures, so intervals and paired tests come from the same numbers as the table.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields, replace

from ..metric_spec import parse_metrics
from .models import REFERENCES, Model, Reference
from .result import ExperimentResult


@dataclass
class Experiment:
    """``data``: a split data set (:func:`fedvlr_plus.load`). ``models``: recipes (``FedAvg()``, ``FedVLR(...)``,
    ``Pop()``). ``metrics``: ``"ndcg@10"``-style names. ``training``: FedConfig fields for every federated model
    (``rounds=50``, ``lr=0.5``, ...); a recipe's own options win over them."""

    data: object
    models: list
    metrics: list[str] = field(default_factory=lambda: ["hr@10", "ndcg@10", "hr@50", "ndcg@50"])
    seeds: int = 1
    seed: int = 0
    protocol: str = "full"
    references: bool = True
    progress: bool = True
    training: dict = field(default_factory=dict)

    def __init__(
        self,
        data,
        models,
        metrics=None,
        seeds: int = 1,
        *,
        seed: int = 0,
        protocol: str = "full",
        references: bool = True,
        progress: bool = True,
        **training,
    ):
        self.data, self.models = data, list(models)
        self.metrics = list(metrics or ["hr@10", "ndcg@10", "hr@50", "ndcg@50"])
        self.names, self.ks, self.keys = parse_metrics(",".join(self.metrics))
        if seeds < 1:
            raise ValueError(f"seeds must be >= 1, got {seeds}")
        if protocol not in ("full", "sampled"):
            raise ValueError(f"protocol must be 'full' or 'sampled', got {protocol!r}")
        self.seeds, self.seed, self.protocol = int(seeds), int(seed), protocol
        self.references, self.progress, self.training = references, progress, training
        self.data.require_split(need=("train", "valid", "test"))

    def run(self) -> ExperimentResult:
        rows = list(self.models)
        if self.references:
            have = {m.name for m in rows if isinstance(m, Reference)}
            rows += [make() for make in REFERENCES if make().name not in have]
        per_seed = {}
        for model in rows:
            per_seed[model.label] = [self._evaluate(model, self.seed + i) for i in range(self.seeds)]
        return ExperimentResult(
            self.data.name,
            self.keys,
            per_seed,
            protocol=self.protocol,
            references=[m.label for m in rows if isinstance(m, Reference)],
        )

    # ------------------------------------------------------------------ one model, one seed
    def _evaluate(self, model, seed: int):
        if isinstance(model, Reference):
            return self._reference(model, seed)
        if not isinstance(model, Model):
            raise TypeError(f"not a model recipe: {model!r} (use FedAvg(), FedVLR(FedAvg()), Pop(), ...)")
        return self._federated(model, seed)

    def test(self, scorer, seed: int):
        """``scorer`` (users -> scores over all items) on the test split, as every model here is scored: the
        experiment's protocol, cut-offs and metrics, and the history mask of its training options."""
        from ..evaluation import evaluate

        return evaluate(
            self.data,
            scorer,
            split="test",
            protocol=self.protocol,
            ks=self.ks,
            metrics=self.names,
            mask_history=self.training.get("mask_history", "train"),
            seed=seed,
        )

    def _reference(self, model: Reference, seed: int):
        from ..evaluation import reference_scorer

        return self.test(reference_scorer(model.name, self.data, seed=seed), seed)

    def config(self, model: Model, seed: int):
        """The FedConfig ``model`` trains with for ``seed``: the experiment's options, then the recipe's own."""
        from ..federation.config import FedConfig

        known = {f.name for f in fields(FedConfig)}
        options = {**self.training, **model.train}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"{model.label}: unknown training option(s) {', '.join(unknown)} "
                f"(FedConfig fields, e.g. rounds, lr, dim, server_lr)"
            )
        names = tuple(dict.fromkeys(list(self.names) + ["hr"]))
        return replace(
            FedConfig(**options), seed=seed, seeds=1, ks=self.ks, metrics=names, valid_protocol=self.protocol
        )

    def start(self, model: Model, seed: int, *, folder=None, on_round=None):
        """``model``'s run for ``seed``, built and ready to train (``.run()``): its training options, selection on
        validation. ``folder``: a run folder to checkpoint into (and resume from, after ``load_checkpoint()``);
        ``on_round(run, record)``: called after every evaluated round."""
        from ..federation.engine import FederatedRun

        cfg = self.config(model, seed)
        return FederatedRun(
            self.data, model.build(self.data, cfg), cfg, folder, progress=self.progress, on_round=on_round
        )

    def selected_test(self, run):
        """The test result of ``run`` at the round selected on validation."""
        return run.best["test_full" if self.protocol == "full" else "test_sampled"]

    def _federated(self, model: Model, seed: int):
        if self.progress:
            print(f"{model.label}, seed {seed}: training on {self.data.name}", file=sys.stderr, flush=True)
        run = self.start(model, seed)
        run.run()
        return self.selected_test(run)
