"""Bad flags at the command-line boundary: each gets one ``error:`` line naming the flag, exit code 2, no
traceback, and nothing written. Most are refused while the command line is parsed, before any data is read."""

from __future__ import annotations

import pytest
from _bad_input import assert_user_error, files_under, run_cli

RUN = ("run", "ml-100k", "--backbone", "fedavg")


@pytest.mark.parametrize(
    "args,needles",
    [
        (RUN + ("--rounds", "0"), ("--rounds", "must be >= 1, got 0", "fedvlr-plus run --help")),
        (RUN + ("--lr", "-1"), ("--lr", "must be > 0, got -1")),
        (RUN + ("--lr", "fast"), ("--lr", "expected a number, got 'fast'")),
        (RUN + ("--dim", "0"), ("--dim", "must be >= 1")),
        (RUN + ("--seeds", "0"), ("--seeds", "must be >= 1")),
        (RUN + ("--metrics", "hr@0"), ("--metrics", "hr@0", ">= 1")),
        (RUN + ("--metrics", "auc@10"), ("--metrics", "unknown metric 'auc'")),
        (RUN + ("--valid-metric", "hr"), ("--valid-metric", "needs a cut-off")),
        (RUN + ("--lr-decay", "1.5"), ("--lr-decay", "in (0, 1]")),
        (RUN + ("--trim-fraction", "0.5"), ("--trim-fraction", "in [0, 0.5)")),
        (RUN + ("--clients-per-round", "2.5"), ("--clients-per-round", "(0, 1]")),
        (RUN + ("--router-temperature", "0"), ("--router-temperature", "must be > 0")),
        (RUN + ("--checkpoint-every", "0"), ("--checkpoint-every", "an integer >= 1 or auto, got '0'")),
        (RUN + ("--checkpoint-every", "often"), ("--checkpoint-every", "an integer >= 1 or auto, got 'often'")),
        (
            ("run", "ml-100k", "--backbone", "nope"),
            ("--backbone", "unknown backbone 'nope'", "fedavg", "recbole:<Model>", "antipop"),
        ),
        (("run", "ml-100k", "--backbone", "recbole:"), ("--backbone", "needs a model name")),
        (
            ("bench", "round", "ml-100k", "--backbone", "fedavg", "--rounds", "3"),
            ("unrecognized arguments: --rounds", "fedvlr-plus bench round --help"),
        ),
        (("bench", "round", "ml-100k", "--backbone", "fedavg", "--repeats", "0"), ("--repeats", ">= 1")),
        (("coldstart", "ml-100k", "--backbone", "fedavg", "--cold-items", "1.5"), ("--cold-items", "(0, 1)")),
        (("coldstart", "ml-100k", "--backbone", "fedavg", "--support", "0,3"), ("--support", ">= 1")),
        (("coldstart", "ml-100k", "--backbone", "fedavg", "--support-epochs", "-1"), ("--support-epochs", ">= 0")),
        (("coldstart", "ml-100k", "--backbone", "fedavg", "--resume", "x"), ("--out", "--resume x continues")),
        (("views", "knn", "store", "--item", "1", "--k", "0"), ("--k", ">= 1", "fedvlr-plus views knn --help")),
        (("experiment", "paper-table", "ml-100k", "--variants", "none,magic"), ("--variants", "magic", "fedgrad")),
        (
            ("flower", "supernode", "--superlink", "x:1", "--partition", "0/1", "--port", "70000"),
            ("--port", "in [1, 65535]"),
        ),
        (("align", "mor", "ml-100k", "--groups", "0"), ("--groups", ">= 1")),
    ],
)
def test_bad_flag_is_one_line_before_anything_runs(tmp_path, args, needles):
    out = tmp_path / "run"
    res = run_cli(
        *args,
        "--out" if args[0] in ("run", "coldstart") else "--json",
        *([str(out)] if args[0] in ("run", "coldstart") else []),
    )
    line = assert_user_error(res, *needles)
    assert "usage:" not in res.err, res.err  # no multi-line usage block
    assert line.startswith("error: ")
    assert not out.exists()


def test_recbole_model_unknown_names_the_reason_and_close_names(tmp_path):
    res = run_cli("run", "ml-100k", "--backbone", "recbole:NeuMFF", "--rounds", "1", "--out", str(tmp_path / "r"))
    line = assert_user_error(
        res, "--backbone", "recbole:NeuMFF", "not a RecBole general recommender", "did you mean recbole:NeuMF"
    )
    assert "lightgbm" not in line.lower()
    assert files_under(tmp_path) == set()


def test_recbole_model_without_close_name_lists_the_general_recommenders():
    from fedvlr_plus.adapters.recbole.backbone import RefusedModel, resolve_model

    with pytest.raises(RefusedModel, match="not a RecBole general recommender.*BPR.*LightGCN") as exc:
        resolve_model("NoSuchModel")
    assert "lightgbm" not in str(exc.value).lower()


def test_refusing_a_recbole_model_leaves_autograd_as_it_was():
    """RecBole's SINE module turns anomaly detection on when its family is imported to look a name up; left on, it
    made every later backward pass of the process several times slower (a notebook, the test suite)."""
    import torch

    from fedvlr_plus.adapters.recbole.backbone import RefusedModel, resolve_model

    assert not torch.is_anomaly_enabled()
    with pytest.raises(RefusedModel, match="sequential model"):
        resolve_model("SINE")
    assert not torch.is_anomaly_enabled()


def test_recbole_model_names_ignore_case():
    from recbole.model.general_recommender import BPR, LightGCN

    from fedvlr_plus.adapters.recbole.backbone import resolve_model

    assert resolve_model("bpr") is BPR and resolve_model("LIGHTGCN") is LightGCN


def test_recbole_config_with_a_plain_backbone_names_the_flag(tmp_path):
    cfg = tmp_path / "m.yaml"
    cfg.write_text("embedding_size: 8\n")
    res = run_cli(*RUN, "--rounds", "1", "--recbole-config", str(cfg), "--out", str(tmp_path / "r"))
    assert_user_error(res, "--recbole-config", "recbole:<Model>", "fedavg")
    assert files_under(tmp_path) == {"m.yaml"}


def test_synthetic_source_of_the_wrong_shape_names_the_source():
    res = run_cli("bench", "round", "synthetic:lots", "--backbone", "fedavg")
    assert_user_error(res, "synthetic:lots", "synthetic:USERSxITEMS")


def test_flower_run_config_without_equals_names_the_flag():
    res = run_cli(
        "flower", "run", "examples/flower_app", "--superlink", "127.0.0.1:1", "--insecure", "--config", "rounds3"
    )
    assert_user_error(res, "--config rounds3", "KEY=VALUE")


def test_paper_table_override_unknown_field_names_it():
    from fedvlr_plus.cli import build_parser
    from fedvlr_plus.cli.experiment.command import parse_overrides
    from fedvlr_plus.cli.run.args import config_from_args
    from fedvlr_plus.errors import ConfigError
    from fedvlr_plus.experiments.paper.table import config_for_row

    args = build_parser().parse_args(["experiment", "paper-table", "x", "--override", "fedvlr:magic=3"])
    with pytest.raises(ConfigError, match="--override fedvlr:magic.*unknown training field 'magic'"):
        config_for_row(config_from_args(args), parse_overrides(args.override), "fedavg", "fedvlr")
    with pytest.raises(ConfigError, match="--override fedvlr:lr=fast"):
        config_for_row(config_from_args(args), parse_overrides(["fedvlr:lr=fast"]), "fedavg", "fedvlr")
