"""Speed on a busy laptop: tok/s of the CLI (`localspec run --local`) and of the chat app in a real
terminal (tmux, 120x40, the reply's footnote read off the screen) and headless (Textual's Pilot, which
never draws to a terminal: a second column), quiet and with N busy background processes
(`python3 -c "while True: pass"`, started and stopped here), default (adaptive) threads vs fixed.
Runs alternate configurations, RUNS times each; medians.
  scripts/load-check                  # N=1 busy process, RUNS=3, the default pair
  N=2 RUNS=5 scripts/load-check --target T.gguf --draft D.gguf
"""

import json
import os
import statistics
import subprocess
import sys
import time

N, RUNS = int(os.environ.get("N", 1)), int(os.environ.get("RUNS", 3))
pair = sys.argv[1:]
PROMPT = os.environ.get("PROMPT", "Write a Python function that checks whether a string is a palindrome.")
GEN = ["--temperature", "0", "-n", os.environ.get("TOKENS", "64")]

def cli(threads):
    r = subprocess.run([sys.executable, "-m", "localspec", "run", "--local", *pair, *GEN, *threads, "--json", PROMPT],
                       capture_output=True, text=True, timeout=600)
    if r.returncode:
        sys.exit(r.stderr)
    st = json.loads(r.stdout)["stats"]
    return st["tokens_per_second"], st["threads"]

CHAT = r'''
import asyncio, json, sys
from localspec.chat.app import ChatApp
from localspec.commands.chat import parse_chat_args
async def main():
    app = ChatApp(parse_chat_args(sys.argv[1:-1]))
    async with app.run_test(size=(100, 30)) as pilot:
        while app.loading:
            await pilot.pause(0.05)
        app.query_one("#prompt").load_text(sys.argv[-1])
        await pilot.press("enter")
        while app.replies < 1:  # a slow poll: the harness must not compete with the decode threads itself
            await pilot.pause(0.25)
        print(json.dumps([app.last_stats.tokens_per_second, app.last_stats.threads]))
asyncio.run(main())
'''

def chat_terminal(threads):
    """The chat app as a person sees it: a real terminal (tmux, 120x40), the prompt typed, the reply's
    own footnote read off the screen when it is done."""
    import re
    import shlex
    import tempfile
    work = tempfile.mkdtemp(prefix="load-check-tmux-")
    T = ["tmux", "-S", f"{work}/sock"]
    cmd = " ".join(shlex.quote(x) for x in [sys.executable, "-m", "localspec", "chat", *pair, *GEN, *threads])
    subprocess.run([*T, "-f", "/dev/null", "new-session", "-d", "-s", "c", "-x", "120", "-y", "40",
                    f"TERM=xterm-256color COLORTERM=truecolor {cmd}; sleep 600"], check=True)
    def screen():
        return subprocess.run([*T, "capture-pane", "-p", "-t", "c"], capture_output=True, text=True).stdout
    def wait(pattern, limit=300):
        end = time.time() + limit
        while time.time() < end:
            m = re.search(pattern, screen())
            if m:
                return m
            time.sleep(0.5)  # a slow poll: tmux and this loop must not compete with the decode threads
        sys.exit(f"chat in tmux: waited {limit} s for /{pattern}/:\n{screen()}")
    try:
        wait(r"ready in [0-9.]+ s")
        subprocess.run([*T, "send-keys", "-t", "c", "-l", PROMPT], check=True)
        subprocess.run([*T, "send-keys", "-t", "c", "Enter"], check=True)
        m = wait(r"(\d+) tok · ([0-9.]+) tok/s")
        return float(m.group(2)), None
    finally:
        subprocess.run([*T, "kill-server"], capture_output=True)


def chat(threads):
    r = subprocess.run([sys.executable, "-c", CHAT, *pair, *GEN, *threads, PROMPT], capture_output=True, text=True,
                       timeout=600)
    if r.returncode:
        sys.exit(r.stderr)
    return tuple(json.loads(r.stdout.strip().splitlines()[-1]))

configs = [("run", cli, []), ("run -t 2", cli, ["-t", "2"]), ("run -t 1", cli, ["-t", "1"]),
           ("chat (tmux)", chat_terminal, []), ("chat (headless)", chat, [])]
if os.environ.get("ONLY"):  # e.g. ONLY="run,chat (tmux)"
    configs = [c for c in configs if c[0] in os.environ["ONLY"].split(",")]
results = {}
from localspec import paths  # noqa: E402

hint = str(paths.home() / "threads.json")
for load in (0, N):
    if os.path.exists(hint):  # "quiet" means no busy process lately: forget what a loaded run learnt
        os.remove(hint)
    busy = [subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 1800\nwhile time.time() < end: pass"])
            for _ in range(load)]
    try:
        time.sleep(0.5 if load else 0)
        for r in range(RUNS):
            for name, fn, threads in configs:
                tps, used = fn(threads)
                results.setdefault((name, load), []).append((tps, used))
    finally:
        for p in busy:
            p.kill()
            p.wait()
print(f"{'':10} {'quiet tok/s':>12} {f'{N} busy tok/s':>14} {'loaded/quiet':>13}  threads at the end (quiet; loaded)")
for name, _, _ in configs:
    q, busy = results[(name, 0)], results[(name, N)]
    mq, ml = statistics.median(x[0] for x in q), statistics.median(x[0] for x in busy)
    print(f"{name:10} {mq:12.1f} {ml:14.1f} {ml / mq:13.2f}  {[x[1] for x in q]}; {[x[1] for x in busy]}")
for view in ("chat (tmux)", "chat (headless)"):
    if (view, 0) in results and ("run", 0) in results:
        cq = statistics.median(x[0] for x in results[(view, 0)]) / statistics.median(x[0] for x in results[("run", 0)])
        cl = statistics.median(x[0] for x in results[(view, N)]) / statistics.median(x[0] for x in results[("run", N)])
        print(f"{view} / CLI: quiet {cq:.2f}, loaded {cl:.2f}")
