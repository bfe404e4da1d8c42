"""localspec serve against llama.cpp's llama-server on the same machine, all up at once.

Servers (each on its own loopback port, started here and stopped at the end):
  localspec        `localspec serve` with its defaults (--spec auto)
  llama            llama-server, plain
  llama-spec       llama-server --spec-default (its n-gram-mod drafter, drafts of 48-64 tokens)
  llama-draft      llama-server --spec-type draft-simple -md DRAFT (the pair's draft model)
and, to take a difference apart:
  localspec-plain  `localspec serve --spec off` (the same engine, never drafting)
  localspec-fa-on  `localspec serve -fa on` (llama.cpp's flash-attention kernel, llama-server's choice)
  localspec-isolated `localspec serve --isolate` (the model in a child process: what the boundary costs)
  localspec-exact  `localspec serve --exact` (batch-invariant kernels), and localspec-exact-plain, its --spec off
  localspec@REV    `localspec serve` from this repository's commit REV (a git worktree): before against after
  llama-fa-off     llama-server -fa off (the attention kernel localspec uses on a CPU)
llama-server is built once from the llama-cpp-python sdist this project installs (llama.cpp's own code
of the version localspec runs on) into ~/.cache/localspec, never into the repository.

Each request goes to every server in turn, the order alternating from request to request, and is sent
only once every server has been quiet (no CPU time used) for a moment, so no server's background work
lands on another's request. Greedy, OpenAI chat API, not streamed. Per workload and server: end-to-end
tok/s (tokens generated, the end of text counted for every server as llama-server counts it, / wall time
of the request) and decode tok/s (the server's own `timings`: steps after the first token / their time), the
ratios to llama-server plain and --spec-default, and how many greedy texts equal llama-server plain's and the
server's own plain twin's (localspec's --spec off, llama-server's plain). With --repeat every request is sent
again afterwards to localspec's drafting servers, in reverse order after a sampled one, and their second
answers are compared with their first: a greedy answer should not depend on what the server did before.

Workloads, prompts of this script's own on real files (Python's standard library of the running
interpreter, so every machine has them):
  edit        return a whole file with a small change
  predict     the same on other files, with OpenAI's `prediction` = the original file (llama-server ignores it)
  code        write a function
  chat        short questions
  quote       summaries that quote a document
and the project's own task prompts (localspec/workloads: code, chat, support; the benchmark's):
  tasks       30 more prompts with their system prompts, so a count of equal greedy texts rests on more
              than a handful of answers
  followup    one long conversation (a 3.1k-token module, follow-up questions, a quote), each server carrying
              its own answers: the first byte of every turn (race_followup.py)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import race_followup  # noqa: E402

from harness import llamacpp_tools  # noqa: E402
from harness.serverproc import process_tree  # noqa: E402

STDLIB = Path(sysconfig.get_paths()["stdlib"])
EDIT_FILES = [("bisect.py", "Rename the parameter `hi` to `upper` everywhere in this module (signatures, docstrings "
               "and code)."),
              ("nturl2path.py", "Add a module-level constant `DRIVE_SEPARATORS = ':|'` after the imports and use it "
               "wherever the code compares against ':' or '|'."),
              ("keyword.py", "Sort the `softkwlist` list in reverse alphabetical order and add a comment above it "
               "saying so.")]
PREDICT_FILES = [("colorsys.py", "Rename the function `rgb_to_yiq` to `rgb_to_yiq_color` everywhere in this module."),
                 ("genericpath.py", "Add a one-line docstring to `_check_arg_types` saying what it checks."),
                 ("copyreg.py", "Rename the variable `_extension_registry` to `_EXTENSION_REGISTRY` everywhere.")]
# chat and code draft little (nothing is copied): their ratios are this machine's noise around the engine's
# plain speed, 5-15% a request between identical servers, so each has several requests to average over
CODE = ["Write a Python function `merge_intervals(intervals)` that merges overlapping [start, end] intervals, with "
        "a docstring and type hints.",
        "Write a Python class `LRUCache` with get and put in O(1), using collections.OrderedDict.",
        "Write a Python generator `chunked(iterable, size)` that yields lists of at most `size` items, with type hints.",
        "Write a Python function `is_palindrome(text)` that ignores case, spaces and punctuation, with doctests."]
CHAT = ["Explain in a short paragraph what a hash table is and when to use one.",
        "Give me three tips for writing clear commit messages.",
        "What is the difference between a process and a thread? Answer briefly.",
        "What does a race condition mean in programming? Give a short example.",
        "Summarize the difference between TCP and UDP in a few sentences.",
        "Why do people say premature optimization is the root of all evil? Answer in a paragraph."]
QUOTE_DOCS = [("textwrap.py", "Quote, word for word, the docstring of the `TextWrapper` class, then summarize it in "
               "two sentences."),
              ("shlex.py", "Quote the first line of every method of the `shlex` class that has a docstring, each on "
               "its own line, then say in one sentence what the class does.")]
TASK_KINDS = ("code", "chat", "support")
EDIT_SUFFIX = "\n\nReturn the complete updated file in one ```python block, nothing else."


def workloads(names: list[str], quick: bool) -> list[tuple[str, dict]]:
    """(workload, request body) in the order they are sent."""
    def chat(content: str, max_tokens: int, **extra) -> dict:
        return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0,
                **extra}

    out = []
    pick = (lambda xs: xs[:1]) if quick else (lambda xs: xs)
    for name in names:
        if name == "edit":
            for f, task in pick(EDIT_FILES):
                src = (STDLIB / f).read_text()
                out.append((name, chat(f"```python\n{src}```\n\n{task}{EDIT_SUFFIX}", 2000)))
        elif name == "predict":
            for f, task in pick(PREDICT_FILES):
                src = (STDLIB / f).read_text()
                out.append((name, chat(f"```python\n{src}```\n\n{task}{EDIT_SUFFIX}", 2000,
                                       prediction={"type": "content", "content": f"```python\n{src}```"})))
        elif name == "code":
            out += [(name, chat(p, 400)) for p in pick(CODE)]
        elif name == "chat":
            out += [(name, chat(p, 300)) for p in pick(CHAT)]
        elif name == "tasks":
            from localspec.bench.workloads import load_builtin

            for kind in TASK_KINDS:
                out += [(name, {"messages": [{"role": "system", "content": p.system}] * bool(p.system)
                                + [{"role": "user", "content": p.prompt}], "max_tokens": 300, "temperature": 0})
                        for p in pick(load_builtin(kind))]
        elif name == "quote":
            for f, task in pick(QUOTE_DOCS):
                src = (STDLIB / f).read_text()[:6000]
                out.append((name, chat(f"{src}\n\n{task}", 400)))
    return out


def _cpu_ticks(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # it ended meanwhile
        return 0
    return int(fields[11]) + int(fields[12])


@dataclass
class Entrant:
    """One server in the race: its name, loopback port, process, and how to stop it."""
    name: str
    port: int
    proc: subprocess.Popen
    stop: Callable[[], object]

    def cpu_s(self) -> float:
        """CPU seconds used so far by the server process and the processes it started (an isolated model's)."""
        return sum(_cpu_ticks(pid) for pid in process_tree(self.proc.pid)) / os.sysconf("SC_CLK_TCK")


    def ask(self, body: dict, timeout: float = 900) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=timeout) as r:
            out = json.loads(r.read())
        wall = time.perf_counter() - t0
        t = out.get("timings", {})
        usage = out.get("usage", {})
        n = usage.get("completion_tokens") or t.get("predicted_n", 0)
        # tokens generated, counted alike for both servers (llama-server's completion_tokens counts the
        # end-of-text token, localspec's does not): the decode steps after the first token, plus that one
        decode_s = t.get("predicted_ms", 0.0) / 1e3
        steps = round(t.get("predicted_per_second", 0.0) * decode_s)
        generated = steps + 1 if decode_s else n
        return {"text": out["choices"][0]["message"].get("content") or "", "tokens": n, "wall_s": wall,
                "generated": generated, "steps": steps, "decode_s": decode_s,
                "e2e_tps": generated / wall if wall else 0.0, "decode_tps": t.get("predicted_per_second", 0.0),
                "prompt_n": t.get("prompt_n"), "draft_n": t.get("draft_n", 0),
                "draft_n_accepted": t.get("draft_n_accepted", 0),
                "accepted_prediction_tokens": usage.get("completion_tokens_details", {}).get("accepted_prediction_tokens"),
                "prompt_ms": t.get("prompt_ms"),
                # localspec's thread governor: a change during a quiet race would be its own doing
                "thread_changes": out.get("localspec", {}).get("stats", {}).get("thread_changes")}


NOISE = {"messages": [{"role": "user", "content": "Write a limerick about a cache that forgot everything."}],
         "max_tokens": 60, "temperature": 0.9, "seed": 7}


def repeat(servers: list[Entrant], results: list[dict], bodies: list[dict], gap: float) -> None:
    """Every request again to the servers that draft (localspec's; their plain twins have nothing to draft
    differently), in reverse order after a sampled answer: row["again"][server] is the second answer."""
    drafting = [s for s in servers if s.name in PLAIN_TWIN and s.name in LOCALSPEC_ARGS or s.name.startswith("localspec@")]
    for s in drafting:
        s.ask(NOISE)
    for row, body in reversed(list(zip(results, bodies))):
        row["again"] = {}
        for s in drafting:
            wait_quiet(servers, quiet_s=1.0, gap_s=gap)
            row["again"][s.name] = s.ask(body)
            print(f"again {row['workload']} {s.name}: same text {row['again'][s.name]['text'] == row[s.name]['text']}",
                  file=sys.stderr)


def wait_quiet(servers: list[Entrant], quiet_s: float, gap_s: float, limit_s: float = 120) -> None:
    """Sleep gap_s, then until no server has used CPU for quiet_s (their idle work done), at most limit_s."""
    time.sleep(gap_s)
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        before = [s.cpu_s() for s in servers]
        time.sleep(quiet_s)
        if all(s.cpu_s() - b < 0.05 * quiet_s for s, b in zip(servers, before)):
            return


LOCALSPEC_ARGS = {"localspec": [], "localspec-plain": ["--spec", "off"], "localspec-fa-on": ["-fa", "on"],
                  "localspec-isolated": ["--isolate"],
                  "localspec-exact": ["--exact"], "localspec-exact-plain": ["--exact", "--spec", "off"]}
# the plain decoding each server's greedy text is promised to equal (the same engine and kernels, never drafting)
PLAIN_TWIN = {"localspec": "localspec-plain", "localspec-fa-on": "localspec-plain", "localspec-isolated": "localspec-plain",
              "localspec-exact": "localspec-exact-plain", "llama-spec": "llama", "llama-draft": "llama"}
LLAMA_ENTRANTS = ("llama", "llama-spec", "llama-draft", "llama-fa-off")


def start_servers(names: list[str], work: Path, llama_server: Path | None, backend: str = "cpu",
                  extra: dict[str, list[str]] | None = None) -> list[Entrant]:
    """extra: more flags for a server by name (scripts/split-race: each one's RPC hosts)."""
    from harness.serverproc import ServerProcess
    from localspec import models

    pair = models.resolve_pair()
    # on a GPU every layer of both models there (llama-server fits them to the card by itself); localspec fits its own
    gpu = [] if backend == "cpu" else ["-ngl", "99"]
    flags = {"llama": gpu, "llama-spec": ["--spec-default", *gpu],
             "llama-draft": ["--spec-type", "draft-simple", "-md", str(pair.draft_path), *gpu,  # -md alone drafts nothing
                             *(["-ngld", "99"] if gpu else [])],
             "llama-fa-off": ["-fa", "off", *gpu]}
    servers = []
    for name in names:
        if name in LOCALSPEC_ARGS or name.startswith("localspec@"):  # a data root of its own (the defaults'
            # unless LOCALSPEC_HOME names one)
            home = Path(os.environ.get("LOCALSPEC_HOME") or work / "home") if name == "localspec" else work / name
            cwd = checkout(name.partition("@")[2], work) if "@" in name else None
            srv = ServerProcess([*LOCALSPEC_ARGS.get(name, []), *(extra or {}).get(name, [])], home, wait=False, cwd=cwd)
            srv.wait_ready(timeout=600)
        else:
            llama_server = llama_server or llamacpp_tools.build("llama-server", backend)
            srv = llamacpp_tools.LlamaServer(llama_server, str(pair.target_path), [*flags[name], *(extra or {}).get(name, [])],
                                             work / f"{name}.log")
        servers.append(Entrant(name, srv.port, srv.proc, srv.stop))
    return servers


def checkout(rev: str, work: Path) -> Path:
    """This repository at `rev`, as a git worktree under `work` (removed from git's list at once; the files stay)."""
    repo = Path(__file__).resolve().parent.parent
    path = work / f"at-{rev}"
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(path), rev], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run(["git", "-C", str(repo), "worktree", "prune"], check=False)
    (path / ".git").unlink(missing_ok=True)  # a plain copy from now on: nothing to clean up in the repository
    subprocess.run(["git", "-C", str(repo), "worktree", "prune"], check=False)
    return path


def summarize(results: list[dict], names: list[str]) -> list[dict]:
    """One row per (workload, server): summed tokens over summed seconds, and ratios to llama-server's two."""
    rows = []
    for w in dict.fromkeys(r["workload"] for r in results):
        per = {}
        for name in names:
            rs = [r[name] for r in results if r["workload"] == w and name in r]
            if not rs:
                continue
            toks = sum(x["tokens"] for x in rs)
            decode_s = sum(x["decode_s"] for x in rs)
            per[name] = {"e2e": sum(x["generated"] for x in rs) / sum(x["wall_s"] for x in rs),
                         "decode": sum(x["steps"] for x in rs) / decode_s if decode_s else 0.0,
                         "tokens": toks, "drafted": sum(x["draft_n"] for x in rs),
                         "accepted": sum(x["draft_n_accepted"] for x in rs)}
        for name, v in per.items():
            v["texts_equal"] = _equal_count([r for r in results if r["workload"] == w], name, "llama")
            v["texts_equal_twin"] = _equal_count([r for r in results if r["workload"] == w], name, PLAIN_TWIN.get(name))
            v["texts_equal_again"] = _equal_count([r for r in results if r["workload"] == w], name, "again")
            for base in ("llama", "llama-spec"):
                if base in per and name != base:
                    v[f"e2e_vs_{base}"] = v["e2e"] / per[base]["e2e"]
                    v[f"decode_vs_{base}"] = v["decode"] / per[base]["decode"] if per[base]["decode"] else None
            rows.append({"workload": w, "server": name, **v})
    return rows


def _equal_count(rows: list[dict], name: str, other: str | None) -> str:
    """How many of `name`'s texts equal `other`'s ("again": its own second answers) on the same requests."""
    pairs = [(r[name]["text"], ((r["again"].get(name) if other == "again" else r.get(other)) or {}).get("text"))
             for r in rows if name in r and other and other != name and (other != "again" or "again" in r)]
    pairs = [(a, b) for a, b in pairs if b is not None]
    return f"{sum(a == b for a, b in pairs)}/{len(pairs)}" if pairs else ""


def print_spread(results: list[dict]) -> None:
    """Per request, localspec's decode speed over llama-server plain's: the spread says how much of a
    workload's ratio is this machine's noise."""
    for w in dict.fromkeys(r["workload"] for r in results):
        ratios = sorted(r["localspec"]["decode_tps"] / r["llama"]["decode_tps"] for r in results
                        if r["workload"] == w and "localspec" in r and r.get("llama", {}).get("decode_tps"))
        if len(ratios) > 1:
            print(f"{w}: localspec / llama decode per request: median {ratios[len(ratios) // 2]:.2f}x, "
                  f"{ratios[0]:.2f}x-{ratios[-1]:.2f}x over {len(ratios)}")


def print_table(rows: list[dict]) -> None:
    def f(x, fmt="{:.2f}x"):
        return fmt.format(x) if isinstance(x, (int, float)) else "—"

    print("| workload | server | tokens | end-to-end tok/s | decode tok/s | e2e / llama | decode / llama | "
          "e2e / llama-spec | decode / llama-spec | drafts accepted | greedy text = llama | = own plain | "
          "= its first answer |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        acc = f"{r['accepted']}/{r['drafted']}" if r["drafted"] else "—"
        print(f"| {r['workload']} | {r['server']} | {r['tokens']} | {f(r['e2e'], '{:.1f}')} | {f(r['decode'], '{:.1f}')} | "
              f"{f(r.get('e2e_vs_llama'))} | {f(r.get('decode_vs_llama'))} | {f(r.get('e2e_vs_llama-spec'))} | "
              f"{f(r.get('decode_vs_llama-spec'))} | {acc} | {r['texts_equal']} | {r['texts_equal_twin']} | "
              f"{r['texts_equal_again']} |")


def parser(doc: str = __doc__, servers: str = "localspec,llama,llama-spec,llama-draft") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default="edit,predict,code,chat,quote")
    p.add_argument("--servers", default=servers)
    p.add_argument("--quick", action="store_true", help="one request per workload")
    p.add_argument("--gap", type=float, default=2.0, help="seconds of quiet before each request (default 2)")
    p.add_argument("--llama-server", type=Path, help="a llama-server binary (default: built from the sdist, cached)")
    p.add_argument("--backend", default="cpu", choices=sorted(llamacpp_tools.BACKEND_FLAGS),
                   help="llama-server's build, and every layer on the device unless cpu (scripts/gpu-race)")
    p.add_argument("--json", type=Path, help="write every request's figures and texts here")
    p.add_argument("--max-tokens", type=int, metavar="N",
                   help="cap every request at N tokens (1: the first byte alone, each prompt's evaluation compared)")
    p.add_argument("--repeat", action="store_true",
                   help="send every request again afterwards (reverse order, after a sampled one): same answers?")
    return p


def server_names(p: argparse.ArgumentParser, a) -> list[str]:
    names = a.servers.split(",")
    unknown = {n for n in names if not n.startswith("localspec@")} - {*LOCALSPEC_ARGS, *LLAMA_ENTRANTS}
    if unknown:
        p.error(f"unknown server {sorted(unknown)[0]!r}")
    return names


def main() -> int:
    p = parser()
    a = p.parse_args()
    names = server_names(p, a)
    work = Path(tempfile.mkdtemp(prefix="localspec-race-"))
    print(f"logs in {work}", file=sys.stderr)
    servers = start_servers(names, work, a.llama_server, a.backend)
    results, turns = run(servers, work, a)
    report(results, turns, names, a.json)
    return 0


def run(servers: list[Entrant], work: Path, a) -> tuple[list[dict], list]:
    """Every request of `a.workloads` to every server in turn (`a`: race.py's options); the servers are
    stopped at the end, also when a request fails."""
    results, sent, turns = [], [], []
    try:
        # one warm-up request each (loads, first cost profile), then time for localspec's idle measurements
        for s in servers:
            s.ask({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0})
        wait_quiet(servers, quiet_s=3.0, gap_s=a.gap, limit_s=300)
        for i, (w, body) in enumerate(workloads(a.workloads.split(","), a.quick)):
            if a.max_tokens:
                body["max_tokens"] = min(body["max_tokens"], a.max_tokens)
            results.append(one_request(servers, i, w, body, a.gap))
            sent.append(body)
        if "followup" in a.workloads.split(","):
            turns = race_followup.converse(servers, wait_quiet, a.gap, lambda m: print(m, file=sys.stderr))
        if a.repeat:
            repeat(servers, results, sent, a.gap)
    finally:
        for s in servers:
            s.stop()
        from harness.serverproc import drop_data_copies

        drop_data_copies(work)  # the pair assembled into each server's data root; the logs stay
        if a.json:  # whatever was measured, before anything else can fail
            a.json.write_text(json.dumps({"results": results, "followup": turns}, indent=1))
    return results, turns


def one_request(servers: list[Entrant], i: int, w: str, body: dict, gap: float) -> dict:
    """Request i to every server, the order rotating and alternating, each after a quiet moment."""
    order = servers[i % len(servers):] + servers[:i % len(servers)]
    if i % 2:
        order.reverse()
    row = {"workload": w}
    for s in order:
        wait_quiet(servers, quiet_s=1.0, gap_s=gap)
        others = [(o, o.cpu_s()) for o in servers if o is not s]
        row[s.name] = s.ask(body)
        # CPU the other servers used meanwhile: anything but ~0 means background work shared the cores
        row[s.name]["bystander_cpu_s"] = round(sum(o.cpu_s() - c for o, c in others), 2)
        print(f"{w} #{i} {s.name}: {row[s.name]['tokens']} tokens, {row[s.name]['e2e_tps']:.1f} e2e, "
              f"{row[s.name]['decode_tps']:.1f} decode tok/s, others' CPU meanwhile "
              f"{row[s.name]['bystander_cpu_s']:.2f} s", file=sys.stderr)
    return row


def report(results: list[dict], turns: list, names: list[str], json_path: Path | None) -> list[dict]:
    rows = summarize(results, names)
    if rows:
        print_table(rows)
        print_spread(results)
    if turns:
        race_followup.print_turns(turns, names)
    if json_path:
        json_path.write_text(json.dumps({"results": results, "rows": rows, "followup": turns}, indent=1))
    return rows

if __name__ == "__main__":
    sys.exit(main())
