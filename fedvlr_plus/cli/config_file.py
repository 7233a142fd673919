"""``--config FILE.toml`` of every command: a file that sets the command's flags and SOURCE, read before the
command line is parsed so that a flag given there wins over the file.

Each key of the file becomes the default of its flag, checked by the flag's own ``type`` and ``choices``, so a
file accepts exactly what the command line accepts and refuses it with one line naming the file and the key.
A command that keeps a folder (``run``, ``coldstart``, ``experiment paper-table``) writes every flag it ran with
into ``config.toml`` there; ``--config`` on that file repeats the run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..experiment_file import CONFIG_NAME, bad_value, read_experiment_file, unknown_key, write_experiment_file

CONFIG_DEST = "config_file"
#: the namespace attribute with the command's words and the flags a run folder's config.toml records
RECORD = "_config_record"
#: flags about where a command writes and how it talks, not what it computes: left out of config.toml, so that
#: rerunning a folder's file never writes into that folder
NOT_RECORDED = frozenset({CONFIG_DEST, "out", "resume", "json", "json_history", "no_progress", "help"})
#: other names of a positional in a file (``data = "ml-100k"`` reads as well as ``source = ...``)
POSITIONAL_ALIASES = {"source": ("data",)}


def _subcommands(parser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _leaves(parser):
    sub = _subcommands(parser)
    if sub is None:
        yield parser
        return
    for child in dict.fromkeys(sub.choices.values()):
        yield from _leaves(child)


def add_config_flags(parser) -> None:
    """``--config`` on every command that does not already take a flag of that name (``flower run`` passes
    Flower's own ``--config KEY=VALUE``)."""
    for leaf in _leaves(parser):
        if "--config" in leaf._option_string_actions:
            continue
        leaf.add_argument(
            "--config",
            dest=CONFIG_DEST,
            metavar="FILE.toml",
            default=None,
            help="set this command's flags from a TOML (or YAML) file, keys named like the flags (source = "
            "'ml-100k', rounds = 20, fusion-residual = true); flags given here win. A run folder's "
            "config.toml repeats its run",
        )


def _command(parser, argv: list[str]) -> tuple[argparse.ArgumentParser, list[str]] | None:
    """The innermost command ``argv`` names and its words (``experiment paper-table``), or None."""
    words, i = [], 0
    while (sub := _subcommands(parser)) is not None:
        while i < len(argv) and argv[i].startswith("-"):
            i += 1
        if i == len(argv) or argv[i] not in sub.choices:
            return None
        parser = sub.choices[argv[i]]
        words.append(argv[i])
        i += 1
    return parser, words


def _config_path(leaf, argv: list[str]) -> str | None:
    """The last ``--config PATH`` / ``--config=PATH`` of ``argv`` (argparse keeps the last one too), also as an
    abbreviation argparse would take (``--conf``: no other flag of the command starts so)."""
    path = None
    for i, token in enumerate(argv):
        name, equals, value = token.partition("=")
        if not name.startswith("--") or [o for o in leaf._option_string_actions if o.startswith(name)] != ["--config"]:
            continue
        if equals:
            path = value
        elif i + 1 < len(argv):
            path = argv[i + 1]
    return path


def apply_config_file(parser, argv: list[str]) -> None:
    """Set the defaults of the command ``argv`` names from its ``--config`` file, if it has one."""
    found = _command(parser, argv)
    if found is None:
        return
    leaf, words = found
    leaf.set_defaults(**{RECORD: (" ".join(words), _recorded(leaf))})
    if not _takes_config(leaf) or (path := _config_path(leaf, argv)) is None:
        return
    keys = _keys(leaf)
    for key, value in read_experiment_file(path).items():
        action = keys.get(key)
        if action is None:
            raise unknown_key(path, key, keys)
        _set_default(leaf, action, _value(action, value, path, key))


def _takes_config(leaf) -> bool:
    action = leaf._option_string_actions.get("--config")
    return action is not None and action.dest == CONFIG_DEST


def _keys(leaf) -> dict[str, argparse.Action]:
    """Each key a file may set, by name: a flag's long names without dashes, a positional's name."""
    keys = {}
    for action in leaf._actions:
        if action.dest in (CONFIG_DEST, "help") or isinstance(action, argparse._VersionAction):
            continue
        if not action.option_strings:
            names = {action.dest, str(action.metavar or action.dest).lower()} | set(
                POSITIONAL_ALIASES.get(action.dest, ())
            )
        else:
            negated = isinstance(action, argparse.BooleanOptionalAction)
            names = {s[2:] for s in action.option_strings if s.startswith("--")}
            names = {n for n in names if not (negated and n.startswith("no-"))}
        keys.update({n.replace("-", "_"): action for n in names})
    return keys


def _recorded(leaf) -> tuple[str, ...]:
    """The flags a run folder's config.toml records: every one that says what the command computes."""
    return tuple(dict.fromkeys(a.dest for a in leaf._actions if a.dest not in NOT_RECORDED))


def _value(action, value, path, key):
    """The file's ``value`` as the flag would have parsed it; a bad one names the file and key."""
    if isinstance(action, argparse.BooleanOptionalAction) or action.nargs == 0:
        if not isinstance(value, bool):
            raise bad_value(path, key, f"expected true or false, got {value!r}")
        if isinstance(action, argparse._StoreFalseAction):
            return not value
        if isinstance(action, argparse._StoreConstAction) and not isinstance(action, argparse._StoreTrueAction):
            return action.const if value else action.default
        return value
    if isinstance(action, argparse._AppendAction):
        return [_converted(action, item, path, key) for item in (value if isinstance(value, list) else [value])]
    return _converted(action, value, path, key)


def _converted(action, value, path, key):
    if isinstance(value, (bool, dict)):
        raise bad_value(path, key, f"takes a value like the flag's ({action.metavar or key.upper()}), got {value!r}")
    if value == [] and action.default in ((), [], None):  # none of them: what a flag that is off by default holds
        return action.default
    text = ",".join(map(_text, value)) if isinstance(value, list) else _text(value)
    try:
        result = action.type(text) if action.type else text
    except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
        raise bad_value(path, key, str(exc)) from None
    if action.choices is not None and result not in action.choices:
        raise bad_value(path, key, f"{result!r} is not one of {', '.join(map(str, action.choices))}")
    return result


def _text(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _set_default(leaf, action, value) -> None:
    action.default = value
    action.required = False  # the file gave it: the command line need not
    if not action.option_strings:  # a positional the file gives may be left out of the command line
        action.nargs = "?"
    leaf.set_defaults(**{action.dest: value})


def write_resolved_config(folder, args) -> Path | None:
    """``folder/config.toml``: every flag the command ran with (after the command resolved its automatic ones),
    so that ``--config`` on it repeats the run. None when there is no folder."""
    command, keys = getattr(args, RECORD, ("", ()))
    if not folder or not keys:
        return None
    settings = {k: getattr(args, k, None) for k in keys}
    path = Path(folder) / CONFIG_NAME
    unset = ", ".join(k for k, v in settings.items() if v is None)
    header = (
        f"fedvlr-plus {command}: the flags this folder's results were made with.\n"
        f"Rerun: fedvlr-plus {command} --config {path} --out NEW_DIR\n"
        + (f"Left to the command's or the backbone's default (see result.json's 'resolved'): {unset}" if unset else "")
    )
    write_experiment_file(path, settings, header)
    return path
