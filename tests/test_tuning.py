"""``--tune``: the layer's recipe chosen on validation (the grid, its selection, the run and the paper table)."""

import json

import numpy as np
import pytest
import torch

from fedvlr_plus.cli.main import main
from fedvlr_plus.fedvlr.tuning import RECIPES, Recipe, candidate_recipes, select_recipe


def test_grid_keeps_the_values_a_user_fixed_and_drops_duplicates():
    own = [r.name for r in RECIPES if not (r.unit_scale or r.residual_gate)]  # the package's backbones: one view size
    assert [r.name for r in candidate_recipes()] == own
    fixed_lr = candidate_recipes(lr=0.2)
    assert {r.lr for r in fixed_lr} == {0.2} and len(fixed_lr) == len(own)
    # everything fixed: one recipe is left
    only = candidate_recipes(lr=0.2, server_lr=2.0, residual=True, content_preference=False)
    assert [(r.lr, r.server_lr, r.residual, r.content_preference) for r in only] == [(0.2, 2.0, True, False)]
    # the residual path fixed: the recipes without it collapse into those with it
    assert all(r.residual for r in candidate_recipes(residual=True))
    assert len(candidate_recipes(residual=True)) == 3
    # a backbone that scores through its own module gets no content-preference recipe
    assert not any(r.content_preference for r in candidate_recipes(backbone="recbole:BPR"))
    assert any(r.content_preference for r in candidate_recipes())


def test_a_cold_item_study_adds_an_id_dropout_twin_of_every_recipe_after_the_others():
    from fedvlr_plus.fedvlr import FedVLROptions
    from fedvlr_plus.fedvlr.tuning import COLD_ITEM_DROPOUT

    own = [r.name for r in candidate_recipes()]
    cold = candidate_recipes(cold_items=True)
    assert [r.name for r in cold] == own + [f"{n}+dropout" for n in own]
    assert all(r.id_dropout == (COLD_ITEM_DROPOUT if r.name.endswith("+dropout") else 0.0) for r in cold)
    twin = {r.name: r for r in cold}["content+dropout"]
    assert twin.content_preference and twin.settings()["--id-dropout"] == COLD_ITEM_DROPOUT
    assert twin.layer_options(FedVLROptions()).id_dropout == COLD_ITEM_DROPOUT
    # a dropout the user fixed applies to every recipe, and the twins collapse into them
    fixed = candidate_recipes(cold_items=True, id_dropout=0.5)
    assert [r.name for r in fixed] == own and all(r.id_dropout == 0.5 for r in fixed)
    assert all(r.id_dropout == 0.0 for r in candidate_recipes())


def test_the_twins_are_tried_where_validation_sees_cold_items():
    from fedvlr_plus.fedvlr.tuning import COLD_VALID_SHARE, tries_id_dropout

    class Data:  # the two facts the rule reads
        def __init__(self, cold, valid_items):
            self._cold, self._valid = np.asarray(cold), valid_items

        def cold_items(self):
            return self._cold

        def valid(self):
            import pandas as pd

            return pd.DataFrame({"item": self._valid})

    cold = np.array([False, False, True])
    assert not tries_id_dropout(Data(cold, [0, 1] * 100 + [2]))  # 0.5% of validation targets: no
    assert tries_id_dropout(Data(cold, [0, 1] * 40 + [2]))  # 1.2%: yes
    assert not tries_id_dropout(Data(cold, []))
    assert COLD_VALID_SHARE == 0.01


def test_fast_recipe_triples_the_models_own_server_step():
    fast = {r.name: r for r in candidate_recipes()}["fast"]
    assert (fast.lr, fast.server_lr) == (None, 3.0)  # the layer's SGD step 1.0, client step its default
    rb = {r.name: r for r in candidate_recipes(backbone="recbole:NeuMF")}
    assert (rb["fast"].server_lr, rb["fast+residual"].server_lr) == (0.15, 0.15)  # the RecBole model's Adam 0.05
    assert rb["default"].server_lr is None
    # a server step the user fixed leaves fast nothing to change: it collapses into the defaults
    assert [r.name for r in candidate_recipes(server_lr=0.5, backbone="recbole:BPR")] == [
        "default",
        "residual",
        "unit",
        "unit+residual",
        "residual+gate",
        "residual+gate+wd",
    ]


def test_a_recbole_model_also_tries_unit_size_views_unless_the_user_fixed_the_size():
    names = [r.name for r in candidate_recipes(backbone="recbole:NeuMF")]
    assert names == [
        "default",
        "residual",
        "fast",
        "fast+residual",
        "unit",
        "unit+residual",
        "residual+gate",
        "residual+gate+wd",
    ]
    unit = {r.name: r for r in candidate_recipes(backbone="recbole:NeuMF")}["unit"]
    assert unit.settings()["--fusion-view-scale"] == "unit" and not unit.residual
    assert all(r.unit_scale for r in candidate_recipes(view_scale="unit", backbone="recbole:BPR"))
    assert len(candidate_recipes(view_scale="model", backbone="recbole:BPR")) == 6


def test_a_recbole_model_also_tries_the_residual_gate_and_a_fixed_gate_fixes_the_residual_path():
    gate = {r.name: r for r in candidate_recipes(backbone="recbole:NeuMF")}["residual+gate"]
    assert gate.residual and gate.residual_gate and not gate.unit_scale and gate.server_lr is None
    assert gate.settings() == {"--fusion-residual": True, "--content-preference": False, "--fusion-residual-gate": True}
    assert not any(r.residual_gate for r in candidate_recipes())  # the package's own backbones: not in the grid
    fixed = candidate_recipes(residual_gate=True, backbone="recbole:NeuMF")
    assert fixed and all(r.residual and r.residual_gate for r in fixed)
    assert [r.name for r in fixed] == ["default", "fast", "unit", "residual+gate+wd"]  # the rest collapse


def test_the_gated_recipe_with_weight_decay_is_a_recbole_recipe_and_a_decay_the_user_passes_replaces_it():
    from fedvlr_plus.fedvlr.tuning import GATE_WEIGHT_DECAY

    wd = {r.name: r for r in candidate_recipes(backbone="recbole:NeuMF")}["residual+gate+wd"]
    assert wd.residual and wd.residual_gate and wd.weight_decay == GATE_WEIGHT_DECAY == 1e-4
    assert wd.settings()["--weight-decay"] == 1e-4
    assert all(r.weight_decay is None for r in candidate_recipes(backbone="recbole:NeuMF") if r.name != wd.name)
    assert not any(r.weight_decay for r in candidate_recipes())  # the package's own backbones: not in the grid
    # a decay the user passed is every recipe's, so the two gated recipes are one
    fixed = candidate_recipes(weight_decay=0.0, backbone="recbole:NeuMF")
    assert "residual+gate+wd" not in [r.name for r in fixed] and {r.weight_decay for r in fixed} == {0.0}


def test_a_run_tunes_the_recipes_weight_decay_and_keeps_a_decay_the_user_passed():
    from fedvlr_plus.cli.main import build_parser
    from fedvlr_plus.cli.run.args import config_from_args
    from fedvlr_plus.cli.run.tune import _candidates, _with_recipe

    def decays(argv):
        args = build_parser().parse_args(["run", "ml-100k", "--backbone", "recbole:NeuMF", "--fusion", "fedvlr", *argv])
        return {r.name: config_from_args(_with_recipe(args, r, seeds=1)).weight_decay for r in _candidates(args)}

    grid = decays([])
    assert grid["residual+gate+wd"] == 1e-4 and grid["residual+gate"] == 0.0 and grid["default"] == 0.0
    # an explicit decay, even 0, is the user's: the grid's decayed recipe collapses into the gated one
    for passed in ("0", "1e-3"):
        fixed = decays(["--weight-decay", passed])
        assert "residual+gate+wd" not in fixed and set(fixed.values()) == {float(passed)}


def test_selection_keeps_the_best_validation_score_and_ties_keep_the_earlier_recipe():
    recipes = candidate_recipes()
    seen = []

    def score(r):
        seen.append(r.name)
        return {"default": 0.3, "residual": 0.5, "fast": 0.5, "fast+residual": 0.1, "content": 0.2}[r.name]

    report = select_recipe(recipes, score, metric="ndcg@10", seed=4)
    assert seen == [r.name for r in recipes]  # each recipe trained once, in grid order
    assert report.selected == "residual"  # 0.5 first reached by residual; fast only ties it
    js = report.to_json()
    assert js["split"] == "valid" and js["seed"] == 4
    assert js["selected_settings"] == {"--fusion-residual": True, "--content-preference": False}
    assert [c["valid"] for c in js["candidates"]] == [0.3, 0.5, 0.5, 0.1, 0.2]
    flat = select_recipe(recipes, lambda r: 0.2, metric="ndcg@10", seed=0)
    assert flat.selected == "default"  # no recipe strictly better: the layer's defaults


def test_recipe_settings_name_the_flags():
    assert Recipe("x", lr=0.5, server_lr=3.0).settings() == {
        "--fusion-residual": False,
        "--lr": 0.5,
        "--server-lr": 3.0,
        "--content-preference": False,
    }
    with pytest.raises(ValueError):
        select_recipe([], lambda r: 0.0, metric="hr@10", seed=0)


def _folder(tmp_path):
    """40 users in 4 taste groups over 48 items with group-revealing text features; last two rows valid / test."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    g = np.random.default_rng(7)
    rows = []
    for u in range(40):
        items = g.choice(np.arange(u % 4, 48, 4), size=8, replace=False)
        for t, i in enumerate(items):
            rows.append(f"{u},{i},1,{t},{0 if t < 6 else t - 5}")
    (tmp_path / "inter.csv").write_text("userID,itemID,rating,timestamp,split_label\n" + "\n".join(rows) + "\n")
    feats = np.hstack([np.eye(4)[np.arange(48) % 4], 0.2 * g.standard_normal((48, 4))]).astype(np.float16)
    np.save(tmp_path / "text_features.npy", feats)
    return tmp_path


FLAGS = [
    "--backbone",
    "fedavg",
    "--fusion",
    "fedvlr",
    "--rounds",
    "4",
    "--eval-every",
    "2",
    "--local-epochs",
    "1",
    "--dim",
    "8",
    "--metrics",
    "hr@10,ndcg@10",
    "--valid-metric",
    "ndcg@10",
    "--no-progress",
    "--json",
]


def _last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_run_tune_trains_the_grid_on_valid_and_runs_the_chosen_recipe(tmp_path, capsys):
    src = _folder(tmp_path / "data")
    assert main(["run", str(src), *FLAGS, "--tune", "--out", str(tmp_path / "run")]) == 0
    res = _last_json(capsys)
    tune = res["tuning"]
    scores = {c["name"]: c["valid"] for c in tune["candidates"]}
    assert list(scores) == [r.name for r in RECIPES if not (r.unit_scale or r.residual_gate)]
    best = max(scores.values())
    assert tune["selected"] == next(n for n, s in scores.items() if s == best)
    chosen = next(c for c in tune["candidates"] if c["name"] == tune["selected"])
    # the run trained the chosen recipe: the same seed and settings give the candidate's validation score again
    assert res["valid"]["ndcg@10"] == pytest.approx(chosen["valid"])
    assert sorted(p.name for p in (tmp_path / "run" / "tuning").iterdir()) == sorted(
        r.name.replace("+", "-") for r in RECIPES if not (r.unit_scale or r.residual_gate)
    )
    # a candidate is read on validation only: no test pass, no test figures or per-user test file in its folder
    candidate = tmp_path / "run" / "tuning" / tune["selected"].replace("+", "-") / "seed-0"
    saved = json.loads((candidate / "result.json").read_text())
    assert "test" not in saved and saved["valid"]["ndcg@10"] == pytest.approx(chosen["valid"])
    assert not (candidate / "per_user_test.csv").exists() and "per_user_test.csv" in {
        p.name for p in (tmp_path / "run" / "seed-0").iterdir()
    }
    # resumed: every candidate and the run are read back, the same choice and figures
    assert main(["run", str(src), *FLAGS, "--tune", "--resume", str(tmp_path / "run")]) == 0
    again = _last_json(capsys)
    assert again["tuning"] == tune and again["test"] == res["test"]


def test_run_tune_leaves_a_flag_the_user_passed_alone(tmp_path, capsys):
    src = _folder(tmp_path / "data")
    assert main(["run", str(src), *FLAGS, "--tune", "--lr", "0.3", "--fusion-residual"]) == 0
    tune = _last_json(capsys)["tuning"]
    assert [(c["lr"], c["residual"]) for c in tune["candidates"]] == [(0.3, True)] * 3
    assert [(c["server_lr"], c["content_preference"]) for c in tune["candidates"]] == [
        (None, False),
        (3.0, False),
        (None, True),
    ]


def test_paper_table_tune_chooses_the_fusion_row_recipe_on_valid(tmp_path, capsys):
    src = _folder(tmp_path / "data")
    argv = [
        "experiment",
        "paper-table",
        str(src),
        "--backbones",
        "fedavg",
        "--variants",
        "fedgrad,sum,fedvlr",
        "--seeds",
        "2",
        "--rounds",
        "4",
        "--eval-every",
        "2",
        "--local-epochs",
        "1",
        "--dim",
        "8",
        "--metrics",
        "hr@10,ndcg@10",
        "--valid-metric",
        "ndcg@10",
        "--no-progress",
        "--tune",
        "--json",
        "--out",
        str(tmp_path / "table"),
    ]
    assert main(argv) == 0
    res = _last_json(capsys)
    assert sorted(res["tuning"]) == ["fedavg+fedvlr", "fedavg+sum"]  # fusion rows only, not the fedgrad row
    tune = res["tuning"]["fedavg+fedvlr"]
    chosen = next(c for c in tune["candidates"] if c["name"] == tune["selected"])
    for row in ("fedavg+fedvlr", "fedavg+sum"):  # the ablation row trains with the FedVLR row's recipe
        assert res["row_configs"][row]["lr"] == chosen["lr"]
        assert res["row_configs"][row]["server_lr"] == chosen["server_lr"]
    assert res["tuning"]["fedavg+sum"]["from"] == "fedavg+fedvlr"
    assert res["tuning"]["fedavg+sum"]["selected"] == tune["selected"]
    assert [p.name for p in (tmp_path / "table" / "runs").glob("*/tuning")] == ["tuning"]
    text = (tmp_path / "table" / "table.md").read_text()
    assert "chosen on valid" in text and "the one fedavg+fedvlr chose" in text


def test_run_tune_adds_the_id_dropout_twins_where_the_data_has_cold_items(tmp_path, capsys):
    src = _folder(tmp_path / "data")
    # validation and test rows on an item nobody trained on: the data now has a cold item that validation sees
    lines = (src / "inter.csv").read_text().splitlines()
    (src / "inter.csv").write_text("\n".join(lines + [f"{u},48,1,9,{1 + u % 2}" for u in range(4)]) + "\n")
    np.save(
        src / "text_features.npy", np.vstack([np.load(src / "text_features.npy"), np.ones((1, 8), dtype=np.float16)])
    )
    assert main(["run", str(src), *FLAGS, "--fusion-residual", "--content-preference", "--tune"]) == 0
    tune = _last_json(capsys)["tuning"]
    assert [c["name"] for c in tune["candidates"]] == ["default", "fast", "default+dropout", "fast+dropout"]
    assert [c["id_dropout"] for c in tune["candidates"]] == [0.0, 0.0, 0.5, 0.5]
    assert all(c["residual"] and c["content_preference"] for c in tune["candidates"])


def test_the_gate_recipe_reaches_the_layer_options_and_a_passed_gate_stays_on():
    from fedvlr_plus.cli.fusion import options_from_args
    from fedvlr_plus.cli.main import build_parser
    from fedvlr_plus.cli.run.tune import _candidates, _with_recipe

    def options(argv):
        args = build_parser().parse_args(["run", "ml-100k", "--backbone", "recbole:NeuMF", "--fusion", "fedvlr", *argv])
        return {r.name: options_from_args(_with_recipe(args, r, seeds=1)) for r in _candidates(args)}

    grid = options([])
    assert grid["residual+gate"].residual and grid["residual+gate"].residual_gate
    assert not any(o.residual_gate for n, o in grid.items() if not n.startswith("residual+gate"))
    fixed = options(["--fusion-residual-gate"])
    assert list(fixed) == ["default", "fast", "unit", "residual+gate+wd"]
    assert all(o.residual and o.residual_gate for o in fixed.values())


def test_the_paper_table_hands_a_recipes_weight_decay_to_the_row_and_a_nonzero_table_decay_fixes_it():
    from types import SimpleNamespace

    import pandas as pd

    from fedvlr_plus.api import FedVLR, Model
    from fedvlr_plus.experiments.paper.tuning import _candidate, _fixed

    row = FedVLR(Model("recbole:NeuMF", "recbole:NeuMF"), label="neumf+fedvlr")
    points = {r.name: r for r in candidate_recipes(backbone="recbole:NeuMF")}
    assert _candidate(row, points["residual+gate+wd"]).train == {"weight_decay": 1e-4}
    assert "weight_decay" not in _candidate(row, points["residual+gate"]).train

    def study(decay):
        data = SimpleNamespace(cold_items=lambda: np.zeros(3, bool), valid=lambda: {"item": pd.Series([0, 1])})
        return SimpleNamespace(experiment=SimpleNamespace(training={"weight_decay": decay}), data=data)

    assert _fixed(study(0.0), row)["weight_decay"] is None  # the table's default: the grid may choose
    assert _fixed(study(1e-3), row)["weight_decay"] == 1e-3


def test_successive_halving_cuts_the_worse_half_at_each_budget_and_keeps_ties_in_grid_order():
    from fedvlr_plus.fedvlr.halving import rungs, successive_halving
    from fedvlr_plus.fedvlr.tuning import Recipe

    assert rungs(100) == [13, 25, 50, 100] and rungs(100, eval_every=2) == [14, 26, 50, 100]
    assert rungs(15) == [15]  # too short to cut
    recipes = [Recipe(n) for n in ("a", "b", "c", "d", "e")]
    quality = {"a": 0.3, "b": 0.5, "c": 0.5, "d": 0.1, "e": 0.4}
    calls = []

    def train_to(alive, rounds):
        calls.append(([r.name for r in alive], rounds))
        return [quality[r.name] * rounds / 100 for r in alive]

    seen = []
    report = successive_halving(
        recipes,
        train_to,
        budgets=[13, 25, 50, 100],
        metric="ndcg@10",
        seed=0,
        on_rung=lambda budget, kept, stopped, scores: seen.append((budget, len(stopped))),
    )
    assert calls == [(["a", "b", "c", "d", "e"], 13), (["b", "c", "e"], 25), (["b", "c"], 50)]
    assert report.stopped == {"a": 13, "d": 13, "e": 25, "c": 50}
    assert report.selected == "b"  # level with c on every budget: the earlier recipe, as the full grid keeps it
    assert seen == [(13, 2), (25, 1), (50, 1)]
    assert report.to_json()["candidates"][0]["stopped_at_round"] == 13


def test_a_recipe_continued_across_budgets_scores_as_if_trained_straight(tmp_path, capsys):
    src = _folder(tmp_path / "data")
    flags = [f for f in FLAGS if f != "4"]
    flags.insert(flags.index("--rounds") + 1, "8")
    assert main(["run", str(src), *flags, "--tune", "--no-halving"]) == 0
    straight = {c["name"]: c["valid"] for c in _last_json(capsys)["tuning"]["candidates"]}
    # 8 rounds, evaluated every 2: too short to cut by default, so the test lowers the bar
    from fedvlr_plus.fedvlr import halving

    old = halving.MIN_ROUNDS_TO_HALVE
    halving.MIN_ROUNDS_TO_HALVE = 8
    try:
        assert main(["run", str(src), *flags, "--tune", "--halving"]) == 0
    finally:
        halving.MIN_ROUNDS_TO_HALVE = old
    err_out = capsys.readouterr()
    tune = json.loads(err_out.out.strip().splitlines()[-1])["tuning"]
    stopped = {c["name"]: c["stopped_at_round"] for c in tune["candidates"]}
    assert sorted(set(stopped.values()) - {None}) == [2, 4]  # budgets 2, 4 and 8: 5 recipes, then 3, then 2
    survivors = [c for c in tune["candidates"] if c["stopped_at_round"] is None]
    assert len(survivors) == 2 and tune["selected"] in [c["name"] for c in survivors]
    # each survivor trained 2 rounds, then to 4, then to 8, each time from its checkpoint: its best validation
    # score is the one it reaches trained straight to 8 rounds
    for c in survivors:
        assert c["valid"] == pytest.approx(straight[c["name"]], abs=1e-12), c["name"]
    assert "tuning: after 2 rounds, kept" in err_out.err


@pytest.mark.parametrize("with_folder", [True, False])
def test_paper_table_tune_halves_the_grid_and_survivors_score_as_if_trained_straight(
    tmp_path, capsys, monkeypatch, with_folder
):
    from fedvlr_plus.fedvlr import halving

    src = _folder(tmp_path / "data")
    argv = ["experiment", "paper-table", str(src), "--backbones", "fedavg", "--variants", "fedvlr", "--seeds", "1"]
    argv += ["--rounds", "8", "--eval-every", "2", "--local-epochs", "1", "--dim", "8", "--metrics", "hr@10,ndcg@10"]
    argv += ["--valid-metric", "ndcg@10", "--no-progress", "--tune", "--json"]
    assert main([*argv, "--no-halving"]) == 0
    straight = {c["name"]: c["valid"] for c in _last_json(capsys)["tuning"]["fedavg+fedvlr"]["candidates"]}
    monkeypatch.setattr(halving, "MIN_ROUNDS_TO_HALVE", 8)  # 8 rounds are too short to cut
    argv += ["--halving"]
    out = ["--out", str(tmp_path / "table")] if with_folder else []
    assert main([*argv, *out]) == 0
    captured = capsys.readouterr()
    tune = json.loads(captured.out.strip().splitlines()[-1])["tuning"]["fedavg+fedvlr"]
    stopped = {c["name"]: c["stopped_at_round"] for c in tune["candidates"]}
    assert sorted(set(stopped.values()) - {None}) == [2, 4]  # budgets 2, 4 and 8
    survivors = [c for c in tune["candidates"] if c["stopped_at_round"] is None]
    assert len(survivors) == 2 and tune["selected"] in [c["name"] for c in survivors]
    for c in survivors:  # continued from its checkpoint at each budget: the score of a straight run
        assert c["valid"] == pytest.approx(straight[c["name"]], abs=1e-12), c["name"]
    assert "paper-table: tuning fedavg+fedvlr: after 2 rounds, kept" in captured.err
    if with_folder:
        return
    # the candidates side by side in worker processes (one torch thread each on two cores) and one after another
    # (one thread here too): the same scores, cuts and choice
    tables, threads = {}, torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for jobs in ("1", "2"):
            assert main([*argv, "--jobs", jobs]) == 0
            tables[jobs] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tuning"]["fedavg+fedvlr"]
    finally:
        torch.set_num_threads(threads)
    assert tables["1"] == tables["2"] and tables["2"]["selected"] == tune["selected"]


def test_a_candidate_in_a_temporary_folder_checkpoints_at_the_end_of_its_budget_only():
    from fedvlr_plus.fedvlr.halving import budget_settings

    assert budget_settings(13, temporary=True) == {"rounds": 13, "checkpoint_every": 13}
    assert budget_settings(13, temporary=False) == {"rounds": 13}  # the user's folder keeps the run's own setting


def test_a_privacy_target_tunes_every_recipe_to_the_end(tmp_path, capsys, monkeypatch):
    """Under --target-epsilon the upload noise is set for the run's rounds, so a candidate cut short and continued
    would not be the run it stands for: the grid is not halved (it used to stop with a resume error)."""
    from types import SimpleNamespace

    from fedvlr_plus.fedvlr import halving
    from fedvlr_plus.fedvlr.halving import budgets

    assert budgets(SimpleNamespace(rounds=64, eval_every=1, target_epsilon=None), halving=True) == [8, 16, 32, 64]
    assert budgets(SimpleNamespace(rounds=64, eval_every=1, target_epsilon=None)) == [64]  # the default: no cut
    assert budgets(SimpleNamespace(rounds=64, eval_every=1, target_epsilon=8.0), halving=True) == [64]
    monkeypatch.setattr(halving, "MIN_ROUNDS_TO_HALVE", 4)  # FLAGS' 4 rounds would be cut after 2 without the target
    src = _folder(tmp_path / "data")
    assert main(["run", str(src), *FLAGS, "--tune", "--halving", "--target-epsilon", "8", "--upload-clip", "1"]) == 0
    tune = _last_json(capsys)["tuning"]
    assert all(c["stopped_at_round"] is None for c in tune["candidates"])


@pytest.mark.parametrize("cut", [["--halving"], []])
def test_the_kept_recipes_seed_goes_on_from_its_candidate_with_and_without_a_folder(tmp_path, capsys, monkeypatch, cut):
    """With the cut or with the whole grid (the default), the kept recipe's candidate is the run's first seed, with
    a run folder or without: the figures of the run whose every seed trains from round 1."""
    from fedvlr_plus.federation.engine import FederatedRun
    from fedvlr_plus.fedvlr import halving

    src = _folder(tmp_path / "data")
    flags = [f for f in FLAGS if f not in ("4", "--no-progress")]
    flags[flags.index("--rounds") + 1 : flags.index("--rounds") + 1] = ["8", "--seeds", "2", "--jobs", "1", *cut]
    monkeypatch.setattr(halving, "MIN_ROUNDS_TO_HALVE", 8)  # budgets 2, 4 and 8
    runs = {}
    for name, out in (("continued", []), ("in a folder", ["--out", str(tmp_path / "run")])):
        assert main(["run", str(src), *flags, *out]) == 0
        captured = capsys.readouterr()
        runs[name] = json.loads(captured.out.strip().splitlines()[-1])
        assert "seed 0: goes on from its tuning run at round 8" in captured.err, name
        assert "seed 1: goes on" not in captured.err
    monkeypatch.setattr(FederatedRun, "continue_from", lambda run, folder: False)  # every seed from round 1
    assert main(["run", str(src), *flags, "--out", str(tmp_path / "straight")]) == 0
    captured = capsys.readouterr()
    straight = json.loads(captured.out.strip().splitlines()[-1])
    assert "tuning run" not in captured.err
    for name, res in runs.items():
        for key in ("tuning", "selected_round", "valid", "test", "router"):
            assert res[key] == straight[key], (name, key)
        assert [s["selected_round"] for s in res["per_seed"]] == [s["selected_round"] for s in straight["per_seed"]]
    # the seed's folder holds what a seed trained in it holds
    mine, theirs = (tmp_path / run / "seed-0" for run in ("run", "straight"))
    assert (mine / "per_user_test.csv").read_text() == (theirs / "per_user_test.csv").read_text()
    assert (
        json.loads((mine / "result.json").read_text())["test"]
        == json.loads((theirs / "result.json").read_text())["test"]
    )


def test_a_seed_gone_on_from_its_candidate_in_a_folder_resumes_as_its_own(tmp_path, capsys):
    """The seed's folder holds its checkpoint from the moment it goes on from the candidate: a resume reads its
    result back."""
    src = _folder(tmp_path / "data")
    flags = [f for f in FLAGS if f != "--no-progress"] + ["--seeds", "2", "--jobs", "1", "--out", str(tmp_path / "run")]
    assert main(["run", str(src), *flags]) == 0
    first = _last_json(capsys)
    resume = [a if a != "--out" else "--resume" for a in flags]
    assert main(["run", str(src), *resume]) == 0
    err = capsys.readouterr()
    assert json.loads(err.out.strip().splitlines()[-1])["test"] == first["test"]
    assert "seed 0: finished at round 4; its result is read back" in err.err


@pytest.mark.parametrize("cut", [["--halving"], []])
def test_paper_table_tune_goes_on_from_the_kept_candidate_with_the_same_table(tmp_path, capsys, monkeypatch, cut):
    from fedvlr_plus.federation.engine import FederatedRun
    from fedvlr_plus.fedvlr import halving

    src = _folder(tmp_path / "data")
    argv = ["experiment", "paper-table", str(src), "--backbones", "fedavg", "--variants", "fedvlr,sum", "--seeds"]
    argv += ["2", "--rounds", "8", "--eval-every", "2", "--local-epochs", "1", "--dim", "8", "--metrics"]
    argv += ["hr@10,ndcg@10", "--valid-metric", "ndcg@10", "--no-progress", "--tune", *cut, "--json"]
    monkeypatch.setattr(halving, "MIN_ROUNDS_TO_HALVE", 8)  # budgets 2, 4 and 8
    assert main(argv) == 0
    captured = capsys.readouterr()
    continued = json.loads(captured.out.strip().splitlines()[-1])
    # the FedVLR row's first seed goes on from its candidate; the router-ablation row trains from round 1
    assert "paper-table: fedavg+fedvlr seed 0 goes on from its tuning run at round 8" in captured.err
    assert captured.err.count("goes on from its tuning run") == 1
    assert main([*argv, "--out", str(tmp_path / "table")]) == 0  # with a table folder too
    captured = capsys.readouterr()
    in_folder = json.loads(captured.out.strip().splitlines()[-1])
    assert captured.err.count("paper-table: fedavg+fedvlr seed 0 goes on from its tuning run at round 8") == 1
    monkeypatch.setattr(FederatedRun, "continue_from", lambda run, folder: False)  # every seed from round 1
    assert main([*argv, "--out", str(tmp_path / "straight")]) == 0
    captured = capsys.readouterr()
    straight = json.loads(captured.out.strip().splitlines()[-1])
    assert "goes on from its tuning run" not in captured.err
    for key in ("rows", "tuning"):
        assert continued[key] == straight[key] == in_folder[key], key


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "ml-100k", "--backbone", "fedavg", "--fusion", "fedvlr", "--tune"],
        ["experiment", "paper-table", "ml-100k", "--backbones", "fedavg", "--variants", "fedvlr", "--tune"],
        ["coldstart", "ml-100k", "--backbone", "fedavg", "--fusion", "fedvlr", "--cold-items", "0.2", "--tune"],
    ],
)
def test_every_tuner_trains_the_whole_grid_unless_halving_is_asked_for(argv):
    """The cut stopped slow learners that win (lfm2k, docs/usage.md): the whole grid is every command's default."""
    from fedvlr_plus.cli import build_parser
    from fedvlr_plus.coldstart.study import ColdStartOptions
    from fedvlr_plus.experiments.paper.table import PaperTableOptions

    parser = build_parser()
    assert parser.parse_args(argv).halving is False
    assert parser.parse_args([*argv, "--halving"]).halving is True
    assert PaperTableOptions.halving is False and ColdStartOptions.halving is False
