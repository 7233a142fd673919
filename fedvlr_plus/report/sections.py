"""What the page shows for each kind of folder, in order: a summary of the run, then sections of tables and plots
built from what the folder holds. A part the folder lacks (no history, no router, no cold-start curves) is left
out, and the summary says what the page covers."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import plots
from .gather import FolderContents
from .tables import (
    bucket_gains,
    long_table,
    paper_table,
    reference_rankers,
    router_table,
    run_figures,
    seed_figures,
    tuning_table,
)


@dataclass
class Figure:
    title: str
    png: bytes
    caption: str = ""


@dataclass
class Section:
    heading: str
    blocks: list = field(default_factory=list)  # Table and Figure, in order

    def add(self, block) -> None:
        if block is not None:
            self.blocks.append(block)


#: what the summary lists when the result has it, and its label
_SUMMARY = (
    ("dataset", "data set"),
    ("model", "model"),
    ("backbone", "model"),
    ("protocol", "protocol"),
    ("split", "split"),
    ("seeds", "seeds"),
    ("selected_round", "selected round"),
    ("rounds_run", "rounds run"),
    ("stopped_early", "stopped early"),
    ("strategy", "aggregation"),
    ("cold_rule", "cold-item rule"),
    ("command", "command"),
    ("data_digest", "data digest"),
)


def summary(contents: FolderContents) -> list[tuple[str, str]]:
    """(label, value) pairs of what the run was, from its result."""
    out, seen = [("folder", str(contents.folder)), ("kind", contents.kind)], set()
    for key, label in _SUMMARY:
        value = contents.result.get(key)
        if value is None or value == [] or label in seen or (key == "model" and not isinstance(value, str)):
            continue  # a run's "model" is its parameter layout, not a name
        seen.add(label)
        out.append((label, _plain(value)))
    return out


def _plain(value) -> str:
    """A summary value as text: lists joined, a dict (per model) as ``name: value; ...``."""
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_plain(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(map(_plain, value))
    return str(value)


def sections(contents: FolderContents) -> list[Section]:
    """The page's sections for this folder's kind, then any plot of the folder no section showed."""
    build = {"run": run_sections, "coldstart": coldstart_sections, "paper-table": paper_sections}[contents.kind]
    out, shown = build(contents)
    rest = Section("other plots in the folder")
    for name, png in contents.images.items():
        if name not in shown:
            rest.add(Figure(name, png))
    return out + ([rest] if rest.blocks else [])


def run_sections(c: FolderContents) -> tuple[list[Section], set[str]]:
    figures = Section("figures")
    figures.add(run_figures(c.result))
    figures.add(seed_figures(c.result))
    figures.add(reference_rankers(c.result))
    figures.add(tuning_table(c.result))
    out = [figures]
    if c.histories:
        metric = _valid_metric(c)
        selected = {s: r.get("selected_round") for s, r in _per_seed(c.result).items()}
        curves = Section("learning curves")
        curves.add(
            Figure(
                f"validation {metric} and training loss per round",
                plots.learning_curves(c.histories, metric, selected),
                f"{len(c.histories)} seed(s); evaluated rounds only for validation",
            )
        )
        out.append(curves)
    if c.routers:
        router = Section("router weights")
        router.add(Figure("distribution of the router's weights over users", plots.router_weights(c.routers)))
        router.add(router_table(c.routers))
        out.append(router)
    by_round = plots.router_rounds(c.round_logs) if c.round_logs else None
    if by_round is not None:
        out.append(Section("router by round", [Figure("router weights and entropy by round (--log csv)", by_round)]))
    return out, set()


def coldstart_sections(c: FolderContents) -> tuple[list[Section], set[str]]:
    t = c.tables
    items = Section("cold items")
    rows = long_table(
        "test figures by model and part",
        t.get("cold_items.csv", []),
        ["model", "part"],
        "mean ± sd over seeds [95% bootstrap interval over test users]",
    )
    if rows is not None:
        rows.notes += list(c.result.get("notes") or [])
    items.add(rows)
    items.add(_image(c, "cold_items.png", "cold targets among cold items and among all items"))
    users = Section("cold-start curves")
    users.add(_image(c, "user_coldstart.png", "test figures by the number of interactions a new user brings"))
    users.add(long_table("by support size", t.get("user_coldstart.csv", []), ["model", "support"]))
    buckets = Section("per-bucket gains")
    buckets.add(_image(c, "sparsity.png", "by the user's number of training interactions"))
    buckets.add(bucket_gains("gain over popularity per bucket", t.get("sparsity.csv", [])))
    out = [s for s in (items, users, buckets) if s.blocks]
    return out, {"cold_items.png", "user_coldstart.png", "sparsity.png"}


def paper_sections(c: FolderContents) -> tuple[list[Section], set[str]]:
    table = Section("paper table")
    rows = paper_table(c.tables.get("table.csv", []))
    if rows is not None:
        rows.notes += list(c.result.get("notes") or [])
    table.add(rows)
    table.add(_image(c, "table.png", "by part, with 95% intervals"))
    buckets = Section("per-bucket gains")
    buckets.add(bucket_gains("gain over popularity per bucket", c.tables.get("sparsity.csv", [])))
    return [s for s in (table, buckets) if s.blocks], {"table.png"}


def _image(c: FolderContents, name: str, caption: str) -> Figure | None:
    return Figure(name, c.images[name], caption) if name in c.images else None


def _valid_metric(c: FolderContents) -> str:
    """The run's selection metric, or the first validation figure its history has."""
    metric = (c.result.get("config") or {}).get("valid_metric")
    first = next((r["valid"] for h in c.histories.values() for r in h if r.get("valid")), {})
    return metric if metric in first else next(iter(first), metric or "")


def _per_seed(result: dict) -> dict[int, dict]:
    per = result.get("per_seed") or [result]
    return {int(r.get("seed", 0)): r for r in per if isinstance(r, dict)}
