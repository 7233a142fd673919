"""The layer against its backbone alone (and the content-only ranker): paired tests over the same users.

Both models of a study score the same users on the same targets, so each user is a pair; the result holds the mean
difference (layer − other), the paired t-test and the Wilcoxon signed-rank test
(:func:`fedvlr_plus.evaluation.stats.paired_frames`), each user's figure being their mean over the seeds:

- joining users: per support size and metric (:func:`paired_against_backbone`);
- cold items: the layer's headline rule against each variant of the backbone alone (as trained, every cold rule)
  and against the content-only ranker, per part (cold among cold items, cold among all, warm) and metric
  (:func:`paired_cold_items`).
"""

from __future__ import annotations

#: the key under which :func:`~.experiment.user_coldstart` hands its per-user frames over (removed before JSON)
PER_USER = "_per_user"
#: the key under which a study's result holds its joining users' per-user frames until the report folder is
#: written (``{model: {support: frame}}``; never in the JSON)
JOINING_FRAMES = "_joining_per_user"
#: the same for a cold-item study's per-user frames (``{model: {variant: {part: frame}}}``; never in the JSON)
COLD_ITEM_FRAMES = "_cold_item_per_user"


def paired_against_backbone(layer: dict, alone: dict, keys) -> dict:
    """``{support: {metric: paired test}}`` of the layer's joining users against the backbone's."""
    from ..evaluation.stats import paired_frames

    a, b = layer[PER_USER], alone[PER_USER]
    return {
        n: {k: paired_frames(a[n], b[n], k, which=f"joining users, support {n}") for k in keys} for n in a if n in b
    }


def paired_cold_items(layer: dict, alone: dict | None, keys) -> dict:
    """``{other: {part: {metric: paired test}}}``: the layer's headline cold-item variant against the backbone
    alone's variants (``backbone alone, <rule>``) and the content-only ranker."""
    from ..evaluation.stats import paired_frames

    mine = layer[PER_USER]["headline"]
    others = {"content only": layer[PER_USER].get("content only", {})}
    if alone is not None and PER_USER in alone:
        others.update(
            {
                f"backbone alone, {name}": parts
                for name, parts in alone[PER_USER].items()
                if name not in ("headline", "content only")
            }
        )
    return {
        other: {
            part: {k: paired_frames(mine[part], theirs[part], k, which=part) for k in keys}
            for part in mine
            if part in theirs
        }
        for other, theirs in others.items()
    }
