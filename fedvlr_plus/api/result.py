"""What :meth:`Experiment.run` returns: the table, per-user figures, paired tests, and their renderings.

Each model's per-user figures are averaged over its seeds first (the same users every seed), so the
bootstrap interval and the paired tests are over users of the seed-averaged figure; the ``± sd`` beside the
mean is the spread across seeds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..evaluation import EvalResult, bootstrap_ci, paired_test


def _seed_average(results: list[EvalResult], which: str, keys: list[str]) -> pd.DataFrame:
    frames = [r.frame(which)[["user", *[k for k in keys if k in r.frame(which).columns]]] for r in results]
    return pd.concat(frames).groupby("user", as_index=False).mean()


@dataclass
class ExperimentResult:
    dataset: str
    metrics: list[str]
    per_seed: dict[str, list[EvalResult]]  # model label -> one EvalResult per seed
    protocol: str = "full"
    references: list[str] = field(default_factory=list)
    ci_seed: int = 0  # seed of the bootstrap intervals' resamples

    @property
    def models(self) -> list[str]:
        return list(self.per_seed)

    def per_user(self, model: str, which: str = "all") -> pd.DataFrame:
        """One row per user: ``model``'s figures averaged over its seeds (``which``: all, warm or cold targets)."""
        self._check(model=model, which=which)
        return _seed_average(self.per_seed[model], which, self.metrics)

    def table(self, which: str = "all") -> pd.DataFrame:
        """One row per model: mean over seeds, sd across seeds, 95% bootstrap interval over users, users."""
        self._check(which=which)
        rows = []
        for model, results in self.per_seed.items():
            row = {"model": model, "seeds": len(results)}
            users = self.per_user(model, which)
            row["users"] = len(users)
            for k in self.metrics:
                by_seed = [r.summary(which).get(k, math.nan) for r in results]
                row[k] = float(np.mean(by_seed)) if users.shape[0] else math.nan
                row[f"{k}_sd"] = float(np.std(by_seed, ddof=1)) if len(by_seed) > 1 else 0.0
                ci = bootstrap_ci(users[k].to_numpy(), seed=self.ci_seed) if k in users else [math.nan, math.nan]
                row[f"{k}_ci"] = ci
            rows.append(row)
        return pd.DataFrame(rows).set_index("model")

    def paired(self, a: str, b: str, metric: str, which: str = "all") -> dict:
        """Paired t-test and Wilcoxon test of ``a`` against ``b`` over the users both have (seed-averaged)."""
        self._check(model=a, which=which, where="paired(a=...)")
        self._check(model=b, metric=metric, where="paired(b=...)")

        def wrap(m):  # the seed-averaged users in the slot of ``which``, the other groups empty
            users = self.per_user(m, which)
            frames = {w: users if w == which else users.iloc[:0] for w in ("all", "warm", "cold")}
            return EvalResult(frames["all"], frames["warm"], frames["cold"], metric_names=list(self.metrics))

        return paired_test(wrap(a), wrap(b), metric, which)

    def _check(self, *, model=None, metric=None, which="all", where: str = "model") -> None:
        """A label, metric or target group this result does not have: one line that lists the ones it has."""
        from ..errors import ConfigError

        if model is not None and model not in self.per_seed:
            raise ConfigError(
                f"{where} {model!r}", "no model of this result has that label", f"labels: {', '.join(self.per_seed)}"
            )
        if metric is not None and metric not in self.metrics:
            raise ConfigError(
                f"metric {metric!r}", "not a metric of this result", f"metrics: {', '.join(self.metrics)}"
            )
        if which not in ("all", "warm", "cold"):
            raise ConfigError(f"which={which!r}", "the target groups are 'all', 'warm' and 'cold'")

    def to_dict(self) -> dict:
        table = self.table()
        out = {"dataset": self.dataset, "protocol": self.protocol, "metrics": self.metrics, "models": {}}
        for model in self.models:
            row = table.loc[model]
            out["models"][model] = {
                "seeds": int(row["seeds"]),
                "users": int(row["users"]),
                **{k: _num(row[k]) for k in self.metrics},
                **{f"{k}_sd": _num(row[f"{k}_sd"]) for k in self.metrics},
                **{f"{k}_ci": [_num(x) for x in row[f"{k}_ci"]] for k in self.metrics},
            }
        return out

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def to_markdown(self, which: str = "all") -> str:
        table = self.table(which)
        head = "| model | seeds | users | " + " | ".join(self.metrics) + " |"
        lines = [head, "|" + "---|" * (3 + len(self.metrics))]
        for model, row in table.iterrows():
            cells = [_cell(row, k) for k in self.metrics]
            lines.append(f"| {model} | {int(row['seeds'])} | {int(row['users'])} | " + " | ".join(cells) + " |")
        lines.append("")
        lines.append(
            f"{self.dataset}, test, {self.protocol} protocol: mean over seeds ± sd across seeds "
            f"[95% bootstrap interval over users of the seed-averaged figure]."
        )
        return "\n".join(lines)

    def plot(self, path, metric: str | None = None, which: str = "all") -> None:
        """A bar chart of ``metric`` (default: the first) per model with its interval, written to ``path``."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from ..atomic_write import atomic_write

        metric = metric or self.metrics[0]
        self._check(metric=metric, which=which)
        table = self.table(which)
        means = table[metric].to_numpy(float)
        lo = np.array([c[0] for c in table[f"{metric}_ci"]], float)
        hi = np.array([c[1] for c in table[f"{metric}_ci"]], float)
        fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(table), 3.2))
        ax.bar(range(len(table)), means, yerr=[means - lo, hi - means], capsize=3, color="#4c72b0")
        ax.set_xticks(range(len(table)), table.index, rotation=30, ha="right")
        ax.set_ylabel(f"test {metric}")
        ax.set_title(self.dataset)
        fig.tight_layout()
        atomic_write(path, lambda tmp: fig.savefig(tmp, format=str(path).rsplit(".", 1)[-1], dpi=120))
        plt.close(fig)


def _num(x) -> float | None:
    x = float(x)
    return None if math.isnan(x) else x


def _cell(row, k: str) -> str:
    if math.isnan(row[k]):
        return "—"
    lo, hi = row[f"{k}_ci"]
    return f"{row[k]:.4f} ± {row[f'{k}_sd']:.4f} [{lo:.4f}, {hi:.4f}]"
