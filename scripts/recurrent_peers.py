"""recurrent-bench's `peers` mode: localspec serve and llama-server (built from the same sdist) on one tiny pair,
each with its own speculation (k=4, the perturbed draft) and plain, all four up at once; 64-token greedy answers
after a ~1,929-token prompt both keep cached, the servers asked in turn, the order alternating, once all are quiet.
Per server: the median answer's decode time as the server counts it (`timings.predicted_ms`) and its wall time;
per family: speculation's decode time against its own plain decoding's."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from race import Entrant, wait_quiet

from harness import llamacpp_tools
from harness.faults import post_json
from harness.serverproc import ServerProcess
from harness.tinygguf import PROMPT_WORDS as WORDS

PROMPT_TOKENS = 1929


def start(target: Path, draft: Path, home: Path) -> list[Entrant]:
    out = []
    for name, extra in (("localspec-plain", ["--spec", "off"]),
                        ("localspec-spec", ["--draft", str(draft), "--spec", "on", "--drafter", "model", "-k", "4"])):
        srv = ServerProcess(["--target", str(target), "-c", "8192", *extra], home / name)
        out.append(Entrant(name, srv.port, srv.proc, srv.stop))
    binary = llamacpp_tools.build("llama-server")
    for name, extra in (("llama-server-plain", []),
                        ("llama-server-spec", ["--spec-type", "draft-simple", "-md", str(draft),
                                               "--spec-draft-n-max", "4", "--spec-draft-n-min", "0"])):
        ll = llamacpp_tools.LlamaServer(binary, str(target), ["-c", "8192", "-np", "1", *extra], home / f"{name}.log")
        out.append(Entrant(name, ll.port, ll.proc, ll.stop))
    return out


def post(e: Entrant, path: str, body: dict) -> tuple[dict, float]:
    t0 = time.perf_counter()
    status, _, raw = post_json(e.port, path, body, timeout=600)
    if status != 200:
        raise SystemExit(f"{e.name} answered {status} to {path}: {raw[:300]!r}")
    return json.loads(raw), time.perf_counter() - t0


def long_prompt(e: Entrant) -> str:
    """Words up to about PROMPT_TOKENS tokens of the tiny vocabulary (counted by the server)."""
    text, toks = "", []
    while len(toks) < PROMPT_TOKENS:
        text += " " + " ".join(WORDS[(len(text) + j * 7) % len(WORDS)] for j in range(100))
        toks = post(e, "/tokenize", {"content": text})[0]["tokens"]
    return post(e, "/detokenize", {"tokens": toks[:PROMPT_TOKENS]})[0]["content"]


def bench_peers(target: Path, draft: Path, home: Path, reps: int) -> dict:
    servers = start(target, draft, home)
    try:
        prompt = long_prompt(servers[0])
        body = {"prompt": prompt, "n_predict": 64, "temperature": 0.0, "ignore_eos": True, "cache_prompt": True}
        runs: dict[str, list] = {s.name: [] for s in servers}
        for rep in range(reps + 1):  # the first caches the prompt
            order = servers if rep % 2 else servers[::-1]
            for s in order:
                wait_quiet(servers, 0.5, 0.2)
                out, wall = post(s, "/completion", body)
                if rep:
                    t = out.get("timings", {})
                    runs[s.name].append((t.get("predicted_ms", 0.0), wall * 1e3, out["content"],
                                         t.get("draft_n", 0), t.get("draft_n_accepted", 0)))
        med = {n: {"decode_ms": statistics.median(r[0] for r in v), "wall_ms": statistics.median(r[1] for r in v),
                   "drafted": v[-1][3], "accepted": v[-1][4]} for n, v in runs.items()}
        plain = runs["localspec-plain"][0][2]
        for n, v in runs.items():  # every answer of a server the same, and the same as localspec's plain one
            med[n]["same_text"] = all(r[2] == plain for r in v)
        return {"servers": med,
                "localspec_ratio": med["localspec-spec"]["decode_ms"] / med["localspec-plain"]["decode_ms"],
                "llama_server_ratio": med["llama-server-spec"]["decode_ms"] / med["llama-server-plain"]["decode_ms"],
                "texts_equal": all(m["same_text"] for m in med.values())}
    finally:
        for s in servers:
            s.stop()
