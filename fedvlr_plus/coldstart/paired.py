"""Joining users served by the layer against its backbone alone: paired tests over the same users.

Both models of a new-user study score the same reported joining users with the same support and query, so each
user is a pair; per support size and metric the result holds the mean difference (layer − backbone), the paired
t-test and the Wilcoxon signed-rank test (:func:`fedvlr_plus.evaluation.stats.paired_frames`), each user's figure
being their mean over the seeds.
"""
from __future__ import annotations

#: the key under which :func:`~.experiment.user_coldstart` hands its per-user frames over (removed before JSON)
PER_USER = "_per_user"


def paired_against_backbone(layer: dict, alone: dict, keys) -> dict:
    """``{support: {metric: paired test}}`` of the layer's joining users against the backbone's."""
    from ..evaluation.stats import paired_frames

    a, b = layer[PER_USER], alone[PER_USER]
    return {n: {k: paired_frames(a[n], b[n], k, which=f"joining users, support {n}") for k in keys}
            for n in a if n in b}
