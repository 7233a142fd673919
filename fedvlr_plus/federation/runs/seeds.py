"""One result from the results of a run's seeds: means and standard deviations of every figure that every seed
has, the parts some seed lacks named in ``notes``, and every seed's own result kept under ``per_seed``."""

from __future__ import annotations

import numpy as np


def _mean_std(dicts: list[dict]) -> tuple[dict, dict]:
    """Mean and standard deviation over seeds of every figure that every seed has (a null figure is missing)."""
    keys = sorted(set.intersection(*(set(d) for d in dicts))) if dicts else []
    keys = [k for k in keys if all(isinstance(d[k], (int, float)) and d[k] == d[k] for d in dicts)]
    mean = {k: float(np.mean([d[k] for d in dicts])) for k in keys}
    std = {k: float(np.std([d[k] for d in dicts], ddof=1)) if len(dicts) > 1 else 0.0 for k in keys}
    return mean, std


SEED_PARTS = ("valid", "test", "test_warm", "test_cold", "test_sampled", "test_sampled_warm", "test_sampled_cold")


def _part_present(result: dict, key: str) -> bool:
    """A seed has a part when it has figures for it and (where counted) users in it."""
    part = result.get(key)
    return isinstance(part, dict) and any(v is not None for v in part.values()) and result.get(f"{key}_n_users", 1) != 0


def combine_seeds(results: list[dict]) -> dict:
    """One seed: its result plus ``per_seed``. Several: means (and ``*_std``) of the figures, per-seed results.

    Only parts present in every seed are combined; a part absent from some seed keeps its key with null mean and
    std, and ``notes`` says in which seeds it was absent (with every seed's own notes, without repeats).
    """
    if len(results) == 1:
        out = dict(results[0])
        out["per_seed"] = [results[0]]
        return out
    out = {
        "backbone": results[0]["backbone"],
        "dataset": results[0]["dataset"],
        "data_digest": results[0].get("data_digest"),
        "seeds": [r["seed"] for r in results],
        "selected_round": [r["selected_round"] for r in results],
        "strategy": results[0]["strategy"],
        "simulator": results[0]["simulator"],
    }
    notes = list(dict.fromkeys(n for r in results for n in r.get("notes", [])))
    for key in SEED_PARTS:
        counts = [r[f"{key}_n_users"] for r in results if f"{key}_n_users" in r]
        if counts:
            out[f"{key}_n_users"] = counts[0] if len(set(counts)) == 1 else counts
        absent = [r["seed"] for r in results if not _part_present(r, key)]
        if not absent:
            out[key], out[f"{key}_std"] = _mean_std([r[key] for r in results])
        elif any(key in r for r in results):
            out[key] = out[f"{key}_std"] = None
            label = key.replace("_", " ")
            if len(absent) < len(results):
                notes.append(f"{label}: absent in seeds {', '.join(map(str, absent))}; not combined over seeds")
            elif not any(n.startswith(f"{label}:") for n in notes):  # else every seed's own note says why
                notes.append(f"{label}: absent in every seed")
    if "test_n_users" in out:
        out["n_users"] = out["test_n_users"]
    out["notes"] = notes
    out["config"] = results[0]["config"]
    if "privacy" in results[0]:  # the same for every seed but for the rounds each ran: the most spent
        out["privacy"] = max((r["privacy"] for r in results), key=lambda p: p["rounds"])
    out["per_seed"] = results
    return out
