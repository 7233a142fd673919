"""The cold-start study of one backbone (``fedvlr-plus coldstart``): which data it splits how, which models it
trains, and the item and user experiments of :mod:`.experiment` run on them.

Without ``cold_items`` / ``cold_users`` the data's own split is used (leave-one-out when it has none); its natural
cold targets (KU: items that occur only in valid/test) are then the item cold-start test. The models are the
Python API's recipes (:class:`~fedvlr_plus.api.FedVLR` around the backbone), so this study builds the layer as
every other path does.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..metric_spec import parse_metrics


@dataclass(frozen=True)
class StudySplit:
    """How the data is read and split: a cold-item split, a cold-user hold-out, both, or the data's own split."""

    source: str
    cold_items: float | None = None
    cold_users: float | None = None
    #: held-out users need more history than the largest support size
    min_history: int = 6
    implicit_threshold: float | None = None
    k_core: int = 0
    split_seed: int = 0


def load_study_splits(split: StudySplit) -> dict:
    """``{"items": (data, how)}`` and/or ``{"users": (full, warm, held_out)}`` for the study's experiments."""
    from ..phases import phase, start_up_done

    start_up_done()
    with phase("loading"):
        return _load_study_splits(split)


def _load_study_splits(split: StudySplit) -> dict:
    from ..datasets import load, splits
    from .splits import cold_item_loo, cold_user_holdout

    data = load(split.source)

    def prepared():
        d = splits.dedup(splits.implicit(data, split.implicit_threshold))
        return splits.k_core(d, split.k_core) if split.k_core > 1 else d

    out = {}
    if split.cold_items is not None:
        out["items"] = (
            cold_item_loo(prepared(), split.cold_items, seed=split.split_seed),
            f"cold-items {split.cold_items}",
        )
    if split.cold_users is not None:
        d = prepared()
        warm, held = cold_user_holdout(d, split.cold_users, seed=split.split_seed, min_history=split.min_history)
        out["users"] = (d, warm, held)
    if not out:
        if data.is_split:
            d, how = splits.predefined(data), "predefined"
        else:
            d, how = splits.leave_one_out(prepared()), "loo"
        out["items"] = (d, f"{how} (natural cold targets)")
    return out


@dataclass(frozen=True)
class ColdStartOptions:
    """The study's settings. ``training``: every run's FedConfig (its ``seed``/``seeds``: the study's seeds);
    ``fusion``: ``none`` or a FedVLR mode; ``fedvlr``: the layer's options (and where the content views come from,
    used by the content rules and ranker even without the layer); ``with_backbone``: also train the backbone
    alone; ``cold_rule``: ``auto`` (chosen on validation for the layer, none for the backbone) or a rule;
    ``command``: the command line, recorded in the result."""

    split: StudySplit
    backbone: str
    training: object
    fedvlr: object
    metrics: list[str]
    fusion: str = "none"
    with_backbone: bool = False
    support: tuple = (1, 3, 5)
    #: a joining user's local epochs, or "auto": chosen on validation users (.support_epochs)
    support_epochs: int | str = 20
    #: a joining user's private state starts from its own draw or the trained clients' mean (.population)
    new_user_start: str = "population"
    #: ``popularity``: a log-popularity prior added to a joining user's logits, its weight chosen on validation
    #: joining users (.popularity_prior); ``none``: the model's scores alone
    new_user_prior: str = "none"
    #: the backbone's own options (FedRAP's penalties)
    backbone_options: dict = field(default_factory=dict)
    cold_rule: str = "auto"
    cold_select: str = "ndcg@10"
    #: choose the fusion layer's recipe on the training data's validation split first (fedvlr_plus.fedvlr.tuning)
    tune: bool = False
    #: cut the tuning grid by successive halving (fedvlr_plus.fedvlr.halving); False: every recipe to the end
    halving: bool = False
    progress: bool = True
    command: str | None = None
    #: worker processes training the seeds side by side (fedvlr_plus.coldstart.seeds); None: as the cores allow
    jobs: int | None = 1
    #: where every finished seed (and the tuner's choice) is saved as it finishes (.finished), and whether the
    #: steps already there are read back
    folder: Path | None = None
    resume: bool = False


@dataclass(frozen=True)
class _Built:
    """``data -> backbone``: ``model`` (an API recipe) built under ``cfg``; a class, not a lambda, so that a worker
    process can be sent it."""

    model: object
    cfg: object

    def __call__(self, data):
        return self.model.build(data, self.cfg)


def _recipe(opts: ColdStartOptions, fusion: str, cfg, views: dict | None = None):
    """``data -> backbone`` of one trained model: the backbone's name, or the API's FedVLR recipe built. ``views``:
    the study's views, loaded once (None: each build loads them as the options say)."""
    from ..api import FedVLR, Model

    base = Model(opts.backbone, opts.backbone, backbone_options=dict(opts.backbone_options))
    if fusion == "none":
        return _Built(base, cfg)
    label = f"{opts.backbone}+{fusion}"
    return _Built(FedVLR(base, views or None, options=opts.fedvlr, mode=fusion, label=label), cfg)


def _views(opts: ColdStartOptions, data) -> dict:
    """The items' content views; none for a backbone alone on data without content (the content-only ranker and
    the cold rules are then left out), which a cold-item split cannot do without."""
    from ..fedvlr.views import load_views

    fo = opts.fedvlr
    views = load_views(
        data,
        fo.views,
        list(fo.fusion_views) if fo.fusion_views else None,
        progress=opts.progress,
        optional=opts.fusion == "none",
    )
    if not views:  # a backbone alone on data without content
        if opts.split.cold_items is not None:
            raise _no_content_for_cold_items(data)
        print(f"{data.name} has no item content: the study goes on without the content-only ranker", file=sys.stderr)
        return {}
    return {k: v for k, v in views.items() if k not in set(fo.drop_modality)}


def _no_content_for_cold_items(data):
    from ..errors import ConfigError
    from ..fedvlr.views import content_remedy

    return ConfigError(
        "--cold-items",
        f"{data.name} has no item content, so nothing can place the items that "
        "no one has interacted with (the cold rules and the content-only ranker read their content)",
        f"{content_remedy(data)}, pass --views DIR with a view store of the same items, or study "
        "joining users alone with --cold-users",
    )


def _spec_and_config(opts: ColdStartOptions):
    """The evaluation (the requested metrics and the cold-rule selection metric) and the runs' FedConfig."""
    from .experiment import EvalSpec

    names, ks, keys = parse_metrics(",".join(opts.metrics))
    if opts.cold_select.lower() not in keys:
        names, ks, keys = parse_metrics(",".join(keys + [opts.cold_select.lower()]))
    spec = EvalSpec(ks=ks, metrics=names, keys=tuple(keys), seed=opts.training.seed)
    cfg = replace(opts.training, ks=tuple(ks), metrics=tuple(dict.fromkeys(list(names) + ["hr"])))
    return spec, cfg


def run_coldstart(opts: ColdStartOptions, log=None) -> dict:
    """The whole study; returns the JSON-ready result. With ``opts.folder`` every step is saved there as it
    finishes (the folder locked meanwhile), and with ``opts.resume`` the finished ones are read back."""
    from ..federation.runs.folder import locked

    with locked(opts.folder) if opts.folder is not None else nullcontext():
        return _run_study(opts, log)


def _run_study(opts: ColdStartOptions, log) -> dict:
    from ..data_identity import split_digest
    from .finished import FinishedSteps, study_settings

    spec, cfg = _spec_and_config(opts)
    parts = load_study_splits(opts.split)
    any_data = parts["items"][0] if "items" in parts else parts["users"][1]
    finished = None
    if opts.folder is not None:
        finished = FinishedSteps(Path(opts.folder), study_settings(opts, split_digest(any_data)))
        finished.refuse_started(opts.resume)
    views = _views(opts, any_data)
    result = {
        "dataset": any_data.name,
        "backbone": opts.backbone,
        "fusion": opts.fusion,
        "model": opts.backbone if opts.fusion == "none" else f"{opts.backbone}+{opts.fusion}",
        "seeds": list(range(cfg.seed, cfg.seed + cfg.seeds)),
        "metrics": list(spec.keys),
        "views": sorted(views),
        "config": cfg.to_dict(),
        "command": opts.command,
    }
    fusions = [opts.fusion] + (["none"] if opts.with_backbone and opts.fusion != "none" else [])
    for fusion in fusions:
        target = result if fusion == opts.fusion else result.setdefault("backbone_alone", {"model": opts.backbone})
        model_opts, model_cfg = opts, cfg
        if opts.tune and fusion != "none":
            model_opts, model_cfg, result["tuning"] = _tuned(opts, fusion, cfg, any_data, log, parts, views, finished)
        _study_one_model(model_opts, fusion, parts, views, spec, model_cfg, target, log, finished)
    _pair_joining_users(result, spec.keys)
    _pair_cold_items(result, spec.keys)
    return result


def _pair_cold_items(result: dict, keys) -> None:
    """Paired tests of the layer's cold-item headline against the backbone alone and the content-only ranker, and
    the per-user frames they came from moved out of the JSON result to ``result[COLD_ITEM_FRAMES]`` (the report
    folder keeps them, so that studies on other draws of the cold items can be pooled)."""
    from .paired import COLD_ITEM_FRAMES, PER_USER, paired_cold_items

    alone = result.get("backbone_alone")
    if PER_USER in result and result.get("fusion", "none") != "none":
        result["paired_cold_items"] = paired_cold_items(result, alone, keys)
    names = (result.get("model", "model"), result.get("backbone", "backbone") + "-alone")
    for name, res in zip(names, (result, alone or {})):
        if PER_USER in res:
            result.setdefault(COLD_ITEM_FRAMES, {})[name] = res.pop(PER_USER)


def _pair_joining_users(result: dict, keys) -> None:
    """Paired tests of the layer against the backbone alone on the joining users (when both were trained), and
    the per-user frames they came from moved out of the JSON result to ``result[JOINING_FRAMES]`` (the report
    folder keeps them, so that two studies can be paired too)."""
    from .paired import JOINING_FRAMES, PER_USER, paired_against_backbone

    layer = result.get("user_coldstart")
    alone = result.get("backbone_alone", {}).get("user_coldstart")
    if layer is not None and alone is not None:
        layer["paired_vs_backbone"] = paired_against_backbone(layer, alone, keys)
    for name, uc in ((result.get("model", "model"), layer), (result.get("backbone", "backbone") + "-alone", alone)):
        if uc is not None and PER_USER in uc:
            result.setdefault(JOINING_FRAMES, {})[name] = uc.pop(PER_USER)


def _tuned(opts: ColdStartOptions, fusion: str, cfg, data, log, parts: dict | None = None, views=None, finished=None):
    """The layer's recipe chosen for the first seed on ``data``'s validation split (the study's training data: the
    cold-item split, else the warm users'): in an item study with cold validation targets, on the figure the study
    reports (the ``cold_select`` metric among cold items, best cold rule); in a new-user study, on its validation
    joining users; else on the run's own validation metric. Returns the options and config the study then trains
    with, and the tuning report. Flags the user passed stay fixed; the backbone alone keeps its own settings. The
    recipes of a budget train side by side in worker processes where ``opts.jobs`` allows (the same scores)."""
    from ..fedvlr.halving import budgets as halving_budgets
    from ..fedvlr.halving import budgets_note, successive_halving
    from ..fedvlr.tuning import Recipe, candidate_recipes, fixed_by, tries_id_dropout

    saved = finished.load(f"tuning-{fusion}") if finished is not None else None
    if saved is not None:  # (a resumed study: the recipe its tuner chose)
        if log:
            log(f"tuning: kept recipe {saved['report']['selected']}, read back from {finished.folder}")
        return (*_with_point(opts, cfg, Recipe(**saved["recipe"])), saved["report"])
    fo = opts.fedvlr
    # a new-user study scores joining users, not items: the warm users' data may lack items only newcomers touched,
    # but ranking those is not what it measures
    cold_items = "items" in (parts or {}) and tries_id_dropout(data)
    # a weight decay of 0 is the config's default, so only a non-zero one counts as fixed
    points = candidate_recipes(
        lr=cfg.lr,
        server_lr=cfg.server_lr,
        **fixed_by(fo),
        cold_items=cold_items,
        weight_decay=cfg.weight_decay or None,
        backbone=opts.backbone,
    )
    rate = _Rate(opts, cfg, parts, views)
    joining, among_cold = rate.ratings()
    metric = _tuning_metric(opts, cfg, joining, among_cold)
    budgets = halving_budgets(cfg, opts.halving)
    if log:
        log(f"tuning: {len(points)} recipes on seed {cfg.seed}, on {metric}" + budgets_note(budgets))
    announce = (lambda point, rounds: log(f"tuning: recipe {point.name} up to round {rounds}")) if log else None
    score = _scorer_of(joining, among_cold)
    # in a study folder the candidates train in DIR/runs/, so a grid killed midway goes on where it stopped
    root = finished.run_path(f"tuning-{fusion}") if finished is not None else None
    build = _Candidate(opts, fusion, cfg, views)
    with _trainer(opts, build, rate, score, data, len(points), announce, log, root) as train_to:
        report = successive_halving(points, train_to, budgets=budgets, metric=metric, seed=cfg.seed, on_rung=_cut(log))
    if log:
        log(f"tuning: kept recipe {report.selected} ({report.scores_line()})")
    out = report.to_json()
    if joining is not None:
        out["split"] = "validation joining users (a seeded third of the held-out users, never reported)"
    if finished is not None:
        finished.save(f"tuning-{fusion}", {"report": out, "recipe": asdict(report.chosen)})
        shutil.rmtree(root, ignore_errors=True)  # the choice is saved: its candidates are not read again
    return (*_with_point(opts, cfg, report.chosen), out)


@contextmanager
def _trainer(opts: ColdStartOptions, build, rate, score, data, n_points: int, announce, log, root=None):
    """The tuner's ``train_to``: each recipe going on from its own folder under ``root`` (the study's, kept
    between calls) or a temporary one, in worker processes where ``opts.jobs`` gives more than one; without
    ``root`` and with one worker, one after another, kept in memory between budgets. ``rate``: the :class:`_Rate`
    a worker builds its scoring from; ``score``: the scoring built here."""
    from ..federation.runs.parallel import worker_count
    from .tune_halving import folder_trainer, in_memory_trainer

    workers = worker_count(opts.jobs, n_points)  # (one for --jobs 1 or a single recipe)
    if root is not None:
        yield folder_trainer(data, build, rate, Path(root), workers, announce)
        return
    if workers == 1:
        yield in_memory_trainer(
            data, lambda point: build(point, data), score, progress=opts.progress, announce=announce
        )
        return
    if log:
        log(f"tuning: the recipes of each budget side by side in {workers} worker processes")
    with tempfile.TemporaryDirectory(prefix="fedvlr-coldstart-tuning-") as root:
        yield folder_trainer(data, build, rate, Path(root), workers, announce)


def _with_point(opts: ColdStartOptions, cfg, point):
    """The study's options and config with a grid point's recipe."""
    decay = cfg.weight_decay if point.weight_decay is None else point.weight_decay
    return (
        replace(opts, fedvlr=point.layer_options(opts.fedvlr)),
        replace(cfg, lr=point.lr, server_lr=point.server_lr, weight_decay=decay),
    )


@dataclass(frozen=True)
class _Candidate:
    """``(point, data) -> (model, config)`` of one grid point, trained for one seed (a class, so that a worker
    process can be sent it)."""

    opts: ColdStartOptions
    fusion: str
    cfg: object
    views: dict | None = None

    def __call__(self, point, data):
        o, c = _with_point(self.opts, self.cfg, point)
        c = replace(c, seeds=1)
        return _recipe(o, self.fusion, c, self.views)(data), c


@dataclass(frozen=True)
class _Rate:
    """How the tuning rates a candidate run at its selected round: its validation joining users in a new-user
    study, its best cold rule among cold items in an item study with cold validation targets, else the run's own
    validation metric. A worker process builds the same scoring function from it (:meth:`scorer`)."""

    opts: ColdStartOptions
    cfg: object
    parts: dict | None
    views: object

    def ratings(self) -> tuple:
        """``(joining, among_cold)``: the joining users' rating of a new-user study, else None and the cold items'
        rating (None too where the validation split has no cold target)."""
        joining = _joining_validation(self.opts, self.parts, self.cfg) if self.parts is not None else None
        return joining, (_cold_item_validation(self.opts, self.parts, self.views) if joining is None else None)

    def scorer(self):
        """``run -> score`` (see the class)."""
        return _scorer_of(*self.ratings())


def _scorer_of(joining, among_cold):
    """The first rating that applies (:meth:`_Rate.ratings`), else the run's own validation metric."""
    return joining or among_cold or _best_valid


def _best_valid(run) -> float:
    return run.best["metric"]


def _tuning_metric(opts: ColdStartOptions, cfg, joining, among_cold) -> str:
    """What the tuning rates a recipe by, as its report names it."""
    if joining:
        return f"{opts.cold_select.lower()} of validation joining users"
    if among_cold:
        return f"valid {opts.cold_select.lower()} among cold items (best cold rule)"
    return cfg.valid_metric


def _cut(log):
    """``on_rung`` of the tuning: the recipes kept and stopped at a budget, with their scores."""
    from ..fedvlr.halving import cut_line

    def cut(budget, kept, stopped, scores) -> None:
        if log:
            log(f"tuning: {cut_line(budget, kept, stopped, scores)}")

    return cut


def _cold_item_validation(opts: ColdStartOptions, parts: dict | None, views):
    """``run -> score`` of a recipe for an item study: the figure it reports, validation ``cold_select`` among cold
    items under the best cold rule (:func:`.experiment.best_rule_valid_score`); None without an item study,
    content views or cold validation targets."""
    if not parts or "items" not in parts or not views:
        return None
    from .experiment import best_rule_valid_score

    spec, _ = _spec_and_config(opts)
    return best_rule_valid_score(
        parts["items"][0], views, spec, opts.cold_select.lower(), max(opts.fedvlr.cold_neighbours, 1)
    )


def _joining_validation(opts: ColdStartOptions, parts: dict, cfg):
    """``run -> score`` of a recipe for a new-user study (only users held out, no cold items): its validation
    joining users' mean score over the support sizes (:mod:`.tune_joining`); None for any other study."""
    if "users" not in parts or "items" in parts:
        return None
    from .popularity_prior import log_popularity
    from .splits import support_query
    from .support_epochs import split_joining_users
    from .tune_joining import joining_valid_score

    full, warm, held = parts["users"]
    spec, _ = _spec_and_config(opts)
    valid_users, _ = split_joining_users(held, spec.seed)
    joins = {n: support_query(full, held, n) for n in opts.support}
    prior = log_popularity(warm.item_popularity("train")) if opts.new_user_prior == "popularity" else None
    return lambda run: joining_valid_score(
        run,
        joins,
        valid_users,
        spec,
        epochs=opts.support_epochs,
        start=opts.new_user_start,
        metric=opts.cold_select.lower(),
        prior=prior,
    )


def _study_one_model(opts, fusion: str, parts: dict, views: dict, spec, cfg, target: dict, log, finished=None) -> None:
    """The item and/or user experiments of one model, written into ``target`` (each seed saved in ``finished``)."""
    from .experiment import item_coldstart, rules_for, user_coldstart
    from .rules import plain_rule

    make = _recipe(opts, fusion, cfg, views)
    who = fusion if fusion != "none" else "backbone alone"
    # how the seeds train and where they are kept, the same for both studies
    runs = dict(progress=opts.progress, log=log, jobs=opts.jobs, finished=finished, model_label=fusion)
    if "items" in parts:
        data, how = parts["items"]
        rule = (
            None
            if opts.cold_rule == "auto" and fusion != "none"
            else ("none" if opts.cold_rule == "auto" else opts.cold_rule)
        )
        if fusion == "none":
            rule = plain_rule(rule)  # a backbone's item rows are its output: the same estimate
        if log:
            log(f"item cold-start, {who}: {how}")
        rules = rules_for(fusion != "none") if views else ()  # every rule reads the items' content
        res = item_coldstart(
            data,
            make,
            cfg,
            views,
            spec=spec,
            rules=rules,
            neighbours_k=max(opts.fedvlr.cold_neighbours, 1),
            select_metric=opts.cold_select.lower(),
            default_rule=rule,
            **runs,
        )
        res["split"] = how
        target.update(res)
    if "users" in parts:
        full, warm, held = parts["users"]
        if log:
            log(f"user cold-start, {who}: {len(held)} held-out users")
        target["user_coldstart"] = user_coldstart(
            full,
            warm,
            held,
            make,
            cfg,
            views,
            spec=spec,
            supports=opts.support,
            epochs=opts.support_epochs,
            start=opts.new_user_start,
            select_metric=opts.cold_select.lower(),
            hold_valid=opts.tune,
            prior=opts.new_user_prior,
            **runs,
        )
        if "items" not in parts:
            target["sparsity"] = target["user_coldstart"]["sparsity"]
            target["sparsity_targets"] = "all"
