"""The FedVLR paper's Table 2, reproduced honestly (``fedvlr-plus experiment paper-table``).

Every backbone is trained alone with its own aggregation (``none``), alone with the aggregation FedVLR trains
with (``fedgrad``: Algorithm 1's averaged gradients and server step — the like-for-like baseline, since a gain
of FedVLR over ``none`` may come from the aggregation rather than from the content), with one server fusion
expert (``mlp``, the paper's single-MLP baseline) and with the full FedVLR layer (``fedvlr``), each selected on
validation only (the engine's early stopping), over several seeds. Test figures at the selected round are
reported overall and split by warm and cold targets, plus cold targets ranked among cold items only, beside the
reference rankers (pop, random, antipop) and a content-only ranker (cosine between a user's mean training-item
view and every item). FedVLR is compared with its backbone alone (both rows) by a paired test over users
(per-user values averaged over seeds). Where there are cold items and content views, each backbone-alone row
also appears as ``<row> + cold rule``: the same model at the same selected round, with its untrained cold item
rows (shared, and each user's private item tables) replaced by the mean row of their content neighbours (the
layer's rule), so that FedVLR is also compared with backbones that do not profit from ranking untrained rows
(KU's split artifact).

The table is a user of the Python API: each row is a model recipe trained per seed by an
:class:`~fedvlr_plus.api.Experiment` (selection on validation), and its summaries and paired tests are those of
:class:`~fedvlr_plus.api.ExperimentResult`. What the API does not do stays here: run folders with resume, the
cold-rule rows, cold targets ranked among cold items, and the content-only ranker.

Protocol as the paper's: leave-one-out by time, full ranking over all items with training items masked.
"""

from __future__ import annotations

import copy
import sys
from contextlib import ExitStack
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from ...api import AntiPop, Experiment, ExperimentResult, FedVLR, Model, Pop, Random
from ...coldstart.content import ContentRanker, RestrictedScorer
from ...errors import ConfigError
from ...federation.runs.folder import refuse_started_runs
from ..selected_extra import load_selected_extra, save_selected_extra
from ..variants import FUSION_VARIANTS, ROUTER_ABLATION, VARIANTS
from .report import PARTS, table_notes, write_report
from .sparsity import sparsity_section


@dataclass
class PaperTableOptions:
    """What the table trains and where it keeps its runs.

    ``training``: every run's FedConfig (its ``seed`` and ``seeds``: the table's seeds); ``overrides``:
    ``(selector, field, value)`` triples that change it for some rows only (selector: a backbone, a variant or
    ``backbone+variant``); ``fedvlr``: the layer's options (its ``mode`` is each fusion variant's).
    ``folder``: the report and run folder; ``resume``: continue the runs already in it."""

    backbones: tuple[str, ...]
    variants: tuple[str, ...]
    training: object
    fedvlr: object
    metrics: list[str]
    overrides: tuple[tuple[str, str, str], ...] = ()
    #: each backbone's own options by backbone name (FedRAP's penalties), for its rows alone and with the layer
    backbone_options: dict = field(default_factory=dict)
    folder: Path | None = None
    resume: bool = False
    progress: bool = True
    #: choose each fusion row's recipe on validation first (fedvlr_plus.fedvlr.tuning)
    tune: bool = False
    #: with ``tune``, stop the recipes behind on validation early (successive halving, fedvlr_plus.fedvlr.halving)
    halving: bool = False
    #: worker processes training the rows' seeds side by side (None: as the cores allow; 1: one after another)
    jobs: int | None = 1

    def __post_init__(self):
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad:
            raise ConfigError("paper table variants", f"unknown {', '.join(bad)}", f"choose from {', '.join(VARIANTS)}")


def row_label(backbone: str, variant: str) -> str:
    """Row name: ``fedavg``, ``fedavg (fedgrad)``, ``fedavg+mlp``, ``fedavg+fedvlr``."""
    return {"none": backbone, "fedgrad": f"{backbone} (fedgrad)"}.get(variant, f"{backbone}+{variant}")


def rule_label(label: str) -> str:
    """Row name of a backbone-alone row scored with the layer's cold-item rule."""
    return f"{label} + cold rule"


@dataclass
class _Study:
    """What every row of one table shares, and the per-seed results the rows collect."""

    data: object
    opts: PaperTableOptions
    experiment: Experiment
    views: dict
    cold: np.ndarray
    rule: object
    tests: dict = field(default_factory=dict)  # label -> [test EvalResult per seed]
    among: dict = field(default_factory=dict)  # label -> [cold targets among cold items, per seed]
    selected: dict = field(default_factory=dict)  # label -> [selected round per seed]
    routers: dict = field(default_factory=dict)  # label -> [router report per seed]
    references: list = field(default_factory=list)
    #: label -> the tuning candidate's seed folder the row's first seed goes on from (a tuned row, no table folder)
    continued: dict = field(default_factory=dict)

    @property
    def seed(self) -> int:
        return self.experiment.seed


def run_paper_table(data, opts: PaperTableOptions) -> dict:
    """Train every (backbone, variant) over the seeds and build the table (see the module docstring)."""
    study = _prepare(data, opts)
    _add_references(study)
    skipped = _refused_rows(study)
    row_configs, tuning = {}, {}
    rows = list(_recipes(study, skipped))
    with ExitStack() as stack:  # holds the tuning candidates' temporary folders until the rows are trained
        if opts.tune:
            from .tuning import tune_rows

            rows = tune_rows(study, rows, tuning, stack)
        for recipe, _ in rows:
            row_configs[recipe.label] = study.experiment.config(recipe, study.seed).to_dict()
        _train_rows(study, rows)
    result = _result(study, skipped, row_configs)
    if tuning:
        result["tuning"] = tuning
    if opts.folder is not None:
        write_report(result, opts.folder)
    return result


# ---------------------------------------------------------------------------------------------- set-up
def _prepare(data, opts: PaperTableOptions) -> _Study:
    from ...coldstart.rules import make_rule

    # the experiment sets the seed, the cut-offs and metrics of every run itself
    training = {
        f.name: getattr(opts.training, f.name)
        for f in fields(opts.training)
        if f.name not in ("seed", "seeds", "ks", "metrics", "valid_protocol")
    }
    experiment = Experiment(
        data,
        [],
        metrics=opts.metrics,
        seeds=opts.training.seeds,
        seed=opts.training.seed,
        protocol="full",
        references=False,
        progress=opts.progress,
        **training,
    )
    fo = opts.fedvlr
    views = _content_views(data, opts)
    cold = data.cold_items()
    # the layer's cold-item rule applied to the backbones alone (reference rows): their untrained cold rows
    # replaced by the mean ID row of each cold item's content neighbours, at the round selected on validation
    rule = (
        make_rule("neighbours", views, cold, k=fo.cold_neighbours, seed=opts.training.seed)
        if cold.any() and views and fo.cold_neighbours > 0
        else None
    )
    return _Study(data, opts, experiment, views, cold, rule)


def _content_views(data, opts: PaperTableOptions) -> dict:
    """The items' content views; none where the data has no content and no store is given (the fusion rows and
    the content-only ranker are then left out, and the backbones alone still run)."""
    from ...fedvlr.views import content_remedy, load_views

    fo = opts.fedvlr
    views = load_views(
        data, fo.views, list(fo.fusion_views) if fo.fusion_views else None, progress=opts.progress, optional=True
    )
    if not views:
        if all(v in FUSION_VARIANTS for v in opts.variants):
            raise ConfigError(
                "--variants",
                f"every variant asked for ({', '.join(opts.variants)}) fuses item content, and {data.name} has none",
                f"{content_remedy(data)}, or add none,fedgrad",
            )
        print(
            f"paper-table: {data.name} has no item content: the fusion rows and the content-only ranker are left "
            f"out ({content_remedy(data)} to have them)",
            file=sys.stderr,
        )
    return views


def _add_references(study: _Study) -> None:
    """pop, random, antipop and the content-only ranker: deterministic (random is seeded), evaluated once."""
    from ...evaluation import reference_scorer

    exp, seed = study.experiment, study.seed
    scorers = {m.name: reference_scorer(m.name, study.data, seed=seed) for m in (Pop(), Random(), AntiPop())}
    if study.views:  # the cold-start study's content-only ranker
        scorers["content"] = ContentRanker(study.data, study.views)
    for name, scorer in scorers.items():
        study.tests[name] = [exp.test(scorer, seed)]
        if study.cold.any():
            study.among[name] = [exp.test(RestrictedScorer(scorer, study.cold), seed)]
    study.references = list(scorers)


def _refused_rows(study: _Study) -> dict[str, str]:
    """Fusion rows of backbones the layer cannot wrap, or of data without content -> the reason."""
    from ...adapters import make_backbone
    from ...fedvlr import wrap_refusal

    skipped = {}
    for backbone in study.opts.backbones:
        why = wrap_refusal(make_backbone(backbone, study.data.n_items, study.opts.training.dim))
        why = why if study.views else f"{study.data.name} has no item content to fuse"
        for variant in study.opts.variants:
            if variant in FUSION_VARIANTS and why:
                skipped[row_label(backbone, variant)] = why
    return skipped


def _recipes(study: _Study, skipped: dict):
    """(recipe, variant) of every row to train, in table order."""
    from ...fedvlr import FusionLayer

    base, opts = study.opts.training, study.opts
    for backbone in opts.backbones:
        for variant in opts.variants:
            label = row_label(backbone, variant)
            if label in skipped:
                print(f"paper-table: skipping {label}: {skipped[label]}", file=sys.stderr)
                continue
            start = base
            if variant == "fedgrad":  # the layer's aggregation and default server lr, unless overridden
                start = replace(base, strategy="fedgrad", server_lr=base.server_lr or FusionLayer.default_server_lr)
            row = config_for_row(start, opts.overrides, backbone, variant)
            train = {f.name: getattr(row, f.name) for f in fields(row) if getattr(row, f.name) != getattr(base, f.name)}
            own = dict(opts.backbone_options.get(backbone, {}))
            if variant not in FUSION_VARIANTS:
                yield Model(backbone, label, train, backbone_options=own), variant
            else:
                yield (
                    FedVLR(
                        Model(backbone, backbone, train, backbone_options=own),
                        study.views,
                        label=label,
                        options=opts.fedvlr,
                        mode=variant,
                    ),
                    variant,
                )


def config_for_row(base_cfg, overrides, backbone: str, variant: str):
    """``base_cfg`` with the overrides whose selector names this backbone, this variant or both."""
    from ...federation.config import FedConfig

    cfg = base_cfg
    types = {f: type(getattr(FedConfig(), f)) for f in vars(FedConfig())}
    for sel, name, value in overrides:
        if sel not in (backbone, variant, f"{backbone}+{variant}"):
            continue
        if name not in types:
            raise ConfigError(
                f"--override {sel}:{name}",
                f"unknown training field {name!r}",
                "fields are FedConfig's, e.g. lr, server_lr, rounds, dim",
            )
        kind = float if name in ("lr", "server_lr", "item_lr_scale") else types[name]
        try:
            cfg = replace(cfg, **{name: None if value.lower() == "none" else kind(value)})
        except ValueError as exc:  # not a number, or out of FedConfig's range
            raise ConfigError(f"--override {sel}:{name}={value}", str(exc)) from None
    return cfg


# ---------------------------------------------------------------------------------------------- training
def _train_rows(study: _Study, rows: list) -> None:
    """Every seed of every row, side by side in worker processes where ``--jobs`` allows (each run builds from its
    arguments and all randomness is keyed by seed and round: the same figures as one run after another), then
    collected row by row in table order."""
    from ...federation.runs.parallel import map_jobs, worker_count

    runs = [(recipe, variant, study.seed + i) for recipe, variant in rows for i in range(study.experiment.seeds)]
    workers = worker_count(study.opts.jobs, len(runs))  # (one for --jobs 1 or a single run)
    if workers > 1:
        print(
            f"paper-table: {len(runs)} runs ({len(rows)} rows x {study.experiment.seeds} seeds) side by side in "
            f"{workers} worker processes",
            file=sys.stderr,
            flush=True,
        )
        lean = for_workers(study)
        names = [f"{recipe.label} seed {seed}" for recipe, _, seed in runs]
        done = map_jobs(_train_seed_job, [(lean, *run) for run in runs], workers, names=names, what="paper-table")
    else:
        done = [_train_seed(study, *run) for run in runs]
    per_row = study.experiment.seeds
    for k, (recipe, _) in enumerate(rows):
        _collect_row(study, recipe, done[k * per_row : (k + 1) * per_row])


def for_workers(study: _Study) -> _Study:
    """What a worker needs of the study: without the results collected so far, and without progress bars (several
    workers would write over each other's)."""
    experiment = copy.copy(study.experiment)
    experiment.progress = False
    return replace(
        study,
        experiment=experiment,
        opts=replace(study.opts, progress=False),
        tests={},
        among={},
        selected={},
        routers={},
    )


def _train_seed_job(job: tuple) -> dict:
    """:func:`_train_seed` of one ``(study, recipe, variant, seed)`` (module level: a worker process calls it)."""
    return _train_seed(*job)


def _collect_row(study: _Study, recipe: Model, seeds: list[dict]) -> None:
    """A row's seeds into the study; its cold-rule twin when every seed could be scored with the rule."""
    label = recipe.label
    study.tests[label] = [s["test"] for s in seeds]
    study.selected[label] = [s["round"] for s in seeds]
    if all(s.get("cold") is not None for s in seeds):
        study.among[label] = [s["cold"] for s in seeds]
    ruled = [s["with_rule"] for s in seeds if s.get("with_rule") is not None]
    if ruled and len(ruled) == len(seeds):
        study.tests[rule_label(label)] = [r[0] for r in ruled]
        study.among[rule_label(label)] = [r[1] for r in ruled]
        study.selected[rule_label(label)] = study.selected[label]
    if any("router" in s for s in seeds):
        study.routers[label] = [s["router"] for s in seeds if "router" in s]


def _train_seed(study: _Study, recipe: Model, variant: str, seed: int) -> dict:
    """One seed of one row, trained or read back from its run folder, with what its selected round adds."""
    folder = study.opts.folder / "runs" / recipe.label / f"seed-{seed}" if study.opts.folder else None
    extra = {}

    def on_round(run, record):
        if run.best is not None and run.best["round"] == record["round"]:
            extra.update(_selected_extra(study, run, variant))
            if folder is not None:
                save_selected_extra(run, extra)  # what the selected round adds, kept for resume

    run = study.experiment.start(recipe, seed, folder=folder, on_round=on_round)
    start_from = study.continued.get(recipe.label) if seed == study.seed else None
    if start_from is not None and run.continue_from(start_from):
        print(
            f"paper-table: {recipe.label} seed {seed} goes on from its tuning run at round {run.round}",
            file=sys.stderr,
            flush=True,
        )
    elif folder is not None and run.folder.has_checkpoint():
        refuse_started_runs(study.opts.folder, [folder], study.opts.resume)
        run.load_checkpoint()
        extra.update(load_selected_extra(run) or {})
    run.run()
    return {**extra, "test": study.experiment.selected_test(run), "round": int(run.best["round"])}


def _selected_extra(study: _Study, run, variant: str) -> dict:
    """At the selected round: cold targets among cold items, the router's report (FedVLR), and the backbone
    alone scored with the layer's cold-item rule."""
    from ...fedvlr import router_report

    exp, cold = study.experiment, study.cold
    extra = {"cold": exp.test(RestrictedScorer(run.scorer(), cold), study.seed) if cold.any() else None}
    if variant == "fedvlr":
        extra["router"] = router_report(run)
    if study.rule is not None and variant not in FUSION_VARIANTS:
        extra["with_rule"] = _with_rule(run, study.rule, exp, cold)
    return extra


def _with_rule(run, rule, experiment: Experiment, cold):
    """Test results of ``run`` with the cold rows of every item table it scores with filled by ``rule`` (all
    targets, and cold targets among cold items): the shared tables, and per user the private ones (PFedRec's
    fine-tuned copy, FedRAP's ``A_u``), each from the same table's neighbour rows. None when the simulator cannot
    rewrite private tables and the backbone has some."""
    import torch

    from ...coldstart.rules import apply_to_tables

    bb = run.bb
    private_tables = {s.name for s in bb.all_specs() if s.item_table and not s.shared} | set(
        bb.personal_copies.values()
    )
    shared = apply_to_tables(bb, run.shared, rule)

    def per_user(name, stacked):  # [B, n_items, ...]: each user's cold rows from the same user's table
        return torch.stack([rule.apply(t) for t in stacked]) if name in private_tables else stacked

    if private_tables and not getattr(run.sim, "maps_private", False):
        return None
    kw = {"private_map": per_user} if private_tables else {}

    def score(users):
        return run.sim.scores(np.asarray(users, dtype=np.int64), shared, **kw)

    return (experiment.test(score, experiment.seed), experiment.test(RestrictedScorer(score, cold), experiment.seed))


# ---------------------------------------------------------------------------------------------- the table
def _results(study: _Study) -> tuple[ExperimentResult, ExperimentResult]:
    """The API's result objects of the rows: test targets (all, warm, cold), and cold targets among cold items."""
    keys, name = list(study.experiment.keys), study.data.name
    return (
        ExperimentResult(name, keys, study.tests, references=study.references, ci_seed=study.seed),
        ExperimentResult(name, keys, study.among, references=study.references, ci_seed=study.seed),
    )


def _rows(study: _Study, tests: ExperimentResult, among: ExperimentResult) -> list[dict]:
    """One row per model and part that has users: mean over seeds, sd across seeds, bootstrap CI over users."""
    keys = tests.metrics
    tables = {p: tests.table(p) for p in ("all", "warm", "cold")}
    tables["cold_among_cold"] = among.table("cold") if among.per_seed else None
    rows = []
    for model in tests.models:
        for part in PARTS:
            source, which = (among, "cold") if part == "cold_among_cold" else (tests, part)
            if model not in source.per_seed or not len(source.per_user(model, which)):
                continue
            t = tables[part].loc[model]
            row = {"model": model, "part": part, "n_users": int(t["users"]), "seeds": int(t["seeds"])}
            for k in keys:
                row[k] = float(t[k])
                row[f"{k}_std"] = float(t[f"{k}_sd"])
                row[f"{k}_ci"] = list(t[f"{k}_ci"])
            row["kind"] = "reference" if model in study.references else "federated"
            rows.append(row)
    return rows


def _paired_tests(study: _Study, tests: ExperimentResult, among: ExperimentResult) -> dict:
    """FedVLR (and the single MLP) against the backbone alone, its fedgrad twin and their cold-rule rows; FedVLR
    against the content-only ranker (every part), and on cold targets among cold items against the content-only
    ranker and the cold-rule rows."""
    keys, out = tests.metrics, {}

    def has(result, model, which):
        return model in result.per_seed and len(result.per_user(model, which)) > 0

    def by_part(a, b):
        """``a`` against ``b`` on every part both have targets in."""
        return {
            part: {k: tests.paired(a, b, k, part) for k in keys}
            for part in ("all", "warm", "cold")
            if has(tests, a, part) and has(tests, b, part)
        }

    for backbone in study.opts.backbones:
        fedvlr = row_label(backbone, "fedvlr")
        pairs = [(row_label(backbone, v), backbone) for v in FUSION_VARIANTS]
        pairs.append((fedvlr, row_label(backbone, "fedgrad")))
        pairs += [(fedvlr, row_label(backbone, v)) for v in ROUTER_ABLATION]
        pairs += [(fedvlr, rule_label(row_label(backbone, v))) for v in ("none", "fedgrad")]
        for a, b in pairs:
            if a in study.selected and b in study.selected:
                out[f"{a} vs {b}"] = by_part(a, b)
        if fedvlr not in study.selected:
            continue
        against_content = by_part(fedvlr, "content")
        if against_content:
            out[f"{fedvlr} vs content"] = against_content
        for b in ["content"] + [rule_label(row_label(backbone, v)) for v in ("none", "fedgrad")]:
            if has(among, fedvlr, "cold") and has(among, b, "cold"):
                out[f"{fedvlr} vs {b} (cold among cold)"] = {
                    "cold": {k: among.paired(fedvlr, b, k, "cold") for k in keys}
                }
    return out


def _sparsity(study: _Study, tests: ExperimentResult) -> dict:
    """Every row by users' history length, each FedVLR row paired with its fedgrad twin and its backbone alone."""
    train_counts = study.data.user_history_length("train")
    pairs = [(row_label(b, "fedvlr"), row_label(b, v)) for b in study.opts.backbones for v in ("fedgrad", "none")]
    return sparsity_section(tests, train_counts, [p for p in pairs if set(p) <= set(study.selected)])


def _result(study: _Study, skipped: dict, row_configs: dict) -> dict:
    tests, among = _results(study)
    exp, opts = study.experiment, study.opts
    base = exp.config(Model("", "table"), study.seed)  # the settings every row starts from
    result = {
        "dataset": study.data.name,
        "protocol": "full",
        "mask_history": base.mask_history,
        "metrics": list(exp.keys),
        "seeds": [study.seed + i for i in range(exp.seeds)],
        "backbones": list(opts.backbones),
        "variants": list(opts.variants),
        "rows": _rows(study, tests, among),
        "paired_tests": _paired_tests(study, tests, among),
        "selected_round": study.selected,
        "router": {k: v[0] if len(v) == 1 else v for k, v in study.routers.items()},
        "config": base.to_dict(),
        "row_configs": row_configs,
        "overrides": [list(o) for o in opts.overrides],
        "n_cold_items": int(study.cold.sum()),
        "skipped": skipped,
        "sparsity": _sparsity(study, tests),
    }
    result["notes"] = table_notes(result)
    return result
