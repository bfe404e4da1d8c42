"""Seconds from launch to the first answer on a fresh data root (nothing measured on this machine yet),
quiet and with BUSY CPU-bound background processes (`python3 -c "while True: pass"`, started and stopped
here): `localspec serve` (launch to its first short chat's last token) and the chat app (Textual's
headless mode, the same app as `localspec chat`: launch to its first reply's first and last text), with
llama-server from the same sdist (default flags, the same target) started and asked the same way beside them.
  scripts/first-answer                 # BUSY=1, RUNS=1, the default pair
  BUSY=2 RUNS=3 scripts/first-answer --target T.gguf --draft D.gguf
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from harness import llamacpp_tools
from harness.serverproc import ServerProcess

BUSY, RUNS, pair = int(os.environ.get("BUSY", 1)), int(os.environ.get("RUNS", 1)), sys.argv[1:]
CHAT = {"messages": [{"role": "user", "content": "Say hello in five words."}], "max_tokens": 8, "temperature": 0}

def fresh_home() -> str:
    home = tempfile.mkdtemp(prefix="localspec-first-")
    env = {**os.environ, "LOCALSPEC_HOME": home}  # the offline bundle assembled first: once per machine, not start-up
    subprocess.run([sys.executable, "-c", "from localspec.models import resolve_pair; resolve_pair()"], env=env,
                   capture_output=True)
    return home

def ask(url: str) -> None:
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(CHAT).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        json.loads(r.read())


def serve_first(home: str) -> float:
    t0 = time.perf_counter()
    srv = ServerProcess(pair, __import__("pathlib").Path(home), wait=False)
    try:
        srv.wait_ready(timeout=600)
        ask(srv.url)
        return time.perf_counter() - t0
    finally:
        srv.stop()


def llama_first(binary, target: str, home: str) -> float:
    t0 = time.perf_counter()
    srv = llamacpp_tools.LlamaServer(binary, target, [], __import__("pathlib").Path(home) / "llama-server.log")
    try:
        ask(f"http://127.0.0.1:{srv.port}")
        return time.perf_counter() - t0
    finally:
        srv.stop()

def chat_first(home: str) -> tuple[float, float]:
    code = r'''
import asyncio, sys, time
from localspec.chat.app import ChatApp
from localspec.commands.chat import parse_chat_args
async def main():
    t0 = time.perf_counter()
    app = ChatApp(parse_chat_args([*sys.argv[1:], "--temperature", "0", "-n", "16"]))
    async with app.run_test(size=(100, 30)) as pilot:
        while app.loading:
            await pilot.pause(0.02)
        if app.engine is None:
            sys.exit(f"load failed: {app.load_error}")
        app.query_one("#prompt").load_text("Say hello in five words.")
        await pilot.press("enter")
        first = None
        while app.replies < 1:
            if first is None and app.last_live is not None:
                first = time.perf_counter() - t0
            await pilot.pause(0.02)
        print(first or time.perf_counter() - t0, time.perf_counter() - t0)
asyncio.run(main())
'''
    out = subprocess.run([sys.executable, "-c", code, *pair], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "LOCALSPEC_HOME": home, "LOCALSPEC_SERVER": "127.0.0.1:9"})
    if out.returncode != 0:
        sys.exit(out.stderr[-800:])
    first, done = map(float, out.stdout.split()[-2:])
    return first, done

from localspec.session import ModelChoice, select_models  # noqa: E402

args = dict(zip(pair[::2], pair[1::2]))
target = args.get("--target") or select_models(ModelChoice(pair=pair[0] if pair and not pair[0].startswith("-") else None)).target
llama = llamacpp_tools.build("llama-server")
rows = {}
for load in ("quiet", f"{BUSY} busy"):
    burners = [] if load == "quiet" else [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(BUSY)]
    try:
        for _ in range(RUNS):
            home = fresh_home()
            rows.setdefault((load, "serve: first short chat answered"), []).append(serve_first(home))
            rows.setdefault((load, "llama-server: first short chat answered"), []).append(llama_first(llama, target, home))
            shutil.rmtree(home, ignore_errors=True)
            home = fresh_home()
            first, done = chat_first(home)
            rows.setdefault((load, "chat: first reply's first text"), []).append(first)
            rows.setdefault((load, "chat: first reply done"), []).append(done)
            shutil.rmtree(home, ignore_errors=True)
    finally:
        for b in burners:
            b.kill()
print("| machine | what | seconds from launch (median) | runs |\n|---|---|---|---|")
for (load, what), v in rows.items():
    print(f"| {load} | {what} | {statistics.median(v):.1f} | {', '.join(f'{x:.1f}' for x in v)} |")
