"""Speculation on recurrent and hybrid targets, against a transformer control, on tiny models built here.

Each architecture (a llama control, mamba, lfm2, qwen35) gets a target and a perturbed draft built with
the `gguf` package (scripts/harness/tinyarch.py); every figure is measured in this process, side by side:

  spec    greedy --spec on (the draft model, k=4) against --spec off, 64 tokens after a 61- and a
          1,929-token prompt: generation seconds, their ratio, the whole request's ratio (the prompt's
          pass too, what a `localspec run` waits for), acceptance, texts equal, fallbacks
  miss    a rejected tail (a 5-token verify pass keeping 2) rolled back at 100 and at 4,000 tokens (ms)
  turns   a 10-turn conversation, ~100 new tokens a turn: each turn's prompt seconds (first token)
  prefix  a second prompt sharing a 1k-token prefix: its prompt seconds against the first's
  lanes   a real `localspec serve --parallel 2`: pairs of overlapping greedy requests sharing a long
          prefix, each answer against the same request sent alone (--tries pairs)
  peers   localspec serve and llama-server, each with its own speculation and plain, all up at once: each
          family's speculation against its plain decoding (scripts/recurrent_peers.py)

  scripts/recurrent-bench [--only spec,miss,turns,prefix,lanes,peers] [--archs llama,mamba,lfm2,qwen35] [--json]

Run it on another checkout (the code before a change) with PYTHONPATH=THAT_CHECKOUT.
"""
import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from harness.tinyarch import build_tiny_arch  # noqa: E402
from harness.tinygguf import PROMPT_WORDS as WORDS  # noqa: E402
from harness.tinygguf import build_tiny_model  # noqa: E402
from localspec.config import GenConfig, LoadConfig  # noqa: E402
from localspec.engine import Engine  # noqa: E402

PERTURB = {"llama": 0.1, "mamba": 0.15, "lfm2": 0.1, "qwen35": 0.15}  # about 40% acceptance each


def build(arch: str, d: Path) -> tuple[Path, Path]:
    if arch == "llama":
        return (build_tiny_model(d / "llama.gguf", seed=0),
                build_tiny_model(d / "llama-p.gguf", seed=0, perturb=PERTURB[arch]))
    return (build_tiny_arch(d / f"{arch}.gguf", arch),
            build_tiny_arch(d / f"{arch}-p.gguf", arch, perturb=PERTURB[arch]))


def prompt(e: Engine, n: int, salt: str = "") -> list[int]:
    text, i = salt, 0
    toks: list[int] = []
    while len(toks) < n:
        text += " " + " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(50))
        i += 1
        toks = e.target_model.tokenize(text, add_special=True)
    return toks[:n]


def generate(e: Engine, p: list[int], cfg: GenConfig, cold: bool = True):
    """cold: both caches emptied first (a `localspec run`: the draft model evaluates the prompt in its first
    round); otherwise the draft's cache keeps the prompt from the run before (a server's next answer)."""
    e.target.reset()
    if cold and e.draft_ctx is not None:
        e.draft_ctx.reset()
    toks = [c.token for c in e.generate(p, cfg) if c.token is not None]
    return toks, e.last_stats


def bench_spec(e: Engine, reps: int) -> list[dict]:
    rows = []
    for n in (61, 1929):
        p = prompt(e, n)
        no_end = {t: -100.0 for t in e.target_model.eog_tokens()}  # 64 tokens every time
        off = GenConfig(temperature=0.0, spec="off", max_tokens=64, logit_bias=no_end)
        on = off.with_(spec="on", drafter="model", draft_max=4)
        t = {"off": [], "cold": [], "warm": []}  # each: (generation, the whole request: its prompt's pass too)
        same, st_on = True, None
        for _ in range(reps):
            texts = []
            for name, cfg, cold in (("off", off, True), ("cold", on, True), ("warm", on, False)):
                toks, st_on = generate(e, p, cfg, cold)
                t[name].append((st_on.generation_s, st_on.generation_s + st_on.prompt_eval_s))
                texts.append(toks)
            same = same and texts[0] == texts[1] == texts[2]
        med = {k: statistics.median(g for g, _ in v) for k, v in t.items()}
        whole = {k: statistics.median(w for _, w in v) for k, v in t.items()}
        rows.append({"prompt": n, "off_s": med["off"], "on_cold_s": med["cold"], "on_warm_s": med["warm"],
                     "ratio_cold": med["cold"] / med["off"], "ratio_warm": med["warm"] / med["off"],
                     "whole_ratio_cold": whole["cold"] / whole["off"], "whole_ratio_warm": whole["warm"] / whole["off"],
                     "acceptance": round(st_on.acceptance_rate, 2), "same_text": same,
                     "fallbacks": getattr(getattr(e.target, "miss", None), "fallbacks", None)})
    return rows


def bench_miss(e: Engine, reps: int) -> list[dict]:
    rows, ctx = [], e.target
    for depth in (100, 4000):
        ctx.reset()
        ctx.sync(prompt(e, depth))
        times = []
        for _ in range(reps):
            ctx.eval([5, 6, 7, 8, 9], logits="all")
            t0 = time.perf_counter()
            ctx.truncate(depth + 2)
            times.append(time.perf_counter() - t0)
            ctx.truncate(depth)
        rows.append({"depth": depth, "rollback_ms": round(statistics.median(times) * 1e3, 3)})
    return rows


def first_token_s(e: Engine, p: list[int]) -> tuple[float, int, list[int]]:
    cfg = GenConfig(temperature=0.0, spec="off", max_tokens=8)
    t0 = time.perf_counter()
    out = []
    for c in e.generate(p, cfg):
        if c.token is not None:
            out.append(c.token)
            if len(out) == 1:
                dt = time.perf_counter() - t0
    return dt, e.last_stats.prompt_eval_tokens, out


def bench_turns(e: Engine) -> list[dict]:
    e.target.reset()
    from localspec.chat_format import Message
    msgs, rows = [], []
    for turn in range(1, 11):
        words = " ".join(WORDS[(turn * 3 + j) % len(WORDS)] for j in range(18))  # ~100 tokens
        msgs.append(Message("user", f"turn {turn}: {words}"))
        p = e.prompt_tokens(msgs)
        dt, evaluated, out = first_token_s(e, p)
        rows.append({"turn": turn, "prompt": len(p), "evaluated": evaluated, "first_token_s": round(dt, 4)})
        msgs.append(Message("assistant", b"".join(e.target_model.piece(t) for t in out).decode("utf-8", "replace")))
    return rows


def bench_prefix(e: Engine) -> dict:
    """An agent's two requests: the same ~1k-token system prompt, another question."""
    from localspec.chat_format import Message
    e.target.reset()
    system = " ".join(WORDS[(j * 5) % len(WORDS)] for j in range(180))
    a, b = ([Message("system", system), Message("user", q)] for q in ("read the data file", "write the code list"))
    t_a, n_a, _ = first_token_s(e, e.prompt_tokens(a))
    t_b, n_b, _ = first_token_s(e, e.prompt_tokens(b))
    return {"prompt": len(e.prompt_tokens(a)), "first_s": round(t_a, 4), "first_evaluated": n_a, "second_s": round(t_b, 4),
            "second_evaluated": n_b, "ratio": round(t_b / t_a, 3)}


def bench_lanes(target: Path, draft: Path, tries: int, home: Path) -> dict:
    """Overlapping requests on a real server's two lanes, each answer against the same request alone."""
    import threading
    import urllib.request

    from harness.serverproc import ServerProcess

    srv = ServerProcess(["--target", str(target), "--draft", str(draft), "--parallel", "2", "--spec", "on",
                         "-c", "8192", "--cache-ram", "64"], home / f"lanes-{target.stem}")

    def complete(prompt: str, seed: int) -> str:
        body = json.dumps({"prompt": prompt, "n_predict": 24, "temperature": 0.0, "seed": seed,
                           "cache_prompt": True}).encode()
        req = urllib.request.Request(srv.url + "/completion", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())["content"]

    try:
        base = " ".join(WORDS[(j * 3) % len(WORDS)] for j in range(400))
        same = 0
        for t in range(tries):
            prompts = [f"{base} {w} {t}" for w in ("fast", "slow")]
            alone = [complete(p, t) for p in prompts]
            complete(base + " warm", t)  # one lane holds the shared prefix
            out: list = [None, None]
            threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, complete(prompts[i], t))) for i in (0, 1)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            same += (out[0] == alone[0]) + (out[1] == alone[1])
        _, props = srv.get("/props")
        return {"equal": same, "of": 2 * tries, "rollback": props["localspec"].get("rollback")}
    finally:
        srv.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="spec,miss,turns,prefix")
    ap.add_argument("--archs", default="llama,mamba,lfm2,qwen35")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tries", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    only = set(args.only.split(","))
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.archs.split(","):
            target, draft = build(arch, Path(tmp))
            if "lanes" in only:
                out.setdefault(arch, {})["lanes"] = bench_lanes(target, draft, args.tries, Path(tmp))
            if "peers" in only:
                from recurrent_peers import bench_peers
                out.setdefault(arch, {})["peers"] = bench_peers(target, draft, Path(tmp) / f"peers-{arch}", args.reps)
            e = Engine(target, draft, LoadConfig(n_ctx=8192, n_threads=args.threads, n_threads_batch=args.threads))
            try:
                r = out.setdefault(arch, {})
                r["rollback"] = getattr(e.target, "rollback", "?")
                if "spec" in only:
                    r["spec"] = bench_spec(e, args.reps)
                if "miss" in only:
                    r["miss"] = bench_miss(e, 20)
                if "turns" in only:
                    r["turns"] = bench_turns(e)
                if "prefix" in only:
                    r["prefix"] = bench_prefix(e)
            finally:
                e.close()
            if not args.json:
                print(arch, json.dumps(r), flush=True)
    if args.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
