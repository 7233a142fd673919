"""``fedvlr-plus data stats SOURCE``: users, items, interactions (per split), sparsity and the detected format."""

from __future__ import annotations

import sys

from .common import emit_json, say


def register(sub) -> None:
    p_data = sub.add_parser("data", help="inspect data sources")
    data_sub = p_data.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True)
    p_stats = data_sub.add_parser(
        "stats",
        help="users, items, interactions, per split, sparsity",
        description="Print users, items, interactions (per split) and sparsity of SOURCE, "
        "and which format was detected.",
    )
    p_stats.add_argument("source", metavar="SOURCE", help="'ml-100k' (embedded) or a path; the format is detected")
    p_stats.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p_stats.set_defaults(func=cmd_data_stats)


def cmd_data_stats(args) -> int:
    from ..datasets import detect_format, load, print_warnings

    fmt = detect_format(args.source)
    data = load(args.source)
    stats = data.stats()
    stats["detected_format"] = fmt
    print_warnings(data, sys.stderr, stats["warnings"])
    if args.json:
        emit_json(stats)
    else:
        print(format_stats(stats))
    say(_next_after_stats(args.source))
    return 0


def _next_after_stats(source: str) -> str:
    """Where to go once the data reads as expected: the reference rankers, then a federated backbone."""
    from ..errors import shell_word

    return (
        f"next: the reference rankers on it, fedvlr-plus run {shell_word(source)} --backbone pop, then a federated "
        f"backbone with --backbone fedavg"
    )


def format_stats(stats: dict) -> str:
    """The console table of :meth:`InteractionData.stats` (with ``detected_format`` added)."""
    lines = [
        f"{stats['dataset']}  (detected format: {stats['detected_format']})",
        f"  users         {stats['users']:>10,}",
        f"  items         {stats['items']:>10,}",
        f"  interactions  {stats['interactions']:>10,}",
        f"  sparsity      {stats['sparsity']:>10.4%}",
    ]
    for name, s in stats["splits"].items():
        lines.append(f"  {name:<13} {s['interactions']:>10,} interactions, {s['users']:,} users, {s['items']:,} items")
    if "cold_items" in stats:
        lines.append(
            f"  items never in train: {stats['cold_items']:,}; cold targets: valid "
            f"{stats['valid_cold_targets']:,}, test {stats['test_cold_targets']:,}"
        )
    if stats["content_coverage"]:  # only fields some item holds a value in, with how many items do
        lines.append(
            "  item content: "
            + ", ".join(f"{k} {n:,}/{stats['items']:,}" for k, n in stats["content_coverage"].items())
        )
    for k, shape in stats["features"].items():
        lines.append(f"  features '{k}': {shape[0]:,} x {shape[1]}")
    if stats["warnings"]:
        lines.append(
            f"  warnings: {len(stats['warnings'])} (on stderr; codes {', '.join(w['code'] for w in stats['warnings'])})"
        )
    return "\n".join(lines)
