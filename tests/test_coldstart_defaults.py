"""The plain new-user command runs the validated recipe: a joining-user study with the layer chooses the layer's
recipe, the local epochs and the popularity prior's weight on its validation joining users unless the user fixed
them; any other study keeps the layer's defaults and serves no prior."""

import pytest

from fedvlr_plus.cli.coldstart import resolve_new_user_defaults
from fedvlr_plus.cli.main import build_parser


def _resolved(*flags):
    args = build_parser().parse_args(["coldstart", "ml-100k", "--backbone", "fedavg", *flags])
    resolve_new_user_defaults(args)
    return args.tune, args.support_epochs, args.new_user_prior, args.new_user_start


@pytest.mark.parametrize(
    "flags, want",
    [
        (("--fusion", "fedvlr", "--cold-users", "0.2"), (True, "auto", "popularity", "population")),
        (("--cold-users", "0.2"), (False, "auto", "popularity", "population")),
        (("--fusion", "fedvlr", "--cold-users", "0.2", "--no-tune"), (False, "auto", "popularity", "population")),
        (
            ("--fusion", "fedvlr", "--cold-users", "0.2", "--no-tune", "--support-epochs", "20"),
            (False, 20, "none", "population"),
        ),
        (("--fusion", "fedvlr", "--cold-users", "0.2", "--support-epochs", "5"), (True, 5, "popularity", "population")),
        (
            ("--fusion", "fedvlr", "--cold-users", "0.2", "--new-user-prior", "none"),
            (True, "auto", "none", "population"),
        ),
        (("--fusion", "fedvlr", "--cold-items", "0.2"), (False, "auto", "none", "population")),
        (("--fusion", "fedvlr", "--cold-items", "0.2", "--tune"), (True, "auto", "none", "population")),
    ],
)
def test_flags_left_at_their_defaults_take_the_validated_new_user_recipe(flags, want):
    assert _resolved(*flags) == want


def test_a_new_user_study_does_not_tune_a_grid_its_flags_left_with_one_recipe(monkeypatch):
    import fedvlr_plus.cli.run.tune as run_tune

    monkeypatch.setattr(run_tune, "_candidates", lambda args, cold_items=False: ["the one recipe left"])
    assert _resolved("--fusion", "fedvlr", "--cold-users", "0.2")[0] is False


@pytest.mark.parametrize("decay, want", [(0.0, {0.0, 1e-4}), (1e-3, {1e-3})])
def test_a_studys_tuning_trains_each_recipe_with_its_weight_decay_unless_the_study_fixed_one(monkeypatch, decay, want):
    import fedvlr_plus.coldstart.study as study
    import fedvlr_plus.coldstart.tune_halving as tune_halving
    from fedvlr_plus.federation.config import FedConfig
    from fedvlr_plus.fedvlr import FedVLROptions

    trained = {}

    def in_memory_trainer(data, start, score, progress=False, announce=None):
        def train_to(recipes, rounds):
            decays = [start(recipe)[1].weight_decay for recipe in recipes]
            trained.update({len(trained) + i: d for i, d in enumerate(decays)})
            return [0.1 * d for d in decays]  # the decayed recipe scores best

        return train_to

    monkeypatch.setattr(tune_halving, "in_memory_trainer", in_memory_trainer)
    monkeypatch.setattr(study, "_recipe", lambda opts, fusion, cfg, views=None: lambda data: None)
    cfg = FedConfig(weight_decay=decay)
    opts = study.ColdStartOptions(
        split=None, backbone="recbole:NeuMF", training=cfg, fedvlr=FedVLROptions(), metrics=["ndcg@10"], progress=False
    )
    _, cfg, report = study._tuned(opts, "fedvlr", cfg, data=None, log=None)
    assert set(trained.values()) == want and cfg.weight_decay == max(want)
    assert (report["selected"] == "residual+gate+wd") == (decay == 0.0)
