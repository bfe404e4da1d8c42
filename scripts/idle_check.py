"""A background server must be invisible: what `localspec serve` does with the cores while nobody asks, on a
fresh data root (nothing measured on this machine yet), quiet and beside busy programs.

For each localspec server named (`localspec`: this checkout; `localspec@REV`: another commit's, as
scripts/race checks it out), each phase on a fresh data root (the pair assembled into it first):
  quiet       a short chat, then the server's CPU (cores, from /proc) until its measurements are done, then
              over the next 60 s
  busy        a short chat, then one CPU-bound process (`python3 -c "while True: pass"`) beside it: the
              server's CPU over 60 s
  during      a short chat, then the same chat again while the server measures (its first token's wait), and
              once more after the measurements ended: the difference is what a measurement costs a request
  copy        a verbatim copy of a paragraph as the fresh server's first answer: drafted tokens, if any
  loaded      two CPU-bound processes beside it: launch to the first 64-token answer and its decode speed,
              with llama-server (same sdist, same file, default flags) asked the same way in the same run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from race import checkout  # noqa: E402

from harness import llamacpp_tools  # noqa: E402
from harness.serverproc import ServerProcess, drop_data_copies  # noqa: E402

CHAT = {"messages": [{"role": "user", "content": "Say hello in five words."}], "max_tokens": 8, "temperature": 0}
PARAGRAPH = ("The cache keeps the keys and values of every token the model has seen, so the next token attends to "
             "them without computing them again. When the cache is full, the oldest conversation is saved to host "
             "memory and its cells are freed; when its client comes back, it is copied in again, bit for bit. ") * 2
COPY = {"messages": [{"role": "user", "content": f"Repeat this text exactly, word for word:\n\n{PARAGRAPH}"}],
        "max_tokens": 200, "temperature": 0}
LONG = {"messages": [{"role": "user", "content": "Write a short story about a lighthouse keeper."}],
        "max_tokens": 64, "temperature": 0}


def ask(port: int, body: dict) -> dict:
    """A streamed chat: seconds to the first text, and the final `timings`."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 json.dumps({**body, "stream": True}).encode(), {"Content-Type": "application/json"})
    t0, first, timings = time.perf_counter(), None, {}
    with urllib.request.urlopen(req, timeout=900) as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith("data:") and line != "data: [DONE]":
                chunk = json.loads(line[5:])
                timings = chunk.get("timings") or timings
                if first is None and any((c.get("delta") or {}).get("content") for c in chunk.get("choices", [])):
                    first = time.perf_counter() - t0
    return {"first_s": first, "total_s": time.perf_counter() - t0, "timings": timings}


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cores_over(pid: int, seconds: float) -> float:
    c0, t0 = cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_s(pid) - c0) / (time.monotonic() - t0)


def measurement(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/props", timeout=10) as r:
        return (json.loads(r.read()).get("localspec") or {}).get("measurement") or {}


def busy(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
        p.wait()


def source(name: str, work: Path) -> Path | None:
    """The checkout a server runs from: this one for `localspec`, REV's (checked out once) for `localspec@REV`."""
    if "@" not in name:
        return None
    rev = name.partition("@")[2]
    path = work / f"at-{rev}"
    return path if path.exists() else checkout(rev, work)


class Fresh:
    """A localspec server on a fresh data root (the pair assembled into it before the server starts)."""

    def __init__(self, name: str, work: Path):
        self.home = Path(tempfile.mkdtemp(prefix="idle-", dir=work))
        cwd = source(name, work)
        subprocess.run([sys.executable, "-c", "from localspec.models import resolve_pair; resolve_pair()"],
                       env={**os.environ, "LOCALSPEC_HOME": str(self.home)}, cwd=cwd, capture_output=True, check=True)
        self.t0 = time.perf_counter()
        self.srv = ServerProcess([], self.home, wait=False, cwd=cwd)
        self.srv.wait_ready(timeout=600)
        self.ready_s = time.perf_counter() - self.t0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.srv.stop()
        drop_data_copies(self.home)


def until_measured(port: int, pid: int, limit_s: float = 400) -> float:
    """Seconds until the server says its first measurements are done (one that does not say: at once) and it
    has used no CPU for 10 s (a server also prices passes at the last request's depth after them)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if measurement(port).get("state", "done") == "done" and cores_over(pid, 10.0) < 0.02:
            return time.monotonic() - t0 - 10.0
        time.sleep(1.0)
    return time.monotonic() - t0


def phases(name: str, work: Path, log) -> dict:
    out: dict = {}
    with Fresh(name, work) as f:
        port, pid = f.srv.port, f.srv.proc.pid
        out["copy"] = ask(port, COPY)["timings"].get("draft_n", 0)
        log(f"{name} copy: {out['copy']} tokens drafted on a fresh data root")
        took = until_measured(port, pid)
        out["quiet"] = {"measuring_s": round(took, 1), "idle_cores": round(cores_over(pid, 60), 3)}
        log(f"{name} quiet: measured in {took:.0f} s, then {out['quiet']['idle_cores']:.3f} cores idle")
    with Fresh(name, work) as f:
        ask(f.srv.port, CHAT)
        hogs = busy(1)
        try:
            out["busy"] = {"idle_cores": round(cores_over(f.srv.proc.pid, 60), 3), "state": measurement(f.srv.port)}
        finally:
            stop_all(hogs)
        log(f"{name} busy: {out['busy']['idle_cores']:.3f} cores idle beside a busy process")
    with Fresh(name, work) as f:
        ask(f.srv.port, CHAT)
        time.sleep(8)  # its first measurement under way (quiet for 5 s, the old rule's 2 s)
        during = ask(f.srv.port, CHAT)["first_s"]
        until_measured(f.srv.port, f.srv.proc.pid)
        after = ask(f.srv.port, CHAT)["first_s"]
        out["during"] = {"first_s": round(during, 3), "measured_first_s": round(after, 3)}
        log(f"{name} during: first token {during:.2f} s while measuring, {after:.2f} s measured")
    return out


def loaded(names: list[str], work: Path, log) -> dict:
    """Beside two busy processes: launch to the first 64-token answer, localspec's on fresh roots and llama-server's."""
    out = {}
    hogs = busy(2)
    try:
        for name in names:
            with Fresh(name, work) as f:
                got = ask(f.srv.port, LONG)
                out[name] = {"ready_s": round(f.ready_s, 2), "first_token_s": round(f.ready_s + got["first_s"], 2),
                             "first_answer_s": round(time.perf_counter() - f.t0, 2),
                             "decode_tps": got["timings"].get("predicted_per_second")}
        from localspec import models

        target = str(models.resolve_pair().target_path)
        t0 = time.perf_counter()
        srv = llamacpp_tools.LlamaServer(llamacpp_tools.build("llama-server"), target, [], work / "llama.log")
        try:
            ready = time.perf_counter() - t0
            got = ask(srv.port, LONG)
            out["llama"] = {"ready_s": round(ready, 2), "first_token_s": round(ready + got["first_s"], 2),
                            "first_answer_s": round(time.perf_counter() - t0, 2),
                            "decode_tps": got["timings"].get("predicted_per_second")}
        finally:
            srv.stop()
    finally:
        stop_all(hogs)
    for name, v in out.items():
        log(f"loaded {name}: ready {v['ready_s']:.1f} s, first token {v['first_token_s']:.1f} s, whole answer "
            f"{v['first_answer_s']:.1f} s after launch, {v['decode_tps'] or 0:.2f} tok/s")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default="localspec", help="localspec and/or localspec@REV, comma-separated")
    p.add_argument("--loaded-only", action="store_true", help="only the two-busy-processes comparison")
    p.add_argument("--json", type=Path, help="write the figures here")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="localspec-idle-"))
    names = a.servers.split(",")
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    result = {} if a.loaded_only else {name: phases(name, work, log) for name in names}
    result["loaded"] = loaded(names, work, log)
    print(json.dumps(result, indent=1))
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
