"""The routing headroom (:mod:`.mor_headroom`) over seeds: mean ± std, paired tests of the oracle weights against
uniform averaging on test, the own-group accuracy summary, and the markdown the docs quote."""

from __future__ import annotations

import time

import numpy as np

from .table import paired_test

ROWS = ("reference", "uniform", "oracle_global", "oracle_per_group", "own_fit")
#: the rewards a GRPO run follows, tested against uniform averaging like the rows above
REWARDS = ("mor_router", "fedavg_reward")
#: those rewards and each one's KL-regularised optimum (``kl_``), in the order of the table
REWARD_ROWS = REWARDS + ("kl_uniform", "kl_mor_router", "kl_fedavg_reward")
#: the pairs the table tests: MoR's routed reward against the FedAvg reward, as rankers and at their optimum
REWARD_PAIRS = (("mor_router", "fedavg_reward"), ("kl_mor_router", "kl_fedavg_reward"), ("kl_mor_router", "kl_uniform"))


def own_group_summary(run: dict) -> dict:
    """Per seed: how many clients are the most accurate on their own group's held-out pairs, and the mean own-
    minus-others accuracy gap of a client on its own group (rows: clients; columns: the participating groups in
    the order of ``run["groups"]``)."""
    acc = np.asarray(run["group_accuracy"])
    col = {g: j for j, g in enumerate(run["groups"])}
    own = [col[c["group"]] for c in run["clients"]]
    best_on_own = sum(int(np.argmax(acc[:, j]) == k) for k, j in enumerate(own))
    gap = [acc[k, j] - np.delete(acc[:, j], k).mean() for k, j in enumerate(own)]
    return {"best_on_own": best_on_own, "n_clients": len(own), "own_gap": float(np.mean(gap))}


def summarise_headroom(runs: list[dict]) -> dict:
    """Mean, std and paired tests (each oracle row against uniform, test HR@10) over the seeds."""

    def values(row, part):
        return [r["rerank"][row][part] for r in runs]

    n_clients = len(runs[0]["clients"])
    rows = ROWS + REWARD_ROWS + tuple(f"client_{k}" for k in range(n_clients))
    stats = {
        f"{row}/{part}": {
            "mean": float(np.mean(values(row, part))),
            "std": float(np.std(values(row, part), ddof=1)) if len(runs) > 1 else float("nan"),
        }
        for row in rows
        for part in ("valid", "test")
    }
    tests = {
        f"{row}-vs-uniform/{part}": paired_test(values(row, part), values("uniform", part))
        for row in ROWS + REWARDS
        if row != "uniform"
        for part in ("valid", "test")
    }
    tests.update(
        {
            f"{a}-vs-{b}/{part}": paired_test(values(a, part), values(b, part))
            for a, b in REWARD_PAIRS
            for part in ("valid", "test")
        }
    )
    own = [own_group_summary(r) for r in runs]
    return {"stats": stats, "tests": tests, "own_group": own}


def run_headroom_seeds(
    data, *, seeds: int = 5, first_seed: int = 0, cfg=None, setting_kw: dict | None = None, seed_kw: dict | None = None
) -> dict:
    """:func:`.mor_headroom.headroom_seed` on every seed of one shared setting, with the summary."""
    from dataclasses import replace

    from .config import MoRConfig
    from .headroom import headroom_seed
    from .seeds import FEDAVG_REWARD, prepare_setting

    cfg = cfg or MoRConfig()
    t0, c0 = time.perf_counter(), time.process_time()
    s = prepare_setting(data, candidates=cfg.candidates, **(setting_kw or {}))
    kw = {k: v for k, v in (seed_kw or {}).items() if k in ("negatives", "view", "test_fraction")}
    kw["fedavg"] = {k: v for k, v in (seed_kw or {}).items() if k in FEDAVG_REWARD}
    runs = [headroom_seed(s, replace(cfg, seed=seed), **kw) for seed in range(first_seed, first_seed + seeds)]
    return {
        "source": getattr(data, "name", "data"),
        "seeds": [r["seed"] for r in runs],
        "per_seed": runs,
        "held_out_clients": [s.names[g] for g in s.held_out],
        "summary": summarise_headroom(runs),
        "seconds": {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0},
    }


def headroom_markdown(result: dict, command: str) -> str:
    st, tests = result["summary"]["stats"], result["summary"]["tests"]
    lines = [
        f"`{command}` ({len(result['seeds'])} seeds)",
        "",
        "| re-ranking of the reference's top candidates by | valid HR@10 | test HR@10 | p vs uniform (valid / test) |",
        "|---|---|---|---|",
    ]
    clients = tuple(k.split("/")[0] for k in st if k.startswith("client_") and k.endswith("/test"))
    rows = ROWS + REWARD_ROWS + clients
    for row in rows:
        p = (
            "—"
            if f"{row}-vs-uniform/test" not in tests
            else f"{tests[f'{row}-vs-uniform/valid']['p']:.3g} / {tests[f'{row}-vs-uniform/test']['p']:.3g}"
        )
        lines.append(
            f"| {row} | {100 * st[f'{row}/valid']['mean']:.2f} ± {100 * st[f'{row}/valid']['std']:.2f} | "
            f"{100 * st[f'{row}/test']['mean']:.2f} ± {100 * st[f'{row}/test']['std']:.2f} | {p} |"
        )
    lines += [
        "",
        "Rows `mor_router` and `fedavg_reward`: the rewards GRPO follows, re-ranking alone; "
        "`kl_<reward>`: the maximiser of GRPO's objective E[R] - beta KL to the reference for that reward "
        "at the run's beta (reference logits / T + reward / beta), where that reward points the policy.",
        "",
        "| reward − reward | valid (p) | test (p) |",
        "|---|---|---|",
    ]
    for a, b in REWARD_PAIRS:
        cells = [
            f"{100 * (st[f'{a}/{part}']['mean'] - st[f'{b}/{part}']['mean']):+.2f} "
            f"({tests[f'{a}-vs-{b}/{part}']['p']:.3g})"
            for part in ("valid", "test")
        ]
        lines.append(f"| {a} − {b} | {cells[0]} | {cells[1]} |")
    own = result["summary"]["own_group"]
    lines += [
        "",
        "Own group: clients most accurate on their own group's held-out pairs, per seed: "
        + ", ".join(f"{o['best_on_own']}/{o['n_clients']}" for o in own)
        + f"; mean own-minus-others accuracy gap {100 * np.mean([o['own_gap'] for o in own]):+.2f} points.",
    ]
    return "\n".join(lines) + "\n"
