"""Compare models on one data set in a few lines: ``Experiment(data, models, metrics, seeds).run()``.

Every federated model is trained once per seed, selected on validation only, and scored once on test; the
reference rankers (pop, random, antipop) run on the same test unless ``references=False``. The result keeps
each model's per-user figures, so intervals and paired tests come from the same numbers as the table.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields, replace

from ..errors import ConfigError, UserError
from .checks import SEED_LIMIT, check_data, check_int, check_metrics, check_recipes, check_training
from .models import REFERENCES, Model, Reference
from .result import ExperimentResult

DEFAULT_METRICS = ["hr@10", "ndcg@10", "hr@50", "ndcg@50"]
#: more seeds than this is a typo, not a study (each seed trains every model once)
MAX_SEEDS = 1000


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
        self.data = check_data(data)
        self.models = check_recipes(models, references=references)
        self.metrics = list(metrics.split(",") if isinstance(metrics, str) else metrics or DEFAULT_METRICS)
        self.names, self.ks, self.keys = check_metrics(self.metrics, self.data, default=metrics is None)
        self.seeds = check_int("Experiment(seeds=...)", seeds, low=1, high=MAX_SEEDS + 1)
        self.seed = check_int("Experiment(seed=...)", seed, low=0, high=SEED_LIMIT - self.seeds + 1)
        if protocol not in ("full", "sampled"):
            raise ConfigError(f"Experiment(protocol={protocol!r})", "must be 'full' or 'sampled'")
        self.protocol = protocol
        self.references, self.progress, self.training = bool(references), bool(progress), training
        check_training("Experiment", training)
        self._check_before_training()

    @classmethod
    def from_config(cls, path) -> Experiment:
        """The experiment an experiment file describes (``fedvlr-plus run --config`` reads the same file; a run
        folder's ``config.toml`` too): its data, its one model (``backbone``, with ``fusion`` the FedVLR layer)
        and training options. A key the file should not have, or a bad value, names the file and the key."""
        from .experiment_file import experiment_arguments

        arguments = experiment_arguments(path)
        try:
            return cls(**arguments)
        except UserError as exc:  # a value the experiment refuses: named with the file it came from
            raise ConfigError(str(path), str(exc)) from None

    def _check_before_training(self) -> None:
        """Everything that would fail later, refused now: each model's whole configuration (the experiment's
        options with the recipe's own), and the sampled protocol on a catalogue too small for it."""
        for model in self.models:
            if isinstance(model, Model):
                try:
                    self.config(model, self.seed)
                except ValueError as exc:
                    if isinstance(exc, UserError):
                        raise
                    raise ConfigError(model.label, str(exc).removeprefix("FedConfig: ")) from None
        if self.protocol == "sampled":
            from ..evaluation import sampled_unavailable

            for split in ("valid", "test"):
                why = sampled_unavailable(self.data, split=split)
                if why:
                    raise ConfigError("Experiment(protocol='sampled')", why, "use protocol='full'")

    def run(self) -> ExperimentResult:
        rows = check_recipes(
            self.models, references=self.references, to_run=True
        )  # again: the list may have been edited
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
        if not isinstance(model, Model):  # models edited after the experiment was made
            check_recipes(self.models, references=self.references)
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
            raise ConfigError(
                f"{model.label}: unknown training option(s) {', '.join(unknown)}",
                hint="FedConfig fields, e.g. rounds, lr, dim, server_lr",
            )
        names = tuple(dict.fromkeys(list(self.names) + ["hr"]))
        return replace(
            FedConfig(**options), seed=seed, seeds=1, ks=self.ks, metrics=names, valid_protocol=self.protocol
        )

    def start(
        self,
        model: Model,
        seed: int,
        *,
        folder=None,
        on_round=None,
        settings: dict | None = None,
        test: bool = True,
        keep_selected: bool = False,
    ):
        """``model``'s run for ``seed``, built and ready to train (``.run()``): its training options, selection on
        validation. ``folder``: a run folder to checkpoint into (and resume from, after ``load_checkpoint()``);
        ``on_round(run, record)``: called after every evaluated round; ``settings``: config fields changed for this
        run (a tuner's budget, :func:`~fedvlr_plus.fedvlr.halving.budget_settings`; a run resumed with more rounds
        continues); ``test``: False for validation only (a tuner's candidate: no test pass); ``keep_selected``: its
        checkpoints keep the selected round's model, so that a later run can go on from it."""
        from ..federation.engine import FederatedRun

        cfg = self.config(model, seed)
        cfg = cfg if not settings else replace(cfg, **settings)
        backbone = model.build(self.data, cfg)
        return FederatedRun(
            self.data,
            backbone,
            cfg,
            folder,
            progress=self.progress,
            on_round=on_round,
            test=test,
            keep_selected=keep_selected,
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
