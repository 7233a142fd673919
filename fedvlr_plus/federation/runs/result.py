"""The result of a federated ``run``: the engine's figures cut to the requested metrics, laid out as the
reference rankers' result is (valid/test/test_ci/test_warm/test_cold/baselines), plus the selected round,
per-seed figures and history."""

from __future__ import annotations


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
        "backbone": backbone,
        "protocol": protocol_name,
        "split": split_used,
        "mask_history": cfg.mask_history,
        "seed": cfg.seed,
        "metrics": keys,
        "valid": pick(res["valid"]),
        "selected_round": res["selected_round"],
    }
    for part in ("", "_warm", "_cold"):
        if f"{prefix}{part}" in res:
            result[f"test{part}"] = pick(res[f"{prefix}{part}"])
        if f"{prefix}{part}_std" in res:
            result[f"test{part}_std"] = pick(res[f"{prefix}{part}_std"])
        if f"{prefix}{part}_ci" in res:
            result[f"test{part}_ci"] = pick(res[f"{prefix}{part}_ci"])
        if f"{prefix}{part}_n_users" in res:
            result[f"test{part}_n_users"] = res[f"{prefix}{part}_n_users"]
    result["n_users"] = res.get(f"{prefix}_n_users", res.get("n_users"))
    if recbole_test:
        # RecBole's own Collector + metric classes on the same masked scores at the selected round(s)
        per = [recbole_test[k] for k in sorted(recbole_test)]
        result["test_recbole"] = pick({k: float(sum(d[k] for d in per) / len(per)) for k in per[0]})
        result["evaluator"] = "recbole"
    if router:
        result["router"] = router[max(router)] if len(router) == 1 else {"per_seed": router, **router[min(router)]}
    if fusion != "none":
        result["fusion"] = fusion
        result["backbone"] = f"{backbone}+{fusion}"
    other = "test_sampled" if protocol == "full" else "test"
    if res.get(other) is not None:  # (sampled beside full with --test-both-protocols)
        result[f"other_protocol_{'sampled' if protocol == 'full' else 'full'}"] = pick(res.get(other))
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
    for key in (
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
    ):
        if key in res:
            result[key] = res[key]
    return result
