"""On a machine with a GPU: localspec against llama-server built for the same backend from the same sdist.

1. The race (scripts/race.py --backend B): `localspec serve` (its own placement, --spec auto) and its --spec
   off twin against llama-server plain, --spec-default and `-md DRAFT --spec-type draft-simple`, every layer on
   the device, on the edits, chats and follow-ups, all up at once, requests alternating: end-to-end tok/s each.
2. The real pair's acceptance by draft position on this machine (the 0.5B drafting for the 1.5B, greedy, k = 8,
   on the race's code and chat prompts): what a model draft earns per round.
3. Memory-bound targets: Qwen2.5-shaped twins at Q4_K_M (7B, 14B: random weights, the real tokenizer; those
   whose layers all fit the card at a 4k context) with a 0.5B-shaped twin as the draft. Each side's pass costs
   are measured on the card, localspec's as its generation runs them (costs/tuning.py), llama.cpp's with
   llama-bench; the speed-up of a model draft is then ESTIMATED for both at step 2's acceptance (a twin's own
   outputs are noise, so no twin is ever raced for acceptance): the best k of each, tokens per round over
   k drafted decodes and one verify pass of k + 1, against a plain decode.

  scripts/gpu-race                                  # all three (about half an hour)
  scripts/gpu-race --skip-race --sizes 7b           # the twins alone
  scripts/gpu-race --allow-cpu --skip-race --sizes 0.5b --prompts 2   # a dry run of steps 2-3 on a CPU build
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import llamacpp_tools
from harness.qwen_headers import QWEN25, write_qwen25_twin
from localspec.config import GenConfig, LoadConfig
from localspec.costs.tuning import measure_costs
from localspec.engine import Engine
from localspec.models.gguf_header import read_layout_file
from localspec.models.placement import fit_pair, shape_of

K_MAX = 8
HERE = Path(__file__).resolve().parent


def acceptance_by_position(target: str, draft: str, ngl: int, n_prompts: int) -> list[float]:
    """P(draft token i accepted | tokens before it accepted), i = 1..K_MAX, greedy, on the race's prompts."""
    import race

    e = Engine(target, draft, LoadConfig(n_gpu_layers_target=ngl, n_gpu_layers_draft=ngl))
    drafted, accepted = [0] * K_MAX, [0] * K_MAX
    try:
        for text in (race.CODE + race.CHAT)[:n_prompts]:
            prompt = e.prompt_tokens(text)
            cfg = GenConfig(temperature=0, max_tokens=200, spec="on", drafter="model", draft_max=K_MAX, p_min=0.0)
            for _ in e.generate(prompt, cfg):
                pass
            s = e.last_stats
            for i in range(min(K_MAX, len(s.drafted_by_position))):
                drafted[i] += s.drafted_by_position[i]
                accepted[i] += s.accepted_by_position[i]
    finally:
        e.close()
    return [a / d if d else 0.0 for a, d in zip(accepted, drafted)]


def best_speedup(acc: list[float], t_decode: float, t_verify, t_draft: float) -> tuple[float, int]:
    """(expected tokens/s over plain decoding, k) at the best k: 1 + E[accepted] tokens a round."""
    best = (1.0, 0)
    for k in range(1, K_MAX + 1):
        expected, p = 1.0, 1.0
        for i in range(k):
            p *= acc[i]
            expected += p
        best = max(best, (expected / (k * t_draft + t_verify(k + 1)) * t_decode, k))
    return best


def llama_costs(bench: Path, target: str, draft: str, ngl: int) -> tuple[float, list[float], float]:
    """(decode s, pass s for n = 1..K_MAX+1, the draft's decode s) from llama-bench on the same card."""
    def run(model: str, *args: str) -> list[dict]:
        out = subprocess.run([str(bench), "-m", model, "-ngl", str(ngl), "-r", "5", "-o", "json", *args],
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)
    sizes = ",".join(str(n) for n in range(1, K_MAX + 2))
    passes = {r["n_prompt"]: r["n_prompt"] / r["avg_ts"] for r in run(target, "-p", sizes, "-n", "0")}
    decode = next(1 / r["avg_ts"] for r in run(target, "-p", "0", "-n", "64"))
    draft_decode = next(1 / r["avg_ts"] for r in run(draft, "-p", "0", "-n", "64"))
    return decode, [passes[n] for n in range(1, K_MAX + 2)], draft_decode


def twins(args, pair, ngl: int, acc: list[float], work: Path, backend: str) -> None:
    from localspec.backend.devices import gpu_devices

    free = sum(d["memory_free"] for d in gpu_devices()) if ngl else 1 << 62
    bench = args.llama_bench or llamacpp_tools.build("llama-bench", backend)
    dtwin = write_qwen25_twin(work / "0.5b-twin.gguf", "0.5b", str(pair.target_path))
    print("\n| target twin (Q4_K_M) | decode ms | localspec: est. speed-up (k) | llama-server draft-simple: est. (k) |")
    print("|---|---|---|---|")
    for size in args.sizes.split(","):
        twin = write_qwen25_twin(work / f"{size}-twin.gguf", size, str(pair.target_path))
        placed = fit_pair(shape_of(read_layout_file(twin)), shape_of(read_layout_file(dtwin)), free, 4096, True)
        if ngl and placed.target_layers < QWEN25[size][0] + 1:
            print(f"| {size} | does not fit the card whole ({placed.describe(shape_of(read_layout_file(twin)), None)}) | | |")
            twin.unlink()
            continue
        e = Engine(str(twin), str(dtwin), LoadConfig(n_gpu_layers_target=ngl, n_gpu_layers_draft=ngl, adapt_threads=False))
        try:
            prof = measure_costs(e, n_max=K_MAX + 1)
        finally:
            e.close()
        ours = best_speedup(acc, prof.t_decode, prof.verify, prof.t_draft)
        decode, passes, draft_decode = llama_costs(bench, str(twin), str(dtwin), ngl)
        theirs = best_speedup(acc, decode, lambda n: passes[n - 1], draft_decode)
        print(f"| {size} | {prof.t_decode * 1e3:.2f} (llama-bench {decode * 1e3:.2f}) | {ours[0]:.2f}x ({ours[1]}) "
              f"| {theirs[0]:.2f}x ({theirs[1]}) |", flush=True)
        twin.unlink()
    print("(estimated: each side's pass costs measured on this card, both at the acceptance above; twins' own "
          "outputs are noise)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="7b,14b", help=f"target twins, of {', '.join(QWEN25)} (default 7b,14b)")
    p.add_argument("--skip-race", action="store_true", help="no race of the real pair (steps 2-3 only)")
    p.add_argument("--allow-cpu", action="store_true", help="run on a CPU build too (a dry run: no GPU figures)")
    p.add_argument("--prompts", type=int, default=10, help="prompts the acceptance is measured on (default 10)")
    p.add_argument("--llama-bench", type=Path, help="a llama-bench binary (default: built from the sdist, cached)")
    a = p.parse_args()
    from localspec import models
    from localspec.doctor import llama_build_info

    backend = llama_build_info().get("compiled_backend") or "cpu"
    if backend == "cpu" and not a.allow_cpu:
        print("gpu-race: this llama-cpp-python is built for the CPU; on a machine with a GPU scripts/bootstrap builds "
              "for it (LOCALSPEC_BACKEND=cuda|vulkan|metal|hip forces one)", file=sys.stderr)
        return 2
    ngl = 0 if backend == "cpu" else 99
    pair = models.resolve_pair()
    work = Path(tempfile.mkdtemp(prefix="localspec-gpu-race-"))
    print(f"backend {backend}, llama.cpp {llamacpp_tools.sdist_version()} (llama-cpp-python's); files in {work}")
    if not a.skip_race:
        subprocess.run([sys.executable, str(HERE / "race.py"), "--backend", backend, "--workloads", "edit,chat,followup",
                        "--servers", "localspec,localspec-plain,llama,llama-spec,llama-draft",
                        "--json", str(work / "race.json")], check=True, env={**os.environ, "PYTHONPATH": str(HERE)})
    acc = acceptance_by_position(str(pair.target_path), str(pair.draft_path), ngl, a.prompts)
    print("\nthe real pair's acceptance by draft position (greedy, k = 8, measured here): "
          + ", ".join(f"{x:.2f}" for x in acc))
    twins(a, pair, ngl, acc, work, backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
