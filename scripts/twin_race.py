"""localspec serve against llama-server on one hybrid GGUF (a shape twin, scripts/hybrid-twin), up at once.

  turns   a 10-turn conversation, each turn ~100 new tokens, each server carrying its own answers: the
          first byte of every turn (streamed, from sending the request) and the prompt tokens it evaluated
  spec    speculation with a draft model (--draft): each 64-token answer's whole time, its decode speed as the
          server counts it, and how much each server drafted and kept

Every request goes to both servers in turn, the order alternating, once both have been quiet a moment;
temperature 0.

  scripts/twin-race TWIN.gguf [--draft DRAFT.gguf [--spec on|auto] [-k 4]] [--only turns,spec] [--json OUT]
"""
import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path

from race import Entrant, wait_quiet  # noqa: E402
from race_followup import ask_streamed  # noqa: E402

from harness import llamacpp_tools  # noqa: E402
from harness.serverproc import ServerProcess  # noqa: E402
from harness.tinygguf import PROMPT_WORDS as WORDS  # noqa: E402


def start(model: Path, draft: Path | None, work: Path, ctx: int, k: int = 4, mode: str = "on") -> list[Entrant]:
    spec = ["--draft", str(draft), "--spec", mode, "-k", str(k)] if draft else ["--spec", "off"]
    ls = ServerProcess(["--target", str(model), "-c", str(ctx), *spec], work / "localspec", wait=False)
    ls.wait_ready(timeout=600)
    binary = llamacpp_tools.build("llama-server")
    flags = ["-c", str(ctx)] + (["--spec-type", "draft-simple", "-md", str(draft), "--spec-draft-n-max", str(k)]
                                 if draft else [])
    ll = llamacpp_tools.LlamaServer(binary, str(model), flags, work / "llama-server.log")
    return [Entrant("localspec", ls.port, ls.proc, ls.stop), Entrant("llama-server", ll.port, ll.proc, ll.stop)]


def ask(servers: list[Entrant], s: Entrant, body: dict) -> dict:
    """One request, once every server has been quiet a moment (no server's background work lands on it)."""
    wait_quiet(servers, quiet_s=1.0, gap_s=0.5)
    t0 = time.perf_counter()
    r = ask_streamed(s.port, body)
    return {**r, "wall_s": time.perf_counter() - t0}


def turns(servers: list[Entrant], n_turns: int = 10) -> list[dict]:
    convs = {s.name: [] for s in servers}
    rows = []
    for turn in range(1, n_turns + 1):
        words = " ".join(WORDS[(turn * 5 + j) % len(WORDS)] for j in range(18))  # ~100 tokens of the twin's
        row = {"turn": turn}
        for s in (servers if turn % 2 else servers[::-1]):
            msgs = convs[s.name] + [{"role": "user", "content": f"turn {turn}: {words}"}]
            r = ask(servers, s, {"messages": msgs, "max_tokens": 8, "temperature": 0})
            convs[s.name] = msgs + [{"role": "assistant", "content": r["text"]}]
            row[s.name] = {"first_byte_s": round(r["first_byte_s"] or 0.0, 3), "evaluated": r["prompt_n"]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def spec(servers: list[Entrant], reps: int = 3) -> dict:
    out = {s.name: [] for s in servers}
    for s in servers:  # each loads its draft and measures what it measures first: not timed
        ask(servers, s, {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0})
    for i in range(reps):
        prompt = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(60))
        for s in (servers if i % 2 else servers[::-1]):
            r = ask(servers, s, {"messages": [{"role": "user", "content": prompt}], "max_tokens": 64, "temperature": 0})
            out[s.name].append(r)
    # the request's whole time: localspec's draft model reads the prompt in its first drafting round (decode
    # time), llama-server's with the prompt (prompt time), so only the whole is comparable
    summary = {name: {"wall_s": round(statistics.median(x["wall_s"] for x in rows), 2),
                      "decode_tok_s": round(statistics.median(x["decode_tps"] for x in rows), 2),
                      "drafted": sum(x["draft_n"] or 0 for x in rows),
                      "accepted": sum(x["draft_n_accepted"] or 0 for x in rows)} for name, rows in out.items()}
    print(json.dumps(summary), flush=True)
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--only", default="turns,spec")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("-k", type=int, default=4, help="tokens drafted a round at most, both servers (default 4)")
    ap.add_argument("--spec", default="on", choices=("on", "auto"),
                    help="localspec's speculation with the draft: on (every round, as llama-server's) or auto")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    only = set(a.only.split(","))
    tmp = tempfile.mkdtemp(prefix="localspec-twin-race-")  # the servers' logs stay for reading
    print(f"logs in {tmp}", file=sys.stderr)
    if True:
        result = {}
        if "turns" in only:
            servers = start(a.model, None, Path(tmp) / "turns", a.ctx)
            try:
                result["turns"] = turns(servers)
            finally:
                for s in servers:
                    s.stop()
        if "spec" in only and a.draft:
            servers = start(a.model, a.draft, Path(tmp) / "spec", a.ctx, a.k, a.spec)
            try:
                result["spec"] = spec(servers)
            finally:
                for s in servers:
                    s.stop()
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
