"""The bench's result document (schema localspec.bench/1): what ran, on what, and every figure.

Assembled here, not in the CLI, so every front end that runs a bench writes the same document."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from . import report


def pair_info(sel) -> dict:
    def size(p):
        try:
            return Path(p).stat().st_size if p else None
        except OSError:
            return None

    return {"name": sel.name, "target": sel.target, "draft": sel.draft,
            "target_bytes": size(sel.target), "draft_bytes": size(sel.draft)}


def bench_document(engine, sel, settings, opts, costs, results: list[dict], warnings: list[str], command: str,
                   prompts_per_workload: int, auto_profile=None) -> dict:
    from .. import __version__
    from ..backend import system_info

    load = engine.load
    return {
        "schema": "localspec.bench/1",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "localspec": __version__,
        "llama_cpp_python": system_info()["llama_cpp_python"],
        "machine": report.machine_info(),
        "command": command,
        "pair": pair_info(sel),
        "load": {"n_ctx": load.n_ctx, "threads": load.n_threads, "threads_batch": load.n_threads_batch,
                 "n_gpu_layers_target": load.n_gpu_layers_target, "n_gpu_layers_draft": load.n_gpu_layers_draft,
                 "mmap": load.mmap},
        "options": {"max_tokens": opts.max_tokens, "repeat": opts.repeat, "temperature": opts.temperature,
                    "seed": opts.seed, "baseline_every": opts.baseline_every, "warmup": opts.warmup,
                    "prompts_per_workload": prompts_per_workload},
        "settings": [s.to_dict() for s in settings],
        "costs": report.costs_dict(costs),
        "auto_profile": report.costs_dict(auto_profile) if auto_profile else None,
        "warnings": warnings + result_warnings(results),
        "workloads": results,
    }


def result_warnings(results: list[dict]) -> list[str]:
    out, differ = [], []
    for w in results:
        for s in w["settings"]:
            same = s["identical_outputs"]
            if same and same["same"] < same["of"]:
                differ.append(f"{w['workload']} {s['setting']['label']} {same['of'] - same['same']}/{same['of']}")
            ctx = s["pooled"]["stop_reasons"].get("context", 0)
            if ctx:
                out.append(f"{w['workload']}, {s['setting']['label']}: {ctx} runs filled the context; raise --ctx-size")
    if differ:  # one line: the per-setting counts are in the `same` column of the details
        out.insert(0, "greedy outputs that part from plain decoding (near-ties where batched and single-token "
                      "logits round differently; `localspec verify` checks this): " + ", ".join(differ))
    return out
