"""What a finished run prints and keeps: the console table of its figures (valid, test, warm / cold parts,
reference rankers, intervals, notes), the summary its ``--json`` line prints, and its files (``result.json``,
``per_user_test.csv``)."""

from __future__ import annotations

from pathlib import Path

from .results import empty_part_reason


def _has_figures(means) -> bool:
    return isinstance(means, dict) and any(isinstance(v, (int, float)) and v == v for v in means.values())


def format_table(rows: list[tuple], keys: list[str]) -> str:
    """Rows ``(label, means, n_users[, note])``; a row without figures prints its note (or why) instead."""
    head = f"{'':<14}" + "".join(f"{k:>12}" for k in keys)
    lines = [head]
    for label, means, n, *note in rows:
        if not _has_figures(means):
            lines.append(f"{label:<14}   ({note[0] if note and note[0] else 'no users'})")
            continue
        cells = "".join(
            f"{v:>12.4f}" if isinstance(v, (int, float)) and v == v else f"{'–':>12}"
            for v in (means.get(k) for k in keys)
        )
        lines.append(f"{label:<14}" + cells + (f"   ({n} users)" if n is not None else ""))
    return "\n".join(lines)


def part_rows(result: dict) -> list[tuple]:
    """The console rows of a run: valid, test, then test warm / cold, each with its note when it is empty."""
    rows = [
        ("valid", result.get("valid"), None, "no validation figures"),
        ("test", result.get("test"), result.get("n_users"), "no test figures"),
    ]
    for part in ("warm", "cold"):
        n = result.get(f"test_{part}_n_users")
        if f"test_{part}" not in result and n is None:
            continue
        why = empty_part_reason(part) if n == 0 else "not combined over seeds: absent in some (see notes)"
        rows.append((f"test {part}", result.get(f"test_{part}"), n, why))
    return rows


def format_run_report(result: dict, keys: list[str]) -> str:
    """The console report of a run's result (the lines ``run`` prints before its JSON)."""
    lines = [
        f"{result['dataset']} | {result['backbone']} | {result['protocol']} | split {result['split']}",
        format_table(part_rows(result), keys),
    ]
    if result.get("baselines"):
        present = [p for p in ("all", "warm", "cold") if any(p in v for v in result["baselines"].values())]
        names = {"all": "overall", "warm": "warm", "cold": "cold"}
        lines.append(f"reference rankers on the same test ({' / '.join(names[p] for p in present)}):")
        for name, parts in result["baselines"].items():
            lines.append(format_table([(f"  {name} {p}", v, None) for p, v in parts.items()], keys).split("\n", 1)[1])
    ci = result.get("test_ci") or {}
    shown = [k for k in keys if isinstance(ci.get(k), list) and None not in ci[k]]
    if shown:
        lines.append(
            "95% CI (bootstrap over users): " + ", ".join(f"{k} [{ci[k][0]:.4f}, {ci[k][1]:.4f}]" for k in shown)
        )
    if result.get("privacy"):
        lines.append(format_privacy(result["privacy"]))
    lines.extend(f"note: {note}" for note in result.get("notes", []))
    return "\n".join(lines)


def format_privacy(p: dict) -> str:
    """One line: the run's accounted (epsilon, delta) and what it was computed from."""
    eps = "inf" if p["epsilon"] is None else f"{p['epsilon']:.3g}"
    server = "inf" if p["epsilon_server"] is None else f"{p['epsilon_server']:.3g}"
    return (
        f"privacy: epsilon {eps} at delta {p['delta']:.2g} (client level, uploaded values only; sigma "
        f"{p['sigma']:.4g}, clip {p['clip']:g}, {p['clients_per_round']} of {p['population']} clients per round, "
        f"{p['rounds']} rounds; against the server itself: epsilon {server}; docs/privacy.md)"
    )


#: the column of ``per_user_test.csv`` with each user's number of training interactions
HISTORY_COLUMN = "n_train"


def per_user_file_frame(per_user, data):
    """What ``per_user_test.csv`` holds: the per-user test metrics with each user's number of training
    interactions beside them (``n_train``), so that two run folders can later be compared per history length
    (``experiment paired --by-history``) without the data."""
    frame = per_user.copy()
    counts = data.user_history_length("train")
    frame.insert(min(2, len(frame.columns)), HISTORY_COLUMN, counts[frame["user"].to_numpy(dtype="int64")])
    return frame


def write_run_files(out_dir, result: dict, test_result=None, data=None) -> None:
    """``result.json`` (and with a test result, ``per_user_test.csv``; with ``data``, its users' history lengths
    too) in ``out_dir``, each written atomically."""
    from ..jsonio import write_json_atomic

    out = Path(out_dir)
    write_json_atomic(out / "result.json", result)
    if test_result is not None:
        from ..atomic_write import atomic_write

        frame = test_result.per_user if data is None else per_user_file_frame(test_result.per_user, data)
        atomic_write(out / "per_user_test.csv", lambda tmp: frame.to_csv(tmp, index=False))


#: what the ``--json`` line leaves out of a run's result: the per-round history (in ``RUN_DIR/result.json``), so
#: that the line stays a summary a script reads
NOT_SUMMARISED = ("history",)
#: what it also leaves out of each seed's entry: the settings and model, the same as the run's own
NOT_SUMMARISED_PER_SEED = NOT_SUMMARISED + ("config", "resolved", "model")


def run_summary(result: dict, files: dict | None = None, *, history: bool = False) -> dict:
    """The ``--json`` line of ``run``: the figures, intervals, selected round and settings of ``result``, without
    the per-round history (``history=True`` keeps it), with the ``files`` the run wrote."""
    if history:
        return {**result, **({"files": files} if files else {})}
    out = {k: v for k, v in result.items() if k not in NOT_SUMMARISED}
    if "per_seed" in out:
        out["per_seed"] = [{k: v for k, v in s.items() if k not in NOT_SUMMARISED_PER_SEED} for s in out["per_seed"]]
    if files:
        out["files"] = files
    return out
