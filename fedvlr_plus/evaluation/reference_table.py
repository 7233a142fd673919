"""The reference rankers (pop, random, antipop) on a run's test: the bar every model's figures stand beside,
and the whole result of ``run --backbone pop|random|antipop``."""

from __future__ import annotations

from ..backbones import REFERENCE_BACKBONES
from .protocols import evaluate
from .rankers import reference_scorer


def reference_table(data, keys: list[str], **common) -> dict:
    """Test figures of the reference rankers (pop, random, antipop), overall and by warm/cold target. A part the
    test does not have (no cold targets, say) is left out here; the result's ``notes`` say so."""
    out = {}
    for name in REFERENCE_BACKBONES:
        res = evaluate(data, reference_scorer(name, data, seed=common.get("seed", 0)), split="test", **common)
        out[name] = {
            part: {k: v for k, v in res.summary(part).items() if k in keys}
            for part in ("all", "warm", "cold")
            if res.n_users(part)
        }
    return out


def select_keys(value, keys):
    """``value`` cut to the requested metric keys when it is a dict of figures; anything else as it is."""
    if isinstance(value, dict) and all(isinstance(k, str) for k in value) and any(k in value for k in keys):
        return {k: value[k] for k in keys if k in value}
    return value


def reference_run(
    data,
    backbone: str,
    *,
    protocol_name: str,
    split_used: str,
    names,
    ks,
    keys: list[str],
    mask_history: str,
    seed: int,
):
    """``(result, test EvalResult)`` of one reference ranker: valid and test figures (with intervals and the
    warm/cold parts), the other reference rankers beside it, and the data's warnings."""
    protocol = "sampled" if protocol_name == "sampled99" else "full"
    scorer = reference_scorer(backbone, data, seed=seed)
    common = dict(protocol=protocol, ks=ks, metrics=names, mask_history=mask_history, seed=seed)
    valid = evaluate(data, scorer, split="valid", **common)
    test = evaluate(data, scorer, split="test", **common)
    from ..data_identity import split_digest

    result = {
        "dataset": data.name,
        "data_digest": split_digest(data),  # what `experiment paired` checks two runs by
        "backbone": backbone,
        "protocol": protocol_name,
        "split": split_used,
        "mask_history": mask_history,
        "seed": seed,
        "metrics": keys,
        "valid": {k: valid.summary()[k] for k in keys},
    }
    tj = test.to_json(prefix="test")
    result.update({k: select_keys(v, keys) for k, v in tj.items() if k not in result})
    result["n_users"] = int(len(test.per_user))
    result["baselines"] = reference_table(data, keys, **common)
    result["data_warnings"] = data.sanity()
    return result, test
