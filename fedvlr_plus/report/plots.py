"""The report's own plots, drawn with matplotlib as PNG bytes (the page embeds them, so it opens without a
network): a run's learning curves, the router's weights at the selected round, and the router round by round
where the run logged it (``--log csv``)."""

from __future__ import annotations

import io

#: one colour per seed, in order, so a seed keeps its colour across the plots of one page
_SEED_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display: the plots only ever go into a file
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    _pyplot().close(fig)
    return buf.getvalue()


def _round_axes(*axes, legend_size: int = 8) -> None:
    """Axes over rounds: ticks at whole rounds only, a label, a light grid and the legend."""
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=legend_size)


def _colour(i: int) -> str:
    return _SEED_COLOURS[i % len(_SEED_COLOURS)]


def learning_curves(histories: dict[int, list[dict]], metric: str, selected: dict[int, int]) -> bytes:
    """Validation ``metric`` and training loss per round, one line per seed; a dot marks each seed's selected
    round."""
    plt = _pyplot()
    fig, (ax_valid, ax_loss) = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, (seed, history) in enumerate(histories.items()):
        evaluated = [r for r in history if metric in (r.get("valid") or {})]
        rounds = [r["round"] for r in evaluated]
        values = [r["valid"][metric] for r in evaluated]
        ax_valid.plot(rounds, values, marker=".", color=_colour(i), label=f"seed {seed}")
        if seed in selected and selected[seed] in rounds:
            at = rounds.index(selected[seed])
            ax_valid.plot([rounds[at]], [values[at]], "o", ms=9, mfc="none", color=_colour(i))
        ax_loss.plot(
            [r["round"] for r in history], [r["loss"] for r in history], color=_colour(i), label=f"seed {seed}"
        )
    ax_valid.set_title(f"validation {metric} (circle: selected round)", fontsize=10)
    ax_loss.set_title("training loss (mean over clients)", fontsize=10)
    _round_axes(ax_valid, ax_loss)
    return _png(fig)


def router_weights(routers: dict[int, dict]) -> bytes:
    """The mean weight of each expert over the users at the selected round, with its spread across users (one
    standard deviation), a bar per seed; the dashed line is uniform routing (1 / experts)."""
    plt = _pyplot()
    experts = next(iter(routers.values()))["experts"]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(experts) + 2), 3.4))
    width = 0.8 / len(routers)
    for i, (seed, report) in enumerate(routers.items()):
        x = [j + (i - (len(routers) - 1) / 2) * width for j in range(len(experts))]
        ax.bar(
            x,
            report["mean_weights"],
            width,
            yerr=report.get("std_across_users"),
            capsize=4,
            color=_colour(i),
            label=f"seed {seed}",
        )
    ax.axhline(1 / len(experts), ls="--", color="#555555", lw=1, label="uniform")
    ax.set_xticks(range(len(experts)), experts, fontsize=9)
    ax.set_ylabel("weight")
    ax.set_title("mean weight per expert (±1 sd across users)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def router_rounds(round_logs: dict[int, list[dict]]) -> bytes | None:
    """The router's mean weights and mean entropy round by round (``--log csv``); None without router columns."""
    weights = sorted({k for rows in round_logs.values() for row in rows for k in row if k.startswith("router/weight/")})
    if not weights:
        return None
    plt = _pyplot()
    fig, (ax_w, ax_h) = plt.subplots(1, 2, figsize=(10, 3.4))
    styles = ("-", "--", ":", "-.")
    for i, (seed, rows) in enumerate(round_logs.items()):
        for j, tag in enumerate(weights):
            points = [(r["round"], r[tag]) for r in rows if tag in r]
            ax_w.plot(
                *zip(*points),
                ls=styles[j % len(styles)],
                color=_colour(i),
                label=f"{tag.rsplit('/', 1)[1]}, seed {seed}",
            )
        points = [(r["round"], r["router/entropy"]) for r in rows if "router/entropy" in r]
        if points:
            ax_h.plot(*zip(*points), marker=".", color=_colour(i), label=f"seed {seed}")
    ax_w.set_title("router: mean weight per expert, by round", fontsize=10)
    ax_h.set_title("router: mean entropy over users, by round", fontsize=10)
    _round_axes(ax_w, ax_h, legend_size=7)
    return _png(fig)
