"""localspec's NextN (MTP) drafter against llama-server's `--spec-type draft-mtp` on one GGUF with NextN blocks
(a tiny Qwen3.5-style hybrid built here, or MODEL), both up at once, greedy requests alternating: whether the
texts agree (with each other and with localspec's plain decoding), and the time per drafted round.

    scripts/mtp-race                      # a tiny qwen35 with one NextN block, 20 prompts, k = 3
    scripts/mtp-race --model M.gguf --prompts 10 -k 2 -n 64
    scripts/mtp-race --model TWIN.gguf --exact      # both localspec servers under --exact (K-quant weights)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import urllib.request
from pathlib import Path

from harness import llamacpp_tools
from harness.serverproc import ServerProcess
from harness.tinyarch import build_tiny_arch

WORDS = "the cache model token draft target fast slow def return import print hello world code data file".split()


def prompts(n: int) -> list[str]:
    return [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(6 + i % 5)) for i in range(n)]


def ask(port: int, prompt: str, n: int) -> dict:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": False}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
    out["wall_s"] = time.perf_counter() - t0
    return out


def rounds(out: dict) -> int:
    """Target passes after the first token: each round confirms its accepted drafts and one token of its own."""
    t = out["timings"]
    return max(1, t["predicted_n"] - t.get("draft_n_accepted", 0) - 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="a GGUF with NextN blocks (default: a tiny one built here)")
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("-k", type=int, default=3)
    p.add_argument("-n", type=int, default=48)
    p.add_argument("--exact", action="store_true", help="localspec's servers with --exact (batch-invariant kernels)")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mtp-race-"))
    model = a.model or str(build_tiny_arch(work / "tiny-qwen35-nextn.gguf", "qwen35", seed=0, nextn=1))
    binary = llamacpp_tools.build("llama-server")
    common = ["--target", model, "--threads", "2", "-c", "1024", "--temperature", "0", "--parallel", "1",
              *(["--exact"] if a.exact else [])]
    starts = {  # llama-server's plain twin is left out: it loads a NextN file only with its head
        "localspec-mtp": lambda: ServerProcess([*common, "--spec", "on", "--drafter", "mtp", "-k", str(a.k)], work / "h1"),
        "localspec-plain": lambda: ServerProcess([*common, "--spec", "off"], work / "h2"),
        "llama-mtp": lambda: llamacpp_tools.LlamaServer(
            binary, model, ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(a.k), "-fa", "off", "-t", "2",
                            "-c", "1024", "-np", "1"], work / "llama-mtp.log"),
    }
    servers = {}
    try:
        for name, start in starts.items():
            servers[name] = start()
        results = {name: [] for name in servers}
        for i, text in enumerate(prompts(a.prompts)):
            order = list(servers) if i % 2 == 0 else list(reversed(servers))
            for name in order:
                results[name].append(ask(servers[name].port, text, a.n))
        report(results)
    finally:
        for s in servers.values():
            s.stop()


def report(results: dict) -> None:
    texts = {name: [r["content"] for r in rs] for name, rs in results.items()}
    n = len(texts["llama-mtp"])
    print(f"greedy texts, {n} prompts:")
    for a, b in (("localspec-mtp", "localspec-plain"), ("localspec-mtp", "llama-mtp"), ("localspec-plain", "llama-mtp")):
        print(f"  {a} = {b}: {sum(x == y for x, y in zip(texts[a], texts[b]))}/{n}")
    print("| server | drafted | accepted | ms per round (decode time / rounds) | decode tok/s |")
    print("|---|---|---|---|---|")
    for name, rs in results.items():
        drafted = sum(r["timings"].get("draft_n", 0) for r in rs)
        accepted = sum(r["timings"].get("draft_n_accepted", 0) for r in rs)
        ms = sum(r["timings"]["predicted_ms"] for r in rs) / sum(rounds(r) for r in rs)
        tps = sum(r["timings"]["predicted_n"] for r in rs) / sum(r["timings"]["predicted_ms"] / 1e3 for r in rs)
        print(f"| {name} | {drafted} | {accepted} | {ms:.2f} | {tps:.1f} |")


if __name__ == "__main__":
    main()
