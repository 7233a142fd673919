"""The CLI contract other issues and users rely on (run in-process through fedvlr_plus.cli.main)."""

import json

import pytest
from _shared import shared_data

from fedvlr_plus.cli import build_parser, main
from fedvlr_plus.metric_spec import parse_metrics


def run_json(capsys, argv):
    code = main(argv)
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    return json.loads(out[-1])


def test_data_stats_ml100k(capsys):
    stats = run_json(capsys, ["data", "stats", "ml-100k", "--json"])
    assert (stats["users"], stats["items"], stats["interactions"]) == (943, 1682, 100000)
    assert stats["detected_format"] == "recbole-atomic" and stats["dataset"] == "ml-100k"


def test_data_stats_ends_with_the_next_command(capsys):
    assert main(["data", "stats", "ml-100k"]) == 0
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .startswith("next: the reference rankers on it, fedvlr-plus run ml-100k --backbone pop")
    )


def test_data_stats_ku_detects_feature_folder(capsys):
    stats = run_json(capsys, ["data", "stats", str(shared_data("ku")), "--json"])
    assert stats["detected_format"] == "feature-folder"
    assert (stats["users"], stats["items"], stats["interactions"]) == (204, 560, 3489)
    assert stats["splits"]["train"]["interactions"] == 3081
    assert stats["test_cold_targets"] == 88 and stats["cold_items"] == 16


def test_run_pop_on_ku_matches_reference_and_splits_warm_cold(capsys, tmp_path):
    res = run_json(capsys, ["run", str(shared_data("ku")), "--backbone", "pop", "--json", "--out", str(tmp_path / "r")])
    for key in ("dataset", "backbone", "protocol", "test", "valid", "test_ci", "n_users", "test_warm", "test_cold"):
        assert key in res, key
    assert res["n_users"] == 204
    assert 0.18 <= res["test"]["hr@50"] <= 0.20 and 0.05 <= res["test"]["ndcg@50"] <= 0.06
    assert res["test_cold_n_users"] == 88 and res["test_warm_n_users"] == 116
    # popularity never puts an untrained item above a trained one: cold targets only by tie luck
    assert res["test_cold"]["hr@50"] < 0.05
    lo, hi = res["test_ci"]["hr@50"]
    assert lo <= res["test"]["hr@50"] <= hi
    assert json.loads((tmp_path / "r" / "result.json").read_text())["test"] == res["test"]
    assert (tmp_path / "r" / "per_user_test.csv").exists()
    base = res["baselines"]
    assert set(base) == {"pop", "random", "antipop"}
    assert base["pop"]["all"] == res["test"]
    assert base["antipop"]["cold"]["hr@50"] > 0.99 and base["antipop"]["all"]["hr@50"] > 0.6


def test_run_antipop_shows_the_ku_artifact(capsys):
    res = run_json(capsys, ["run", str(shared_data("ku")), "--backbone", "antipop", "--json"])
    assert 0.67 <= res["test"]["hr@50"] <= 0.72 and 0.20 <= res["test"]["ndcg@50"] <= 0.24
    assert res["test_cold"]["hr@50"] > 0.99  # 16 cold items all sit in the top 50
    assert res["test_warm"]["hr@50"] < res["test_cold"]["hr@50"]


def test_run_sampled_protocol_ml100k(capsys):
    res = run_json(
        capsys,
        ["run", "ml-100k", "--backbone", "pop", "--protocol", "sampled99", "--metrics", "hr@10,ndcg@10", "--json"],
    )
    assert res["protocol"] == "sampled99" and res["n_users"] == 943
    assert 0.3 < res["test"]["hr@10"] < 0.8  # popularity is far above random (0.10) on ml-100k
    rnd = run_json(
        capsys, ["run", "ml-100k", "--backbone", "random", "--protocol", "sampled99", "--metrics", "hr@10", "--json"]
    )
    assert 0.06 < rnd["test"]["hr@10"] < 0.14


def test_unknown_folder_is_a_clear_error(capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    assert main(["data", "stats", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path) in err


def test_metric_parsing_rejects_bad_specs():
    assert parse_metrics("hr@10,ndcg@50")[2] == ["hr@10", "ndcg@50"]
    for bad in ("hr", "foo@10", "hr@x", "hr@0"):
        with pytest.raises(ValueError):
            parse_metrics(bad)


def _all_parsers(parser):
    yield parser
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for sub in action.choices.values():
                yield from _all_parsers(sub)


def test_every_command_has_help_for_every_flag():
    for p in _all_parsers(build_parser()):
        for action in p._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{p.prog}: {action.option_strings} has no help"
        text = p.format_help()
        assert text.startswith("usage:")
