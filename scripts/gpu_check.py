"""Does verifying k tokens cost, in localspec's generation, what llama.cpp says it costs on this device?

1. llama.cpp's llama-bench (built from the same sdist, for the backend found) times passes of 1, 2, 4, 8
   tokens, each size repeated (`-p 1,2,4,8 -n 0`): the backend's own curve, T(n)/T(1).
2. localspec's T_verify(n)/T_decode as generation sees it (tuning.measure_costs: sizes interleaved),
   and the same curve with each size repeated (tuning.steady_verify).
3. CUDA only: graph warm-ups and resets counted in llama.cpp's log during a localspec generation, with
   constant verify shapes on and off; then the same with graphs disabled (GGML_CUDA_DISABLE_GRAPHS=1).
4. The end-to-end bench: plain against --spec auto on the default workloads.
The last line states the largest gap between localspec's curve and llama-bench's, in percent.

Runs on any build (CPU, CUDA, Vulkan, Metal): the backend is the one llama-cpp-python was built with
(`localspec doctor` says which); `--backend` picks llama-bench's build.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from harness import llamacpp_tools
from localspec.config import LoadConfig
from localspec.costs.tuning import measure_costs, steady_verify
from localspec.engine import Engine
from localspec.session import ModelChoice, select_models

SIZES = (1, 2, 4, 8)
GRAPH_WORDS = {"warmup": re.compile(rb"graph.*warm", re.I), "reset": re.compile(rb"graph.*(reset|disabl)", re.I)}


def backend_of_build() -> str:
    from localspec.doctor import llama_build_info
    return llama_build_info().get("compiled_backend") or "cpu"


def llama_bench_curve(binary: Path, model: str, threads: int, ngl: int) -> list[float]:
    out = subprocess.run([str(binary), "-m", model, "-p", ",".join(map(str, SIZES)), "-n", "0", "-r", "5",
                          "-t", str(threads), "-ngl", str(ngl), "-o", "json"], capture_output=True, text=True,
                         check=True).stdout
    rows = {r["n_prompt"]: r["avg_ts"] for r in json.loads(out) if r.get("n_gen", 0) == 0}
    per_pass = [n / rows[n] for n in SIZES]  # seconds per pass of n tokens
    return [t / per_pass[0] for t in per_pass]


def localspec_curves(target: str, threads: int, ngl: int) -> tuple[list[float], list[float], list[float]]:
    """T(n)/T(1): as generation runs verification (sizes interleaved, every row's logits), with each size
    repeated, and repeated with the last row's logits only (what llama-bench's prompt passes compute)."""
    e = Engine(target, None, LoadConfig(n_threads=threads, n_threads_batch=threads, n_gpu_layers_target=ngl,
                                        adapt_threads=False))
    try:
        prof = measure_costs(e, n_max=max(SIZES), repeats=5, warmup=2)
        steady = steady_verify(e.target, max(SIZES))
        last_row = steady_verify(e.target, max(SIZES), logits="last")
    finally:
        e.close()

    def rel(ts):
        return [ts[n - 1] / ts[0] for n in SIZES]
    return rel(prof.t_verify), rel(steady), rel(last_row)


def graph_counts(target: str, draft: str, env_extra: dict, pad: bool) -> dict:
    """One 128-token speculative generation in a child process with llama.cpp's log on; its graph lines counted."""
    code = (f"from localspec.engine import Engine\nfrom localspec.config import GenConfig, LoadConfig\n"
            f"e = Engine({target!r}, {draft!r}, LoadConfig(verify_buckets={pad}))\n"
            f"p = e.prompt_tokens('Write a Python function that parses a CSV file.')\n"
            f"e.complete(p, GenConfig(temperature=0, max_tokens=128, spec='on', drafter='model', draft_max=4))\n")
    env = {**os.environ, "LOCALSPEC_DEBUG": "1", **env_extra}
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, timeout=600)
    if child.returncode != 0:
        return {"failed": [line for line in child.stderr.decode(errors="replace").splitlines() if "Error" in line][-1:]}
    return {k: len(rx.findall(child.stderr)) for k, rx in GRAPH_WORDS.items()}


def end_to_end(args) -> str:
    cmd = [sys.executable, "-m", "localspec", "bench", "--prompts-per-workload", "2", "-n", "96", "--setting",
           "auto:hybrid", "--target", args.target, "--draft", args.draft]
    child = subprocess.run(cmd, capture_output=True, text=True)
    return child.stdout if child.returncode == 0 else child.stdout + child.stderr[-2000:]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="target GGUF (default: the default pair's, or a shape twin's path)")
    p.add_argument("--draft", help="draft GGUF (default: the default pair's)")
    p.add_argument("--llama-bench", type=Path, help="a llama-bench binary (default: built from the sdist, cached)")
    p.add_argument("--backend", choices=sorted(llamacpp_tools.BACKEND_FLAGS), help="llama-bench's build (default: "
                   "the backend llama-cpp-python has)")
    p.add_argument("--no-e2e", action="store_true", help="skip the end-to-end bench")
    a = p.parse_args()
    if not a.target:
        sel = select_models(ModelChoice())
        a.target, a.draft = sel.target, a.draft or sel.draft
    backend = a.backend or backend_of_build()
    ngl = 0 if backend == "cpu" else -1
    threads = os.cpu_count() or 1
    bench = a.llama_bench or llamacpp_tools.build("llama-bench", backend)
    print(f"backend {backend}, llama.cpp {llamacpp_tools.sdist_version()} (llama-cpp-python's), "
          f"target {Path(a.target).name}, {threads} threads")
    theirs = llama_bench_curve(bench, a.target, threads, ngl)
    seen, steady, last_row = localspec_curves(a.target, threads, ngl)
    print("\n| n | llama-bench T(n)/T(1) | localspec, as generation runs it | localspec, each size repeated "
          "| the same, last row's logits only (as llama-bench) |")
    print("|---|---|---|---|---|")
    for i, n in enumerate(SIZES):
        print(f"| {n} | {theirs[i]:.2f} | {seen[i]:.2f} | {steady[i]:.2f} | {last_row[i]:.2f} |")
    print("(verification reads every row's logits, llama-bench's prompt passes only the last row's: the "
          "difference between the last two columns is that output, not the shapes)")
    if backend == "cuda" and a.draft:
        print("\nCUDA graphs in one 128-token speculative generation (llama.cpp's log):")
        for label, env, pad in (("verify shapes as drafted", {}, False), ("constant verify shapes", {}, True),
                                ("graphs disabled", {"GGML_CUDA_DISABLE_GRAPHS": "1"}, False)):
            print(f"  {label}: {graph_counts(a.target, a.draft, env, pad)}")
    if not a.no_e2e and a.draft:
        print("\n" + end_to_end(a))
    def worst(curve):
        gaps = [abs(s - t) / t * 100 for s, t in zip(curve, theirs)]
        i = max(range(len(SIZES)), key=lambda j: gaps[j])
        return f"{gaps[i]:.0f}% at n = {SIZES[i]}"
    print(f"largest gap between localspec's verify curve and llama-bench's: {worst(seen)} (same outputs as "
          f"llama-bench, last row only: {worst(last_row)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
