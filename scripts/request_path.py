"""Which of localspec's modules one request runs through, counted as it runs (Python's profiler, every thread).

  scripts/request-path                   # `localspec run` in-process, then one chat request per protocol
  scripts/request-path --repo DIR        # the same for another checkout of this repository (its own venv's
                                         # llama-cpp-python is not needed: this one's is used)
  scripts/request-path --json FILE

`localspec run` is run twice in this process and the second is counted (the first measures what a new data
root has not measured yet). The server runs as a child process: each protocol is asked once to warm up, then
once counted, between two signals. A module counts when one of its functions ran; a module's import does not.
Needs the default pair in the data root; no server of localspec may already listen (`run` would use it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

MARK = "request-path: "  # the line that carries the run's modules, after the answer's text
PROMPT = "Write a Python function that reverses a string."
REQUESTS = {  # protocol -> (path, body): one short greedy chat each
    "openai": ("/v1/chat/completions", {"model": "localspec", "max_tokens": 8, "temperature": 0,
                                        "messages": [{"role": "user", "content": PROMPT}]}),
    "anthropic": ("/v1/messages", {"model": "localspec", "max_tokens": 8, "temperature": 0,
                                   "messages": [{"role": "user", "content": PROMPT}]}),
    "responses": ("/v1/responses", {"model": "localspec", "max_output_tokens": 8, "temperature": 0,
                                    "input": PROMPT}),
    "ollama": ("/api/chat", {"model": "localspec", "stream": False, "options": {"num_predict": 8, "temperature": 0},
                             "messages": [{"role": "user", "content": PROMPT}]}),
}


class Recorder:
    """Modules of the traced package whose functions ran while `on`, from every thread."""

    def __init__(self, root: Path):
        self.root, self.on, self.seen = str(root) + os.sep, False, set()

    def __call__(self, frame, event, arg):
        if self.on and event == "call":
            code = frame.f_code
            if code.co_filename.startswith(self.root) and code.co_name != "<module>":
                self.seen.add(code.co_filename[len(self.root):])

    def install(self) -> None:
        sys.setprofile(self)
        threading.setprofile(self)

    def take(self) -> list[str]:
        self.on = False
        out, self.seen = sorted(self.seen), set()
        return out


def _package_root() -> Path:
    import localspec
    return Path(localspec.__file__).resolve().parent


def trace_run() -> list[str]:
    from localspec import cli

    rec = Recorder(_package_root())
    rec.install()
    argv = ["run", "--max-tokens", "8", "--temperature", "0", PROMPT]
    for counted in (False, True):
        rec.take()
        rec.on = counted
        try:
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code
        if code:
            raise SystemExit(f"localspec run exited with {code}")
    return rec.take()


def serve_child(port: int, out: Path) -> None:
    """The server, traced: SIGUSR1 starts a count, SIGUSR2 writes it to `out`."""
    from localspec import cli

    rec = Recorder(_package_root())
    rec.install()

    def start(*_):
        rec.take()
        rec.on = True

    def stop(*_):
        out.write_text(json.dumps(rec.take()))
    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    cli.main(["serve", "--port", str(port)])


def _post(port: int, path: str, body: dict) -> None:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        r.read()


def _wait_health(port: int, proc: subprocess.Popen, timeout: float = 600) -> None:
    from harness.serverproc import wait_healthy

    if not wait_healthy(f"http://127.0.0.1:{port}/health", proc, timeout, poll_s=0.5):
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
    raise SystemExit("the server did not become ready")


def trace_server(settle_s: float) -> dict[str, list[str]]:
    from harness.serverproc import free_port  # the port picker every script that starts servers uses

    port = free_port()
    out = Path(f"/tmp/request-path-{os.getpid()}.json")
    proc = subprocess.Popen([sys.executable, __file__, "--serve-child", str(port), "--out", str(out)])
    try:
        _wait_health(port, proc)
        for path, body in REQUESTS.values():  # warm-ups: what a first request does once
            _post(port, path, body)
        time.sleep(settle_s)  # the server's idle work (measuring) ends before anything is counted
        found = {}
        for name, (path, body) in REQUESTS.items():
            out.unlink(missing_ok=True)
            proc.send_signal(signal.SIGUSR1)
            time.sleep(0.2)
            _post(port, path, body)
            time.sleep(0.3)  # what the lane does after the answer (saving its prompt) is the request's too
            proc.send_signal(signal.SIGUSR2)
            deadline = time.monotonic() + 30
            while not out.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            found[name] = json.loads(out.read_text())
        return found
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        out.unlink(missing_ok=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, help="another checkout of this repository to trace")
    ap.add_argument("--json", type=Path, help="write the modules per request here")
    ap.add_argument("--settle", type=float, default=20.0, help="seconds for the server's idle work after warm-ups")
    ap.add_argument("--serve-child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--run-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_child:
        serve_child(args.serve_child, args.out)
        return 0
    if args.repo is not None:  # the same script, with the other checkout's package first on the path
        env = {**os.environ, "PYTHONPATH": str(args.repo.resolve())}
        argv = [sys.executable, __file__] + [a for a in sys.argv[1:] if a not in ("--repo", str(args.repo))]
        return subprocess.call(argv, env=env)
    if args.run_only:
        print("\n" + MARK + json.dumps(trace_run()))
        return 0
    printed = subprocess.check_output([sys.executable, __file__, "--run-only"]).decode().splitlines()
    run = json.loads(next(line for line in printed if line.startswith(MARK))[len(MARK):])
    found = {"run": run, **trace_server(args.settle)}
    print(f"package: {_package_root()}")
    for name, mods in found.items():
        print(f"{name:10s} {len(mods):3d} modules: {' '.join(m.removesuffix('.py') for m in mods)}")
    if args.json:
        args.json.write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
