"""Misuse of the Python API (``load``, the recipes, ``Experiment``, its result): a UserError that names the
argument and what to do, raised before any model trains, in Python terms (no command-line flag)."""

from __future__ import annotations

import pytest

from fedvlr_plus import FCF, AntiPop, Experiment, FedAvg, FedRAP, FedVLR, Pop, RecBole, load
from fedvlr_plus.errors import UserError
from fedvlr_plus.federation.synthetic import synthetic_data


@pytest.fixture(scope="module")
def data():
    return synthetic_data(30, 80, 8.0, groups=2, seed=1, name="small")


@pytest.fixture(scope="module")
def tiny():
    return synthetic_data(20, 30, 6.0, groups=2, seed=1, name="tiny")


@pytest.fixture
def no_training(monkeypatch):
    """Any training started fails the test: every refusal here comes before the first round."""
    from fedvlr_plus.federation import engine

    def refuse(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(engine.FederatedRun, "__init__", refuse)


def _refused(make, *needles) -> str:
    with pytest.raises(UserError) as exc:
        make()
    line = str(exc.value)
    assert "\n" not in line and "--" not in line, line  # one line, no command-line flag
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    return line


RECIPES = [
    (lambda: FedAvg(lr="fast"), ("FedAvg(lr='fast')", "must be a number")),
    (lambda: FedAvg(lr=-1), ("FedAvg(lr=-1)", "lr must be positive")),
    (lambda: FedAvg(epochz=3), ("FedAvg(epochz=...)", "unknown training option 'epochz'")),
    (lambda: FCF(rounds=0), ("FCF(rounds=0)", "rounds must be >= 1")),
    (lambda: FCF(rounds=2.5), ("FCF(rounds=2.5)", "must be an integer")),
    (lambda: FedAvg(dim=True), ("FedAvg(dim=True)", "must be an integer")),
    (lambda: FedAvg(strategy="krum"), ("FedAvg(strategy='krum')", "strategy must be one of")),
    (lambda: FedAvg(label=""), ("FedAvg(label='')", "non-empty string")),
    (lambda: FedAvg(label=3), ("FedAvg(label=3)", "non-empty string")),
    (lambda: FedRAP(fedrap_lambda=-1), ("FedRAP(fedrap_lambda=-1)", ">= 0")),
    (lambda: RecBole(None), ("RecBole(None)", "RecBole('BPR')")),
    (lambda: FedVLR(Pop()), ("FedVLR(pop())", "reference ranker", "FedVLR(FedAvg())")),
    (lambda: FedVLR("fedavg"), ("FedVLR('fedavg')", "recipe")),
    (lambda: FedVLR(FedVLR(FedAvg())), ("already there",)),
    (lambda: FedVLR(FedAvg(), mode="nope"), ("FedVLR(mode='nope')", "fusion mode must be one of")),
    (lambda: FedVLR(FedAvg(), temperature="hot"), ("FedVLR(temperature='hot')", "must be a number")),
    (lambda: FedVLR(FedAvg(), residual_gate=True), ("FedVLR(residual_gate=True)", "residual=True")),
    (lambda: FedVLR(FedAvg(), options="fast"), ("FedVLR(options=...)", "FedVLROptions")),
    (lambda: FedVLR(FedAvg(), roundz=3), ("FedVLR(roundz=...)", "unknown training option")),
]


@pytest.mark.parametrize("make, needles", RECIPES)
def test_a_bad_recipe_is_refused_when_it_is_made(make, needles):
    _refused(make, *needles)


EXPERIMENTS = [
    (lambda d, t: Experiment("not data", [FedAvg()]), ("Experiment(data)", "got str", "fedvlr_plus.load")),
    (lambda d, t: Experiment(None, [FedAvg()]), ("Experiment(data)", "NoneType")),
    (lambda d, t: Experiment(d, ["FedAvg"]), ("Experiment(models[0])", "not a model recipe: 'FedAvg'")),
    (lambda d, t: Experiment(d, [FedAvg(), FedAvg]), ("Experiment(models[1])", "not a model recipe")),
    (lambda d, t: Experiment(d, FedAvg()), ("Experiment(models)", "expected a list of recipes")),
    (lambda d, t: Experiment(d, "FedAvg"), ("Experiment(models)", "expected a list of recipes")),
    (
        lambda d, t: Experiment(d, [FedAvg(), FedAvg(lr=5.0)]),
        ("Experiment(models[1])", "label 'FedAvg' is already used by models[0]", "label="),
    ),
    (lambda d, t: Experiment(d, [FedAvg(label="pop")]), ("Experiment(models[0])", "reference ranker")),
    (lambda d, t: Experiment(d, [Pop(), Pop()]), ("Experiment(models[1])", "label 'pop'", "once")),
    (lambda d, t: Experiment(d, [FedAvg()], seeds=0), ("Experiment(seeds=...)", "got 0")),
    (lambda d, t: Experiment(d, [FedAvg()], seeds=2.5), ("Experiment(seeds=...)", "must be an integer")),
    (lambda d, t: Experiment(d, [FedAvg()], seeds=10**9), ("Experiment(seeds=...)", "1000000000")),
    (lambda d, t: Experiment(d, [FedAvg()], seed=-1), ("Experiment(seed=...)", "got -1")),
    (lambda d, t: Experiment(d, [FedAvg()], seed=2**40), ("Experiment(seed=...)", str(2**40))),
    (lambda d, t: Experiment(d, [FedAvg()], rounds=-1), ("Experiment(rounds=-1)", "rounds must be >= 1")),
    (lambda d, t: Experiment(d, [FedAvg()], lr="fast"), ("Experiment(lr='fast')", "must be a number")),
    (lambda d, t: Experiment(d, [FedAvg()], epochz=1), ("Experiment(epochz=...)", "unknown training option")),
    (lambda d, t: Experiment(d, [FedAvg()], metrics=["auc@10"]), ("Experiment(metrics=...)", "unknown metric 'auc'")),
    (lambda d, t: Experiment(d, [FedAvg()], metrics=["ndcg"]), ("Experiment(metrics=...)", "needs a cut-off")),
    (lambda d, t: Experiment(d, [FedAvg()], metrics=["hr@0"]), ("Experiment(metrics=...)", ">= 1")),
    (lambda d, t: Experiment(d, [FedAvg()], metrics=[10]), ("Experiment(metrics=...)", "a list of names")),
    (lambda d, t: Experiment(d, [FedAvg()], protocol="sampled99"), ("Experiment(protocol='sampled99')",)),
    (lambda d, t: Experiment(d, [FedAvg()], protocol="sampled"), ("protocol='sampled'", "99", "protocol='full'")),
    (
        lambda d, t: Experiment(d, [FedAvg(upload_noise=1.0)], target_epsilon=1.0),
        ("FedAvg", "give upload_noise or target_epsilon, not both"),
    ),
    (lambda d, t: Experiment(d, []).run(), ("Experiment(models)", "empty")),
]


@pytest.mark.parametrize("make, needles", EXPERIMENTS)
def test_a_bad_experiment_is_refused_before_training(data, tiny, no_training, make, needles):
    _refused(lambda: make(data, tiny), *needles)


@pytest.mark.parametrize(
    "make, needles",
    [
        (
            lambda d, t: Experiment(d, [FedAvg()], metrics=["hr@500"]),
            ("cut-off 500 is larger than the catalogue", "80"),
        ),
        (lambda d, t: Experiment(t, [FedAvg()]), ("metrics=None: the default", "30 items")),
    ],
)
def test_cut_offs_above_the_catalogue_are_said(data, tiny, make, needles):
    with pytest.warns(UserWarning) as said:
        make(data, tiny)
    text = " ".join(str(w.message) for w in said)
    assert all(n in text for n in needles), text


@pytest.mark.parametrize(
    "source, needles",
    [
        (None, ("load(None)", "load('ml-100k')")),
        (123, ("load(123)",)),
        ("", ("load('')",)),
        (["ml-100k"], ("load(['ml-100k'])",)),
    ],
)
def test_load_names_a_source_that_is_not_one(source, needles):
    _refused(lambda: load(source), *needles)


def test_load_names_a_bad_split_and_k_core():
    _refused(lambda: load("ml-100k", split="random"), "load(split='random')", "loo")
    _refused(lambda: load("ml-100k", k_core=-2), "load(k_core=-2)", ">= 0")


def test_old_exception_types_still_catch_the_api_errors(data):
    """Code written against the old TypeError / ValueError keeps catching them."""
    with pytest.raises(TypeError):
        Experiment(data, ["fedavg"])
    with pytest.raises(ValueError):
        FedAvg(lr=-1)


@pytest.fixture(scope="module")
def result(data):
    return Experiment(
        data,
        [FedAvg(), FedAvg(lr=5.0, label="FedAvg lr5"), AntiPop()],
        metrics=["ndcg@10"],
        rounds=1,
        dim=4,
        progress=False,
    ).run()


def test_two_recipes_named_apart_keep_two_rows(result):
    assert list(result.table().index) == ["FedAvg", "FedAvg lr5", "antipop", "pop", "random"]


@pytest.mark.parametrize(
    "call, needles",
    [
        (lambda r: r.paired("nope", "FedAvg", "ndcg@10"), ("'nope'", "labels: FedAvg, FedAvg lr5")),
        (lambda r: r.paired("FedAvg", "nope", "ndcg@10"), ("'nope'", "no model")),
        (lambda r: r.paired("FedAvg", "pop", "hr@10"), ("metric 'hr@10'", "metrics: ndcg@10")),
        (lambda r: r.paired("FedAvg", "pop", "ndcg@10", which="new"), ("which='new'", "'warm'")),
        (lambda r: r.per_user("nope"), ("'nope'",)),
        (lambda r: r.table("hot"), ("which='hot'",)),
        (lambda r: r.plot("x.png", metric="mrr@10"), ("metric 'mrr@10'",)),
    ],
)
def test_a_result_names_an_unknown_label_or_metric(result, call, needles):
    _refused(lambda: call(result), *needles)
