"""Per-user evaluation results, their summaries, bootstrap intervals and a JSON form for reports.

Empty parts (see docs/reports.md): a part no user has (no cold targets, no warm targets) keeps its keys in the
JSON form with ``<prefix>_<part>_n_users: 0`` and null figures and intervals, and ``notes`` says so in words
(``"test cold: no cold targets in test; every target item was seen in training"``). Nothing is dropped
silently and nothing is computed from no users.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .metrics import TIE_POLICY
from .stats import bootstrap_cis

WHICH = ("all", "warm", "cold")


@dataclass
class EvalResult:
    """Per-user metric values for one (model, split, protocol) evaluation.

    ``per_user`` has one row per evaluated user: ``user`` (internal id), ``n_targets`` and one column per
    metric (``hr@10``, ``ndcg@10``, ...), values in [0, 1]. ``per_user_warm`` / ``per_user_cold`` hold the
    same metrics computed on the user's warm targets only (item seen in training) and cold targets only
    (item never in training); users without such targets are absent. The candidate set is the same in all
    three: only the set of relevant items changes. Under the sampled protocol ``n_targets`` is the number of
    (user, target) pairs and each value is the mean over the user's pairs.

    ``meta`` records the protocol, split, masking, seed, K list and ``n_candidates`` (per row of ``per_user``).

    Tie policy: every value is the exact expectation over uniformly random orderings of tied scores
    ("expected over random tie orders"); see :mod:`fedvlr_plus.evaluation.metrics`.
    """

    per_user: pd.DataFrame
    per_user_warm: pd.DataFrame
    per_user_cold: pd.DataFrame
    metric_names: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.metric_names:
            self.metric_names = [c for c in self.per_user.columns if "@" in c]

    # ------------------------------------------------------------------ access
    def frame(self, which: str = "all") -> pd.DataFrame:
        if which == "all":
            return self.per_user
        if which == "warm":
            return self.per_user_warm
        if which == "cold":
            return self.per_user_cold
        raise ValueError(f"which must be one of {', '.join(WHICH)}, got {which!r}")

    def n_users(self, which: str = "all") -> int:
        return int(len(self.frame(which)))

    # ------------------------------------------------------------------ aggregates
    def summary(self, which: str = "all") -> dict[str, float]:
        """Metric -> mean over users (each user weighs the same). NaN when no user is in the group."""
        f = self.frame(which)
        return {m: (float(f[m].mean()) if len(f) and m in f.columns else math.nan) for m in self.metric_names}

    def ci(
        self, which: str = "all", level: float = 0.95, n_resamples: int = 2000, seed: int = 0, method: str = "BCa"
    ) -> dict[str, list[float]]:
        """Metric -> ``[low, high]`` bootstrap interval of the mean over users (:func:`.stats.bootstrap_cis`: SciPy's
        resamples, the users drawn once for every metric)."""
        f = self.frame(which)
        columns = {m: (f[m].to_numpy() if m in f.columns else []) for m in self.metric_names}
        return bootstrap_cis(columns, level=level, n_resamples=n_resamples, seed=seed, method=method)

    def to_json(self, prefix: str = "test", ci: bool = True) -> dict:
        """A JSON-ready dict: summaries for all/warm/cold targets, user counts, optional CIs and the tie policy.

        Keys: ``prefix`` (summary), ``prefix_warm``, ``prefix_cold``, ``n_users`` and ``prefix_n_users``,
        ``prefix_warm_n_users``, ``prefix_cold_n_users``, ``tie_policy``, ``protocol``, ``notes`` (one sentence
        per empty part, see :meth:`notes`); with ``ci=True`` also ``prefix_ci``, ``prefix_warm_ci``,
        ``prefix_cold_ci``. Undefined means and intervals (an empty group) become None.
        """
        out = {
            prefix: _clean(self.summary("all")),
            f"{prefix}_warm": _clean(self.summary("warm")),
            f"{prefix}_cold": _clean(self.summary("cold")),
            "n_users": self.n_users("all"),
            f"{prefix}_n_users": self.n_users("all"),
            f"{prefix}_warm_n_users": self.n_users("warm"),
            f"{prefix}_cold_n_users": self.n_users("cold"),
            "tie_policy": TIE_POLICY,
            "notes": self.notes(prefix),
        }
        for key in ("protocol", "split", "mask_history", "n_negatives", "seed"):
            if key in self.meta:
                out[f"{prefix}_{key}" if key != "protocol" else "protocol"] = self.meta[key]
        if ci:
            out[f"{prefix}_ci"] = _clean(self.ci("all"))
            out[f"{prefix}_warm_ci"] = _clean(self.ci("warm"))
            out[f"{prefix}_cold_ci"] = _clean(self.ci("cold"))
        return out

    def notes(self, prefix: str = "test") -> list[str]:
        """One sentence per part without users, e.g. ``"test cold: no cold targets in test"``."""
        split = self.meta.get("split", prefix.split("_")[0])
        return [empty_part_note(prefix, which, split) for which in WHICH if not self.n_users(which)]


def empty_part_reason(which: str, split: str = "test") -> str:
    """What a report prints in place of the figures of a part without users: ``no cold targets in test; ...``."""
    return {
        "all": f"no users with targets in {split}",
        "warm": f"no warm targets in {split}; every target item is new to training",
        "cold": f"no cold targets in {split}; every target item was seen in training",
    }[which]


def empty_part_note(prefix: str, which: str, split: str = "test") -> str:
    """The ``notes`` sentence for a part without users: ``"test cold: no cold targets in test; ..."``."""
    label = prefix.replace("_", " ") + ("" if which == "all" else f" {which}")
    return f"{label}: {empty_part_reason(which, split)}"


def _clean(d: dict) -> dict:
    """NaN -> None so the dict is strict JSON."""

    def fix(v):
        if isinstance(v, list):
            return [fix(x) for x in v]
        if isinstance(v, (float, np.floating)):
            return None if not math.isfinite(float(v)) else float(v)
        return v

    return {k: fix(v) for k, v in d.items()}
