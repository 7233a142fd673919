"""Cold-start experiments on the project's one protocol and evaluator (:func:`fedvlr_plus.evaluation.evaluate`):

- **item cold-start** (:func:`item_coldstart`): a federated model is trained and selected on validation as in
  ``fedvlr-plus run``; at the selected round its test targets are scored (a) among all items, the user's training
  items masked, and (b) among the cold items only (every warm item removed from the candidates). Cold items get
  their ID rows from one of the server-side :mod:`rules <fedvlr_plus.coldstart.rules>`; the rule of the headline
  figure is chosen on the *validation* cold targets (never on test); every rule is reported.
- **user cold-start** (:func:`user_coldstart`): held-out users join after federated training with ``n`` support
  interactions; with the shared state frozen they train only their private parts (head, user embedding, router)
  locally, then rank the rest of their history among all items, their support masked.
- **sparsity buckets** (:func:`sparsity_table`): per-user test results by the user's number of training
  interactions (the FedVLR paper's Fig. 2c grouping).

Several seeds: the split is fixed (``split_seed``); training seeds vary. A user's value is averaged over seeds,
means are over users, and 95% intervals are bootstrap intervals over users of those averages; ``sd_seeds`` is the
spread of the per-seed means.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import torch

from ..evaluation import evaluate, reference_scorer
from ..evaluation.stats import bootstrap_cis, per_user_mean
from ..phases import phase
from .content import ContentRanker, RestrictedScorer
from .paired import PER_USER
from .rules import FUSED_RULES, RULES, apply_to_tables, make_rule

BUCKETS = (0, 10, 20, 50, 100, 200, 500)


@dataclass
class EvalSpec:
    ks: tuple = (10, 50)
    metrics: tuple = ("hr", "ndcg")
    keys: tuple = ("hr@10", "ndcg@10", "hr@50", "ndcg@50")
    seed: int = 0
    mask_history: str = "train"
    #: the evaluator's cache of the last data evaluated: a study scores one split many times (every rule, every
    #: part, every seed), and reading its targets and masks afresh each time cost a sixth of its evaluations
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def run(self, data, scorer, split: str):
        with phase("evaluation"):
            return evaluate(data, scorer, split=split, protocol="full", ks=self.ks, metrics=self.metrics,
                            mask_history=self.mask_history, seed=self.seed, cache=self._cache_of(data))

    def _cache_of(self, data) -> dict:
        """The evaluator's cache for ``data``, new whenever another data object (or frame) is evaluated."""
        key = (id(data), id(data.inter))
        if self._cache.get("key") != key:
            # the data object is kept with its key, so its id cannot be reused while the cache is alive
            self._cache.clear()
            self._cache.update(key=key, data=data, evaluator={})
        return self._cache["evaluator"]


# ---------------------------------------------------------------------- summaries over users and seeds
def summarise(frames: list[pd.DataFrame], keys) -> dict:
    """``metric -> {mean, ci, sd_seeds, n_users}`` from one per-user frame per seed."""
    frames = [f for f in frames if f is not None]
    if not frames or not any(len(f) for f in frames):
        return {k: {"mean": None, "ci": [None, None], "sd_seeds": None, "n_users": 0} for k in keys}
    per_user = per_user_mean(frames, keys)
    values = {k: per_user[k].to_numpy(np.float64) for k in keys}
    cis = bootstrap_cis(values, seed=0)   # the users drawn once for every metric; each interval as alone
    out = {}
    for k, v in values.items():
        seeds = [float(f[k].mean()) for f in frames if len(f)]
        out[k] = {"mean": float(v.mean()), "ci": [float(x) for x in cis[k]],
                  "sd_seeds": float(np.std(seeds, ddof=1)) if len(seeds) > 1 else 0.0, "n_users": int(len(v))}
    return out


def _means(summary: dict) -> dict:
    return {k: v["mean"] for k, v in summary.items()}


# ---------------------------------------------------------------------- training with the selected state kept
def keepable(cfg):
    """``cfg`` with a private store whose selected round can be kept aside: the selected round's states are kept
    as a snapshot, which a disk store (one file per client) is not; a table store's can be."""
    return replace(cfg, private_store="memory") if cfg.private_store == "disk" else cfg


def train_selected(data, model, cfg, *, progress: bool = False, folder=None):
    """Train one seed (:class:`~fedvlr_plus.federation.engine.FederatedRun`) and put it back into the state of
    its selected (best-validation) round: shared state, server fusion state and every private state. ``folder``:
    the run checkpoints there, each checkpoint with its selected round's model, and goes on from the latest
    checkpoint the folder holds (the same figures as a run straight through)."""
    from ..federation.engine import FederatedRun

    run = FederatedRun(data, model, keepable(cfg), folder, progress=progress, keep_selected=folder is not None)
    if run.resume_saved():
        print(f"seed {cfg.seed}: goes on from its checkpoint at round {run.round} in {folder}", file=sys.stderr)
    run.run(end_at_selected=True)   # the engine keeps that round's model for its own test already
    return run


def is_fusion(run) -> bool:
    from ..fedvlr import FusionLayer

    return isinstance(run.bb, FusionLayer)


def shared_with_rule(run, rule) -> dict:
    """The run's shared state with the cold rows filled by ``rule`` (``None``: as trained). Under the FedVLR layer
    the rule stands in for the layer's own cold-item rule on the ID input of the server's fusion."""
    from ..fedvlr import FUSED

    if rule is None:
        return run.shared
    if is_fusion(run) and rule.on_fused:
        return {**run.shared, FUSED: fused_with_rule(run.bb, run.bb.fused_views(run.strategy.server), rule)}
    if is_fusion(run):
        return {**run.shared, FUSED: run.bb.fused_views(run.strategy.server, cold_rule=rule)}
    if rule.on_fused:
        raise ValueError(f"cold rule {rule.name!r} acts on the FedVLR layer's fused views; this model has none")
    return apply_to_tables(run.bb, run.shared, rule)


def fused_with_rule(layer, fused: torch.Tensor, rule) -> torch.Tensor:
    """The layer's broadcast views ``fused`` with the cold items' expert blocks filled by ``rule`` from the warm
    items' (the content-preference block, computed from content alone, is kept)."""
    cols = len(layer.experts) * layer.d
    out = fused.clone()
    out[:, :cols] = rule.apply(fused[:, :cols])
    return out


def rules_for(fusion: bool) -> tuple[str, ...]:
    """The cold rules a model is scored under: the layer's also in their output form."""
    return RULES + FUSED_RULES if fusion else RULES


def _scorer(run, shared):
    # the router reads the fused views of ``shared`` (the ones the items are scored with) through the call context
    def score(users):
        return run.sim.scores(np.asarray(users, dtype=np.int64), shared)
    return score


# ---------------------------------------------------------------------- item cold-start
@dataclass
class ItemColdStart:
    """Per-seed per-user frames of every variant (rule) and reference ranker."""

    rules: tuple
    frames: dict = field(default_factory=dict)   # (name, part) -> [frames per seed]
    valid: dict = field(default_factory=dict)    # rule -> [valid cold-among-cold mean of the selection metric]
    sparsity: list = field(default_factory=list)  # per-seed per-user frames of the model's test (warm if any)
    selected_round: list = field(default_factory=list)

    def add(self, name, part, frame):
        self.frames.setdefault((name, part), []).append(frame)


def _parts(spec: EvalSpec, data, scorer, cold_mask, split="test") -> dict:
    res = spec.run(data, scorer, split)
    out = {"cold_among_all": res.frame("cold"), "warm": res.frame("warm"), "all": res.frame("all")}
    if cold_mask.any():
        out["cold_among_cold"] = spec.run(data, RestrictedScorer(scorer, cold_mask), split).frame("cold")
    return out


def item_coldstart(data, make_model, cfg, views: dict, *, spec: EvalSpec, rules=RULES, neighbours_k: int = 10,
                   select_metric: str = "ndcg@10", default_rule: str | None = None, progress: bool = False,
                   log=None, jobs: int | None = 1, finished=None, model_label: str = "model") -> dict:
    """Train ``make_model(data)`` for ``cfg.seeds`` seeds and evaluate cold targets under every rule.

    ``default_rule``: the headline rule; ``None`` chooses it on the validation cold targets (``select_metric``
    among cold items). ``jobs``: worker processes training the seeds side by side (:mod:`.seeds`; None: as the
    cores allow). ``finished``: the study's :class:`.finished.FinishedSteps`, where each seed of the model
    ``model_label`` is saved as it finishes and read back on resume. Returns the JSON-ready result (see
    :func:`item_result`).
    """
    from .seeds import ItemSeed, fresh_spec, item_seed, run_seed_jobs

    cold = data.cold_items()
    if not cold.any():
        rules = ()   # no cold rows to fill: the trained model is the only variant, and the notes say why
    state = ItemColdStart(tuple(rules))
    fitted = {r: make_rule(r, views, cold, k=neighbours_k, seed=spec.seed) for r in rules}
    seeds, workers = _seed_plan(cfg, jobs, make_model, log)
    job = ItemSeed(data, make_model, None, fresh_spec(spec) if workers > 1 else spec, fitted, select_metric,
                   progress and workers == 1)
    per_seed = [replace(job, cfg=c) for c in seeds]
    for scfg, res in zip(seeds, run_seed_jobs(item_seed, per_seed, f"items-{model_label}", finished, workers, log)):
        state.selected_round.append(res["round"])
        if log:
            log(f"seed {scfg.seed}: selected round {res['round']} of {res['rounds']}")
        trained = res["trained"]
        for part, f in trained.items():
            state.add("trained", part, f)
        state.sparsity.append(trained["warm"] if len(trained["warm"]) else trained["all"])
        for r in rules:
            if r in res["valid"]:
                state.valid.setdefault(r, []).append(res["valid"][r])
            for part, f in res["rules"][r].items():
                state.add(r, part, f)
    refs = {name: reference_scorer(name, data, seed=spec.seed) for name in ("pop", "random", "antipop")}
    if views:   # none where the data has no content (a sparse-user study of a backbone alone)
        refs["content"] = ContentRanker(data, views)
    for name, sc in refs.items():
        for part, f in _parts(spec, data, sc, cold).items():
            state.add(f"ref:{name}", part, f)
    return item_result(state, data, spec, select_metric, default_rule)


def valid_cold_targets(data, cold: np.ndarray) -> int:
    """How many validation targets are cold items (``cold``: the boolean mask over items)."""
    return int(cold[data.valid()["item"].to_numpy()].sum())


def valid_among_cold(data, spec: EvalSpec, scorer, cold: np.ndarray, metric: str) -> float:
    """Mean validation ``metric`` of the cold targets ranked among the cold items only (NaN without any)."""
    v = spec.run(data, RestrictedScorer(scorer, cold), "valid").frame("cold")
    return float(v[metric].mean()) if len(v) else float("nan")


def best_rule_valid_score(data, views: dict, spec: EvalSpec, metric: str, neighbours_k: int = 10):
    """``run -> score`` that rates a trained model as the item study will report it: its best validation
    ``metric`` among cold items over the cold rules (the study's headline rule is chosen the same way); None when
    the validation split has no cold target to rate with."""
    cold = data.cold_items()
    if not valid_cold_targets(data, cold):
        return None
    fitted = [make_rule(r, views, cold, k=neighbours_k, seed=spec.seed) for r in RULES + FUSED_RULES]
    return lambda run: max(valid_among_cold(data, spec, _scorer(run, shared_with_rule(run, rule)), cold, metric)
                           for rule in fitted if is_fusion(run) or not rule.on_fused)


def item_result(state: ItemColdStart, data, spec: EvalSpec, select_metric: str, default_rule) -> dict:
    keys = list(spec.keys)
    cold = data.cold_items()
    test = data.test()
    sel = {r: float(np.nanmean(v)) for r, v in state.valid.items()}
    if default_rule is None:
        chosen = max(sel, key=sel.get) if sel else "trained"
    else:
        chosen = default_rule if default_rule in state.rules else "trained"
    parts = ("cold_among_cold", "cold_among_all", "warm", "all")

    def block(name):
        return {p: summarise(state.frames.get((name, p), []), keys) for p in parts}

    variants = {"trained": block("trained")}
    for r in state.rules:
        variants[r] = block(r)
        variants[r]["valid_" + select_metric.replace("@", "_at_") + "_among_cold"] = sel.get(r)
    head = variants[chosen]
    out = {
        "n_items": int(data.n_items), "n_cold_items": int(cold.sum()),
        "test_targets": int(len(test)), "test_cold_targets": int(cold[test["item"].to_numpy()].sum()),
        "valid_cold_targets": valid_cold_targets(data, cold),
        "cold_rule": chosen,
        "cold_rule_selected_on": _rule_choice(state, sel, default_rule, select_metric, bool(cold.any())),
        "cold_among_cold": head["cold_among_cold"], "cold_among_all": head["cold_among_all"],
        "warm": head["warm"], "all": head["all"], "variants": variants,
        "selected_round": state.selected_round,
        "baselines": {n: block(f"ref:{n}") for n in ("pop", "random", "antipop", "content")
                      if any((f"ref:{n}", p) in state.frames for p in parts)},
    }
    out["notes"] = item_notes(out)
    trains = data.user_history_length("train")
    # warm targets when the test has any (the cold ones are reported above), else all targets
    part = "warm" if any(len(f) for f in state.frames.get(("trained", "warm"), [])) else "all"
    out["sparsity_targets"] = part
    out["sparsity"] = sparsity_table(state.sparsity, trains, keys, reference=state.frames.get(("ref:pop", part)))
    out[PER_USER] = _item_per_user(state, chosen, keys)
    return out


def _item_per_user(state: ItemColdStart, chosen: str, keys) -> dict:
    """``{variant: {part: per-user frame}}`` (each user averaged over seeds) for the paired tests of
    :mod:`.paired`: the headline variant, every rule, the model as trained and the content-only ranker."""
    out = {}
    names = {"headline": chosen, "trained": "trained", "content only": "ref:content",
             **{r: r for r in state.rules}}
    for label, name in names.items():
        parts = {}
        for part in ("cold_among_cold", "cold_among_all", "warm"):
            frames = [f for f in state.frames.get((name, part), []) if f is not None and len(f)]
            if frames:
                parts[part] = per_user_mean(frames, keys)
        out[label] = parts
    return out


def _rule_choice(state: ItemColdStart, sel: dict, default_rule, select_metric: str, any_cold: bool) -> str:
    if not state.rules:
        return "no item content: the model as trained" if any_cold else "no cold items: the model as trained"
    if default_rule is not None:
        return "fixed by --cold-rule"
    return f"valid {select_metric} among cold items" if sel else "no cold validation targets: the model as trained"


def item_notes(out: dict) -> list[str]:
    """One sentence per headline part without users (see docs/reports.md)."""
    from ..evaluation.results import empty_part_reason

    notes = []
    for part in ("cold_among_cold", "cold_among_all", "warm", "all"):
        if next(iter(out[part].values()), {}).get("n_users"):
            continue
        why = empty_part_reason("cold" if part.startswith("cold") else part)
        if part == "cold_among_cold" and not out["n_cold_items"]:
            why = "no cold items to rank among; every item has a training interaction"
        notes.append(f"{part.replace('_', ' ')}: {why}")
    return notes


# ---------------------------------------------------------------------- sparsity buckets
def bucket_labels(edges=BUCKETS) -> list[str]:
    """The buckets' labels, the first for users with at most ``edges[0]`` training interactions ("0": none, such
    as a cold-user split's test users), then ``a < count <= b`` for each pair of edges, then above the last."""
    first = "0" if edges[0] == 0 else f"0-{edges[0]}"
    lab = [f"{a + 1}-{b}" for a, b in zip(edges[:-1], edges[1:])]
    return [first] + lab + [f">{edges[-1]}"]


def history_bucket(train_counts: np.ndarray, users: np.ndarray, edges=BUCKETS) -> np.ndarray:
    """Index into :func:`bucket_labels` of each user's training-interaction count (``a < count <= b``)."""
    bins = np.asarray(list(edges) + [np.inf])
    return np.searchsorted(bins, train_counts[users], side="left")


def sparsity_table(frames: list[pd.DataFrame], train_counts: np.ndarray, keys, *, edges=BUCKETS,
                   reference: list[pd.DataFrame] | None = None) -> list[dict]:
    """One row per bucket of training-interaction counts: users, model metrics (mean, CI), and the reference's."""
    labels = bucket_labels(edges)

    def bucket_of(f):
        return history_bucket(train_counts, f["user"].to_numpy(), edges)

    rows = []
    for b, label in enumerate(labels):
        sub = [f[bucket_of(f) == b] for f in frames]
        if not any(len(s) for s in sub):
            continue
        row = {"bucket": label, "n_users": int(max(len(s) for s in sub)), "model": summarise(sub, keys)}
        if reference:
            row["pop"] = _means(summarise([f[bucket_of(f) == b] for f in reference], keys))
        rows.append(row)
    return rows


# ---------------------------------------------------------------------- user cold-start
def _csr(data):
    m = data.matrix(["train"]).tocsr()
    m.sort_indices()
    return m.indptr.astype(np.int64), m.indices.astype(np.int64)


class _PopFrom:
    """Popularity counted on another split's training data (the warm users'), for the joining users."""

    def __init__(self, counts):
        self.counts = np.asarray(counts, np.float64)

    def __call__(self, users):
        return np.broadcast_to(self.counts, (len(users), len(self.counts))).copy()


def local_private_training(run, support, users: np.ndarray, *, epochs: int, lr: float | None = None,
                           start: str = "fresh", starts=None):
    """Held-out ``users`` train only their private parts on their ``support`` data with the shared state frozen.

    Uses the batched simulator with ``upload="grads"``: shared parameters are then never stepped locally (their
    gradients are only accumulated, and here discarded). ``start``: each user's own initial draw (``fresh``) or the
    mean private state of the trained clients, the router as their mean mixture (``population``; ``mean-params``
    averages the router's parameters too; :mod:`.population`), or the mean over its support items of each item's
    users' mean state (``items``, :mod:`.item_start`). ``starts``: the run's
    :class:`~.population.PopulationStarts` when the caller trains from it more than once. Returns a scorer over
    the trained private states."""
    from ..federation.simulation.batched import BatchedSimulator
    from ..federation.state.store import MemoryStore
    from .population import STARTS, PopulationStarts, start_from

    if start not in STARTS or start == "auto":   # ("auto" is a choice among the others: joining_epochs)
        raise ValueError(f"unknown start {start!r} for joining users' local training")
    indptr, indices = _csr(support)
    sim = BatchedSimulator(run.bb, indptr, indices, MemoryStore(), seed=run.cfg.seed,
                           chunk_floats=run.cfg.chunk_floats)
    conf = dict(run.round_config(1), epochs=int(epochs), upload="grads", round=10_000)
    if lr is not None:
        conf["lr"] = float(lr)
    users = np.asarray(users, np.int64)
    users = users[np.diff(indptr)[users] > 0]
    frozen = {k: v.clone() for k, v in run.shared.items()}
    starts = starts if starts is not None else PopulationStarts(run)
    if start == "items":
        _start_from_items(run, sim.store, starts, indptr, indices, users)
    elif start in ("population", "mean-params"):
        start_from(sim.store, users, starts.router if start == "population" else starts.state)
    if epochs > 0:   # 0: the start itself serves the newcomer (with one interaction, training may only add noise)
        sim.store.begin_round(1)
        sim.fit(users, run.shared, conf)
        sim.store.prepare(1)
        sim.store.commit()
    assert all(torch.equal(frozen[k], run.shared[k]) for k in frozen), "shared state changed during local training"

    def score(u):
        return sim.scores(np.asarray(u, dtype=np.int64), run.shared)
    return score


def _start_from_items(run, store, starts, indptr, indices, users) -> None:
    """Every one of ``users`` starts from its support items' mean states (:mod:`.item_start`; ``starts``: the
    run's :class:`~.population.PopulationStarts`), committed."""
    from .item_start import item_start_states

    for u, state in item_start_states(run, starts.state, starts.item_means, indptr, indices, users).items():
        store.save(u, state)
    store.commit()


def user_coldstart(full, warm, held_out: np.ndarray, make_model, cfg, views: dict | None, *, spec: EvalSpec,
                   supports=(1, 3, 5), epochs: int | str = 20, start: str = "population", progress: bool = False,
                   log=None, select_metric: str = "ndcg@10", hold_valid: bool = False,
                   prior: str = "none", jobs: int | None = 1, finished=None, model_label: str = "model") -> dict:
    """Train on ``warm`` (held-out users absent), then let ``held_out`` users join with each support size, their
    private state starting from ``start`` (:func:`local_private_training`). ``epochs``: the joining users' local
    epochs, or ``"auto"``: chosen per support size and seed on a third of them (:mod:`.support_epochs`), the
    figures then coming from the others. ``hold_valid``: set that third aside even with a fixed epoch count (it
    chose the recipe: ``--tune``), so no reported user took part in any choice. ``prior``: ``popularity`` adds
    the warm users' log-popularity to the joining users' logits, its weight chosen on that third
    (:mod:`.popularity_prior`). ``jobs``: worker processes training the seeds side by side (:mod:`.seeds`; None: as
    the cores allow). ``finished``, ``model_label``: as :func:`item_coldstart`'s."""
    from .paired import PER_USER
    from .popularity_prior import log_popularity
    from .seeds import UserSeed, fresh_spec
    from .splits import support_query
    from .support_epochs import split_joining_users

    keys = list(spec.keys)
    pop_counts = warm.item_popularity("train")
    sq = {n: support_query(full, held_out, n) for n in supports}
    auto = epochs == "auto"
    valid_users, report_users = (split_joining_users(held_out, spec.seed) if auto or hold_valid
                                 else (None, held_out))
    if (prior != "none" or start == "auto") and valid_users is None:
        raise ValueError("a popularity prior's weight and an automatic start are chosen on validation joining "
                         "users: they need epochs='auto' or hold_valid=True")
    prior_row = log_popularity(pop_counts) if prior == "popularity" else None
    seeds, workers = _seed_plan(cfg, jobs, make_model, log)
    joining = dict(epochs=epochs, start=start, valid_users=valid_users, select_metric=select_metric, prior=prior_row)
    job = UserSeed(warm, make_model, None, fresh_spec(spec) if workers > 1 else spec, sq, held_out, joining,
                   report_users, progress and workers == 1)
    rounds, sparsity, frames, chosen = _user_seeds(job, seeds, workers, log, finished, model_label)
    for n in supports:
        _reference_frames(frames, n, sq[n], pop_counts, views, spec, report_users)
    curves = {name: {str(n): summarise(frames[(name, n)], keys) for n in supports}
              for name in ("model", "pop", "random", "content") if (name, supports[0]) in frames}
    trains = warm.user_history_length("train")
    out = {"supports": list(supports), "held_out_users": int(len(held_out)), "local_epochs": epochs,
           "new_user_start": start, **({"new_user_prior": prior} if prior != "none" else {}),
           "query_targets": {str(n): int(len(sq[n].test())) for n in supports},
           "curves": curves, "selected_round": rounds,
           "sparsity": sparsity_table(sparsity, trains, keys, reference=[_pop_test(warm, spec)]),
           "reported_users": int(len(report_users)),
           PER_USER: {str(n): per_user_mean(frames[("model", n)], keys) for n in supports}}
    if auto or prior != "none" or start == "auto":
        out["support_epochs"] = {"valid_users": int(len(valid_users)), "reported_users": int(len(report_users)),
                                 "metric": select_metric, "chosen": chosen}
    return out


def _seed_plan(cfg, jobs: int | None, make_model, log) -> tuple[list, int]:
    """The study's seeds and the worker processes that train them (:func:`.seeds.seed_jobs`), said in the log
    where they train side by side."""
    from .seeds import seed_jobs

    seeds, workers = seed_jobs(cfg, jobs, make_model)
    if workers > 1 and log:
        log(f"seeds {', '.join(str(c.seed) for c in seeds)} side by side in {workers} worker processes")
    return seeds, workers


def _user_seeds(job, seeds: list, workers: int, log, finished, model_label: str) -> tuple[list, list, dict, dict]:
    """Every seed of a new-user study (:func:`.seeds.user_seed`), added up in seed order: the selected rounds, the
    trained users' per-user frames, the joining users' frames per support size (``("model", n)``) and the choices
    made on validation joining users (support size -> records)."""
    from .seeds import run_seed_jobs, user_seed

    rounds, sparsity, frames, chosen = [], [], {}, {}
    jobs = [replace(job, cfg=c) for c in seeds]
    for scfg, res in zip(seeds, run_seed_jobs(user_seed, jobs, f"users-{model_label}", finished, workers, log)):
        rounds.append(res["round"])
        if log:
            log(f"seed {scfg.seed}: selected round {res['round']} of {res['rounds']}")
        sparsity.append(res["sparsity"])
        for n, frame in res["frames"].items():
            frames.setdefault(("model", n), []).append(frame)
            for record in res["chosen"].get(str(n), []):
                chosen.setdefault(str(n), []).append(record)
    return rounds, sparsity, frames, chosen


def _pop_test(warm, spec: EvalSpec) -> pd.DataFrame:
    """pop's per-user test figures on the trained (warm) users, beside the model's in the sparsity buckets."""
    return spec.run(warm, reference_scorer("pop", warm, seed=spec.seed), "test").frame("all")


def _joined(run, support, held_out, epochs, start, spec, valid_users, metric, chosen: dict, n: int, prior=None,
            starts=None):
    """The joining users' scorer after local training (with ``auto``, the epoch count chosen on validation
    users; with a ``prior``, its weight too), the choice recorded in ``chosen[str(n)]``. ``starts``: the run's
    :class:`~.population.PopulationStarts`."""
    if epochs != "auto" and prior is None and start != "auto":
        return local_private_training(run, support, held_out, epochs=int(epochs), start=start, starts=starts)
    best, scorer, scores = joining_epochs(run, support, held_out, valid_users, spec, start=start, metric=metric,
                                         epochs=epochs, prior=prior, starts=starts)
    record = {"seed": int(run.cfg.seed), "epochs": best, "valid": scores, "start": _start_of(scorer)}
    if prior is not None:
        record["prior_weight"] = scorer.weight
    chosen.setdefault(str(n), []).append(record)
    return scorer


def _start_of(scorer) -> str:
    """Where a kept scorer's users started (through a prior-added wrapper, :mod:`.popularity_prior`)."""
    while not isinstance(scorer, StartedScorer):
        scorer = scorer.scorer
    return scorer.start


def joining_epochs(run, support, users: np.ndarray, valid_users: np.ndarray, spec: EvalSpec, *, start: str,
                   metric: str, epochs: int | str = "auto", prior=None, starts=None):
    """:func:`~.support_epochs.choose_epochs` for joining ``users`` trained on ``support``, scored by the mean
    ``metric`` of ``valid_users``: among the grid and extension of :mod:`.support_epochs` with ``epochs="auto"``,
    else that one count (scored all the same, for a recipe's or a prior weight's choice). With a ``prior``
    (``[N]``, :mod:`.popularity_prior`) each epoch count is scored at its best prior weight, and the scorer
    returned carries that weight. ``starts``: the run's :class:`~.population.PopulationStarts` (made here when
    not given, and shared by every epoch count)."""
    from .popularity_prior import best_weight
    from .population import PopulationStarts
    from .support_epochs import EPOCH_EXTENSION, EPOCH_GRID, choose_epochs, only

    def valid_score(scorer):
        return float(only(spec.run(support, scorer, "test").frame("all"), valid_users)[metric].mean())

    weighed = {}   # a kept scorer -> its validation score (computed while choosing its start and prior weight)
    starts = starts if starts is not None else PopulationStarts(run)

    def train(e):
        best = None
        for s in (START_CHOICES if start == "auto" else (start,)):   # a tie keeps the earlier start
            scorer = StartedScorer(local_private_training(run, support, users, epochs=e, start=s, starts=starts), s)
            if prior is None:
                value = valid_score(scorer)
            else:
                _, scorer, value = best_weight(scorer, prior, valid_score)
            if best is None or value > best[1]:
                best = (scorer, value)
        weighed[best[0]] = best[1]
        return best[0]

    def score_valid(scorer):
        return weighed[scorer]

    if epochs == "auto":
        return choose_epochs(train, score_valid, EPOCH_GRID, EPOCH_EXTENSION)
    return choose_epochs(train, score_valid, (int(epochs),), ())


#: the starts ``start="auto"`` chooses between on the validation joining users (:mod:`.item_start`)
START_CHOICES = ("population", "items")


class StartedScorer:
    """A joining users' scorer that says where their states started (``start``), for the study's record."""

    def __init__(self, score, start: str):
        self.score, self.start = score, start

    def __call__(self, users):
        return self.score(users)


def _reference_frames(frames: dict, n: int, data, pop_counts, views, spec: EvalSpec, users) -> None:
    """pop (warm users' counts), random and content-only on the joining users ``users`` with support ``n``."""
    from .support_epochs import only

    frames[("pop", n)] = [only(spec.run(data, _PopFrom(pop_counts), "test").frame("all"), users)]
    frames[("random", n)] = [only(spec.run(data, reference_scorer("random", data, seed=spec.seed), "test")
                                  .frame("all"), users)]
    if views:
        frames[("content", n)] = [only(spec.run(data, ContentRanker(data, views), "test").frame("all"), users)]
