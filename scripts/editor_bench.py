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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from clients import Recorder, start_proxy  # noqa: E402
from serverproc import ROOT, ServerProcess, free_port  # noqa: E402

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "localspec"
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


def build_llama_server() -> Path:
    """llama-server from the same llama.cpp that llama-cpp-python bundles (its sdist), cached."""
    import importlib.metadata
    version = importlib.metadata.version("llama_cpp_python")
    out = CACHE / f"llama.cpp-{version}"
    binary = out / "build" / "bin" / "llama-server"
    if binary.exists():
        return binary
    tmp = Path(tempfile.mkdtemp(prefix="llama-sdist-"))
    print(f"building llama-server {version} from the sdist (once; several minutes)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={version}", "-d", str(tmp)], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["tar", "xzf", next(tmp.glob("*.tar.gz")), "-C", str(tmp)], check=True)
    src = next(tmp.glob("llama_cpp_python-*")) / "vendor" / "llama.cpp"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(src, out, symlinks=True)
    subprocess.run(["cmake", "-B", "build", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF"],
                   cwd=out, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", "build", "--target", "llama-server", "-j", str(os.cpu_count() or 2)],
                   cwd=out, check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(tmp, ignore_errors=True)
    return binary


class LlamaServer:
    def __init__(self, binary: Path, model: str, flags: list[str], log: Path):
        self.port = free_port()
        self.log = open(log, "w")
        self.proc = subprocess.Popen([str(binary), "-m", model, "--host", "127.0.0.1", "--port", str(self.port), *flags],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        end = time.monotonic() + 300
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}); see {log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("llama-server did not become ready")

    def stop(self) -> int:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        return self.proc.returncode


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
        binary = a.llama_server or build_llama_server()
        flags = ["-ub", "512", "-b", "512", "--ctx-size", "0", "--cache-reuse", "256"]  # llama.vim's CPU advice
        srv = LlamaServer(binary, target, flags, work / "llama-server.log")
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
    finally:
        stop()
    return {**describe(name, rows, rec.seen), "requests": rec.seen}


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


if __name__ == "__main__":
    sys.exit(main())
