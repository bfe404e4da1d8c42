"""A bench's runs summed and summarized: per setting (tokens, passes, acceptance, times, ratios against plain,
predicted speedups) and per workload (plain against each setting, greedy outputs compared)."""

from __future__ import annotations

import statistics

from ..costs import predictions as predict
from ..costs.costmodel import CostProfile
from ..stats import Stats
from .workloads import BUILTIN


def spread(values: list[float]) -> dict | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def _add_lists(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def _add_dicts(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def pool_stats(stats: list[Stats]) -> dict:
    """Counters and times summed over runs, and the figures derived from the sums."""
    t = {"runs": len(stats), "tokens": 0, "target_passes": 0, "rounds_plain": 0, "drafted": 0, "accepted": 0,
         "prompt_tokens": 0, "prompt_eval_tokens": 0,
         "drafted_by_position": [], "accepted_by_position": [], "drafted_by_drafter": {},
         "accepted_by_drafter": {}, "tokens_by_source": {}, "stop_reasons": {},
         "prompt_eval_s": 0.0, "draft_s": 0.0, "verify_s": 0.0, "other_s": 0.0, "generation_s": 0.0}
    for s in stats:
        for k in ("tokens", "target_passes", "rounds_plain", "drafted", "accepted", "prompt_tokens",
                  "prompt_eval_tokens"):
            t[k] += getattr(s, k)
        for k in ("prompt_eval_s", "draft_s", "verify_s", "other_s", "generation_s"):
            t[k] += getattr(s, k)
        for k in ("drafted_by_position", "accepted_by_position"):
            t[k] = _add_lists(t[k], getattr(s, k))
        for k in ("drafted_by_drafter", "accepted_by_drafter", "tokens_by_source"):
            t[k] = _add_dicts(t[k], getattr(s, k))
        t["stop_reasons"][s.stop_reason] = t["stop_reasons"].get(s.stop_reason, 0) + 1
    dbp, abp = t["drafted_by_position"], t["accepted_by_position"]
    draft_rounds = t["target_passes"] - t["rounds_plain"]
    t["draft_rounds"] = draft_rounds
    t["tokens_per_second"] = t["tokens"] / t["generation_s"] if t["generation_s"] > 0 else 0.0
    t["acceptance_rate"] = t["accepted"] / t["drafted"] if t["drafted"] else None
    t["alpha"] = predict.estimate_alpha(dbp, abp)
    t["mean_accepted_length"] = t["accepted"] / draft_rounds if draft_rounds else None
    t["mean_draft_length"] = t["drafted"] / draft_rounds if draft_rounds else None
    t["tokens_per_pass"] = t["tokens"] / t["target_passes"] if t["target_passes"] else None
    t["passes_per_token"] = t["target_passes"] / t["tokens"] if t["tokens"] else None
    t["acceptance_by_position"] = [a / d if d else None for a, d in zip(abp, dbp)]
    t["conditional_acceptance_by_position"] = predict.conditional_by_position(dbp, abp)
    t["acceptance_by_drafter"] = {k: (t["accepted_by_drafter"].get(k, 0) / v if v else None)
                                  for k, v in t["drafted_by_drafter"].items()}
    total = t["prompt_eval_s"] + t["generation_s"]
    t["time_split"] = {k: (t[f"{k}_s"] / total if total > 0 else 0.0)
                       for k in ("prompt_eval", "draft", "verify", "other")}
    return t


def summarize_setting(setting, runs: list, prompts: list, costs: CostProfile) -> dict:
    """One setting (runner.Setting) over its runs (runner.BenchRun) of the workload's prompts (workloads.Prompt)."""
    mine = [r for r in runs if r.setting == setting]
    per_prompt = []
    for p in prompts:
        rs = [r for r in mine if r.prompt == p.id]
        if not rs:
            continue
        ratios = [r.ratio for r in rs if r.ratio is not None]
        per_prompt.append({
            "id": p.id,
            "spec_tps": statistics.median([r.tps for r in rs]),
            "plain_tps": statistics.median([r.baseline_tps for r in rs if r.baseline_tps] or [0.0]),
            "ratio": statistics.median(ratios) if ratios else None,
            "tokens": statistics.median([r.stats.tokens for r in rs]),
            "acceptance_rate": (sum(r.stats.accepted for r in rs) / sum(r.stats.drafted for r in rs)
                                if sum(r.stats.drafted for r in rs) else None),
            "identical": None if rs[0].identical is None else all(r.identical for r in rs),
            "latency_s": statistics.median([r.stats.total_s for r in rs]),
            "reference_match": (None if p.reference is None else
                                sum(_same_code(r.text, p.reference) for r in rs) / len(rs)),
        })
    pooled = pool_stats([r.stats for r in mine])
    timed = [r for r in mine if r.baseline_tps]
    spec_s = sum(r.stats.generation_s for r in timed)
    plain_s = sum(r.stats.tokens / r.baseline_tps for r in timed)  # plain's time for the same tokens
    ratio_pooled = plain_s / spec_s if spec_s > 0 and plain_s > 0 else None
    model_share = ((pooled["drafted_by_drafter"].get("model", 0) / pooled["drafted"]) if pooled["drafted"]
                   else (1.0 if setting.drafter == "model" else 0.0))
    plain_share = pooled["rounds_plain"] / pooled["target_passes"] if pooled["target_passes"] else 0.0
    lev = (predict.predict_leviathan(pooled["alpha"], setting.k, costs, model_share, plain_share)
           if setting.spec == "on" else None)
    rounds = predict.predict_from_rounds(pooled["tokens"], pooled["rounds_plain"], pooled["drafted_by_position"],
                                         pooled["drafted_by_drafter"], costs)
    identical = [x["identical"] for x in per_prompt if x["identical"] is not None]
    return {
        "setting": setting.to_dict(),
        "ratio": spread([x["ratio"] for x in per_prompt]),
        "spec_tps": spread([x["spec_tps"] for x in per_prompt]),
        "plain_tps": spread([x["plain_tps"] for x in per_prompt if x["plain_tps"] > 0]),
        "ratio_pooled": ratio_pooled,
        "predicted": {"leviathan": lev, "rounds": rounds},
        "identical_outputs": ({"same": sum(identical), "of": len(identical)} if identical else None),
        "latency_s": spread([x["latency_s"] for x in per_prompt]),
        "reference_match": _matches(per_prompt),
        "pooled": pooled,
        "per_prompt": per_prompt,
    }


def _matches(per_prompt: list[dict]) -> dict | None:
    """Runs (pooled over prompts) whose completion reproduces the real lines: {"same", "of"}."""
    shares = [x["reference_match"] for x in per_prompt if x["reference_match"] is not None]
    return {"same": round(sum(shares), 2), "of": len(shares)} if shares else None


def _same_code(text: str, reference: str) -> bool:
    """The completion reproduces the cut lines (trailing whitespace aside)."""
    def norm(s: str) -> list[str]:
        return [ln.rstrip() for ln in s.strip("\n").splitlines()]
    return norm(text)[:len(norm(reference))] == norm(reference)


def summarize_workload(name: str, prompts: list, runs: list, settings: list,
                       costs: CostProfile) -> dict:
    plain = [r for r in runs if r.setting is None]
    plain_pp = []
    for p in prompts:
        rs = [r for r in plain if r.prompt == p.id]
        plain_pp.append({"id": p.id, "tps": statistics.median([r.tps for r in rs]), "runs": len(rs),
                         "tokens": statistics.median([r.stats.tokens for r in rs]),
                         "latency_s": statistics.median([r.stats.total_s for r in rs]),
                         "reference_match": (None if p.reference is None else
                                             sum(_same_code(r.text, p.reference) for r in rs) / len(rs))})
    return {
        "workload": name,
        "description": BUILTIN.get(name, "user prompts (--prompts)"),
        "prompts": [p.id for p in prompts],
        "plain": {"tps": spread([x["tps"] for x in plain_pp if x["tps"] > 0]), "pooled": pool_stats([r.stats for r in plain]),
                  "latency_s": spread([x["latency_s"] for x in plain_pp]),
                  "reference_match": _matches(plain_pp), "per_prompt": plain_pp},
        "settings": [summarize_setting(s, runs, prompts, costs) for s in settings],
    }
