"""scripts/race's `followup` workload: one long conversation at temperature 0, each server answering its own.

A 3.1k-token module, three follow-up questions about it, then a verbatim quote from it: what a coding tool
sends (aider, an agent, the page with its temperature set to 0). Every turn goes to every server in turn,
the order alternating, each server's conversation carrying its own earlier answers, streamed: the first
byte's time (from sending the request), the prompt tokens the server evaluated (its `timings.prompt_n`) and,
for the quote, the decode speed. A server that re-reads what its cache held shows it in both.
"""

from __future__ import annotations

import json
import sysconfig
import time
import urllib.request
from pathlib import Path

MODULE = Path(sysconfig.get_paths()["stdlib"]) / "cmd.py"  # 3.1k tokens for Qwen's tokenizer
TURNS = [("Here is a Python module:\n\n```python\n{src}```\n\nWhat does this module do? Answer in three sentences.", 120),
         ("Which method dispatches a command line to the do_* methods, and what happens with an unknown command? "
          "Answer briefly.", 80),
         ("How does tab completion find its candidates? One or two sentences.", 80),
         ("What does `columnize` do? Answer in two sentences.", 80),
         ("Quote the `onecmd` method of the module word for word, in a python block.", 300)]


def ask_streamed(port: int, body: dict, timeout: float = 900) -> dict:
    """One streamed chat request: its text, the first byte's time, and the server's final `timings`."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first, text, timings = None, [], {}
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            timings = chunk.get("timings") or timings
            for choice in chunk.get("choices", []):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first if first is not None else time.perf_counter() - t0
                    text.append(piece)
    return {"text": "".join(text), "first_byte_s": first, "prompt_n": timings.get("prompt_n"),
            "decode_tps": timings.get("predicted_per_second"), "draft_n": timings.get("draft_n", 0),
            "draft_n_accepted": timings.get("draft_n_accepted", 0)}


def converse(servers: list, wait_quiet, gap: float, log) -> list[dict]:
    """Every turn to every server (order alternating); one row per turn: {server name: its figures}."""
    history = {s.name: [] for s in servers}
    rows = []
    for i, (prompt, max_tokens) in enumerate(TURNS):
        content = prompt.format(src=MODULE.read_text()) if i == 0 else prompt
        order = servers[i % len(servers):] + servers[:i % len(servers)]
        if i % 2:
            order.reverse()
        row = {"turn": i}
        for s in order:
            msgs = history[s.name] + [{"role": "user", "content": content}]
            wait_quiet(servers, quiet_s=1.0, gap_s=gap)
            got = row[s.name] = ask_streamed(s.port, {"messages": msgs, "max_tokens": max_tokens, "temperature": 0})
            history[s.name] = msgs + [{"role": "assistant", "content": got["text"]}]
            log(f"followup turn {i} {s.name}: first byte {got['first_byte_s']:.2f} s, "
                f"{got['prompt_n']} prompt tokens evaluated, {got['decode_tps'] or 0:.1f} decode tok/s")
        rows.append(row)
    return rows


def print_turns(rows: list[dict], names: list[str]) -> None:
    """First byte (prompt tokens evaluated) per turn and server, then the ratio to llama-server plain's."""
    print("| turn | " + " | ".join(names) + " |" + (" ratio to llama |" if "llama" in names else ""))
    print("|---|" + "---|" * (len(names) + ("llama" in names)))
    for r in rows:
        cells = [f"{r[n]['first_byte_s']:.2f} s ({r[n]['prompt_n']})" for n in names]
        ratios = (" " + ", ".join(f"{n} {r[n]['first_byte_s'] / r['llama']['first_byte_s']:.2f}x"
                                  for n in names if n != "llama") + " |") if "llama" in names else ""
        label = "first prompt" if r["turn"] == 0 else ("quote" if r["turn"] == len(TURNS) - 1 else f"follow-up {r['turn']}")
        print(f"| {label} | " + " | ".join(cells) + " |" + ratios)
    quote = rows[-1]
    print("quote decode tok/s: " + ", ".join(f"{n} {quote[n]['decode_tps'] or 0:.1f} "
                                             f"({quote[n]['draft_n_accepted']}/{quote[n]['draft_n']} drafts)"
                                             for n in names))
