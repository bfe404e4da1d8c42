"""Several requests at once: localspec serve against llama-server (-np 4), both up, one scenario at a time.

Scenarios (greedy, streamed, the OpenAI chat API and llama-server's /infill, each server in turn, order
alternating between rounds, both servers quiet before each scenario):
  alone      each request of the scenarios below by itself: the quiet-machine times
  second     a 400-token answer streams; 2 s later a short chat ("Say hi.") arrives: its first byte and
             total, and the long answer's total against its time alone
  infill     the same, the second request an editor's /infill (llama.vim's body, id_slot 0, 32 tokens)
  burst      4 requests at once sharing a ~2k-token system prompt (an agent's helpers), sent 50 ms apart
             in one order, as one client sends them (so both servers see them arrive in the same order):
             each one's first byte and total, aggregate tok/s; and whether each greedy text equals the
             same request alone
  prompt     (not in the default set) the burst's first request cut to its prompt: the ~2k-token system
             prompt, new to both servers, and one token out, alone: prompt evaluation, which is what the
             burst's first byte waits for on both servers; `--only prompt --rounds 6` pairs them
llama-server is built once from the llama-cpp-python sdist into ~/.cache/localspec (scripts/harness/llamacpp_tools.py).

  scripts/together                 # both servers, 2 rounds (~15 min on 2 cores)
  scripts/together --rounds 1 --servers localspec
  scripts/together --only burst    # one scenario
  scripts/together --only prompt --rounds 6   # the burst's prompt evaluation, 6 sends each, alternating
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

import httpx
from race import Entrant, wait_quiet  # noqa: E402

from harness import llamacpp_tools  # noqa: E402

STDLIB = Path(sysconfig.get_paths()["stdlib"])
LONG = ("Write a detailed essay, at least 600 words, on the history of the Unix operating system, from Bell Labs "
        "to Linux and macOS.")
SHORT = "Say hi."
BURST = ["Summarize what this module does in three sentences.",
         "List the public functions of this module, one per line.",
         "Which function here would you test first, and why? Two sentences.",
         "Suggest one improvement to this module's documentation."]
LONG_TOKENS, SHORT_TOKENS, INFILL_TOKENS, BURST_TOKENS = 400, 8, 32, 96
BURST_GAP_S = 0.05  # one client's requests leave in order; at one instant their order at the server is a coin toss


def chat_body(content: str, max_tokens: int, system: str | None = None, **extra) -> dict:
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    return {"messages": msgs, "max_tokens": max_tokens, "temperature": 0, "stream": True, **extra}


def infill_body() -> dict:
    """llama.vim's request: the cursor inside a standard-library file, 32 tokens, slot 0."""
    lines = (STDLIB / "textwrap.py").read_text().splitlines(keepends=True)
    at = 120
    return {"input_prefix": "".join(lines[at - 60:at]), "input_suffix": "".join(lines[at + 1:at + 20]),
            "prompt": lines[at][:8], "n_predict": INFILL_TOKENS, "id_slot": 0, "temperature": 0,
            "top_k": 40, "top_p": 0.99, "stream": False, "cache_prompt": True, "t_max_prompt_ms": 500,
            "samplers": ["top_k", "top_p", "infill"]}


def system_prompt() -> str:
    """~2k tokens: a module's source as an agent would put it in its system prompt."""
    src = (STDLIB / "shlex.py").read_text()[:9000]
    return "You are a careful coding assistant. The user works on this module:\n\n```python\n" + src + "\n```"


class Timed:
    """One streamed request: first byte (first text), total, tokens, text."""

    def __init__(self, url: str, path: str, body: dict):
        self.url, self.path, self.body = url, path, body
        self.first = self.total = None
        self.text, self.tokens = "", 0
        self.error = None

    def run(self, t0: float) -> None:
        try:
            with httpx.Client(timeout=900) as c:
                if not self.body.get("stream"):
                    r = c.post(self.url + self.path, json=self.body)
                    self.total = self.first = time.perf_counter() - t0
                    out = r.json()
                    self.text = out.get("content", "")
                    self.tokens = out.get("tokens_predicted", 0)
                    return
                with c.stream("POST", self.url + self.path, json={**self.body, "stream_options": {"include_usage": True}}) as r:
                    for line in r.iter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        ev = json.loads(line[6:])
                        for ch in ev.get("choices", []):
                            piece = (ch.get("delta") or {}).get("content") or ""
                            if piece and self.first is None:
                                self.first = time.perf_counter() - t0
                            self.text += piece
                        if ev.get("usage"):
                            self.tokens = ev["usage"].get("completion_tokens", self.tokens)
            self.total = time.perf_counter() - t0
        except Exception as e:  # reported in the table, the run goes on
            self.error = repr(e)


def together(url: str, reqs: list[tuple[float, str, dict]]) -> tuple[list[Timed], float]:
    """Send each (delay, path, body) after its delay from a common start; all timed from their own send."""
    timed = [Timed(url, path, body) for _, path, body in reqs]
    t0 = time.perf_counter()

    def go(delay: float, t: Timed) -> None:
        time.sleep(delay)
        t.run(time.perf_counter())

    threads = [threading.Thread(target=go, args=(d, t)) for (d, _, _), t in zip(reqs, timed)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return timed, time.perf_counter() - t0


def scenarios(sys_prompt: str) -> dict:
    long = ("/v1/chat/completions", chat_body(LONG, LONG_TOKENS, ignore_eos=True))
    short = ("/v1/chat/completions", chat_body(SHORT, SHORT_TOKENS))
    infill = ("/infill", infill_body())
    burst = [("/v1/chat/completions", chat_body(q, BURST_TOKENS, system=sys_prompt)) for q in BURST]
    prompt = ("/v1/chat/completions", chat_body(BURST[0], 1, system=sys_prompt))
    return {"long": long, "short": short, "infill": infill, "burst": burst, "prompt": prompt}


def run_round(s: Entrant, sc: dict, servers: list[Entrant], only: set[str]) -> dict:
    url = f"http://127.0.0.1:{s.port}"
    out = {}
    if only & {"alone", "second", "infill"}:
        out.update(run_second(url, sc, servers))
    if "burst" in only:
        out.update(run_burst(url, sc, servers))
    if "prompt" in only:
        wait_quiet(servers, 1.0, 1.0)
        out["prompt"] = together(url, [(0.0, *new_system_prompt(sc["prompt"], f"[prompt {time.time()}] "))])[0][0]
    return out


def new_system_prompt(req: tuple[str, dict], stamp: str) -> tuple[str, dict]:
    """The request with `stamp` before its system prompt: a prompt neither server has seen, paid for in full."""
    path, body = req
    system, user = body["messages"]
    return path, {**body, "messages": [{"role": "system", "content": stamp + system["content"]}, user]}


def run_second(url: str, sc: dict, servers: list[Entrant]) -> dict:
    out = {}
    for name in ("long", "short", "infill"):  # twice: the second is the quiet-machine time (prompt cached,
        for _ in range(2):                   # as it is when the same request comes during the long answer)
            wait_quiet(servers, 1.0, 1.0)
            out[f"alone_{name}"] = together(url, [(0.0, *sc[name])])[0][0]
    for name in ("short", "infill"):
        wait_quiet(servers, 1.0, 1.0)
        (long_t, second), _ = together(url, [(0.0, *sc["long"]), (2.0, *sc[name])])
        out[f"second_{name}"], out[f"second_{name}_long"] = second, long_t
    return out


def run_burst(url: str, sc: dict, servers: list[Entrant]) -> dict:
    out = {}
    wait_quiet(servers, 1.0, 1.0)
    stamp = f"[burst {time.time()}] "  # one new system prompt, shared by the four as an agent's helpers share it
    burst = [(BURST_GAP_S * i, *new_system_prompt(req, stamp)) for i, req in enumerate(sc["burst"])]
    out["burst"], out["burst_wall"] = together(url, burst)
    for i, req in enumerate(burst):  # then each alone (its prompt now cached): is the greedy text the same?
        wait_quiet(servers, 1.0, 1.0)
        out[f"alone_burst{i}"] = together(url, [req])[0][0]
    return out


def report(results: dict[str, list[dict]]) -> None:
    def med(name, key, server):
        xs = [getattr(r[key], name) for r in results[server] if getattr(r[key], name) is not None]
        return statistics.median(xs) if xs else None

    def f(x, fmt="{:.2f}"):
        return fmt.format(x) if isinstance(x, (int, float)) else "—"

    print("| measure | " + " | ".join(results) + " |")
    print("|---|" + "---|" * len(results))
    rows = [("long answer alone: total s", "total", "alone_long"),
            ("short chat alone: total s", "total", "alone_short"),
            ("/infill alone: total s", "total", "alone_infill"),
            ("short chat during the long answer: first byte s", "first", "second_short"),
            ("short chat during the long answer: total s", "total", "second_short"),
            ("long answer with a short chat: total s", "total", "second_short_long"),
            ("/infill during the long answer: total s", "total", "second_infill"),
            ("long answer with an /infill: total s", "total", "second_infill_long"),
            ("the burst's 2k-token prompt alone, 1 token out: total s", "total", "prompt")]
    for label, field, key in rows:
        if any(key not in r for rs in results.values() for r in rs):
            continue
        print(f"| {label} | " + " | ".join(f(med(field, key, s)) for s in results) + " |")
    if "prompt" in next(iter(results.values()))[0]:
        print("| the burst's prompt alone, each send (in send order) | " + " | ".join(
            ", ".join(f(r["prompt"].total, "{:.1f}") for r in rs) for rs in results.values()) + " |")
    if not all("burst" in r for rs in results.values() for r in rs):
        return print_errors(results)
    for i in range(len(BURST)):
        print(f"| burst request {i + 1}: first byte / total s | " + " | ".join(
            f"{f(statistics.median([r['burst'][i].first or 0 for r in rs]))} / "
            f"{f(statistics.median([r['burst'][i].total or 0 for r in rs]))}" for rs in results.values()) + " |")
    print("| burst of 4: aggregate tok/s | " + " | ".join(
        f(statistics.median([sum(t.tokens for t in r["burst"]) / r["burst_wall"] for r in rs]), "{:.1f}")
        for rs in results.values()) + " |")
    print("| burst: greedy text = alone | " + " | ".join(
        f"{sum(r['burst'][i].text == r[f'alone_burst{i}'].text for r in rs for i in range(len(BURST)))}/"
        f"{len(rs) * len(BURST)}" for rs in results.values()) + " |")
    for rnd in range(min(len(rs) for rs in results.values())):
        print(f"| burst first bytes, round {rnd + 1} | " + " | ".join(
            ", ".join(f(t.first, "{:.1f}") for t in rs[rnd]["burst"]) for rs in results.values()) + " |")
    print_errors(results)


def print_errors(results: dict[str, list[dict]]) -> None:
    errors = [(s, k, t.error) for s, rs in results.items() for r in rs for k, v in r.items()
              for t in (v if isinstance(v, list) else [v]) if isinstance(t, Timed) and t.error]
    for e in errors:
        print("error:", *e)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default="localspec,llama")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only", default="alone,second,infill,burst", help="the scenarios to run (comma-separated)")
    p.add_argument("--json", metavar="FILE", help="also write the raw figures here")
    args = p.parse_args()
    from harness.serverproc import ServerProcess
    from localspec import models

    pair = models.resolve_pair()
    names = args.servers.split(",")
    work = Path(tempfile.mkdtemp(prefix="localspec-together-"))
    servers: list[Entrant] = []
    try:
        for name in names:
            if name == "localspec":
                srv = ServerProcess([], Path(os.environ.get("LOCALSPEC_HOME") or work / "home"), wait=False)
                srv.wait_ready(timeout=600)
            else:  # llama-server as a user runs it for several clients: 4 slots, a context that fits an agent
                binary = llamacpp_tools.build("llama-server")
                srv = llamacpp_tools.LlamaServer(binary, str(pair.target_path), ["-np", "4", "-c", "32768", "--jinja"],
                                                 work / f"{name}.log")
            servers.append(Entrant(name, srv.port, srv.proc, srv.stop))
        sc = scenarios(system_prompt())
        results: dict[str, list[dict]] = {s.name: [] for s in servers}
        for rnd in range(args.rounds):
            order = servers if rnd % 2 == 0 else servers[::-1]
            for s in order:
                print(f"round {rnd + 1}: {s.name}", file=sys.stderr, flush=True)
                results[s.name].append(run_round(s, sc, servers, set(args.only.split(","))))
        report(results)
        if args.json:
            raw = {s: [{k: ([vars(t) for t in v] if isinstance(v, list) else vars(v) if isinstance(v, Timed) else v)
                        for k, v in r.items()} for r in rs] for s, rs in results.items()}
            Path(args.json).write_text(json.dumps(raw, indent=1, default=str))
    finally:
        for s in servers:
            s.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
