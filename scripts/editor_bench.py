"""The real llama.vim in real vim inside tmux, through one scripted editing session at a person's pace,
against `localspec serve` and against llama.cpp's llama-server on the same target GGUF, one after the
other: keystroke -> llama.vim's answer on screen (a suggestion, or its info line for an empty answer).

The session edits a copy of the standard library's textwrap.py after opening shlex.py: new lines, typed
words (a character every 0.12 s), jumps across the file and back, a switch to the other file, idle
pauses that let llama.vim send its extra-context warm-ups. vim itself logs each cursor move and each
time llama.vim's answer appears at the cursor (a 20 ms timer reading llama.vim's text properties);
latency = the answer's time - the event's last keystroke. A recording proxy in front of each server
keeps every request (kind, prompt tokens evaluated, cached, answer).

llama-server is built from the llama-cpp-python sdist the project installs (llama.cpp's own code, same
version), once, into ~/.cache/localspec, never into the repository; --llama-server PATH uses another.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from pathlib import Path

from clients import Recorder, start_proxy  # noqa: E402

from harness import llamacpp_tools  # noqa: E402
from harness.serverproc import ServerProcess  # noqa: E402

TIMEOUT_S = 90.0
CHAR_S = 0.12  # typing pace
# (what happens, keys: ("k", tmux key names...) pressed together or ("t", text) typed a character at a time, pause after)
SESSION = [
    ("new line below line 120", [("k", "Escape", ":120", "Enter", "o")], 2.0),
    ("type a word", [("t", "lines")], 2.0),
    ("new line", [("k", "Enter")], 2.0),
    ("type a word", [("t", "return")], 6.0),
    ("jump to line 300, new line", [("k", "Escape", ":300", "Enter", "o")], 2.0),
    ("type a word", [("t", "width")], 2.0),
    ("jump back to line 123, new line", [("k", "Escape", ":123", "Enter", "o")], 2.0),
    ("type a word", [("t", "chunks")], 8.0),
    ("type after an idle pause", [("t", " = ")], 2.0),
    ("switch to shlex.py, new line below line 100", [("k", "Escape", ":e shlex.py", "Enter", ":100", "Enter", "o")], 2.0),
    ("back to textwrap.py, new line below line 450", [("k", "Escape", ":e textwrap.py", "Enter", ":450", "Enter", "o")], 2.0),
    ("new line", [("k", "Enter")], 2.0),
]

VIM_PROBE = r"""
set nocompatible hidden noswapfile
set runtimepath^=%(llama_vim)s
filetype plugin indent on
syntax off
let g:llama_config = {'endpoint_fim': '%(url)s/infill', 'endpoint_inst': '%(url)s/v1/chat/completions', 'show_info': 2}
let g:bench_last = ''
function! BenchLog(line)
  call writefile([a:line], '%(log)s', 'a')
endfunction
function! BenchProbe(timer)
  try
    let l:info = prop_list(line('.'), {'types': ['llama_hl_fim_info']})
  catch
    return
  endtry
  let l:key = empty(l:info) ? '' : line('.') . ' ' . col('.')
  if l:key !=# g:bench_last
    let g:bench_last = l:key
    if !empty(l:key)
      let l:hint = prop_list(line('.'), {'types': ['llama_hl_fim_hint']})
      call BenchLog(printf('shown %%.3f %%s %%d', reltimefloat(reltime()), l:key, len(l:hint)))
    endif
  endif
endfunction
call timer_start(20, 'BenchProbe', {'repeat': -1})
autocmd CursorMoved,CursorMovedI * call BenchLog(printf('move %%.3f %%d %%d', reltimefloat(reltime()), line('.'), col('.')))
"""


def tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, timeout=30).stdout


def read_log(path: Path) -> list[tuple]:
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        kind, t, y, x, *rest = line.split(" ", 4)
        rows.append((kind, float(t), int(y), int(x), rest[0] if rest else ""))
    return rows


def drive(url: str, llama_vim: Path, work: Path, label: str) -> list[dict]:
    """One session in a fresh vim: a row per event (latency None = no answer within TIMEOUT_S)."""
    for name in ("textwrap.py", "shlex.py"):
        shutil.copy(Path(sysconfig.get_paths()["stdlib"]) / name, work / name)
    log = work / "vim-events.log"
    log.unlink(missing_ok=True)
    vimrc = work / "vimrc"
    vimrc.write_text(VIM_PROBE % {"llama_vim": llama_vim, "url": url, "log": log})
    sock = f"eb{os.getpid()}{label}"
    tmux(sock, "new-session", "-d", "-s", "s", "-x", "120", "-y", "40",
         f"cd {work} && vim -N -u {vimrc} -i NONE shlex.py")
    rows = []
    try:
        time.sleep(3)
        tmux(sock, "send-keys", "-t", "s", ":e textwrap.py", "Enter")
        time.sleep(8)  # the second file's chunks reach the server as warm-ups, as they would for a person
        for what, keys, pause in SESSION:
            for step in keys:
                if step[0] == "k":
                    for k in step[1:]:
                        tmux(sock, "send-keys", "-t", "s", *(["-l", k] if len(k) > 1 and k[0] == ":" else [k]))
                        time.sleep(0.05)
                else:
                    for ch in step[1]:
                        tmux(sock, "send-keys", "-t", "s", "-l", ch)
                        time.sleep(CHAR_S)
            time.sleep(0.3)  # vim has taken the keys
            latency, shown = wait_answer(log)
            rows.append({"event": what, "latency_s": latency, "suggested": shown not in ("", "0")})
            print(f"  {label}: {what}: {'no answer' if latency is None else f'{latency:.2f} s'}",
                  file=sys.stderr, flush=True)
            time.sleep(pause)
        tmux(sock, "send-keys", "-t", "s", "Escape", ":qa!", "Enter")
        time.sleep(0.5)
    finally:
        tmux(sock, "kill-server")
    return rows


def wait_answer(log: Path) -> tuple[float | None, str]:
    end = time.monotonic() + TIMEOUT_S
    while True:
        rows = read_log(log)
        moves = [r for r in rows if r[0] == "move"]
        if moves:
            _, t_key, y, x, _ = moves[-1]
            for kind, t, yy, xx, text in rows:
                if kind == "shown" and t >= t_key and (yy, xx) == (y, x):
                    return t - t_key, text
        if time.monotonic() > end:
            return None, ""
        time.sleep(0.05)


# llama.vscode (src/completion.ts, llama-server.ts at v0.0.63) cannot run headless: its pattern is replayed.
# Every keystroke asks for a completion (debounce 0, n_cmpl 3; a whitespace-only line sends no prompt and
# no indentation), never aborted when the next key comes; after a suggestion it asks for the one that
# follows accepting it (cacheFutureSuggestion).
VSCODE_SESSION = [(120, "        lines"), (121, "        return"), (300, "        width"), (123, "        chunks")]


def vscode_request(prefix: str, suffix: str, prompt: str, n_predict: int = 128) -> dict:
    return {"id_slot": 0, "input_prefix": prefix, "input_suffix": suffix, "input_extra": [], "prompt": prompt,
            "n_predict": n_predict, "n_cmpl": 3, "top_k": 40, "top_p": 0.99, "stream": False,
            "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500,
            "t_max_predict_ms": 2500}


def vscode_replay(url: str) -> list[dict]:
    import threading
    lines = (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text().split("\n")
    rows = []

    def post(body: dict, out: dict) -> None:
        req = urllib.request.Request(url + "/infill", json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S * 3) as r:
                answer = json.loads(r.read())
            if isinstance(answer, list):  # llama-server answers n_cmpl > 1 with a list of completions
                answer = answer[0] if answer else {}
            out["content"] = answer.get("content", "")
        except (OSError, ValueError, AttributeError):
            out["content"] = None
        out["t"] = time.monotonic()

    for y, word in VSCODE_SESSION:
        lines.insert(y, "")
        prefix = "\n".join(lines[max(0, y - 256):y]) + "\n"
        suffix = "\n" + "\n".join(lines[y + 1:y + 65]) + "\n"
        answers = []
        for i in range(8, len(word) + 1):  # the indentation comes with the new line, then one request a key
            typed = word[:i]
            answers.append({})
            threading.Thread(target=post, args=(vscode_request(prefix, suffix, typed if typed.strip() else ""),
                                                answers[-1]), daemon=True).start()
            t_key = time.monotonic()
            time.sleep(CHAR_S)
        end = time.monotonic() + TIMEOUT_S
        while "t" not in answers[-1] and time.monotonic() < end:
            time.sleep(0.02)
        last = answers[-1]
        rows.append({"event": f"line {y}: {word.strip()}", "latency_s": last["t"] - t_key if "t" in last else None})
        lines[y] = word
        if last.get("content"):  # the cache-ahead request, as after a shown suggestion
            first = last["content"].split("\n")[0]
            threading.Thread(target=post, args=(vscode_request(prefix, suffix, word + first), {}), daemon=True).start()
        lat = rows[-1]["latency_s"]
        print(f"  llama.vscode replay: {rows[-1]['event']}: {'no answer' if lat is None else f'{lat:.2f} s'}",
              file=sys.stderr, flush=True)
        time.sleep(2.0)
    return rows


def p90(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]


def describe(name: str, rows: list[dict], sent: list[dict]) -> dict:
    lat = [r["latency_s"] if r["latency_s"] is not None else TIMEOUT_S for r in rows]
    fim = [s for s in sent if s.get("path") == "/infill"]
    comp = [s for s in fim if s.get("n_predict") != 0]
    warm = [s for s in fim if s.get("n_predict") == 0]
    evaluated = [s["response"]["prompt_n"] for s in comp if "prompt_n" in s.get("response", {})]
    return {"server": name, "median_s": statistics.median(lat), "p90_s": p90(lat),
            "unanswered": sum(r["latency_s"] is None for r in rows), "completions": len(comp), "warmups": len(warm),
            "prompt_n_median": statistics.median(evaluated) if evaluated else None,
            "prompt_n_max": max(evaluated) if evaluated else None, "events": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-vim", type=Path, required=True, help="a checkout of llama.vim (it is on no package registry)")
    p.add_argument("--llama-server", type=Path, help="a llama-server binary (default: built from the sdist, cached)")
    p.add_argument("--only", choices=["localspec", "llama-server"], help="run one server only")
    p.add_argument("--json", type=Path, help="also write every event and request here")
    p.add_argument("serve_args", nargs="*", help="after --: flags for localspec serve")
    a = p.parse_args()
    for tool in ("vim", "tmux"):
        if not shutil.which(tool):
            p.error(f"{tool} is needed (apt-get install vim tmux)")
    if not (a.llama_vim / "autoload" / "llama.vim").exists():
        p.error(f"{a.llama_vim} is not a llama.vim checkout (no autoload/llama.vim)")
    from localspec.session import ModelChoice, select_models
    target = select_models(ModelChoice()).target
    results = []
    work = Path(tempfile.mkdtemp(prefix="editor-bench-"))
    if a.only != "llama-server":
        srv = ServerProcess(["--temperature", "0", *a.serve_args], Path(os.environ.get("LOCALSPEC_HOME") or _home()))
        results.append(run_one("localspec serve", srv.port, a.llama_vim, work, srv.stop))
    if a.only != "localspec":
        binary = a.llama_server or llamacpp_tools.build("llama-server")
        flags = ["-ub", "512", "-b", "512", "--ctx-size", "0", "--cache-reuse", "256"]  # llama.vim's CPU advice
        srv = llamacpp_tools.LlamaServer(binary, target, flags, work / "llama-server.log")
        results.append(run_one("llama-server " + " ".join(flags), srv.port, a.llama_vim, work, srv.stop))
    print_table(results)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


def _home() -> str:
    from localspec.paths import home
    return str(home())


def run_one(name: str, port: int, llama_vim: Path, work: Path, stop) -> dict:
    rec = Recorder(port)
    url = f"http://127.0.0.1:{start_proxy(rec)}"
    try:
        rows = drive(url, llama_vim, work, name.split()[0])
        mark = rec.mark()
        vscode = vscode_replay(url)
    finally:
        stop()
    return {**describe(name, rows, rec.seen[:mark]), "requests": rec.seen,
            "vscode": describe(name, vscode, rec.seen[mark:])}


def print_table(results: list[dict]) -> None:
    print("| event | " + " | ".join(r["server"] for r in results) + " |")
    print("|---|" + "---|" * len(results))
    for i, (what, _, _) in enumerate(SESSION):
        cells = []
        for r in results:
            ev = r["events"][i] if i < len(r["events"]) else {"latency_s": None}
            cells.append("no answer" if ev["latency_s"] is None else f"{ev['latency_s']:.2f} s")
        print(f"| {i + 1}. {what} | " + " | ".join(cells) + " |")
    for key, label in (("median_s", "median"), ("p90_s", "p90")):
        print(f"| **{label}** | " + " | ".join(f"**{r[key]:.2f} s**" for r in results) + " |")
    print("| completions / warm-ups received | " + " | ".join(f"{r['completions']} / {r['warmups']}" for r in results) + " |")
    print("| prompt tokens evaluated per completion (median / max) | "
          + " | ".join(f"{r['prompt_n_median']} / {r['prompt_n_max']}" for r in results) + " |")
    print(f"\n(no answer within {TIMEOUT_S:.0f} s counts as {TIMEOUT_S:.0f} s)")
    print("\nllama.vscode's pattern, replayed (a request per key, never aborted; cache-ahead after each answer):\n")
    print("| word typed | " + " | ".join(r["server"] for r in results) + " |")
    print("|---|" + "---|" * len(results))
    for i, (y, word) in enumerate(VSCODE_SESSION):
        cells = []
        for r in results:
            ev = r["vscode"]["events"][i]
            cells.append("no answer" if ev["latency_s"] is None else f"{ev['latency_s']:.2f} s")
        print(f"| line {y}: {word.strip()} | " + " | ".join(cells) + " |")
    for key, label in (("median_s", "median"), ("p90_s", "p90")):
        print(f"| **{label}** | " + " | ".join(f"**{r['vscode'][key]:.2f} s**" for r in results) + " |")
    print("| requests received | " + " | ".join(str(r["vscode"]["completions"]) for r in results) + " |")


if __name__ == "__main__":
    sys.exit(main())
