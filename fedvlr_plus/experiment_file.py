"""An experiment file: a command's settings as one flat TOML table (YAML also read), keys named like its flags.

``rounds = 20`` and ``fusion-residual = true`` are the flags ``--rounds 20`` and ``--fusion-residual``; dashes and
underscores are the same in a key. The command line (:mod:`fedvlr_plus.cli.config_file`) and the Python API
(:meth:`fedvlr_plus.api.Experiment.from_config`) both read a file here, so a mistake in one reads the same in the
other: one line naming the file and the key.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from .errors import ConfigError, UserError

#: what a run folder calls the file that reruns it
CONFIG_NAME = "config.toml"
YAML_SUFFIXES = (".yaml", ".yml")


def key_name(key: str) -> str:
    """A key as the settings are named in Python: ``fusion-residual`` -> ``fusion_residual``."""
    return key.strip().replace("-", "_")


def read_experiment_file(path) -> dict:
    """The file's settings, keys as :func:`key_name` writes them; a file that cannot be read or is not one flat
    table is a :class:`UserError` naming it."""
    path = Path(os.fspath(path))
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(str(path), "no such experiment file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(str(path), f"cannot be read ({exc})") from None
    table = _parse_yaml(path, text) if path.suffix.lower() in YAML_SUFFIXES else _parse_toml(path, text)
    out = {}
    for key, value in table.items():
        if isinstance(value, dict):
            raise ConfigError(
                str(path),
                f"[{key}] is a table; an experiment file is one flat list of keys",
                "write its keys at the top level",
            )
        name = key_name(str(key))
        if name in out:
            raise ConfigError(str(path), f"key '{key}' given twice (dashes and underscores are the same)")
        out[name] = value
    return out


def _parse_toml(path: Path, text: str) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
        import tomli as tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(str(path), f"not valid TOML: {exc}") from None


def _parse_yaml(path: Path, text: str) -> dict:
    import yaml  # installed with RecBole

    try:
        table = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserError(str(path), f"not valid YAML: {' '.join(str(exc).split())}") from None
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise ConfigError(str(path), "an experiment file is a mapping of keys to values")
    return table


def unknown_key(path, key: str, known) -> ConfigError:
    """The error of a key the command does not take, with the nearest key it does take."""
    close = difflib.get_close_matches(key, sorted(known), n=1)
    hint = f"did you mean '{close[0]}'?" if close else "the keys are the command's flags, see its --help"
    return ConfigError(str(path), f"unknown key '{key}'", hint)


def bad_value(path, key: str, why: str) -> ConfigError:
    return ConfigError(str(path), f"{key}: {why}")


def write_experiment_file(path, settings: dict, header: str) -> None:
    """``settings`` as a TOML file (written atomically), under ``header`` (comment lines). None is left out:
    TOML has no null, and an absent key leaves the setting to its default, as None does."""
    import tomli_w

    from .atomic_write import atomic_write_text

    plain = {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items() if v is not None}
    comments = "".join(f"# {line}\n" for line in header.splitlines())
    atomic_write_text(path, comments + tomli_w.dumps(plain))
