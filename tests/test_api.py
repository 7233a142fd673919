"""The Python API: ``Experiment(data, models, metrics, seeds).run()`` and its result object."""

from __future__ import annotations

import json

import pytest

from fedvlr_plus import FCF, Experiment, FedAvg, load
from fedvlr_plus.federation.synthetic import synthetic_data


@pytest.fixture(scope="module")
def small():
    return synthetic_data(60, 80, 12.0, groups=4, seed=1, name="small")


def _test_users(result) -> int:
    return result.per_seed["pop"][0].n_users()


def test_every_model_is_scored_on_every_test_user(small, result):
    assert _test_users(result) == small.test()["user"].nunique()


@pytest.fixture(scope="module")
def result(small):
    return Experiment(
        small, [FedAvg(), FCF(lr=0.5)], metrics=["ndcg@10", "hr@20"], seeds=2, rounds=2, dim=8, progress=False
    ).run()


def test_the_table_has_every_model_and_the_reference_rankers(result):
    table = result.table()
    assert list(table.index) == ["FedAvg", "FCF", "pop", "random", "antipop"]
    assert set(table["seeds"]) == {2} and set(table["users"]) == {_test_users(result)}
    for k in ("ndcg@10", "hr@20"):
        lo, hi = zip(*table[f"{k}_ci"])
        assert all(0 <= a <= m <= b <= 1 for a, m, b in zip(lo, table[k], hi))


def test_figures_equal_the_engine_run_with_the_same_settings(small, result):
    from fedvlr_plus.federation import FedConfig, run_federated

    for seed in (0, 1):
        cfg = FedConfig(rounds=2, dim=8, seed=seed, ks=(10, 20), metrics=("ndcg", "hr"))
        direct = run_federated(small, "fedavg", cfg, progress=False)["test"]
        assert result.per_seed["FedAvg"][seed].summary()["ndcg@10"] == pytest.approx(direct["ndcg@10"], abs=1e-12)


def test_a_recipe_option_overrides_the_experiment_for_that_model_only(small):
    exp = Experiment(small, [FedAvg(), FCF(lr=0.5)], rounds=2, lr=0.1, progress=False)
    assert exp.config(exp.models[0], 0).lr == 0.1
    assert exp.config(exp.models[1], 0).lr == 0.5


def test_paired_test_is_over_the_users_both_have(result):
    test = result.paired("FedAvg", "pop", "ndcg@10")
    assert test["n"] == _test_users(result) and test["n_only_a"] == test["n_only_b"] == 0
    assert test["mean_diff"] == pytest.approx(test["mean_a"] - test["mean_b"])


def test_renderings(result, tmp_path):
    md = result.to_markdown()
    assert md.splitlines()[0].startswith("| model | seeds | users | ndcg@10 | hr@20 |")
    assert f"| FCF | 2 | {_test_users(result)} |" in md
    js = json.loads(result.to_json())
    assert set(js["models"]) == {"FedAvg", "FCF", "pop", "random", "antipop"}
    assert js["models"]["pop"]["ndcg@10"] == pytest.approx(result.table().loc["pop", "ndcg@10"])
    result.plot(tmp_path / "bars.png")
    assert (tmp_path / "bars.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_options_say_what_is_wrong(small):
    with pytest.raises(ValueError, match="unknown training option"):
        Experiment(small, [FedAvg(epochz=3)], progress=False).run()
    with pytest.raises(ValueError, match="needs a cut-off"):
        Experiment(small, [FedAvg()], metrics=["ndcg"])
    with pytest.raises(TypeError, match="not a model recipe"):
        Experiment(small, ["fedavg"], references=False, progress=False).run()


def test_load_splits_like_the_command_line():
    data = load("ml-100k")
    assert data.n_users == 943 and len(data.test()) == 943 and len(data.valid()) == 943


def test_paired_test_of_warm_targets_says_so_and_uses_them(result):
    warm = result.paired("FedAvg", "pop", "ndcg@10", which="warm")
    assert warm["which"] == "warm" and warm["n"] == len(result.per_user("FedAvg", "warm"))
    assert warm["mean_a"] == pytest.approx(result.per_user("FedAvg", "warm")["ndcg@10"].mean())


def test_intervals_follow_the_result_seed(result):
    from dataclasses import replace

    other = replace(result, ci_seed=7).table()
    assert other["ndcg@10"].tolist() == result.table()["ndcg@10"].tolist()
    assert other["ndcg@10_ci"].tolist() != result.table()["ndcg@10_ci"].tolist()


def test_a_started_run_trains_as_run_does_and_calls_the_round_hook(small, result):
    exp = Experiment(small, [FedAvg()], metrics=["ndcg@10", "hr@20"], rounds=2, dim=8, progress=False)
    rounds = []
    run = exp.start(exp.models[0], 1, on_round=lambda run, record: rounds.append(record["round"]))
    run.run()
    assert rounds and rounds[-1] == run.round
    assert exp.selected_test(run).summary() == result.per_seed["FedAvg"][1].summary()


def test_references_are_masked_as_the_models_are(small):
    from fedvlr_plus.evaluation import reference_scorer

    pop = reference_scorer("pop", small)
    train = Experiment(small, [], metrics=["hr@10"], references=False).test(pop, 0)
    every = Experiment(small, [], metrics=["hr@10"], references=False, mask_history="all").test(pop, 0)
    assert train.summary() != every.summary()  # validation items are candidates only under the train mask


def test_fedvlr_recipe_takes_a_whole_options_record_and_a_label():
    from fedvlr_plus import FedVLR
    from fedvlr_plus.fedvlr import FedVLROptions

    recipe = FedVLR(
        FedAvg(lr=0.2), options=FedVLROptions(views="/somewhere", cold_neighbours=3), mode="mlp", label="fedavg+mlp"
    )
    assert recipe.options == FedVLROptions(mode="mlp", views="/somewhere", cold_neighbours=3)
    assert recipe.label == "fedavg+mlp" and recipe.train == {"lr": 0.2}


def test_a_layer_without_content_is_one_line_in_python_terms():
    from fedvlr_plus import Experiment, FedAvg, FedVLR, load
    from fedvlr_plus.errors import UserError

    data = load("synthetic:60x40")
    with pytest.raises(UserError) as caught:
        Experiment(data, [FedVLR(FedAvg())], rounds=1, seeds=1, metrics=["hr@10"], progress=False).run()
    message = str(caught.value)
    assert message.startswith("FedAvg + FedVLR: synthetic-60x40 has no item content") and message.count("FedVLR:") == 1
    assert "views={" in message and " --" not in message and "\n" not in message
