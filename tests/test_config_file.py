"""Experiment files: ``--config FILE.toml`` sets a command's flags and SOURCE (a flag on the command line wins), a
run folder's ``config.toml`` repeats its run, and a bad key or value is one line naming the file and the key."""

from __future__ import annotations

import json

import pytest
from _bad_input import assert_user_error, run_cli

from fedvlr_plus.experiment_file import read_experiment_file

SOURCE = "synthetic:120x60"


def parsed(*argv):
    """The namespace ``fedvlr-plus ARGV`` runs with, its file read as the command line reads it (no training)."""
    from fedvlr_plus.cli.config_file import apply_config_file
    from fedvlr_plus.cli.main import build_parser

    argv = [str(a) for a in argv]
    parser = build_parser()
    apply_config_file(parser, argv)
    return parser.parse_args(argv)


def write(tmp_path, text: str, name: str = "exp.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def run_json(*args):
    res = run_cli("run", *args, "--no-progress", "--json")
    assert res.code == 0, res.err
    return json.loads(res.out.strip().splitlines()[-1]), res


def test_a_run_folders_config_repeats_the_run(tmp_path):
    first, res = run_json(
        SOURCE, "--backbone", "fedavg", "--rounds", "2", "--lr", "0.3", "--seeds", "2", "--out", tmp_path / "a"
    )
    config = tmp_path / "a" / "config.toml"
    assert first["files"]["config"] == str(config)
    assert f"--config {config}" in res.err  # the run says how to repeat it
    recorded = read_experiment_file(config)
    assert recorded["source"] == SOURCE and recorded["lr"] == 0.3 and recorded["seeds"] == 2
    assert "out" not in recorded  # rerunning the file never writes into the first folder

    again, _ = run_json("--config", config, "--out", tmp_path / "b")
    assert "test_std" in first and len(first["per_seed"]) == 2
    assert {k: v for k, v in again.items() if k != "files"} == {k: v for k, v in first.items() if k != "files"}
    assert read_experiment_file(tmp_path / "b" / "config.toml") == recorded


def test_a_tuned_fusion_run_repeats_from_its_config(tmp_path):
    """The recorded ``tune = true`` tunes again on the rerun, to the same recipe and figures."""
    source = "synthetic-planted:120x60"  # items with content views, for the layer
    first, _ = run_json(source, "--backbone", "fedavg", "--fusion", "fedvlr", "--rounds", "2", "--out", tmp_path / "a")
    assert read_experiment_file(tmp_path / "a" / "config.toml")["tune"] is True and "tuning" in first
    again, _ = run_json("--config", tmp_path / "a" / "config.toml", "--out", tmp_path / "b")
    assert {k: v for k, v in again.items() if k != "files"} == {k: v for k, v in first.items() if k != "files"}


def test_flags_on_the_command_line_win_over_the_file(tmp_path):
    path = write(
        tmp_path,
        f'data = "{SOURCE}"\nbackbone = "fedavg"\nrounds = 3\nfusion-residual = true\n'
        'metrics = "hr@5"\ndrop_modality = ["image"]\n',
    )
    args = parsed("run", "--config", path, "--rounds", "1")
    assert (args.source, args.backbone, args.rounds, args.fusion_residual) == (SOURCE, "fedavg", 1, True)
    assert args.metrics == "hr@5" and args.drop_modality == ["image"]
    assert parsed("run", "ml-100k", "--config", path).source == "ml-100k"
    assert parsed("run", f"--conf={path}").rounds == 3  # the abbreviation argparse accepts reads the file too
    assert parsed("run", SOURCE).rounds == 100  # without the file, the flag's own default


def test_the_file_drives_coldstart_and_the_paper_table(tmp_path):
    cold = write(
        tmp_path,
        'source = "ml-100k"\nbackbone = "fedavg"\ncold-items = 0.2\nsupport = [1, 2]\ntune = false\nseeds = 2\n',
    )
    args = parsed("coldstart", "--config", cold)  # --backbone is required on the command line, not with a file
    assert (args.backbone, args.cold_items, args.support, args.tune, args.seeds) == ("fedavg", 0.2, (1, 2), False, 2)
    table = write(tmp_path, 'source = "ml-100k"\nbackbones = "fedavg,fcf"\nrounds = 4\n', "table.toml")
    args = parsed("experiment", "paper-table", "--config", table, "--seeds", "1")
    assert (args.backbones, args.rounds, args.seeds) == ("fedavg,fcf", 4, 1)


def test_a_yaml_file_reads_as_the_toml_one(tmp_path):
    path = write(tmp_path, f"source: {SOURCE}\nbackbone: fcf\nrounds: 7\nlr: 0.05\n", "exp.yaml")
    args = parsed("run", "--config", path)
    assert (args.source, args.backbone, args.rounds, args.lr) == (SOURCE, "fcf", 7, 0.05)


@pytest.mark.parametrize(
    "words, flags",
    [
        (["run"], ["--pad-uploads", "all", "--clients-per-round", "1.0", "--drop-modality", "image", "--lr", "0.1"]),
        (["coldstart"], ["--backbone", "fedavg", "--support", "3,1", "--support-epochs", "5"]),
        (["experiment", "paper-table"], ["--variants", "none,fedvlr"]),
    ],
)
def test_every_recorded_setting_reads_back_as_it_was(tmp_path, words, flags):
    """A folder's config.toml of a command's settings (defaults, and values that print differently from how they
    are typed, such as ``--pad-uploads all``) parses back to the same settings."""
    from fedvlr_plus.cli.config_file import RECORD, write_resolved_config

    args = parsed(*words, SOURCE, *flags)
    path = write_resolved_config(tmp_path, args)
    again = parsed(*words, "--config", path)
    keys = getattr(args, RECORD)[1]
    assert len(keys) > 20 and "source" in keys
    assert {k: getattr(again, k) for k in keys} == {k: getattr(args, k) for k in keys}


def test_checkpoint_every_takes_a_count_or_auto_on_the_line_and_in_the_file(tmp_path):
    assert parsed("run", SOURCE).checkpoint_every is None  # auto, the default
    assert parsed("run", SOURCE, "--checkpoint-every", "auto").checkpoint_every is None
    assert parsed("run", SOURCE, "--checkpoint-every", "7").checkpoint_every == 7
    auto = write(tmp_path, f'source = "{SOURCE}"\ncheckpoint-every = "auto"\n')
    assert parsed("run", "--config", auto).checkpoint_every is None
    three = write(tmp_path, f'source = "{SOURCE}"\ncheckpoint-every = 3\n', name="three.toml")
    assert parsed("run", "--config", three).checkpoint_every == 3


@pytest.mark.parametrize(
    "text, needles",
    [
        ("roundz = 3\n", ["exp.toml: unknown key 'roundz' (did you mean 'rounds'?)"]),
        ("rounds = 0\n", ["exp.toml: rounds: must be >= 1, got 0"]),
        ('fusion = "fedvrl"\n', ["exp.toml: fusion: 'fedvrl' is not one of none, sum"]),
        ('fusion-residual = "yes"\n', ["exp.toml: fusion_residual: expected true or false, got 'yes'"]),
        ("rounds = true\n", ["exp.toml: rounds: takes a value"]),
        ("rounds = [\n", ["exp.toml: not valid TOML"]),
        ("[training]\nrounds = 3\n", ["exp.toml: [training] is a table"]),
        ("rounds = 3\nrounds = 4\n", ["exp.toml: not valid TOML"]),
    ],
)
def test_a_bad_key_or_value_is_one_line_naming_the_file_and_key(tmp_path, text, needles):
    path = write(tmp_path, f'source = "{SOURCE}"\n' + text)
    res = run_cli("run", "--config", path, "--backbone", "fedavg")
    assert_user_error(res, *[n.replace("exp.toml", str(path)) for n in needles])


def test_a_missing_file_and_a_key_given_twice_name_themselves(tmp_path):
    assert_user_error(run_cli("run", "--config", tmp_path / "nope.toml"), "nope.toml: no such experiment file")
    path = write(tmp_path, "k_core = 1\nk-core = 2\n")
    assert_user_error(run_cli("run", SOURCE, "--config", path), "key 'k-core' given twice")


def test_the_json_line_is_a_summary_and_the_history_stays_in_the_folder(tmp_path):
    summary, _ = run_json(SOURCE, "--backbone", "fedavg", "--rounds", "3", "--out", tmp_path / "a")
    saved = json.loads((tmp_path / "a" / "result.json").read_text())
    assert "history" not in summary and all("history" not in s for s in summary["per_seed"])
    assert len(saved["history"]) == 3 and len(saved["per_seed"][0]["history"]) == 3
    for key in ("test", "test_ci", "valid", "selected_round", "rounds_run", "baselines"):
        assert summary[key] == saved[key], key
    assert summary["files"]["result"] == str(tmp_path / "a" / "result.json")
    full, _ = run_json(SOURCE, "--backbone", "fedavg", "--rounds", "3", "--json-history")
    figures = lambda history: [(h["round"], h["loss"], h.get("valid")) for h in history]  # noqa: E731 (not times)
    assert figures(full["history"]) == figures(saved["history"]) and "files" not in full


def test_the_api_runs_a_run_folders_config_to_the_same_figures(tmp_path):
    from fedvlr_plus import Experiment

    summary, _ = run_json(SOURCE, "--backbone", "fcf", "--rounds", "2", "--lr", "0.2", "--out", tmp_path / "a")
    experiment = Experiment.from_config(tmp_path / "a" / "config.toml")
    assert experiment.training["lr"] == 0.2 and experiment.training["rounds"] == 2
    result = experiment.run()
    assert result.per_seed["FCF"][0].summary() == summary["test"]


def test_the_example_file_describes_fedvlr_on_ml100k_for_the_command_and_the_api():
    from fedvlr_plus import Experiment
    from fedvlr_plus.api import FedAvg, FedVLR

    example = "examples/ml100k-fedvlr.toml"
    args = parsed("run", "--config", example)
    assert (args.source, args.backbone, args.fusion, args.tune) == ("ml-100k", "fedavg", "fedvlr", False)
    assert args.rounds <= 20  # an example that runs in minutes
    experiment = Experiment.from_config(example)
    (model,) = experiment.models
    assert isinstance(model, FedVLR) and isinstance(model.inner, FedAvg) and model.options.mode == "fedvlr"
    assert experiment.data.name == "ml-100k" and experiment.training["rounds"] == args.rounds


@pytest.mark.parametrize(
    "text, needles",
    [
        ("roundz = 3\n", ["unknown key 'roundz' (did you mean 'rounds'?)"]),
        ("tune = true\n", [": tune: "]),
        ("rounds = 0\n", ["rounds", ">= 1"]),
        ('fusion = "fedvlr"\nrouter-temperature = "hot"\n', ["temperature", "str"]),
        ('split = "diagonal"\n', ["split", "diagonal"]),
    ],
)
def test_the_api_names_the_file_and_key_of_a_bad_setting(tmp_path, text, needles):
    from fedvlr_plus import Experiment
    from fedvlr_plus.errors import ConfigError

    path = write(tmp_path, f'source = "{SOURCE}"\nbackbone = "fedavg"\n' + text)
    with pytest.raises(ConfigError) as caught:
        Experiment.from_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    for needle in needles:
        assert needle in message, message


@pytest.mark.parametrize("words", [["experiment", "poisoning"], ["experiment", "privacy-table"]])
def test_a_command_that_keeps_a_folder_says_what_it_wrote_and_how_to_repeat_it(tmp_path, capsys, words):
    from fedvlr_plus.cli.common import say_written

    args = parsed(*words, SOURCE, "--rounds", "3")
    say_written(args, tmp_path, "table.md, result.json", read="table.md")
    config = tmp_path / "config.toml"
    assert capsys.readouterr().err.splitlines() == [
        f"wrote {tmp_path}: table.md, result.json, config.toml",
        f"next: read {tmp_path / 'table.md'}, or repeat it: fedvlr-plus {' '.join(words)} --config {config} "
        "--out NEW_DIR",
    ]
    again = parsed(*words, "--config", config)
    assert (again.source, again.rounds) == (SOURCE, 3)
    say_written(args, None, "the table")
    assert capsys.readouterr().err == "next: add --out DIR to keep the table\n"


def test_flower_run_keeps_its_own_config_flag():
    """``flower run --config KEY=VALUE`` is Flower's run config, not an experiment file."""
    args = parsed("flower", "run", "examples/flower_app", "--superlink", "127.0.0.1:1", "--config", "rounds=2")
    assert args.config == ["rounds=2"]


def test_an_empty_list_leaves_a_flag_that_is_off_by_default_off(tmp_path):
    """A recorded ``name = []`` (a list flag left off, e.g. ``--log``) reads back as off, though the flag itself
    refuses an empty value."""
    import argparse

    from fedvlr_plus.cli.config_file import add_config_flags, apply_config_file

    def names(text):
        if not text:
            raise argparse.ArgumentTypeError("expected at least one name")
        return tuple(text.split(","))

    def parse(text):
        parser = argparse.ArgumentParser()
        parser.add_subparsers(dest="command").add_parser("go").add_argument("--log", type=names, default=())
        add_config_flags(parser)
        argv = ["go", "--config", str(write(tmp_path, text))]
        apply_config_file(parser, argv)
        return parser.parse_args(argv).log

    assert parse("log = []\n") == () and parse('log = ["csv", "tensorboard"]\n') == ("csv", "tensorboard")
