"""The result of a federated ``run``: the engine's figures cut to the requested metrics, laid out as the
reference rankers' result is (valid/test/test_ci/test_warm/test_cold/baselines), plus the selected round,
per-seed figures and history."""

from __future__ import annotations

#: what the engine's result carries through to the CLI's as it is
RUN_PARTS = (
    "strategy",
    "simulator",
    "rounds_run",
    "stopped_early",
    "resolved",
    "model",
    "config",
    "history",
    "per_seed",
    "seeds",
    "notes",
    "privacy",
)


def federated_result(
    res: dict,
    data,
    *,
    backbone: str,
    fusion: str,
    protocol_name: str,
    protocol: str,
    split_used: str,
    cfg,
    keys: list[str],
    metrics,
    ks,
    recbole_test: dict | None = None,
    router: dict | None = None,
) -> dict:
    """``res`` of :func:`run_federated` as the CLI's result dict. ``recbole_test``: RecBole's own evaluator at the
    selected round of each seed (seed -> figures); ``router``: the router report of each seed."""
    from ...evaluation.reference_table import reference_table

    prefix = "test" if protocol == "full" else "test_sampled"
    pick = lambda d: {k: d[k] for k in keys if k in d} if isinstance(d, dict) else d  # noqa: E731
    result = {
        "dataset": data.name,
        "data_digest": res.get("data_digest"),
        "backbone": backbone,
        "protocol": protocol_name,
        "split": split_used,
        "mask_history": cfg.mask_history,
        "seed": cfg.seed,
        "metrics": keys,
        "valid": pick(res["valid"]),
        "selected_round": res["selected_round"],
    }
    result.update(_test_parts(res, prefix, pick))
    result.update(_reports(res, protocol, recbole_test, router, pick))
    if fusion != "none":
        result["fusion"] = fusion
        result["backbone"] = f"{backbone}+{fusion}"
    result["baselines"] = reference_table(
        data,
        keys,
        protocol=protocol,
        ks=tuple(ks),
        metrics=tuple(metrics),
        mask_history=cfg.mask_history,
        seed=cfg.seed,
    )
    result["data_warnings"] = data.sanity()
    result.update({key: res[key] for key in RUN_PARTS if key in res})
    return result


def _test_parts(res: dict, prefix: str, pick) -> dict:
    """The test figures of the run's protocol (``prefix``) under the plain names: all, warm and cold targets."""
    out = {}
    for part in ("", "_warm", "_cold"):
        for suffix in ("", "_std", "_ci"):
            if f"{prefix}{part}{suffix}" in res:
                out[f"test{part}{suffix}"] = pick(res[f"{prefix}{part}{suffix}"])
        if f"{prefix}{part}_n_users" in res:
            out[f"test{part}_n_users"] = res[f"{prefix}{part}_n_users"]
    out["n_users"] = res.get(f"{prefix}_n_users", res.get("n_users"))
    return out


def _reports(res: dict, protocol: str, recbole_test: dict | None, router: dict | None, pick) -> dict:
    """RecBole's evaluator, the router report and the other protocol's test, where the run has them."""
    out = {}
    if recbole_test:
        # RecBole's own Collector + metric classes on the same masked scores at the selected round(s)
        per = [recbole_test[k] for k in sorted(recbole_test)]
        out["test_recbole"] = pick({k: float(sum(d[k] for d in per) / len(per)) for k in per[0]})
        out["evaluator"] = "recbole"
    if router:
        out["router"] = router[max(router)] if len(router) == 1 else {"per_seed": router, **router[min(router)]}
    other = "test_sampled" if protocol == "full" else "test"
    if res.get(other) is not None:  # (sampled beside full with --test-both-protocols)
        out[f"other_protocol_{'sampled' if protocol == 'full' else 'full'}"] = pick(res.get(other))
    return out
